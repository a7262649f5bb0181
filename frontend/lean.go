package frontend

import (
	"context"
	"net"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	otelcodes "go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/recmesh/recmesh/frontend/h2unary"
	"github.com/recmesh/recmesh/proto/inference"
)

// rpcServer is what serves the gRPC port: a *grpc.Server or an
// *h2unary.Server.
type rpcServer interface {
	Serve(net.Listener) error
	GracefulStop()
	Stop()
}

// newLean is the port's server for TransportLean: the same services,
// limits, admission and tracing as grpc-go's, on package h2unary.
func (s *Server) newLean() *h2unary.Server {
	maxRecv := maxRecvMsgSize(s.opts.MaxBatch, s.svc.schema.width)
	streamWindow, connWindow := flowWindows(maxRecv)
	o := h2unary.Options{
		MaxConcurrentStreams: uint32(s.opts.MaxStreams),
		MaxRecvMsgSize:       maxRecv,
		StreamWindow:         streamWindow,
		ConnWindow:           connWindow,
		TLS:                  s.tls,
		Admit:                s.svc.admitMethod,
		Workers:              s.opts.StreamWorkers,
		KeepaliveMinTime:     keepaliveMinTime,
		// The service bounds calls by MaxRequestTime too; with the bound
		// already in the deadline it makes no second timer.
		MaxCallTime: s.opts.MaxRequestTime,
		Unmarshal:   newRequestDecoder(s.svc.schema).Unmarshal,
		Logger:      s.log,
		// The limits on what a client holds (the connection count is
		// limitListener's, for both transports).
		HandshakeTimeout:     s.opts.HandshakeTimeout,
		IdleTimeout:          s.opts.IdleTimeout,
		HeaderTimeout:        s.opts.HeaderTimeout,
		BodyTimeout:          s.opts.BodyTimeout,
		MaxConnBufferedBytes: s.opts.MaxConnBufferedBytes,
		MaxBufferedBytes:     s.opts.MaxBufferedBytes,
		OnRefuse:             s.metrics.refuse,
	}
	if s.opts.TracerProvider != nil {
		o.Interceptor = s.traceCalls
	}
	srv := h2unary.NewServer(o)
	srv.RegisterService(&inference.GRPCInferenceService_ServiceDesc, s.svc)
	srv.RegisterService(&healthpb.Health_ServiceDesc, s.health)
	return srv
}

// traceCalls gives each call a server span, child of the caller's trace
// context, named and attributed as otelgrpc names grpc-go's; health checks
// are left out, as there.
func (s *Server) traceCalls(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if strings.HasPrefix(info.FullMethod, "/"+healthpb.Health_ServiceDesc.ServiceName+"/") {
		return handler(ctx, req)
	}
	md, _ := metadata.FromIncomingContext(ctx)
	ctx = s.opts.Propagator.Extract(ctx, metadataCarrier(md))
	name := strings.TrimPrefix(info.FullMethod, "/")
	service, method, _ := strings.Cut(name, "/")
	ctx, span := s.opts.TracerProvider.Tracer("github.com/recmesh/recmesh/frontend").Start(ctx, name,
		trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(attribute.String("rpc.system", "grpc"), attribute.String("rpc.service", service), attribute.String("rpc.method", method)))
	defer span.End()
	resp, err := handler(ctx, req)
	st := status.Convert(err)
	span.SetAttributes(attribute.Int64("rpc.grpc.status_code", int64(st.Code())))
	if err != nil {
		span.SetStatus(otelcodes.Error, st.Message())
	}
	return resp, err
}

// metadataCarrier reads a call's incoming metadata for a propagator.
type metadataCarrier metadata.MD

func (m metadataCarrier) Get(key string) string {
	if v := metadata.MD(m).Get(key); len(v) > 0 {
		return v[0]
	}
	return ""
}

func (m metadataCarrier) Set(key, value string) { metadata.MD(m).Set(key, value) }

func (m metadataCarrier) Keys() []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	return keys
}
