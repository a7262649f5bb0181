package server

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/recmesh/recmesh/shm"
	"github.com/recmesh/recmesh/telemetry"
)

// tracerName is the instrumentation scope of this service's spans.
const tracerName = "github.com/recmesh/recmesh/accelerator"

func newTracer(tp trace.TracerProvider) trace.Tracer { return telemetry.Tracer(tp, tracerName) }

func spanContext(tc shm.TraceContext) trace.SpanContext {
	return telemetry.RemoteSpanContext(tc.TraceID, tc.SpanID, tc.Flags)
}

// traceBatch records the execute span of one bucket run, linked to the
// embedder's batch span and to every traced request, plus a span inside
// each sampled request's trace covering the same run.
func (l *genLoop) traceBatch(b shm.Batch, bucket int, start, end time.Time) {
	links := make([]trace.Link, 0, b.Entries+1)
	if sc := spanContext(b.Trace); sc.IsValid() {
		links = append(links, trace.Link{SpanContext: sc, Attributes: []attribute.KeyValue{attribute.String("recmesh.link", "embedder_batch")}})
	}
	for i := 0; i < b.Entries; i++ {
		e, err := l.reader.Entry(b, i)
		if err != nil || e.Lane < 0 || e.Lane >= len(l.writers) {
			continue
		}
		tc, err := l.writers[e.Lane].Trace(e.Slot, e.Epoch)
		if err != nil {
			continue
		}
		sc := spanContext(tc)
		if !sc.IsValid() {
			continue
		}
		links = append(links, trace.Link{SpanContext: sc})
		if sc.IsSampled() {
			ctx := trace.ContextWithRemoteSpanContext(context.Background(), sc)
			_, sp := l.tracer.Start(ctx, "accelerator.execute_request", trace.WithTimestamp(start),
				trace.WithAttributes(attribute.Int("recmesh.bucket", bucket), attribute.Int("recmesh.examples", e.Rows)))
			sp.End(trace.WithTimestamp(end))
		}
	}
	_, span := l.tracer.Start(context.Background(), "accelerator.execute", trace.WithTimestamp(start), trace.WithLinks(links...),
		trace.WithAttributes(attribute.Int("recmesh.bucket", bucket), attribute.Int("recmesh.examples", b.Examples),
			attribute.Int("recmesh.requests", b.Entries), attribute.Int64("recmesh.batch_seq", int64(b.Seq))))
	span.End(trace.WithTimestamp(end))
}
