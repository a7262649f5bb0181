package main

import (
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

func TestHealthHTTP(t *testing.T) {
	status := http.StatusOK
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/healthz" {
			http.NotFound(w, r)
			return
		}
		w.WriteHeader(status)
		if status != http.StatusOK {
			w.Write([]byte("segment not ready\n"))
		}
	}))
	defer srv.Close()

	code, stdout, stderr := runT(t, nil, "health", "--http", srv.URL+"/healthz")
	if code != exitOK || !strings.Contains(stdout, "healthy") {
		t.Errorf("200: exit %d, stdout %q, stderr %q; want exit 0", code, stdout, stderr)
	}

	status = http.StatusServiceUnavailable
	code, _, stderr = runT(t, nil, "health", "--http", srv.URL+"/healthz")
	if code != exitFailure || !strings.Contains(stderr, "503") || !strings.Contains(stderr, "segment not ready") {
		t.Errorf("503: exit %d, stderr %q; want exit 1 naming the status and the body", code, stderr)
	}

	// The URL may come from the environment twin.
	status = http.StatusOK
	code, _, stderr = runT(t, map[string]string{"RECMESH_HTTP": srv.URL + "/healthz"}, "health")
	if code != exitOK {
		t.Errorf("RECMESH_HTTP: exit %d, stderr %q", code, stderr)
	}
}

func TestHealthGRPC(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := health.NewServer()
	gs := grpc.NewServer()
	healthpb.RegisterHealthServer(gs, hs)
	go gs.Serve(lis)
	defer gs.Stop()
	addr := lis.Addr().String()

	hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	code, stdout, stderr := runT(t, nil, "health", "--grpc", addr)
	if code != exitOK || !strings.Contains(stdout, "healthy") {
		t.Errorf("SERVING: exit %d, stdout %q, stderr %q; want exit 0", code, stdout, stderr)
	}

	hs.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	code, _, stderr = runT(t, nil, "health", "--grpc", addr)
	if code != exitFailure || !strings.Contains(stderr, "NOT_SERVING") {
		t.Errorf("NOT_SERVING: exit %d, stderr %q; want exit 1", code, stderr)
	}

	// A named service the server does not know is NotFound, so unhealthy.
	code, _, stderr = runT(t, nil, "health", "--grpc", addr, "--grpc-service", "inference.GRPCInferenceService")
	if code != exitFailure {
		t.Errorf("unknown service: exit %d, stderr %q; want exit 1", code, stderr)
	}
}

func TestHealthUnreachable(t *testing.T) {
	// A port that was free a moment ago: nothing listens there.
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	for _, args := range [][]string{
		{"--grpc", addr, "--timeout", "2s"},
		{"--http", "http://" + addr + "/healthz", "--timeout", "2s"},
	} {
		code, _, stderr := runT(t, nil, append([]string{"health"}, args...)...)
		if code != exitFailure || !strings.Contains(stderr, "unhealthy") {
			t.Errorf("health %v: exit %d, stderr %q; want exit 1", args, code, stderr)
		}
	}
}

func TestHealthUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		msg  string
	}{
		{nil, "give --http URL or --grpc"},
		{[]string{"--http", "localhost:9102/healthz"}, "want an http://"},
		{[]string{"--grpc", "127.0.0.1:1", "--timeout", "0s"}, "-timeout is 0s"},
	} {
		code, _, stderr := runT(t, nil, append([]string{"health"}, tc.args...)...)
		if code != exitUsage || !strings.Contains(stderr, tc.msg) {
			t.Errorf("health %v: exit %d, stderr %q; want exit 2 mentioning %q", tc.args, code, stderr, tc.msg)
		}
	}
}
