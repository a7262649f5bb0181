package embedder

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/recmesh/recmesh/shm"
	"github.com/recmesh/recmesh/telemetry"
)

// tracerName is the instrumentation scope of this service's spans.
const tracerName = "github.com/recmesh/recmesh/embedder"

func newTracer(tp trace.TracerProvider) trace.Tracer { return telemetry.Tracer(tp, tracerName) }

func spanContext(tc shm.TraceContext) trace.SpanContext {
	return telemetry.RemoteSpanContext(tc.TraceID, tc.SpanID, tc.Flags)
}

// traceBatch records the batch's lookup span, linked to every traced
// request it carries, and a queue-wait span inside each sampled request's
// own trace. It returns the lookup span's context for the batch
// descriptor, so the accelerator's spans can link to it.
func (d *dispatcher) traceBatch(b *openBatch, rows int, now time.Time) shm.TraceContext {
	links := make([]trace.Link, 0, len(b.entries))
	first := now
	for k := range b.entries {
		if b.readAt[k].Before(first) {
			first = b.readAt[k]
		}
		sc := spanContext(b.traces[k])
		if !sc.IsValid() {
			continue
		}
		links = append(links, trace.Link{SpanContext: sc})
		if sc.IsSampled() {
			ctx := trace.ContextWithRemoteSpanContext(context.Background(), sc)
			_, s := d.tracer.Start(ctx, "embedder.queue_wait", trace.WithTimestamp(b.readAt[k]),
				trace.WithAttributes(attribute.Int("recmesh.lane", b.entries[k].Lane), attribute.Int("recmesh.examples", b.entries[k].Rows)))
			s.End(trace.WithTimestamp(now))
		}
	}
	_, span := d.tracer.Start(context.Background(), "embedder.lookup_batch",
		trace.WithTimestamp(first), trace.WithLinks(links...),
		trace.WithAttributes(attribute.Int("recmesh.examples", rows), attribute.Int("recmesh.requests", len(b.entries)),
			attribute.String("recmesh.batch_mode", d.e.opts.Mode.String())))
	span.End(trace.WithTimestamp(now))
	sc := span.SpanContext()
	return shm.TraceContext{TraceID: sc.TraceID(), SpanID: sc.SpanID(), Flags: byte(sc.TraceFlags())}
}
