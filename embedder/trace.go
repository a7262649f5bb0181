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
	links := make([]trace.Link, 0, b.tasks.Len())
	first := now
	for k := range b.tasks.Len() {
		t := b.tasks.At(k)
		if t.ReadAt.Before(first) {
			first = t.ReadAt
		}
		sc := spanContext(t.Trace)
		if !sc.IsValid() {
			continue
		}
		links = append(links, trace.Link{SpanContext: sc})
		if sc.IsSampled() {
			ctx := trace.ContextWithRemoteSpanContext(context.Background(), sc)
			_, s := d.tracer.Start(ctx, "embedder.queue_wait", trace.WithTimestamp(t.ReadAt),
				trace.WithAttributes(attribute.Int("recmesh.lane", t.Lane), attribute.Int("recmesh.examples", t.Rows())))
			s.End(trace.WithTimestamp(now))
		}
	}
	_, span := d.tracer.Start(context.Background(), "embedder.lookup_batch",
		trace.WithTimestamp(first), trace.WithLinks(links...),
		trace.WithAttributes(attribute.Int("recmesh.examples", rows), attribute.Int("recmesh.requests", b.tasks.Len()),
			attribute.String("recmesh.batch_mode", d.e.opts.Mode.String())))
	span.End(trace.WithTimestamp(now))
	sc := span.SpanContext()
	return shm.TraceContext{TraceID: sc.TraceID(), SpanID: sc.SpanID(), Flags: byte(sc.TraceFlags())}
}
