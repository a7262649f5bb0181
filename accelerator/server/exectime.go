package server

import (
	"slices"
	"sync"
	"time"
)

// Execution time estimates, published per bucket in the segment for the
// embedder's SLO batching.
const (
	// execWindow is how many recent runs of a bucket the estimate covers:
	// enough for a stable high quantile, few enough to follow a change of
	// load (another process on the core) within a second or so.
	execWindow = 64
	// execQuantile is the quantile of recent runs published: the budget
	// is a p99, and a batch's time is one term of a request's latency.
	execQuantile = 0.9
	// calibrationRuns per bucket at start-up; the first run of a bucket
	// may be slow (page faults, thread wake-ups) and is not counted.
	calibrationRuns = 3
	// calibrationBudget bounds start-up calibration: buckets beyond the
	// first that would take longer are left to the online estimate (and
	// the embedder scales from smaller buckets until then).
	calibrationBudget = time.Second

	// execRefresh is how many runs of a bucket pass between recomputing its
	// quantile: sorting the window after every run would put a sort on
	// every batch of the serving loop, and the estimate need not move
	// faster than this.
	execRefresh = 8
)

// execTimes keeps, per bucket, a ring of recent execution times and their
// high quantile. One is kept per program and carried across generations,
// so during a rollout or a replacement the goroutines serving the old and
// the new generation share it: mu serialises them.
type execTimes struct {
	mu      sync.Mutex
	buckets []int
	runs    [][]time.Duration // ring per bucket index
	next    []int
	seen    []int           // runs observed per bucket index
	cached  []time.Duration // the last computed estimate per bucket index
	scratch []time.Duration
}

func newExecTimes(buckets []int) *execTimes {
	n := len(buckets)
	t := &execTimes{buckets: buckets, runs: make([][]time.Duration, n), next: make([]int, n),
		seen: make([]int, n), cached: make([]time.Duration, n), scratch: make([]time.Duration, 0, execWindow)}
	for i := range t.runs {
		t.runs[i] = make([]time.Duration, 0, execWindow)
	}
	return t
}

// observe records one run of bucket index i and returns its estimate,
// recomputed for each of the first execRefresh runs and then every
// execRefresh runs.
func (t *execTimes) observe(i int, d time.Duration) time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.runs[i]) < execWindow {
		t.runs[i] = append(t.runs[i], d)
	} else {
		t.runs[i][t.next[i]] = d
		t.next[i] = (t.next[i] + 1) % execWindow
	}
	t.seen[i]++
	if t.seen[i] <= execRefresh || t.seen[i]%execRefresh == 0 {
		t.cached[i] = t.quantile(i)
	}
	return t.cached[i]
}

// estimate is bucket index i's current estimate (0: no run yet).
func (t *execTimes) estimate(i int) time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.cached[i]
}

// quantile is the execQuantile of bucket index i's recent runs. Caller
// holds mu.
func (t *execTimes) quantile(i int) time.Duration {
	r := t.runs[i]
	if len(r) == 0 {
		return 0
	}
	t.scratch = append(t.scratch[:0], r...)
	slices.Sort(t.scratch)
	k := int(execQuantile * float64(len(t.scratch)-1))
	return t.scratch[k]
}

// calibrate runs every bucket calibrationRuns times on private inputs
// (never a staging buffer the embedder may be filling) and records the
// times, smallest bucket first, until calibrationBudget is spent.
func (t *execTimes) calibrate(ex program) error {
	in, err := ex.NewHostInputs(ex.MaxBucket())
	if err != nil {
		return err
	}
	defer in.Close()
	scores := make([]float32, ex.MaxBucket())
	begin := time.Now()
	for i, b := range t.buckets {
		for r := 0; r <= calibrationRuns; r++ {
			// The smallest bucket is always measured; the rest while the
			// budget lasts.
			if (i > 0 || r > 1) && time.Since(begin) > calibrationBudget {
				return nil
			}
			start := time.Now()
			if err := ex.Run(in, b, scores); err != nil {
				return err
			}
			if r > 0 {
				t.observe(i, time.Since(start))
			}
		}
	}
	return nil
}
