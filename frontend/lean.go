package frontend

import (
	"net"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

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
	if s.tracing != nil {
		o.Interceptor = s.traceCalls
	}
	srv := h2unary.NewServer(o)
	srv.RegisterService(&inference.GRPCInferenceService_ServiceDesc, s.svc)
	srv.RegisterService(&healthpb.Health_ServiceDesc, s.health)
	return srv
}
