package telemetry

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime/debug"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

func TestServeHTTP(t *testing.T) {
	t.Setenv("OTEL_TRACES_EXPORTER", "none")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	tel, err := New(ctx, "test", Options{})
	if err != nil {
		t.Fatal(err)
	}
	var live, ready atomic.Bool
	live.Store(true)
	addr, err := tel.ServeHTTP(ctx, "127.0.0.1:0", live.Load, ready.Load)
	if err != nil {
		t.Fatal(err)
	}
	get := func(path string) (int, string) {
		resp, err := http.Get("http://" + addr.String() + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	// Liveness does not depend on readiness: a process waiting for its
	// peers is alive, and must not be restarted for it.
	if code, _ := get("/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz of a live process not yet ready = %d, want 200", code)
	}
	if code, _ := get("/readyz"); code != http.StatusServiceUnavailable {
		t.Fatalf("/readyz before ready = %d, want 503", code)
	}
	ready.Store(true)
	if code, _ := get("/readyz"); code != http.StatusOK {
		t.Fatalf("/readyz when ready = %d, want 200", code)
	}
	live.Store(false)
	if code, body := get("/healthz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "stuck") {
		t.Fatalf("/healthz of a stuck process = %d %q, want 503", code, body)
	}
	code, body := get("/metrics")
	if code != http.StatusOK || !strings.Contains(body, "go_goroutines") || !strings.Contains(body, "process_") {
		t.Fatalf("/metrics = %d without the Go and process collectors", code)
	}
	if code, _ := get("/debug/pprof/heap"); code != http.StatusNotFound {
		t.Fatalf("/debug/pprof/heap without RECMESH_PPROF = %d, want 404", code)
	}
}

func TestProfiling(t *testing.T) {
	t.Setenv("OTEL_TRACES_EXPORTER", "none")
	t.Setenv("RECMESH_PPROF", "true")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	tel, err := New(ctx, "test", Options{})
	if err != nil {
		t.Fatal(err)
	}
	addr, err := tel.ServeHTTP(ctx, "127.0.0.1:0", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get("http://" + addr.String() + "/debug/pprof/allocs?debug=1")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), "heap profile") {
		t.Fatalf("/debug/pprof/allocs = %d %.80q, want the allocation profile", resp.StatusCode, b)
	}

	t.Setenv("RECMESH_PPROF", "sometimes")
	if _, err := New(ctx, "test", Options{}); err == nil || !strings.Contains(err.Error(), "RECMESH_PPROF") {
		t.Fatalf("err = %v, want one naming RECMESH_PPROF", err)
	}
}

func TestTracingOffIsNoop(t *testing.T) {
	t.Setenv("OTEL_TRACES_EXPORTER", "")
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "")
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
	tel, err := New(context.Background(), "test", Options{})
	if err != nil {
		t.Fatal(err)
	}
	_, span := tel.Tracer.Tracer("x").Start(context.Background(), "op")
	if span.SpanContext().IsValid() || span.IsRecording() {
		t.Fatal("tracing is off but a recording span was made")
	}
}

func TestTracingWithProcessor(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tel, err := New(context.Background(), "test", Options{SpanProcessor: trace.NewSimpleSpanProcessor(exp)})
	if err != nil {
		t.Fatal(err)
	}
	_, span := tel.Tracer.Tracer("x").Start(context.Background(), "op")
	span.End()
	// The in-memory exporter forgets its spans on shutdown: read them first.
	if got := exp.GetSpans(); len(got) != 1 || got[0].Name != "op" {
		t.Fatalf("exported %d spans, want the one named op", len(got))
	}
	if err := tel.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestBadLogLevel(t *testing.T) {
	t.Setenv("RECMESH_LOG_LEVEL", "loud")
	if _, err := New(context.Background(), "test", Options{}); err == nil || !strings.Contains(err.Error(), "RECMESH_LOG_LEVEL") {
		t.Fatalf("err = %v, want one naming RECMESH_LOG_LEVEL", err)
	}
}

func TestListenRange(t *testing.T) {
	a, err := ListenRange("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	// Find two consecutive free ports, occupy the first, and check the
	// range gives the second.
	_, p, _ := net.SplitHostPort(a.Addr().String())
	port, _ := strconv.Atoi(p)
	a.Close()
	first, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		t.Skipf("port %d taken again: %v", port, err)
	}
	defer first.Close()
	ln, err := ListenRange(fmt.Sprintf("127.0.0.1:%d-%d", port, port+5))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if got := ln.Addr().(*net.TCPAddr).Port; got <= port || got > port+5 {
		t.Fatalf("range %d-%d with %d taken bound %d", port, port+5, port, got)
	}
	for _, bad := range []string{"127.0.0.1:9-1", "127.0.0.1:a-b", "127.0.0.1:0-70000"} {
		if _, err := ListenRange(bad); err == nil {
			t.Errorf("ListenRange(%q) succeeded", bad)
		}
	}
}

// TestReadVersion covers the three ways a binary is built: a tagged
// module, a build in the repository (clean or with changes), and no VCS
// stamp at all.
func TestReadVersion(t *testing.T) {
	rev := "0123456789abcdef0123456789abcdef01234567"
	for _, tc := range []struct {
		name     string
		bi       *debug.BuildInfo
		ok       bool
		version  string
		revision string
	}{
		{"tagged", &debug.BuildInfo{Main: debug.Module{Version: "v1.2.3"}}, true, "v1.2.3", ""},
		{"repository", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: []debug.BuildSetting{
			{Key: "vcs.revision", Value: rev}, {Key: "vcs.modified", Value: "false"}}}, true, "devel+0123456789ab", rev},
		{"dirty", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: []debug.BuildSetting{
			{Key: "vcs.revision", Value: rev}, {Key: "vcs.modified", Value: "true"}}}, true, "devel+0123456789ab-dirty", rev},
		{"no stamp", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}}, true, "devel", ""},
		{"no build info", nil, false, "devel", ""},
	} {
		v, r := readVersion(tc.bi, tc.ok)
		if v != tc.version || r != tc.revision {
			t.Errorf("%s: %q, %q; want %q, %q", tc.name, v, r, tc.version, tc.revision)
		}
	}
	if Version() == "" {
		t.Fatal("empty version")
	}
}
