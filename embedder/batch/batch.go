// Package batch decides how the embedder groups requests into batches: how
// many examples a batch may hold, when an open batch is sealed and handed
// to the accelerator, and (in SLO mode) which requests are shed because
// they can no longer finish within the latency target. It is pure policy:
// no goroutines, no shared memory, a clock and cost estimates passed in, so
// tests drive it by hand.
package batch

import (
	"fmt"
	"strings"
	"time"
)

// Mode is a batching mode, as serving engineers know them.
type Mode int

const (
	// None runs one lookup and one model call per request.
	None Mode = iota
	// Model looks requests up one by one and merges model calls: a batch is
	// sealed as soon as the device is idle (a zero-wait merger), so under
	// load requests pile up while the device is busy and run together.
	Model
	// Full merges lookups and model calls: a batch stays open for the batch
	// window (or until full), then all of it is looked up and run at once.
	Full
	// SLO is Model's zero-wait merger bounded by the latency target: each
	// request is looked up as it arrives (so the next batch's lookups run
	// while the device executes the current one), the batch is sealed the
	// moment the device is idle, and while the device is busy it grows only
	// as long as its oldest request (counted from when its frontend
	// received it), waiting for the device and then for the expected
	// execution time of the larger bucket, still finishes within the
	// budget: the target less a margin that follows how many served calls
	// missed the target (Feedback). A request that would miss the budget
	// even in a batch of its own is shed before lookup (admission control).
	SLO
)

// ParseMode reads "none", "model", "full" or "slo".
func ParseMode(s string) (Mode, error) {
	switch strings.ToLower(s) {
	case "slo":
		return SLO, nil
	case "none":
		return None, nil
	case "model":
		return Model, nil
	case "full":
		return Full, nil
	}
	return 0, fmt.Errorf("batch: mode %q: want none, model, full or slo", s)
}

func (m Mode) String() string {
	switch m {
	case None:
		return "none"
	case Model:
		return "model"
	case Full:
		return "full"
	case SLO:
		return "slo"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// Defaults.
const (
	DefaultMaxBatch = 4096
	DefaultWindow   = time.Millisecond
	// DefaultLatencyTarget is the end-to-end p99 budget SLO mode keeps.
	DefaultLatencyTarget = 20 * time.Millisecond
)

// Options configure a Batcher. Zero fields take the defaults.
type Options struct {
	// Mode is the batching mode. Default None.
	Mode Mode
	// MaxBatch is the most examples a batch may hold. Default 4096. A
	// larger MaxBatch amortises per-call costs but makes the worst batch
	// slower.
	MaxBatch int
	// MaxEntries is the most requests a batch may hold (the size of a
	// staging buffer's entries table). Default MaxBatch.
	MaxEntries int
	// Window is how long a Full batch waits for more requests after its
	// first one. Default 1 ms. The worst added queueing delay of a request
	// in Full mode is Window plus the time the batch ahead takes to run.
	Window time.Duration
	// LatencyTarget is SLO mode's end-to-end budget. Default 20 ms.
	LatencyTarget time.Duration
	// Margin is the part of the target SLO mode keeps for what it does not
	// predict: the completion's way back to the client, the frontends'
	// work on the one core they may share with the device, scheduling
	// noise. It is where SLO mode starts: Feedback then moves it, from
	// the calls the frontends served, between a twentieth and a half of
	// the target. Default a tenth of the target.
	Margin time.Duration
}

func (o Options) withDefaults() Options {
	if o.MaxBatch <= 0 {
		o.MaxBatch = DefaultMaxBatch
	}
	if o.MaxEntries <= 0 {
		o.MaxEntries = o.MaxBatch
	}
	if o.Window <= 0 {
		o.Window = DefaultWindow
	}
	if o.LatencyTarget <= 0 {
		o.LatencyTarget = DefaultLatencyTarget
	}
	if o.Margin <= 0 || o.Margin >= o.LatencyTarget {
		o.Margin = o.LatencyTarget / 10
	}
	return o
}

// Batcher tracks the one open batch. It is not safe for concurrent use:
// the embedder's dispatcher goroutine owns it.
type Batcher struct {
	opts    Options
	rows    int
	entries int
	first   time.Time
	// costs predicts lookups and execution (SLO mode); deviceFree is when
	// the device is expected to finish every batch sealed so far.
	costs      *Costs
	deviceFree time.Time
	// margin is the part of the target kept back now (see Feedback).
	margin time.Duration
	fb     feedback
}

// feedback is the state of the margin's control loop.
type feedback struct {
	started       bool
	calls, misses uint64 // the last totals read
	wCalls, wMiss uint64 // the window being judged
}

// The margin's control loop, after Clipper's AIMD (which moves the batch
// size instead): judged every feedbackWindow served calls, the margin grows
// by half (plus a fiftieth of the target) when more than missTarget of
// them missed the target, and shrinks by a hundredth of the target when
// fewer than half as many did. Growing fast and shrinking slowly keeps the
// p99 under the target through a load change at the price of a slightly
// smaller batch in steady state.
const (
	feedbackWindow = 200
	missTarget     = 0.01 // the target is a p99
)

// New returns a Batcher with an empty open batch. costs may be nil outside
// SLO mode; in SLO mode a nil costs predicts nothing, so nothing is shed
// and batches grow as in Model mode.
func New(opts Options, costs *Costs) *Batcher {
	if costs == nil {
		costs = &Costs{}
	}
	b := &Batcher{opts: opts.withDefaults(), costs: costs}
	b.margin = b.opts.Margin
	return b
}

// Feedback gives SLO mode the frontends' running totals of calls served
// and of those answered later than the latency target, and returns the
// margin it keeps now. Totals that went backwards (a restarted count)
// start a new baseline.
func (b *Batcher) Feedback(calls, misses uint64) time.Duration {
	f := &b.fb
	if !f.started || calls < f.calls || misses < f.misses {
		f.started, f.calls, f.misses = true, calls, misses
		return b.margin
	}
	dc, dm := calls-f.calls, misses-f.misses
	f.calls, f.misses = calls, misses
	f.wCalls += dc
	f.wMiss += min(dm, dc)
	if f.wCalls < feedbackWindow {
		return b.margin
	}
	target := b.opts.LatencyTarget
	ratio := float64(f.wMiss) / float64(f.wCalls)
	f.wCalls, f.wMiss = 0, 0
	switch {
	case ratio > missTarget:
		b.margin = min(b.margin+b.margin/2+target/50, target/2)
	case ratio < missTarget/2:
		b.margin = max(b.margin-target/100, target/20)
	}
	return b.margin
}

// Margin is the part of the latency target kept back now.
func (b *Batcher) Margin() time.Duration { return b.margin }

// Costs returns the cost model the Batcher predicts with.
func (b *Batcher) Costs() *Costs { return b.costs }

// Options returns the options with defaults filled in.
func (b *Batcher) Options() Options { return b.opts }

// Fits reports whether a request of n examples that arrived at arrival can
// join the open batch. A request that does not fit means: seal the open
// batch, then add it to the next one. n is at most MaxBatch (frontends
// refuse larger requests). In SLO mode a request also does not fit when
// the larger batch would make the batch's oldest request (it included)
// miss the budget.
func (b *Batcher) Fits(n int, arrival, now time.Time) bool {
	if b.entries == 0 {
		return true
	}
	if b.opts.Mode == None {
		return false
	}
	if b.rows+n > b.opts.MaxBatch || b.entries >= b.opts.MaxEntries {
		return false
	}
	if b.opts.Mode == SLO && n > 0 {
		// A batch that runs longer than half the budget makes every request
		// that arrives while it runs miss: it waits for this batch, then
		// runs in its own. So a batch grows only to half the budget's
		// execution time (a request alone may take longer).
		if b.costs.Exec(b.rows+n) > b.budget()/2 {
			return false
		}
		return !b.finish(b.rows+n, n, now).After(earliest(b.first, arrival).Add(b.budget()))
	}
	return true
}

func earliest(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// budget is the part of the latency target the embedder plans with.
func (b *Batcher) budget() time.Duration { return b.opts.LatencyTarget - b.margin }

// finish predicts when a batch of rows examples would complete if sealed
// as soon as its last pending lookups (of pending examples) are done: once
// those are and the device has finished every batch ahead of it, plus its
// bucket's execution time. Requests are looked up as they arrive, so only
// the newest request's lookups are ever pending.
func (b *Batcher) finish(rows, pending int, now time.Time) time.Time {
	start := now.Add(b.costs.Lookup(pending))
	if b.deviceFree.After(start) {
		start = b.deviceFree
	}
	return start.Add(b.costs.Exec(rows))
}

// Admit is SLO mode's admission control for a request of n examples that
// arrived at arrival and must finish by deadline (zero: no deadline of its
// own): false when, behind the work already queued, it would miss the
// budget (the target less the margin) or its deadline even where it goes
// next (the open batch if it Fits, else a new batch behind it). A request
// with nothing ahead of it is
// always admitted, even one too large to finish in time on an idle device:
// shedding it would spare no one else any waiting, and the frontends count
// it as a budget miss instead. Other modes admit everything. Call it
// before Fits and Add.
func (b *Batcher) Admit(n int, arrival, deadline, now time.Time) bool {
	if b.opts.Mode != SLO || n <= 0 {
		return true
	}
	if b.entries > 0 && b.Fits(n, arrival, now) {
		// Fits kept the oldest request, which arrived no later than this
		// one, within the budget; only this one's own deadline can fail.
		return deadline.IsZero() || !b.finish(b.rows+n, n, now).After(deadline)
	}
	// A batch of its own, started once the open batch (if any) and the
	// device's queue are done.
	free := b.deviceFree
	if b.entries > 0 {
		free = b.finish(b.rows, 0, now)
	}
	start := now.Add(b.costs.Lookup(n))
	if !free.After(start) {
		return true // nothing ahead of it
	}
	end := free.Add(b.costs.Exec(n))
	if end.After(arrival.Add(b.budget())) {
		return false
	}
	return deadline.IsZero() || !end.After(deadline)
}

// DeviceIdle tells the Batcher the device has nothing left to run.
func (b *Batcher) DeviceIdle(now time.Time) {
	if b.deviceFree.After(now) {
		b.deviceFree = now
	}
}

// Sealed records that the open batch went to the device at now, so later
// predictions queue behind it, and returns its predicted execution time.
// The caller then calls Reset.
func (b *Batcher) Sealed(now time.Time) (predicted time.Duration) {
	if b.rows == 0 {
		return 0
	}
	predicted = b.costs.Exec(b.rows)
	b.deviceFree = b.finish(b.rows, 0, now)
	return predicted
}

// Add puts a request of n examples (0 for a request that failed before
// lookup and only needs its error delivered) that arrived at arrival into
// the open batch and returns its first row. The caller checks Fits first.
func (b *Batcher) Add(n int, arrival time.Time) (firstRow int) {
	if b.entries == 0 || arrival.Before(b.first) {
		b.first = arrival
	}
	firstRow = b.rows
	b.rows += n
	b.entries++
	return firstRow
}

// Rows and Entries describe the open batch.
func (b *Batcher) Rows() int    { return b.rows }
func (b *Batcher) Entries() int { return b.entries }

// ShouldSeal reports whether the open batch should go to the accelerator
// now, given whether the device is idle.
func (b *Batcher) ShouldSeal(now time.Time, deviceIdle bool) bool {
	if b.entries == 0 {
		return false
	}
	if b.rows >= b.opts.MaxBatch || b.entries >= b.opts.MaxEntries {
		return true
	}
	switch b.opts.Mode {
	case None:
		return true
	case Model, SLO:
		return deviceIdle
	default:
		return !now.Before(b.first.Add(b.opts.Window))
	}
}

// Deadline is when the open batch must be sealed even if nothing else
// arrives (Full mode's window); ok is false when no timer is needed.
func (b *Batcher) Deadline() (t time.Time, ok bool) {
	if b.entries == 0 || b.opts.Mode != Full {
		return time.Time{}, false
	}
	return b.first.Add(b.opts.Window), true
}

// Reset starts a new, empty batch (after the open one was sealed).
func (b *Batcher) Reset() {
	b.rows, b.entries = 0, 0
	b.first = time.Time{}
}

// Costs predicts how long the embedder's lookups and the device's
// execution take. The accelerator measures each bucket's execution time
// (calibrated at start-up, then a high quantile of recent runs) and
// publishes it; the embedder measures its lookups. Zero values mean
// unknown and predict nothing.
type Costs struct {
	exec [maxBuckets]time.Duration // by log2 of the bucket
	// lookupPerExample is the lookups' wall time per example with every
	// worker busy.
	lookupPerExample time.Duration
}

// maxBuckets covers buckets 1 … 2^15.
const maxBuckets = 16

// SetExec sets the expected execution time of a power-of-two bucket.
func (c *Costs) SetExec(bucket int, d time.Duration) {
	if i, ok := bucketIndex(bucket); ok {
		c.exec[i] = max(d, 0)
	}
}

// SetLookup sets the lookups' wall time per example.
func (c *Costs) SetLookup(perExample time.Duration) { c.lookupPerExample = max(perExample, 0) }

// Exec is the expected execution time of a batch of rows examples: its
// power-of-two bucket's, or, when that bucket has no estimate yet, the
// nearest larger one's (a larger bucket is never faster), or failing that
// the largest smaller one's scaled by size (execution is at most linear in
// the bucket beyond the per-call cost). 0 when nothing is known.
func (c *Costs) Exec(rows int) time.Duration {
	if rows <= 0 {
		return 0
	}
	i := 0
	for 1<<i < rows && i < maxBuckets-1 {
		i++
	}
	if d := c.exec[i]; d > 0 {
		return d
	}
	for j := i + 1; j < maxBuckets; j++ {
		if d := c.exec[j]; d > 0 {
			return d
		}
	}
	for j := i - 1; j >= 0; j-- {
		if d := c.exec[j]; d > 0 {
			return d * time.Duration(1<<(i-j))
		}
	}
	return 0
}

// Lookup is the expected wall time of looking up rows examples.
func (c *Costs) Lookup(rows int) time.Duration {
	return c.lookupPerExample * time.Duration(max(rows, 0))
}

func bucketIndex(bucket int) (int, bool) {
	for i := range maxBuckets {
		if bucket == 1<<i {
			return i, true
		}
	}
	return 0, false
}
