package frontend

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/recmesh/recmesh/proto/inference"
)

// testServer is a Server running in the test on loopback ports.
type testServer struct {
	srv  *Server
	conn *grpc.ClientConn
	api  inference.GRPCInferenceServiceClient
	stop context.CancelFunc
	done chan error // Run's result
}

// forEachTransport runs test once per transport of the gRPC port.
func forEachTransport(t *testing.T, test func(t *testing.T, transport string)) {
	for _, tr := range []string{TransportGRPC, TransportLean} {
		t.Run(tr, func(t *testing.T) { test(t, tr) })
	}
}

func startServer(t *testing.T, f *fakeBackend, edit func(*Options)) *testServer {
	t.Helper()
	return startServerOn(t, TransportGRPC, f, edit)
}

func startServerOn(t testing.TB, transport string, f *fakeBackend, edit func(*Options)) *testServer {
	t.Helper()
	opts := Options{
		Transport:         transport,
		Listen:            "127.0.0.1:0",
		MetricsAddr:       "127.0.0.1:0",
		Model:             testConfig(),
		Backend:           f,
		MaxBatch:          f.capacity,
		ReadyPollInterval: 5 * time.Millisecond,
		Logger:            discardLogger(),
		Version:           "test",
	}
	if edit != nil {
		edit(&opts)
	}
	srv, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Listen(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ts := &testServer{srv: srv, stop: cancel, done: make(chan error, 1)}
	go func() { ts.done <- srv.Run(ctx) }()
	ts.conn = dial(t, srv.Addr().String())
	ts.api = inference.NewGRPCInferenceServiceClient(ts.conn)
	t.Cleanup(func() {
		cancel()
		ts.wait(t, 30*time.Second)
	})
	return ts
}

// wait waits for Run to return and reports its error.
func (ts *testServer) wait(t testing.TB, timeout time.Duration) error {
	t.Helper()
	select {
	case err := <-ts.done:
		ts.done <- err // later waits see it too
		return err
	case <-time.After(timeout):
		t.Fatalf("Run did not return within %v", timeout)
		return nil
	}
}

func dial(t testing.TB, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func healthStatus(conn *grpc.ClientConn, service string) healthpb.HealthCheckResponse_ServingStatus {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: service})
	if err != nil {
		return healthpb.HealthCheckResponse_UNKNOWN
	}
	return resp.Status
}

func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 5 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(body)
}

func TestServerProbesAndMetadata(t *testing.T) { forEachTransport(t, testServerProbesAndMetadata) }

func testServerProbesAndMetadata(t *testing.T, tr string) {
	f := newFakeBackend()
	ts := startServerOn(t, tr, f, nil)
	ctx := context.Background()
	metricsURL := "http://" + ts.srv.MetricsAddr().String()

	live, err := ts.api.ServerLive(ctx, &inference.ServerLiveRequest{})
	if err != nil || !live.Live {
		t.Fatalf("ServerLive = %v, %v", live, err)
	}
	waitFor(t, 10*time.Second, "health SERVING", func() bool {
		return healthStatus(ts.conn, "") == healthpb.HealthCheckResponse_SERVING &&
			healthStatus(ts.conn, "inference.GRPCInferenceService") == healthpb.HealthCheckResponse_SERVING
	})
	ready, err := ts.api.ServerReady(ctx, &inference.ServerReadyRequest{})
	if err != nil || !ready.Ready {
		t.Fatalf("ServerReady = %v, %v", ready, err)
	}
	for _, v := range []string{"", "1"} {
		mr, err := ts.api.ModelReady(ctx, &inference.ModelReadyRequest{Name: "dlrm", Version: v})
		if err != nil || !mr.Ready {
			t.Errorf("ModelReady(dlrm, %q) = %v, %v", v, mr, err)
		}
	}
	if _, err := ts.api.ModelReady(ctx, &inference.ModelReadyRequest{Name: "other"}); status.Code(err) != codes.NotFound {
		t.Errorf("ModelReady(other): %v, want NotFound", err)
	}
	if code, body := httpGet(t, metricsURL+"/readyz"); code != 200 {
		t.Errorf("/readyz = %d %q", code, body)
	}
	if code, body := httpGet(t, metricsURL+"/healthz"); code != 200 || body != "ok\n" {
		t.Errorf("/healthz = %d %q", code, body)
	}
	if code, _ := httpGet(t, metricsURL+"/debug/pprof/heap"); code != http.StatusNotFound {
		t.Errorf("/debug/pprof/heap without Options.Profiling = %d, want 404", code)
	}

	sm, err := ts.api.ServerMetadata(ctx, &inference.ServerMetadataRequest{})
	if err != nil || sm.Name != "recmesh" || sm.Version != "test" {
		t.Errorf("ServerMetadata = %v, %v", sm, err)
	}
	type tm = inference.ModelMetadataResponse_TensorMetadata
	wantMeta := &inference.ModelMetadataResponse{
		Name: "dlrm", Versions: []string{"1"}, Platform: "recmesh_dlrm",
		Inputs: []*tm{
			{Name: "dense", Datatype: "FP32", Shape: []int64{-1, 13}},
			{Name: "sparse", Datatype: "INT32", Shape: []int64{-1, 214}},
		},
		Outputs: []*tm{{Name: "score", Datatype: "FP32", Shape: []int64{-1, 1}}},
	}
	for _, v := range []string{"", "1"} {
		md, err := ts.api.ModelMetadata(ctx, &inference.ModelMetadataRequest{Name: "dlrm", Version: v})
		if err != nil || !proto.Equal(md, wantMeta) {
			t.Errorf("ModelMetadata(%q) = %v, %v\nwant %v", v, md, err, wantMeta)
		}
	}
	_, err = ts.api.ModelMetadata(ctx, &inference.ModelMetadataRequest{Name: "dlrm", Version: "3"})
	if st := status.Convert(err); st.Code() != codes.NotFound || st.Message() != "model 'dlrm' has no version '3'; available: '1'" {
		t.Errorf("ModelMetadata(dlrm, 3) = %v", err)
	}

	// Readiness follows the backend, everywhere it is reported.
	f.notReady.Store(true)
	waitFor(t, 10*time.Second, "health NOT_SERVING", func() bool {
		return healthStatus(ts.conn, "") == healthpb.HealthCheckResponse_NOT_SERVING
	})
	if r, err := ts.api.ServerReady(ctx, &inference.ServerReadyRequest{}); err != nil || r.Ready {
		t.Errorf("ServerReady with the backend down = %v, %v", r, err)
	}
	if r, err := ts.api.ModelReady(ctx, &inference.ModelReadyRequest{Name: "dlrm"}); err != nil || r.Ready {
		t.Errorf("ModelReady with the backend down = %v, %v", r, err)
	}
	if code, _ := httpGet(t, metricsURL+"/readyz"); code != http.StatusServiceUnavailable {
		t.Errorf("/readyz with the backend down = %d", code)
	}
	if live, err := ts.api.ServerLive(ctx, &inference.ServerLiveRequest{}); err != nil || !live.Live {
		t.Errorf("ServerLive with the backend down = %v, %v", live, err)
	}
	f.notReady.Store(false)
	waitFor(t, 10*time.Second, "health SERVING again", func() bool {
		return healthStatus(ts.conn, "") == healthpb.HealthCheckResponse_SERVING
	})

	dense, sparse := inputs(2)
	if _, err := ts.api.ModelInfer(ctx, rawRequest(dense, sparse, 2, false)); err != nil {
		t.Fatal(err)
	}
	_, body := httpGet(t, metricsURL+"/metrics")
	for _, want := range []string{
		`recmesh_frontend_requests_total{code="OK"} 1`,
		`recmesh_frontend_examples_total 2`,
		`recmesh_frontend_inflight_requests 0`,
		`recmesh_frontend_request_duration_seconds_count 1`,
	} {
		if !strings.Contains(body, want+"\n") {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}

func TestServerReflection(t *testing.T) {
	ts := startServer(t, newFakeBackend(), nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := reflectionpb.NewServerReflectionClient(ts.conn).ServerReflectionInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&reflectionpb.ServerReflectionRequest{
		MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{},
	}); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range resp.GetListServicesResponse().GetService() {
		names = append(names, s.Name)
	}
	for _, want := range []string{"inference.GRPCInferenceService", "grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection"} {
		if !slices.Contains(names, want) {
			t.Errorf("reflection lists %v, lacking %s", names, want)
		}
	}
	stream.CloseSend()
}

// TestLeanTransportLimits: what the lean transport does not serve is
// refused at once with UNIMPLEMENTED, and the connection serves on.
func TestLeanTransportLimits(t *testing.T) {
	ts := startServerOn(t, TransportLean, newFakeBackend(), nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := reflectionpb.NewServerReflectionClient(ts.conn).ServerReflectionInfo(ctx)
	if err == nil {
		_, err = stream.Recv()
	}
	if status.Code(err) != codes.Unimplemented {
		t.Errorf("reflection over the lean transport: %v, want UNIMPLEMENTED", err)
	}
	w, err := healthpb.NewHealthClient(ts.conn).Watch(ctx, &healthpb.HealthCheckRequest{})
	if err == nil {
		_, err = w.Recv()
	}
	if st := status.Convert(err); st.Code() != codes.Unimplemented || !strings.Contains(st.Message(), "grpc.health.v1.Health/Watch") {
		t.Errorf("health Watch over the lean transport: %v, want UNIMPLEMENTED naming it", err)
	}
	if r, err := ts.api.ServerLive(ctx, &inference.ServerLiveRequest{}); err != nil || !r.Live {
		t.Errorf("ServerLive after the refusals = %v, %v", r, err)
	}
}

// TestServerLargestRequest sends MaxBatch examples with INT64 ids raw, a
// 7 MB message, past grpc-go's default 4 MB receive limit.
func TestServerLargestRequest(t *testing.T) { forEachTransport(t, testServerLargestRequest) }

func testServerLargestRequest(t *testing.T, tr string) {
	f := newFakeBackend()
	f.capacity = DefaultMaxBatch
	f.record = false
	ts := startServerOn(t, tr, f, nil)
	dense, sparse := inputs(DefaultMaxBatch)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req := rawRequest(dense, sparse, DefaultMaxBatch, true)
	if n := proto.Size(req); n <= 4<<20 {
		t.Fatalf("request is only %d bytes", n)
	}
	resp, err := ts.api.ModelInfer(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if scores, _ := responseScores(t, resp); len(scores) != DefaultMaxBatch {
		t.Fatalf("%d scores", len(scores))
	}
}

// TestDrain: readiness turns false first while calls are still served,
// then new connections are refused while the call in flight completes, then
// the backend is closed and Run returns nil.
func TestDrain(t *testing.T) { forEachTransport(t, testDrain) }

func testDrain(t *testing.T, tr string) {
	f := newFakeBackend()
	f.block = make(chan struct{})
	f.entered = make(chan struct{}, 4)
	ts := startServerOn(t, tr, f, func(o *Options) { o.DrainDelay = 300 * time.Millisecond })
	addr := ts.srv.Addr().String()
	waitFor(t, 10*time.Second, "health SERVING", func() bool {
		return healthStatus(ts.conn, "") == healthpb.HealthCheckResponse_SERVING
	})

	dense, sparse := inputs(2)
	inflight := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, err := ts.api.ModelInfer(ctx, rawRequest(dense, sparse, 2, false))
		inflight <- err
	}()
	<-f.entered

	ts.stop()
	waitFor(t, 5*time.Second, "health NOT_SERVING", func() bool {
		return healthStatus(ts.conn, "") == healthpb.HealthCheckResponse_NOT_SERVING
	})
	if r, err := ts.api.ServerReady(context.Background(), &inference.ServerReadyRequest{}); err != nil || r.Ready {
		t.Errorf("ServerReady while draining = %v, %v", r, err)
	}
	waitFor(t, 10*time.Second, "new connections refused", func() bool {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			return true
		}
		c.Close()
		return false
	})
	select {
	case err := <-inflight:
		t.Fatalf("call in flight ended before it was released: %v", err)
	default:
	}
	if c := f.closes.Load(); c != 0 {
		t.Fatalf("backend closed with a call in flight")
	}
	close(f.block)
	if err := <-inflight; err != nil {
		t.Errorf("call in flight failed: %v", err)
	}
	if err := ts.wait(t, 10*time.Second); err != nil {
		t.Errorf("Run = %v", err)
	}
	if c := f.closes.Load(); c != 1 {
		t.Errorf("backend closed %d times, want 1", c)
	}
}

// TestDrainTimeout: calls still running after DrainTimeout are cancelled.
func TestDrainTimeout(t *testing.T) { forEachTransport(t, testDrainTimeout) }

func testDrainTimeout(t *testing.T, tr string) {
	f := newFakeBackend()
	f.block = make(chan struct{}) // never closed
	f.entered = make(chan struct{}, 1)
	ts := startServerOn(t, tr, f, func(o *Options) { o.DrainTimeout = 100 * time.Millisecond })
	dense, sparse := inputs(1)
	inflight := make(chan error, 1)
	go func() {
		_, err := ts.api.ModelInfer(context.Background(), rawRequest(dense, sparse, 1, false))
		inflight <- err
	}()
	<-f.entered
	ts.stop()
	if err := ts.wait(t, 10*time.Second); err != nil {
		t.Errorf("Run = %v", err)
	}
	if code := status.Code(<-inflight); code != codes.Unavailable && code != codes.Canceled {
		t.Errorf("call cut by the drain timeout got %v, want Unavailable or Canceled", code)
	}
	if c := f.closes.Load(); c != 1 {
		t.Errorf("backend closed %d times, want 1", c)
	}
}

// TestDrainEndsStreams: an open health Watch does not hold the drain until
// DrainTimeout.
func TestDrainEndsStreams(t *testing.T) {
	ts := startServer(t, newFakeBackend(), func(o *Options) { o.DrainTimeout = time.Minute })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	watch, err := healthpb.NewHealthClient(ts.conn).Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := watch.Recv(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	ts.stop()
	if err := ts.wait(t, 20*time.Second); err != nil {
		t.Errorf("Run = %v", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("drain took %v with a Watch open", d)
	}
	for {
		if _, err := watch.Recv(); err != nil {
			break
		}
	}
}

func TestOptionErrors(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0") // no SO_REUSEPORT: nobody may share it
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	bad := testConfig()
	bad.Hotness = bad.Hotness[:3]
	for _, tc := range []struct {
		name   string
		edit   func(*Options)
		option string
		listen bool // the error comes from Listen, not New
	}{
		{"no backend", func(o *Options) { o.Backend = nil }, "Backend", false},
		{"bad model", func(o *Options) { o.Model = bad }, "Model", false},
		{"no model", func(o *Options) { o.Model.VocabSizes = nil }, "Model", false},
		{"max batch too big", func(o *Options) { o.MaxBatch = MaxMaxBatch + 1 }, "MaxBatch", false},
		{"max batch negative", func(o *Options) { o.MaxBatch = -1 }, "MaxBatch", false},
		{"drain timeout negative", func(o *Options) { o.DrainTimeout = -time.Second }, "DrainTimeout", false},
		{"drain delay negative", func(o *Options) { o.DrainDelay = -time.Second }, "DrainDelay", false},
		{"stream workers negative", func(o *Options) { o.StreamWorkers = -1 }, "StreamWorkers", false},
		{"stream workers too many", func(o *Options) { o.StreamWorkers = maxStreamWorkers + 1 }, "StreamWorkers", false},
		{"unknown transport", func(o *Options) { o.Transport = "http1" }, "Transport", false},
		{"listen busy", func(o *Options) { o.Listen = busy.Addr().String() }, "Listen", true},
		{"listen malformed", func(o *Options) { o.Listen = "127.0.0.1:notaport" }, "Listen", true},
		{"metrics busy", func(o *Options) { o.MetricsAddr = busy.Addr().String() }, "MetricsAddr", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts := Options{Listen: "127.0.0.1:0", MetricsAddr: "127.0.0.1:0", Model: testConfig(), Backend: newFakeBackend(), Logger: discardLogger()}
			tc.edit(&opts)
			srv, err := New(opts)
			if tc.listen {
				if err != nil {
					t.Fatal(err)
				}
				err = srv.Listen()
				if srv.Addr() != nil {
					srv.lis.Close()
				}
			}
			var oe *OptionError
			if !errors.As(err, &oe) || oe.Option != tc.option {
				t.Fatalf("got %v, want an OptionError for %s", err, tc.option)
			}
			t.Log(err)
		})
	}
}

// TestReusePort: two servers bind one port.
func TestReusePort(t *testing.T) {
	a := startServer(t, newFakeBackend(), nil)
	b := startServer(t, newFakeBackend(), func(o *Options) { o.Listen = a.srv.Addr().String() })
	if a.srv.Addr().String() != b.srv.Addr().String() {
		t.Fatalf("servers on %v and %v", a.srv.Addr(), b.srv.Addr())
	}
	ctx := context.Background()
	for i := range 4 {
		conn := dial(t, a.srv.Addr().String())
		if _, err := inference.NewGRPCInferenceServiceClient(conn).ServerLive(ctx, &inference.ServerLiveRequest{}); err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
	}
}

func TestRunTwice(t *testing.T) {
	f := newFakeBackend()
	srv, err := New(Options{Listen: "127.0.0.1:0", MetricsAddr: MetricsOff, Model: testConfig(), Backend: f, Logger: discardLogger()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := srv.Run(ctx); err != nil {
		t.Fatalf("Run with a done context = %v", err)
	}
	if err := srv.Run(context.Background()); err == nil || !strings.Contains(err.Error(), "twice") {
		t.Errorf("second Run = %v", err)
	}
	if c := f.closes.Load(); c != 1 {
		t.Errorf("backend closed %d times, want 1", c)
	}
}

// TestServerBounds: a call without a client deadline still ends at
// MaxRequestTime when the backend hangs, and calls beyond MaxInflight are
// refused with RESOURCE_EXHAUSTED while the others keep waiting.
func TestServerBounds(t *testing.T) { forEachTransport(t, testServerBounds) }

func testServerBounds(t *testing.T, tr string) {
	f := newFakeBackend()
	f.block = make(chan struct{})
	f.entered = make(chan struct{}, 4)
	ts := startServerOn(t, tr, f, func(o *Options) { o.MaxRequestTime = 300 * time.Millisecond; o.MaxInflight = 2 })
	waitFor(t, 10*time.Second, "health SERVING", func() bool {
		return healthStatus(ts.conn, "") == healthpb.HealthCheckResponse_SERVING
	})
	dense, sparse := inputs(1)
	req := rawRequest(dense, sparse, 1, false)

	start := time.Now()
	_, err := ts.api.ModelInfer(context.Background(), req) // no deadline of its own
	if took := time.Since(start); status.Code(err) != codes.DeadlineExceeded || took > 5*time.Second {
		t.Fatalf("hung call without a client deadline: %v after %v; want DEADLINE_EXCEEDED after about 300ms", err, took)
	}
	<-f.entered

	ts2 := startServerOn(t, tr, f, func(o *Options) { o.MaxRequestTime = time.Minute; o.MaxInflight = 2 })
	waitFor(t, 10*time.Second, "health SERVING", func() bool {
		return healthStatus(ts2.conn, "") == healthpb.HealthCheckResponse_SERVING
	})
	held := make(chan error, 2)
	for i := 0; i < 2; i++ {
		go func() {
			_, err := ts2.api.ModelInfer(context.Background(), req)
			held <- err
		}()
		<-f.entered
	}
	_, err = ts2.api.ModelInfer(context.Background(), req)
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "max-inflight") {
		t.Errorf("third call with two in flight: %v; want RESOURCE_EXHAUSTED naming --max-inflight", err)
	}
	close(f.block)
	for i := 0; i < 2; i++ {
		if err := <-held; err != nil {
			t.Errorf("held call: %v", err)
		}
	}
	// Capacity is back once they finish.
	if _, err := ts2.api.ModelInfer(context.Background(), req); err != nil {
		t.Errorf("call after the others finished: %v", err)
	}
}

// TestCallsBeyondStreamWorkers: the stream workers bound idle goroutines,
// not concurrency: with 2 workers, 8 calls are all inside the backend at
// once, and all succeed when it lets them go.
func TestCallsBeyondStreamWorkers(t *testing.T) { forEachTransport(t, testCallsBeyondStreamWorkers) }

func testCallsBeyondStreamWorkers(t *testing.T, tr string) {
	const calls = 8
	f := newFakeBackend()
	f.block = make(chan struct{})
	f.entered = make(chan struct{}, calls)
	ts := startServerOn(t, tr, f, func(o *Options) { o.StreamWorkers = 2 })
	dense, sparse := inputs(1)
	errs := make(chan error, calls)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for range calls {
		go func() {
			_, err := ts.api.ModelInfer(ctx, rawRequest(dense, sparse, 1, false))
			errs <- err
		}()
	}
	for i := range calls {
		select {
		case <-f.entered:
		case <-ctx.Done():
			t.Fatalf("%d of %d calls reached the backend at once", i, calls)
		}
	}
	close(f.block)
	for range calls {
		if err := <-errs; err != nil {
			t.Errorf("call failed: %v", err)
		}
	}
}

// TestProfiling: Options.Profiling serves Go's profiles on the metrics
// address.
func TestProfiling(t *testing.T) {
	ts := startServer(t, newFakeBackend(), func(o *Options) { o.Profiling = true })
	code, body := httpGet(t, "http://"+ts.srv.MetricsAddr().String()+"/debug/pprof/allocs?debug=1")
	if code != http.StatusOK || !strings.Contains(body, "heap profile") {
		t.Fatalf("/debug/pprof/allocs = %d %.80q, want the allocation profile", code, body)
	}
}

// TestCallsHandBackTheirMessages: on grpc-go, every ModelInfer's received
// message goes back to the pool when its call ends, however it ends: a
// scored call, a large one that arrives in many frames, a call whose
// deadline ends while it waits on the backend, one the client cancels, a
// refused one (unknown model) and one decoded the slow way (typed
// contents, which proto.Unmarshal copies).
func TestCallsHandBackTheirMessages(t *testing.T) {
	f := newFakeBackend()
	f.capacity = 64 // 58 KB requests: four DATA frames
	f.entered = make(chan struct{}, 64)
	ts := startServer(t, f, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	check := func(n int, req *inference.ModelInferRequest) {
		t.Helper()
		resp, err := ts.api.ModelInfer(ctx, req)
		if err != nil {
			t.Fatalf("B=%d: %v", n, err)
		}
		dense, sparse := inputs(n)
		if got, _ := responseScores(t, resp); !slices.Equal(got, expectedScores(dense, sparse, n, f.width)) {
			t.Fatalf("B=%d: wrong scores", n)
		}
	}
	for _, n := range []int{1, 8, 64} {
		dense, sparse := inputs(n)
		check(n, rawRequest(dense, sparse, n, false))
		check(n, typedRequest(dense, sparse, n, false))
	}

	dense, sparse := inputs(4)
	bad := rawRequest(dense, sparse, 4, false)
	bad.ModelName = "other"
	if _, err := ts.api.ModelInfer(ctx, bad); status.Code(err) != codes.NotFound {
		t.Fatalf("unknown model: %v, want NotFound", err)
	}

	// Calls that end while they wait on the backend.
	f.block = make(chan struct{})
	short, cancelShort := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancelShort()
	if _, err := ts.api.ModelInfer(short, rawRequest(dense, sparse, 4, false)); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("call past its deadline: %v, want DeadlineExceeded", err)
	}
	cctx, cancelCall := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := ts.api.ModelInfer(cctx, rawRequest(dense, sparse, 4, false))
		done <- err
	}()
	for len(f.entered) > 0 { // the calls before this one
		<-f.entered
	}
	<-f.entered
	cancelCall()
	if err := <-done; status.Code(err) != codes.Canceled {
		t.Fatalf("cancelled call: %v, want Canceled", err)
	}
	close(f.block)
	waitFor(t, 10*time.Second, "every message handed back", func() bool { return ts.srv.held.len() == 0 })
}

// TestResetAfterTheMessageHandsItBack: grpc-go decodes a unary request as
// soon as its message is in, then reads on to see the stream end. A client
// that sends the whole message without ending the stream and then resets
// it, or lets its deadline pass, ends the call in that read, where no
// interceptor runs; the message still goes back to the pool.
func TestResetAfterTheMessageHandsItBack(t *testing.T) {
	ts := startServer(t, newFakeBackend(), nil)
	dense, sparse := inputs(4)
	msg, err := proto.Marshal(rawRequest(dense, sparse, 4, false))
	if err != nil {
		t.Fatal(err)
	}
	body := make([]byte, 5+len(msg))
	binary.BigEndian.PutUint32(body[1:], uint32(len(msg)))
	copy(body[5:], msg)
	c := dialH2(t, ts.srv.Addr().String())
	headers := callHeaders(inference.GRPCInferenceService_ModelInfer_FullMethodName)
	const resets = 20
	for i := range resets {
		id := uint32(2*i + 1)
		if err := c.sendOpen(id, headers, body); err != nil {
			t.Fatal(err)
		}
		// Wait until the server has decoded it, so the reset lands in
		// the read after the message.
		waitFor(t, 10*time.Second, "the message decoded", func() bool { return ts.srv.held.len() > 0 })
		if err := c.write(func(fr *http2.Framer) error { return fr.WriteRSTStream(id, http2.ErrCodeCancel) }); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 10*time.Second, "the reset call's message handed back", func() bool { return ts.srv.held.len() == 0 })
	}

	// A deadline that passes while the server waits for the stream's end.
	id := uint32(2*resets + 1)
	hb := bytes.NewBuffer(slices.Clone(headers))
	hpack.NewEncoder(hb).WriteField(hpack.HeaderField{Name: "grpc-timeout", Value: "200m"})
	if err := c.sendOpen(id, hb.Bytes(), body); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the call's deadline to end it", func() bool { return c.streamEnded(id) })
	waitFor(t, 10*time.Second, "the timed-out call's message handed back", func() bool { return ts.srv.held.len() == 0 })
	honestCall(t, ts)
	if n := ts.srv.held.len(); n != 0 {
		t.Fatalf("%d messages held after an honest call ended", n)
	}
}
