package frontend

import (
	"context"
	"sort"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// TestTracing: with a TracerProvider, the server span continues the
// caller's W3C trace and its context reaches Slot.Submit; health checks are
// not traced.
func TestTracing(t *testing.T) { forEachTransport(t, testTracing) }

func testTracing(t *testing.T, tr string) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer tp.Shutdown(context.Background())
	f := newFakeBackend()
	ts := startServerOn(t, tr, f, func(o *Options) { o.TracerProvider = tp })

	traceID, _ := trace.TraceIDFromHex("0af7651916cd43dd8448eb211c80319c")
	parent, _ := trace.SpanIDFromHex("b7ad6b7169203331")
	caller := trace.NewSpanContext(trace.SpanContextConfig{TraceID: traceID, SpanID: parent, TraceFlags: trace.FlagsSampled, Remote: true})
	carrier := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(trace.ContextWithSpanContext(context.Background(), caller), carrier)
	ctx := metadata.AppendToOutgoingContext(context.Background(), "traceparent", carrier["traceparent"])

	healthStatus(ts.conn, "")
	dense, sparse := inputs(1)
	before := time.Now()
	if _, err := ts.api.ModelInfer(ctx, rawRequest(dense, sparse, 1, false)); err != nil {
		t.Fatal(err)
	}
	after := time.Now()
	// The stats handler ends the server span once the call is over on the
	// server's side, which may be after the client has its answer.
	var server sdktrace.ReadOnlySpan
	waitFor(t, 10*time.Second, "the ModelInfer server span", func() bool {
		for _, s := range rec.Ended() {
			if s.Name() == "inference.GRPCInferenceService/ModelInfer" {
				server = s
			}
		}
		return server != nil
	})
	for _, s := range rec.Ended() {
		if strings.Contains(s.Name(), "Health") {
			t.Errorf("health check traced: %s", s.Name())
		}
	}
	if server.Parent().SpanID() != parent || server.SpanContext().TraceID() != traceID {
		t.Errorf("server span does not continue the caller's trace")
	}
	f.mu.Lock()
	tc, arrival := f.lastTC, f.lastArrival
	f.mu.Unlock()
	if arrival.Before(before) || arrival.After(after) {
		t.Errorf("Submit got arrival %v, outside the call [%v, %v]", arrival, before, after)
	}
	want := TraceContext{TraceID: traceID, SpanID: server.SpanContext().SpanID(), Flags: 1}
	if tc != want {
		t.Errorf("Submit got trace context %+v, want %+v", tc, want)
	}

	// Untraced servers hand the backend a zero TraceContext.
	f2 := newFakeBackend()
	ts2 := startServerOn(t, tr, f2, nil)
	if _, err := ts2.api.ModelInfer(ctx, rawRequest(dense, sparse, 1, false)); err != nil {
		t.Fatal(err)
	}
	if !f2.lastTC.IsZero() {
		t.Errorf("untraced server passed %+v", f2.lastTC)
	}
}

// TestTracingSameOnBothTransports: a call's server span has the same name,
// kind, status and attributes whichever transport serves it, for a call
// that succeeds and for one refused as invalid, since one handler
// (otelgrpc's) makes the spans of both. The lean transport used to copy
// otelgrpc's naming by hand and drifted from it when otelgrpc moved to the
// newer RPC semantic conventions.
func TestTracingSameOnBothTransports(t *testing.T) {
	spans := map[string][]string{}
	forEachTransport(t, func(t *testing.T, tr string) {
		rec := tracetest.NewSpanRecorder()
		tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
		defer tp.Shutdown(context.Background())
		ts := startServerOn(t, tr, newFakeBackend(), func(o *Options) { o.TracerProvider = tp })
		dense, sparse := inputs(1)
		if _, err := ts.api.ModelInfer(context.Background(), rawRequest(dense, sparse, 1, false)); err != nil {
			t.Fatal(err)
		}
		bad := rawRequest(dense, sparse, 1, false)
		bad.ModelName = "no-such-model"
		if _, err := ts.api.ModelInfer(context.Background(), bad); status.Code(err) == codes.OK {
			t.Fatal("a call for an unknown model succeeded")
		}
		waitFor(t, 10*time.Second, "two ended server spans", func() bool { return len(rec.Ended()) >= 2 })
		for _, s := range rec.Ended() {
			spans[tr] = append(spans[tr], describeSpan(s))
		}
		sort.Strings(spans[tr])
	})
	if g, l := strings.Join(spans[TransportGRPC], "\n"), strings.Join(spans[TransportLean], "\n"); g != l {
		t.Errorf("the transports trace differently:\ngrpc:\n%s\nlean:\n%s", g, l)
	}
	if want := `rpc.response.status_code=OK`; !strings.Contains(strings.Join(spans[TransportLean], " "), want) {
		t.Errorf("lean spans lack %s: %v", want, spans[TransportLean])
	}
}

// describeSpan is what TestTracingSameOnBothTransports compares: the
// attributes that name the server's own address are left out, as the lean
// transport does not report it.
func describeSpan(s sdktrace.ReadOnlySpan) string {
	var attrs []string
	for _, kv := range s.Attributes() {
		if strings.HasPrefix(string(kv.Key), "server.") {
			continue
		}
		attrs = append(attrs, string(kv.Key)+"="+kv.Value.Emit())
	}
	sort.Strings(attrs)
	return s.Name() + " " + s.SpanKind().String() + " " + s.Status().Code.String() + " " + strings.Join(attrs, " ")
}
