package frontend

import (
	"context"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc/filters"
	"google.golang.org/grpc"
	grpcstats "google.golang.org/grpc/stats"
)

// newTraceHandler is the port's tracing on both transports: otelgrpc's
// server stats handler, which grpc-go drives itself and traceCalls drives
// for the lean transport, so one library names and attributes the spans
// (semantic conventions included) whichever transport serves the call.
func newTraceHandler(opts Options) grpcstats.Handler {
	return otelgrpc.NewServerHandler(
		otelgrpc.WithTracerProvider(opts.TracerProvider),
		otelgrpc.WithPropagators(opts.Propagator),
		// Probes every few seconds per load balancer would drown the
		// inference spans.
		otelgrpc.WithFilter(filters.Not(filters.HealthCheck())),
	)
}

// traceCalls is the lean transport's unary interceptor that feeds a call's
// life to the trace handler the way grpc-go would: tagged with its method
// (the handler extracts the caller's context from the incoming metadata),
// begun, and ended with its error.
func (s *Server) traceCalls(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	ctx = s.tracing.TagRPC(ctx, &grpcstats.RPCTagInfo{FullMethodName: info.FullMethod})
	begin := time.Now()
	s.tracing.HandleRPC(ctx, &grpcstats.Begin{BeginTime: begin})
	resp, err := handler(ctx, req)
	s.tracing.HandleRPC(ctx, &grpcstats.End{BeginTime: begin, EndTime: time.Now(), Error: err})
	return resp, err
}
