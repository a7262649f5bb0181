package pyarm

import (
	"context"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/recmesh/recmesh/bench/loadgen"
	"github.com/recmesh/recmesh/bench/monitor"
	"github.com/recmesh/recmesh/bench/parity"
	"github.com/recmesh/recmesh/model"
	pb "github.com/recmesh/recmesh/proto/inference"
	"github.com/recmesh/recmesh/proto/oip"
)

// paths finds the installed Python side, or skips: outside CI a developer
// may not have run `make bench-py-deps`; in CI ($CI set) it must be there.
func paths(t *testing.T) Paths {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	p := DefaultPaths(root)
	if err := p.Check(); err != nil {
		if os.Getenv("CI") == "" {
			t.Skipf("Python arm not installed: %v", err)
		}
		t.Fatalf("Python arm not installed in CI: %v", err)
	}
	return p
}

// fixture exports the small bundle and opens the reference over it.
func fixture(t *testing.T) (string, *model.Bundle, *model.Reference) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "bundle")
	if err := model.Export(context.Background(), dir, model.DLRMv2(model.DevVocabCap), 1, nil); err != nil {
		t.Fatal(err)
	}
	b, err := model.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	ref, err := model.NewReference(b)
	if err != nil {
		t.Fatal(err)
	}
	return dir, b, ref
}

// start runs a server for the rest of the test, its log in the test log.
func start(t *testing.T, o Options) *Server {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	t0 := time.Now()
	o.Log = testLog{t}
	s, err := Start(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s ready on %s after %v", o.Mode, s.Addr, time.Since(t0).Round(time.Millisecond))
	t.Cleanup(func() {
		if err := s.Stop(15 * time.Second); err != nil {
			t.Errorf("stop: %v", err)
		}
	})
	return s
}

func dial(t *testing.T, addr string, n int) *oip.Pool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, err := oip.Dial(ctx, addr, n)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pool.Close() })
	if err := pool.WaitReady(ctx, oip.DefaultModelName); err != nil {
		t.Fatal(err)
	}
	return pool
}

// TestPy starts the single-process arm on the small bundle, checks parity
// through the Go client, drives it with the load generator, and checks
// that bad requests get the protocol's error codes.
func TestPy(t *testing.T) {
	p := paths(t)
	dir, b, ref := fixture(t)
	s := start(t, Options{Paths: p, Mode: "py", Bundle: dir, Workers: 4, WarmMax: 16})
	pool := dial(t, s.Addr, 2)
	ctx := context.Background()

	for _, typ := range []string{oip.TypeINT32, oip.TypeINT64} {
		r, err := parity.Check(ctx, pool.Client(0), b.Config, ref, parity.Options{
			Examples: 48, BatchSizes: []int{1, 5, 16, 26}, SparseType: typ,
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Log(r)
		if !r.Pass {
			t.Errorf("parity failed: %v", r)
		}
	}

	w, err := loadgen.NewWorkload(b.Config, loadgen.WorkloadOptions{BatchSize: 4, PoolRequests: 16, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	mon, err := monitor.Start(monitor.Options{PIDs: []int{s.PID()}, Interval: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	res, err := loadgen.Run(ctx, pool, w, loadgen.Config{Mode: loadgen.Closed, Concurrency: 2, Warmup: 300 * time.Millisecond, Duration: 1500 * time.Millisecond}, loadgen.Hooks{})
	if err != nil {
		t.Fatal(err)
	}
	rep, err := mon.Stop()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("load: %.1f req/s, p50 %.2f ms p99 %.2f ms, errors %v; server %.2f cores, peak RSS %d MiB",
		res.RequestsPerS, res.Latency.P50, res.Latency.P99, res.ErrorsByCode, rep.CPUCores, rep.PeakRSSBytes>>20)
	if res.Errors != 0 || res.OK == 0 {
		t.Errorf("load run: ok %d errors %v (%s)", res.OK, res.ErrorsByCode, res.FirstError)
	}
	if rep.CPUSeconds <= 0 || rep.PeakRSSBytes < 50<<20 {
		t.Errorf("monitor saw cpu %.3f s, rss %d B for a JAX server under load", rep.CPUSeconds, rep.PeakRSSBytes)
	}

	// Typed contents instead of raw ones: the answer comes typed too.
	c := pool.Client(0)
	dense, sparse := model.RandomInputs(b.Config, 11, 3)
	want, err := ref.Predict(dense, sparse, 3)
	if err != nil {
		t.Fatal(err)
	}
	typed, err := oip.BuildRequest(oip.DefaultModelName, b.Config, dense, sparse, 3, oip.TypeINT32)
	if err != nil {
		t.Fatal(err)
	}
	typed.RawInputContents = nil
	typed.Inputs[0].Contents = &pb.InferTensorContents{Fp32Contents: dense}
	typed.Inputs[1].Contents = &pb.InferTensorContents{IntContents: sparse}
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	resp, err := c.ModelInfer(rctx, typed)
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	got, err := oip.Scores(resp, 3)
	if err != nil || len(resp.GetRawOutputContents()) != 0 {
		t.Fatalf("typed answer: %v (raw contents %d)", err, len(resp.GetRawOutputContents()))
	}
	for i := range got {
		if d := math.Abs(float64(got[i] - want[i])); d > parity.DefaultTolerance {
			t.Errorf("typed request, example %d: score %v, reference %v", i, got[i], want[i])
		}
	}

	// Bad requests: an id outside its table, an unknown model, a bad shape.
	dense, sparse = model.RandomInputs(b.Config, 9, 2)
	sparse[b.Config.SparseWidth()+b.Config.HotnessOffsets()[1]] = int32(b.Config.VocabSizes[1]) // example 1, table 1
	req, err := oip.BuildRequest(oip.DefaultModelName, b.Config, dense, sparse, 2, oip.TypeINT32)
	if err != nil {
		t.Fatal(err)
	}
	expectCode(t, c, req, codes.InvalidArgument, "table 1")
	req.ModelName = "nope"
	expectCode(t, c, req, codes.NotFound, "nope")
	req.ModelName = oip.DefaultModelName
	req.Inputs[0].Shape = []int64{2, 12}
	expectCode(t, c, req, codes.InvalidArgument, "shape")
}

func expectCode(t *testing.T, c pb.GRPCInferenceServiceClient, req *pb.ModelInferRequest, want codes.Code, msg string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := c.ModelInfer(ctx, req)
	if s := status.Convert(err); s.Code() != want || !strings.Contains(s.Message(), msg) {
		t.Errorf("got %v, want %v mentioning %q", err, want, msg)
	}
}

// TestPyMP starts two processes on one port and checks that parity holds
// and that connections are spread over both (each burns CPU under load).
func TestPyMP(t *testing.T) {
	if testing.Short() {
		t.Skip("starts two JAX processes")
	}
	p := paths(t)
	dir, b, ref := fixture(t)
	s := start(t, Options{Paths: p, Mode: "py-mp", Bundle: dir, Processes: 2, Workers: 2, WarmMax: 4})
	// 16 connections hashed over 2 listeners all land on one with
	// probability 2^-15.
	pool := dial(t, s.Addr, 16)
	ctx := context.Background()
	r, err := parity.Check(ctx, pool.Client(3), b.Config, ref, parity.Options{Examples: 12, BatchSizes: []int{1, 4, 7}})
	if err != nil {
		t.Fatal(err)
	}
	if !r.Pass {
		t.Errorf("parity failed: %v", r)
	}

	w, err := loadgen.NewWorkload(b.Config, loadgen.WorkloadOptions{BatchSize: 2, PoolRequests: 16, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	var rep *monitor.Report
	var mon *monitor.Monitor
	var monErr error
	hooks := loadgen.Hooks{
		WindowStart: func() {
			mon, monErr = monitor.Start(monitor.Options{PIDs: []int{s.PID()}, Descendants: true, Interval: 100 * time.Millisecond})
		},
		WindowEnd: func() {
			if mon != nil {
				rep, monErr = mon.Stop()
			}
		},
	}
	res, err := loadgen.Run(ctx, pool, w, loadgen.Config{Mode: loadgen.Closed, Concurrency: 16, Warmup: 300 * time.Millisecond, Duration: 1500 * time.Millisecond}, hooks)
	if err != nil {
		t.Fatal(err)
	}
	if monErr != nil {
		t.Fatal(monErr)
	}
	if res.Errors != 0 || res.OK == 0 {
		t.Errorf("load run: ok %d errors %v (%s)", res.OK, res.ErrorsByCode, res.FirstError)
	}
	var workers int
	for _, pr := range rep.Processes {
		t.Logf("process %d %s: cpu %.3f s, rss %d MiB", pr.PID, pr.Comm, pr.CPUSeconds, pr.PeakRSSBytes>>20)
		if pr.PID != s.PID() && pr.CPUSeconds >= 0.05 {
			workers++
		}
	}
	if workers != 2 {
		t.Errorf("%d of 2 server processes served load", workers)
	}
}

// testLog writes the server's log lines into the test log.
type testLog struct{ t *testing.T }

func (l testLog) Write(p []byte) (int, error) {
	l.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
