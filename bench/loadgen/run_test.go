package loadgen

import (
	"context"
	"fmt"
	"math"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/recmesh/recmesh/bench/internal/oiptest"
	"github.com/recmesh/recmesh/model"
	"github.com/recmesh/recmesh/proto/oip"
)

// The tests run against a fake server on loopback with controlled service
// times. The machine may be shared and small, so assertions on absolute
// speed leave room for scheduling noise; those on accounting are exact.

var testCfg = model.DLRMv2(model.DevVocabCap)

// clientKinds are the clients every run test drives the server with.
var clientKinds = []string{ClientLean, ClientGRPC}

// forEachClient runs f as a subtest per client kind.
func forEachClient(t *testing.T, f func(t *testing.T, kind string)) {
	for _, kind := range clientKinds {
		t.Run(kind, func(t *testing.T) { f(t, kind) })
	}
}

func setup(t *testing.T, kind string, opts oiptest.Options, conns, batch int) (*oiptest.Server, Client, *Workload) {
	t.Helper()
	srv := oiptest.Start(t, testCfg, opts)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pool, err := Dial(ctx, kind, srv.Addr, oip.DefaultModelName, conns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pool.Close() })
	if pool.Kind() != kind || pool.Len() != conns {
		t.Fatalf("Dial(%s, %d) gave a %s client of %d connections", kind, conns, pool.Kind(), pool.Len())
	}
	w, err := NewWorkload(testCfg, WorkloadOptions{BatchSize: batch, PoolRequests: 64, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	return srv, pool, w
}

func run(t *testing.T, pool Client, w *Workload, cfg Config) *Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	r, err := Run(ctx, pool, w, cfg, Hooks{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("sent %d ok %d errors %v; %.0f req/s %.0f ex/s (offered %.0f, lag %.1f ms); latency ms p50 %.3f p90 %.3f p99 %.3f max %.3f",
		r.Sent, r.OK, r.ErrorsByCode, r.RequestsPerS, r.ExamplesPerS, r.OfferedRPS, r.MaxSchedulerLagMs, r.Latency.P50, r.Latency.P90, r.Latency.P99, r.Latency.Max)
	if r.OK+r.Errors-r.Dropped != r.Sent {
		t.Errorf("ok %d + errors %d - dropped %d != sent %d", r.OK, r.Errors, r.Dropped, r.Sent)
	}
	if r.Latency.Count != uint64(r.OK) {
		t.Errorf("%d latencies for %d successes", r.Latency.Count, r.OK)
	}
	return r
}

const service = 2 * time.Millisecond

// timingAttempts bounds how often a test re-measures when an assertion on
// time (not on accounting) fails: the machine may be small and shared, and
// a CPU-starved client sees a 2 ms server as slower than it is.
const timingAttempts = 3

// retryTiming runs measure until check returns no complaint or the
// attempts are used up, and fails the test with the last complaint.
func retryTiming(t *testing.T, measure func() *Result, check func(r *Result) string) *Result {
	t.Helper()
	for i := 1; ; i++ {
		r := measure()
		msg := check(r)
		if msg == "" {
			return r
		}
		if i == timingAttempts {
			t.Errorf("after %d attempts: %s", i, msg)
			return r
		}
		t.Logf("attempt %d: %s; measuring again", i, msg)
	}
}

// TestClosedLoop: a server sleeping exactly 2 ms gives p50 ≈ 2 ms, and the
// achieved rate obeys Little's law (C clients / mean latency), which ties
// the rate to the latencies without trusting either.
func TestClosedLoop(t *testing.T) {
	forEachClient(t, func(t *testing.T, kind string) {
		const c, batch = 4, 16
		_, pool, w := setup(t, kind, oiptest.Options{Service: func(int64) time.Duration { return service }}, 2, batch)
		measure := func() *Result {
			r := run(t, pool, w, Config{Mode: Closed, Concurrency: c, Warmup: 200 * time.Millisecond, Duration: 1500 * time.Millisecond})
			if r.Errors != 0 {
				t.Fatalf("errors %v: %s", r.ErrorsByCode, r.FirstError)
			}
			if r.Latency.Min < 2 {
				t.Fatalf("min latency %.3f ms below the 2 ms service time", r.Latency.Min)
			}
			if r.ExamplesPerS != r.RequestsPerS*batch {
				t.Fatalf("examples/s %.1f != %d × requests/s %.1f", r.ExamplesPerS, batch, r.RequestsPerS)
			}
			if r.WindowS != 1.5 {
				t.Fatalf("window %v s", r.WindowS)
			}
			// In the window, completions and starts differ by at most C at each edge.
			if d := r.CompletedInWindow - r.Sent; d < -c || d > c {
				t.Fatalf("completed in window %d vs sent %d", r.CompletedInWindow, r.Sent)
			}
			return r
		}
		retryTiming(t, measure, func(r *Result) string {
			if r.Latency.P50 > 5 { // 2 ms plus what a busy 2-core machine adds
				return fmt.Sprintf("p50 %.3f ms, want ≈ 2 ms", r.Latency.P50)
			}
			little := float64(c) / (r.Latency.Mean / 1000)
			if rel := math.Abs(r.RequestsPerS-little) / little; rel > 0.1 {
				return fmt.Sprintf("%.0f req/s but C/mean latency = %.0f (%.0f%% off)", r.RequestsPerS, little, 100*rel)
			}
			return ""
		})
	})
}

// TestWarmupExcluded: the server is slow (200 ms) for its first 300 ms and
// the warm-up is 600 ms, so no measured request may see the slow phase,
// while the server saw more requests than were measured.
func TestWarmupExcluded(t *testing.T) {
	forEachClient(t, func(t *testing.T, kind string) {
		var t0 atomic.Pointer[time.Time]
		opts := oiptest.Options{Service: func(int64) time.Duration {
			now := time.Now()
			t0.CompareAndSwap(nil, &now)
			if time.Since(*t0.Load()) < 300*time.Millisecond {
				return 200 * time.Millisecond
			}
			return service
		}}
		srv, pool, w := setup(t, kind, opts, 2, 1)
		r := run(t, pool, w, Config{Mode: Closed, Concurrency: 2, Warmup: 600 * time.Millisecond, Duration: time.Second})
		if r.Latency.Max >= 150 {
			t.Errorf("max latency %.1f ms: a warm-up request was measured", r.Latency.Max)
		}
		if srv.Received() <= r.Sent+10 {
			t.Errorf("server received %d, measured %d: warm-up traffic missing", srv.Received(), r.Sent)
		}
	})
}

// TestErrorsByCode: every 10th request fails with RESOURCE_EXHAUSTED.
func TestErrorsByCode(t *testing.T) {
	forEachClient(t, func(t *testing.T, kind string) {
		opts := oiptest.Options{
			Service: func(int64) time.Duration { return service },
			Fail: func(k int64) codes.Code {
				if k%10 == 9 {
					return codes.ResourceExhausted
				}
				return codes.OK
			},
		}
		_, pool, w := setup(t, kind, opts, 2, 4)
		r := run(t, pool, w, Config{Mode: Closed, Concurrency: 4, Warmup: 100 * time.Millisecond, Duration: time.Second})
		n := r.ErrorsByCode["RESOURCE_EXHAUSTED"]
		if len(r.ErrorsByCode) != 1 || n != r.Errors {
			t.Fatalf("errors %v, want RESOURCE_EXHAUSTED only", r.ErrorsByCode)
		}
		// The server fails exactly 1 in 10 of all it receives; the window's
		// share differs by at most one per window edge and client.
		if want := float64(r.Sent) / 10; math.Abs(float64(n)-want) > 8 {
			t.Errorf("%d RESOURCE_EXHAUSTED of %d sent, want ≈ %.0f", n, r.Sent, want)
		}
	})
}

func TestTimeoutAndBadResponse(t *testing.T) {
	forEachClient(t, func(t *testing.T, kind string) {
		_, pool, w := setup(t, kind, oiptest.Options{Service: func(int64) time.Duration { return time.Second }}, 1, 1)
		r := run(t, pool, w, Config{Mode: Closed, Concurrency: 2, Duration: 300 * time.Millisecond, Timeout: 50 * time.Millisecond})
		if r.OK != 0 || r.ErrorsByCode["DEADLINE_EXCEEDED"] != r.Sent || r.Sent == 0 {
			t.Errorf("sent %d ok %d errors %v, want all DEADLINE_EXCEEDED", r.Sent, r.OK, r.ErrorsByCode)
		}
		if r.RequestsPerS != 0 {
			t.Errorf("%.1f req/s with no success", r.RequestsPerS)
		}

		_, pool, w = setup(t, kind, oiptest.Options{ShortBy: 1}, 1, 8)
		r = run(t, pool, w, Config{Mode: Closed, Concurrency: 1, Duration: 200 * time.Millisecond})
		if r.OK != 0 || r.ErrorsByCode[BadResponse] != r.Sent || r.Sent == 0 {
			t.Errorf("sent %d ok %d errors %v, want all %s", r.Sent, r.OK, r.ErrorsByCode, BadResponse)
		}
	})
}

// TestOpenLoopRate: Poisson arrivals at 400/s against a 2 ms server
// achieve ≈ 400/s, at ≈ 2 ms.
func TestOpenLoopRate(t *testing.T) {
	forEachClient(t, func(t *testing.T, kind string) {
		const rate = 400.0
		srv, pool, w := setup(t, kind, oiptest.Options{Service: func(int64) time.Duration { return service }, Typed: true}, 4, 2)
		measure := func() *Result {
			r := run(t, pool, w, Config{Mode: Open, Rate: rate, Warmup: 200 * time.Millisecond, Duration: 2 * time.Second, Seed: 7})
			if r.Errors != 0 {
				t.Fatalf("errors %v: %s", r.ErrorsByCode, r.FirstError)
			}
			if r.Scheduled != r.Sent {
				t.Fatalf("scheduled %d, sent %d, nothing dropped", r.Scheduled, r.Sent)
			}
			// 800 expected arrivals: Poisson sd ≈ 28, so 12 % is over 3 sd.
			// The schedule is fixed by the seed, so this does not depend on
			// timing; the achieved rate does, a little.
			if math.Abs(r.OfferedRPS-rate)/rate > 0.12 {
				t.Fatalf("offered %.0f req/s, target %.0f", r.OfferedRPS, rate)
			}
			return r
		}
		retryTiming(t, measure, func(r *Result) string {
			if math.Abs(r.RequestsPerS-rate)/rate > 0.12 {
				return fmt.Sprintf("achieved %.0f req/s, target %.0f", r.RequestsPerS, rate)
			}
			if r.Latency.P50 < 2 || r.Latency.P50 > 5 {
				return fmt.Sprintf("p50 %.3f ms, want ≈ 2 ms", r.Latency.P50)
			}
			return ""
		})
		if srv.PeakInFlight() < 2 {
			t.Errorf("never more than %d requests in flight: arrivals wait for completions", srv.PeakInFlight())
		}
	})
}

// TestOpenLoopOverload: a serial 5 ms server (200/s) offered 300/s. Arrivals
// keep coming on schedule, so the queue and the latency measured from the
// schedule grow, and the achieved rate stays at the server's capacity.
func TestOpenLoopOverload(t *testing.T) {
	forEachClient(t, func(t *testing.T, kind string) {
		_, pool, w := setup(t, kind, oiptest.Options{Service: func(int64) time.Duration { return 5 * time.Millisecond }, Serial: true}, 4, 1)
		r := run(t, pool, w, Config{Mode: Open, Rate: 300, Duration: 1500 * time.Millisecond, Seed: 3})
		if r.Errors != 0 {
			t.Fatalf("errors %v: %s", r.ErrorsByCode, r.FirstError)
		}
		if r.RequestsPerS > 0.8*r.OfferedRPS {
			t.Errorf("achieved %.0f of offered %.0f req/s from a server capped at 200/s", r.RequestsPerS, r.OfferedRPS)
		}
		if r.Latency.P99 < 100 {
			t.Errorf("p99 %.1f ms: the queue of an overloaded server is missing", r.Latency.P99)
		}
	})
}

// TestOpenLoopDrops: at most 2 requests in flight; the rest are dropped
// and counted as errors.
func TestOpenLoopDrops(t *testing.T) {
	forEachClient(t, func(t *testing.T, kind string) {
		srv, pool, w := setup(t, kind, oiptest.Options{Service: func(int64) time.Duration { return 50 * time.Millisecond }}, 2, 1)
		r := run(t, pool, w, Config{Mode: Open, Rate: 200, MaxOutstanding: 2, Duration: time.Second, Seed: 5})
		if r.Dropped == 0 || r.ErrorsByCode[Dropped] != r.Dropped || r.Errors != r.Dropped {
			t.Errorf("dropped %d, errors %v", r.Dropped, r.ErrorsByCode)
		}
		if r.Scheduled != r.Sent+r.Dropped {
			t.Errorf("scheduled %d != sent %d + dropped %d", r.Scheduled, r.Sent, r.Dropped)
		}
		if p := srv.PeakInFlight(); p > 2 {
			t.Errorf("%d requests in flight, bound 2", p)
		}
	})
}

func TestHooksAndWaitReady(t *testing.T) {
	var readyAt atomic.Pointer[time.Time]
	later := time.Now().Add(300 * time.Millisecond)
	readyAt.Store(&later)
	srv := oiptest.Start(t, testCfg, oiptest.Options{Ready: func() bool { return time.Now().After(*readyAt.Load()) }})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pool, err := oip.Dial(ctx, srv.Addr, 3)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if err := pool.WaitReady(ctx, oip.DefaultModelName); err != nil {
		t.Fatal(err)
	}
	if time.Now().Before(later) {
		t.Error("WaitReady returned before the server was ready")
	}
	short, cancel2 := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel2()
	if err := pool.WaitReady(short, "other"); err == nil {
		t.Error("WaitReady for an unknown model succeeded")
	}

	w, err := NewWorkload(testCfg, WorkloadOptions{BatchSize: 1, PoolRequests: 4})
	if err != nil {
		t.Fatal(err)
	}
	var start, end time.Time
	begin := time.Now()
	_, err = Run(ctx, NewGRPCClient(pool), w, Config{Mode: Closed, Concurrency: 1, Warmup: 200 * time.Millisecond, Duration: 300 * time.Millisecond},
		Hooks{WindowStart: func() { start = time.Now() }, WindowEnd: func() { end = time.Now() }})
	if err != nil {
		t.Fatal(err)
	}
	// The hooks fire on the window's edges, give or take scheduling.
	if s := start.Sub(begin); s < 200*time.Millisecond || s > 300*time.Millisecond {
		t.Errorf("window started %v after the run, want 200 ms", s)
	}
	if e := end.Sub(begin); e < 500*time.Millisecond || e > 600*time.Millisecond {
		t.Errorf("window ended %v after the run, want 500 ms", e)
	}
}

func TestWorkload(t *testing.T) {
	w, err := NewWorkload(testCfg, WorkloadOptions{BatchSize: 128, PoolRequests: 1024, PoolBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	// 128 examples × (13·4 + 214·4) bytes ≈ 116 KB: 1 MiB holds 9.
	if len(w.Requests) != 9 || w.Requests[0].Examples != 128 {
		t.Errorf("%d requests of %d examples", len(w.Requests), w.Requests[0].Examples)
	}
	if w.RequestBytes < 128*(13+214)*4 {
		t.Errorf("request is %d bytes", w.RequestBytes)
	}
	if _, err := NewWorkload(testCfg, WorkloadOptions{BatchSize: 0}); err == nil {
		t.Error("batch size 0 accepted")
	}
	if _, err := NewWorkload(testCfg, WorkloadOptions{BatchSize: 1, SparseType: "FP16"}); err == nil {
		t.Error("sparse type FP16 accepted")
	}
}

func TestConfigCheck(t *testing.T) {
	for _, c := range []Config{
		{Mode: Closed, Duration: time.Second},
		{Mode: Open, Duration: time.Second},
		{Mode: Open, Rate: math.Inf(1), Duration: time.Second},
		{Mode: Closed, Concurrency: 1},
		{Mode: "burst", Concurrency: 1, Duration: time.Second},
	} {
		if err := c.check(); err == nil {
			t.Errorf("config %+v accepted", c)
		}
	}
}
