package telemetry

import (
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// Tracer returns the named tracer of tp, or nil when tp is nil or a no-op
// provider: services test one pointer on their hot paths and do no
// tracing work at all when tracing is off.
func Tracer(tp trace.TracerProvider, name string) trace.Tracer {
	if tp == nil {
		return nil
	}
	if _, off := tp.(noop.TracerProvider); off {
		return nil
	}
	return tp.Tracer(name)
}

// RemoteSpanContext turns the binary W3C context carried in shared memory
// (trace id, span id, flags) into a remote span context; it is invalid
// when the request was not traced.
func RemoteSpanContext(traceID [16]byte, spanID [8]byte, flags byte) trace.SpanContext {
	return trace.NewSpanContext(trace.SpanContextConfig{
		TraceID:    trace.TraceID(traceID),
		SpanID:     trace.SpanID(spanID),
		TraceFlags: trace.TraceFlags(flags),
		Remote:     true,
	})
}
