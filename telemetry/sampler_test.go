package telemetry

import (
	"context"
	"strings"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// TestLinkedSampling: with a ratio of 0, a root span is dropped unless it
// links a sampled span, and a child of a sampled remote parent is kept
// (parentbased), as compose's and Kubernetes' samplers are configured.
func TestLinkedSampling(t *testing.T) {
	t.Setenv("OTEL_TRACES_SAMPLER", "parentbased_traceidratio")
	t.Setenv("OTEL_TRACES_SAMPLER_ARG", "0")
	exp := tracetest.NewInMemoryExporter()
	tel, err := New(context.Background(), "test", Options{SpanProcessor: sdktrace.NewSimpleSpanProcessor(exp)})
	if err != nil {
		t.Fatal(err)
	}
	defer tel.Shutdown(context.Background())
	tr := tel.Tracer.Tracer("t")

	sampled := RemoteSpanContext([16]byte{1}, [8]byte{2}, byte(trace.FlagsSampled))
	unsampled := RemoteSpanContext([16]byte{3}, [8]byte{4}, 0)

	_, s := tr.Start(context.Background(), "root")
	s.End()
	_, s = tr.Start(context.Background(), "batch-unsampled-links", trace.WithLinks(trace.Link{SpanContext: unsampled}))
	s.End()
	_, s = tr.Start(context.Background(), "batch", trace.WithLinks(trace.Link{SpanContext: unsampled}, trace.Link{SpanContext: sampled}))
	s.End()
	_, s = tr.Start(trace.ContextWithRemoteSpanContext(context.Background(), sampled), "child")
	s.End()

	var got []string
	for _, s := range exp.GetSpans() {
		got = append(got, s.Name)
	}
	if strings.Join(got, ",") != "batch,child" {
		t.Errorf("exported %v; want [batch child]", got)
	}
}

func TestBadSampler(t *testing.T) {
	for _, c := range []struct{ name, arg, want string }{
		{"jaeger_remote", "", "OTEL_TRACES_SAMPLER"},
		{"traceidratio", "1.5", "OTEL_TRACES_SAMPLER_ARG"},
		{"parentbased_traceidratio", "x", "OTEL_TRACES_SAMPLER_ARG"},
	} {
		t.Setenv("OTEL_TRACES_SAMPLER", c.name)
		t.Setenv("OTEL_TRACES_SAMPLER_ARG", c.arg)
		_, err := New(context.Background(), "test", Options{SpanProcessor: sdktrace.NewSimpleSpanProcessor(tracetest.NewInMemoryExporter())})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s %q: error %v; want one naming %s", c.name, c.arg, err, c.want)
		}
	}
}
