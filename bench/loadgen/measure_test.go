package loadgen

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/recmesh/recmesh/bench/internal/oiptest"
)

// TestMeasureWatches: Measure puts the monitor's report (when given PIDs)
// and the client's own CPU use (when given ClientCPUs) beside the result,
// each over the measured window only; NewPoint records the load.
func TestMeasureWatches(t *testing.T) {
	_, pool, w := setup(t, ClientLean, oiptest.Options{}, 2, 2)
	rc := Config{Mode: Closed, Concurrency: 2, Warmup: 50 * time.Millisecond, Duration: 300 * time.Millisecond, Timeout: 5 * time.Second}
	ctx := context.Background()

	bare, err := Measure(ctx, pool, w, rc, Watch{})
	if err != nil {
		t.Fatal(err)
	}
	if bare.OK == 0 || bare.Monitor != nil || bare.Client != nil || bare.Stalls != nil {
		t.Errorf("unwatched run: ok %d, monitor %v, client %v, stalls %v", bare.OK, bare.Monitor, bare.Client, bare.Stalls)
	}

	watched, err := Measure(ctx, pool, w, rc, Watch{PIDs: []int{os.Getpid()}, Interval: 50 * time.Millisecond, ClientCPUs: 3})
	if err != nil {
		t.Fatal(err)
	}
	if m := watched.Monitor; m == nil || m.Examples != 2*watched.CompletedInWindow || m.WallSeconds < 0.2 {
		t.Errorf("monitor %+v, want the window's %d examples", m, 2*watched.CompletedInWindow)
	}
	if c := watched.Client; c == nil || c.CPUs != 3 || c.WallSeconds < 0.25 || c.WallSeconds > 5 || c.CPUSeconds <= 0 {
		t.Errorf("client usage %+v, want the window's, against 3 CPUs", c)
	}

	p := NewPoint(pool, w, rc, 2)
	if p.Schema != PointSchema || p.Mode != Closed || p.Concurrency != 2 || p.Connections != 2 || p.BatchSize != 2 ||
		p.PoolRequests != len(w.Requests) || p.Client != ClientLean || p.WarmupS != 0.05 || p.Repeats != 2 || p.RateRPS != 0 {
		t.Errorf("closed-loop point %+v", p)
	}
	open := Config{Mode: Open, Rate: 50, MaxOutstanding: 7}
	if p := NewPoint(pool, w, open, 1); p.Concurrency != 0 || p.RateRPS != 50 || p.MaxOutstanding != 7 {
		t.Errorf("open-loop point: C %d, rate %v, max outstanding %d", p.Concurrency, p.RateRPS, p.MaxOutstanding)
	}
}
