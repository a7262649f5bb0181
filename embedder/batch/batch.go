// Package batch decides how the embedder groups requests into batches: how
// many examples a batch may hold, when an open batch is sealed and handed
// to the accelerator, and (in SLO mode) which requests are shed because
// they can no longer finish within the latency target. It is pure policy:
// no goroutines, no shared memory, a clock and cost estimates passed in, so
// tests drive it by hand.
package batch

import (
	"fmt"
	"math"
	"math/bits"
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
	// SLO sizes batches for throughput within the latency target: each
	// request is looked up as it arrives (so the next batch's lookups run
	// while the device executes the current one). When the device is idle
	// the batch is sealed once it holds the fill size, the smallest bucket
	// the device runs at least as fast as examples arrive (measured), so
	// batches keep up with the load; at light load that is one request and
	// SLO mode is a zero-wait merger. A batch short of the fill size waits
	// only while its oldest request could still finish within the budget,
	// or, where callers have been asking again as soon as they are
	// answered, while the callers of the batch just finished are on their
	// way back and merging them saves the device time (returningBy).
	// While the device is busy the batch grows only
	// as long as its oldest request (counted from when its frontend
	// received it), waiting for the device and then for the expected
	// execution time of the larger bucket, still finishes within the
	// budget (the target less a margin that follows how many served calls
	// missed the target: Feedback), and as long as a request arriving just
	// after it is sealed could still finish within the target in a batch
	// of its own, or running the new request in it costs the device less
	// than running it after it. Under sustained overload, once every
	// request for a whole OverloadWindow was predicted to miss the target,
	// requests predicted to miss it are shed before lookup (admission
	// control, after CoDel's standing-queue rule), until predictions stay
	// on time for a window again; a request that cannot meet its own gRPC
	// deadline is always shed.
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
	// DefaultOverloadWindow is how long predicted misses must last before
	// SLO mode sheds: CoDel's interval, long enough that scheduling noise
	// and a burst are served late rather than refused.
	DefaultOverloadWindow = 100 * time.Millisecond
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
	// MergeRows is the most examples SLO mode merges into one batch; one
	// request of more (up to MaxBatch) still runs, alone. Default
	// MaxBatch. Larger merged batches cost more per example once their
	// rows no longer stay in the caches between the embedder's writes and
	// the accelerator's reads, and an overload, which grows batches to
	// whatever is queued, then cuts the mesh's capacity below the load
	// that caused it: the queue outlives the burst.
	MergeRows int
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
	// the calls the frontends served, between a twentieth and a quarter of
	// the target. Default a tenth of the target.
	Margin time.Duration
	// OverloadWindow is how long every request must be predicted to miss
	// the target before SLO mode starts shedding, and how long predictions
	// must stay on time before it stops. Default 100 ms.
	OverloadWindow time.Duration
}

func (o Options) withDefaults() Options {
	if o.MaxBatch <= 0 {
		o.MaxBatch = DefaultMaxBatch
	}
	if o.MaxEntries <= 0 {
		o.MaxEntries = o.MaxBatch
	}
	if o.MergeRows <= 0 || o.MergeRows > o.MaxBatch {
		o.MergeRows = o.MaxBatch
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
	if o.OverloadWindow <= 0 {
		o.OverloadWindow = DefaultOverloadWindow
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
	ov     overload
	rate   arrivalRate
	// busyArrivals: a request arrived while the device was running the
	// last sealed batch (before, of the one before); prevEntries is how
	// many requests that batch held. A batch on an idle device waits for
	// more only when more are on their way: arrivals independent of the
	// answers (requests come in while the device runs), or the callers of
	// a larger batch just answered, asking again. A single client that
	// waits for each answer never sends while the device runs its
	// request, and waiting for a second request would only stall it.
	busyArrivals, busyArrivalsBefore bool
	prevEntries                      int
	// prevRows is the last sealed batch's rows; idleAt is when the device
	// last went idle and sinceIdle counts the rows that arrived since.
	// returns learns whether the callers of a finished batch come back at
	// once (see returningBy).
	prevRows  int
	idleAt    time.Time
	sinceIdle int
	returns   returnRate
	// idle is the device's state as last told (DeviceIdle, Sealed): the
	// predicted deviceFree runs early whenever a batch runs long.
	idle bool
}

// arrivalRate estimates the offered load in examples per second: counts
// over windows of rateWindow, blended into a moving average that forgets
// by rateWeight per window (also across windows without arrivals).
type arrivalRate struct {
	start    time.Time
	examples int
	perSec   float64
}

const (
	rateWindow = 20 * time.Millisecond
	rateWeight = 0.25
)

func (r *arrivalRate) add(n int, now time.Time) {
	if r.start.IsZero() {
		r.start = now
	}
	r.roll(now)
	r.examples += n
}

// roll closes the current window once it is rateWindow long.
func (r *arrivalRate) roll(now time.Time) {
	el := now.Sub(r.start)
	if el < rateWindow {
		return
	}
	windows := float64(el) / float64(rateWindow)
	keep := math.Pow(1-rateWeight, windows)
	r.perSec = keep*r.perSec + (1-keep)*float64(r.examples)/el.Seconds()
	r.start, r.examples = now, 0
}

// returnRate learns how often the callers of a batch the device just
// finished were all back within returnWindow of it: closed-loop clients
// (perf_analyzer's concurrency mode, a pool of workers that each wait for
// their answer) nearly always are, independent arrivals hardly ever. It is
// judged whether or not the batcher waited for them, so it keeps learning
// when it does not wait.
type returnRate struct {
	judging bool
	by      time.Time // the callers count as back only until then
	need    int       // rows of the batch just finished
	rate    float64   // moving average of the outcomes, 1 = all back
}

const (
	// returnWeight is the weight of one outcome in returnRate.
	returnWeight = 0.125
	// returnLikely is how often the callers must have come back for a
	// batch to wait for them.
	returnLikely = 0.5
)

// start begins judging the batch of need rows the device finished at now.
func (r *returnRate) start(need int, window time.Duration, now time.Time) {
	r.judge(false, now)
	r.judging = need > 0 && window > 0
	r.by, r.need = now.Add(window), need
}

// arrived judges the current batch once arrivals since it finished reach
// its rows, or once its window is over.
func (r *returnRate) arrived(since int, now time.Time) {
	if r.judging && since >= r.need {
		r.judge(!now.After(r.by), now)
	}
	r.judge(false, now)
}

// judge records an outcome: back (true), or not back when the window is
// over. Nothing happens when no batch is being judged, or when it is not
// back and its window still runs.
func (r *returnRate) judge(back bool, now time.Time) {
	if !r.judging || !back && !now.After(r.by) {
		return
	}
	r.judging = false
	v := 0.0
	if back {
		v = 1
	}
	r.rate += returnWeight * (v - r.rate)
}

// overload is admission control's state: SLO mode sheds only while
// predicted misses are standing, not for one late request.
type overload struct {
	shedding bool
	// lateSince starts an unbroken run of requests predicted to miss the
	// target, onTimeSince one predicted on time (zero: no such run).
	lateSince, onTimeSince time.Time
	// drops counts the late requests shed in this overload; the next may
	// be shed at nextDrop (CoDel's control law).
	drops    int
	nextDrop time.Time
}

// observe records one prediction at now and reports whether the mesh is
// overloaded: it becomes so once predictions have missed for a whole
// window and stops once they have been on time for one.
func (o *overload) observe(late bool, now time.Time, window time.Duration) bool {
	if late {
		o.onTimeSince = time.Time{}
		if o.lateSince.IsZero() {
			o.lateSince = now
		}
		if !o.shedding && now.Sub(o.lateSince) >= window {
			o.shedding, o.drops, o.nextDrop = true, 0, now
		}
		return o.shedding
	}
	o.lateSince = time.Time{}
	if o.shedding {
		if o.onTimeSince.IsZero() {
			o.onTimeSince = now
		}
		if now.Sub(o.onTimeSince) >= window {
			o.shedding, o.onTimeSince = false, time.Time{}
		}
	}
	return o.shedding
}

// drop reports whether a late request arriving at now during an overload
// is shed: the first at once, then each after window/√drops, so shedding
// grows until it matches the excess load. Shedding every late request at
// once would, under clients that ask again as soon as they are refused,
// turn one slow batch into a storm of refusals that keeps every later
// prediction late.
func (o *overload) drop(now time.Time, window time.Duration) bool {
	if now.Before(o.nextDrop) {
		return false
	}
	o.drops++
	o.nextDrop = now.Add(time.Duration(float64(window) / math.Sqrt(float64(o.drops))))
	return true
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
// smaller batch in steady state. It stays between a twentieth and a
// quarter of the target: misses that come from overload, not from what
// the plan leaves out, would otherwise push it up until batches shrink,
// throughput falls and more calls miss.
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
	b := &Batcher{opts: opts.withDefaults(), costs: costs, idle: true}
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
		b.margin = min(b.margin+b.margin/2+target/50, target/4)
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
// the larger batch would leave no time for a request arriving after it,
// or would make the batch's oldest request (it included) miss the budget
// that it would make without it, unless it is a returning caller the batch
// waits for (awaited).
func (b *Batcher) Fits(n int, arrival, now time.Time) bool {
	if b.entries == 0 {
		return true
	}
	if b.opts.Mode == None {
		return false
	}
	if b.rows+n > b.maxRows() || b.entries >= b.opts.MaxEntries {
		return false
	}
	if b.opts.Mode == SLO && n > 0 {
		if b.awaited(n) {
			return true
		}
		// A request that arrives just after this batch is sealed waits for
		// it, then runs in a batch of its own: the batch grows only while
		// that request could still make the target, unless running this
		// request with the batch costs the device less than running it
		// after it. A request turned away waits for the batch and then
		// runs anyway, so on a device whose run time hardly grows with the
		// batch (the MLPerf network on a CPU, reading its 63 MB of weights
		// per run whatever the batch) turning it away would cost it, and
		// throughput, a whole run, to spare a request that does not exist
		// yet about as much: that capped batches at 4 examples on a slow
		// core and let the queue grow.
		if !b.leavesRoom(b.rows+n) && !b.mergingSaves(b.rows, n) {
			return false
		}
		if !b.finish(b.rows+n, n, now).After(earliest(b.first, arrival).Add(b.budget())) {
			return true
		}
		// Late with the request. If the oldest was late without it too,
		// it joins anyway: on its own it would queue behind this batch
		// and finish later still, and a train of small batches is what
		// turns a late moment into a standing queue.
		return b.finish(b.rows, 0, now).After(b.first.Add(b.budget()))
	}
	return true
}

func earliest(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// leavesRoom reports whether a batch of rows examples leaves a request that
// arrives just after it is sealed time to finish within the target in a
// batch of its own: it waits for this batch, then runs. Both execution
// times are high quantiles, so the sum is held to the target, not to the
// budget, which would count the margin a second time.
func (b *Batcher) leavesRoom(rows int) bool {
	return b.costs.Exec(rows)+b.costs.Lookup(1)+b.costs.Exec(1) <= b.opts.LatencyTarget
}

// mergingSaves reports whether running n more examples in a batch of rows
// takes the device less time than running them in a batch of their own
// after it.
func (b *Batcher) mergingSaves(rows, n int) bool {
	return b.costs.Exec(rows+n) < b.costs.Exec(rows)+b.costs.Exec(n)
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
// own), decided at now. It predicts when the request would finish where it
// goes next (the open batch if it Fits, else a new batch behind it) and
// refuses it when that is past its own deadline, or past the latency
// target while the mesh is overloaded: every request predicted to miss the
// target for a whole OverloadWindow. Outside
// overload a request predicted late is served late (one slow batch or a
// burst is not a reason to refuse work). A request with nothing ahead of
// it on the device counts as late only when it waited in its lane past
// what the target leaves for its lookup and run; one too large to finish
// in time even on an idle device is admitted: shedding it would spare no
// one else any waiting, and the frontends count it as a budget miss
// instead. Other modes admit
// everything. Call it before Fits and Add.
func (b *Batcher) Admit(n int, arrival, deadline, now time.Time) bool {
	if b.opts.Mode != SLO || n <= 0 {
		return true
	}
	b.rate.add(n, now)
	if !b.idle {
		b.busyArrivals = true
	}
	var end time.Time
	if b.entries > 0 && b.Fits(n, arrival, now) {
		// It joins the open batch: it finishes with it.
		end = b.finish(b.rows+n, n, now)
	} else {
		// A batch of its own, started once the open batch (if any) and the
		// device's queue are done.
		free := b.deviceFree
		if b.entries > 0 {
			free = b.finish(b.rows, 0, now)
		}
		if !free.After(now.Add(b.costs.Lookup(n))) {
			// Nothing ahead of it on the device. It is late only if it
			// waited its budget away before the embedder took it: where
			// the device is fast and the embedder shares a core with the
			// frontends, the queue stands in the lanes, not on the
			// device, and serving what is already late there only
			// makes the requests behind it late too.
			run := b.costs.Lookup(n) + b.costs.Exec(n)
			end = now.Add(run)
			if !end.After(arrival.Add(b.opts.LatencyTarget)) || run > b.opts.LatencyTarget {
				// On time, or too large for the target even on an
				// idle device taken at once: served, since shedding it
				// would spare no one any waiting.
				b.ov.observe(false, now, b.opts.OverloadWindow)
				return true
			}
		} else {
			end = free.Add(b.costs.Exec(n))
		}
	}
	// Shedding refuses work, so it is for requests that miss the target
	// itself: the margin is the batch plans' reserve, not a reason to
	// refuse a request that would still be answered in time.
	late := end.After(arrival.Add(b.opts.LatencyTarget))
	if b.ov.observe(late, now, b.opts.OverloadWindow) && late {
		// A request that would take twice the target is refused at once;
		// one only late, at the rate the overload has earned.
		if end.After(arrival.Add(2*b.opts.LatencyTarget)) || b.ov.drop(now, b.opts.OverloadWindow) {
			return false
		}
	}
	return deadline.IsZero() || !end.After(deadline)
}

// Overloaded reports whether admission control is shedding.
func (b *Batcher) Overloaded() bool { return b.ov.shedding }

// DeviceIdle tells the Batcher the device has nothing left to run.
func (b *Batcher) DeviceIdle(now time.Time) {
	if b.deviceFree.After(now) {
		b.deviceFree = now
	}
	if !b.idle && b.opts.Mode == SLO {
		// The device just finished the last sealed batch: its callers
		// are answered now.
		b.idleAt, b.sinceIdle = now, 0
		b.returns.start(b.prevRows, b.returnWindow(), now)
	}
	b.idle = true
}

// returnWindow is how long after the device goes idle the callers of the
// batch it finished count as coming back at once: the longest the open
// batch would wait for them (see returningBy), and at least a twentieth of
// the target, the time their answers and next requests take through the
// frontends when the device is fast.
func (b *Batcher) returnWindow() time.Duration {
	w := b.costs.Exec(b.prevRows) / 2
	return max(w, b.opts.LatencyTarget/20)
}

// awaited reports whether a request of n examples arriving now is one of
// the returning callers an idle device's open batch waits for (see
// returningBy). It joins even if that makes the batch's oldest request
// late: the wait was chosen because the merged run saves the device more
// than it costs the requests already waiting, and on its own the request
// would queue behind them anyway.
func (b *Batcher) awaited(n int) bool {
	return b.idle && b.prevRows-b.sinceIdle >= n && b.returns.rate >= returnLikely && b.mergingSaves(b.rows, n)
}

// returningBy reports whether an SLO batch on an idle device waits for the
// callers of the batch the device just finished, and until when. It waits
// while callers that usually come back at once (returnRate) are not all
// back yet and merging them saves the device time: at most half of what
// it saves, counted from when the device went idle, so the requests
// already waiting lose less than the returning ones gain. Without it, two
// groups of closed-loop clients alternate on the device for good: each
// group's requests arrive while the other's batch runs, and every batch is
// sealed the moment the device is free, half the size it could be.
func (b *Batcher) returningBy(now time.Time) (time.Time, bool) {
	back := b.prevRows - b.sinceIdle
	if back <= 0 || b.returns.rate < returnLikely || b.rows+back > b.maxRows() {
		return time.Time{}, false
	}
	save := b.costs.Exec(b.rows) + b.costs.Exec(back) - b.costs.Exec(b.rows+back)
	if save <= 0 {
		return time.Time{}, false
	}
	by := b.idleAt.Add(save / 2)
	return by, now.Before(by)
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
	b.busyArrivalsBefore, b.busyArrivals = b.busyArrivals, false
	b.prevEntries, b.prevRows, b.idle = b.entries, b.rows, false
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
	if b.opts.Mode == SLO && n > 0 {
		b.sinceIdle += n
		b.returns.arrived(b.sinceIdle, arrival)
	}
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
	if b.rows >= b.maxRows() || b.entries >= b.opts.MaxEntries {
		return true
	}
	switch b.opts.Mode {
	case None:
		return true
	case Model:
		return deviceIdle
	case SLO:
		if !deviceIdle {
			return false
		}
		_, wait := b.waitUntil(now)
		return !wait
	default:
		return !now.Before(b.first.Add(b.opts.Window))
	}
}

// FillSize is the batch size SLO mode waits for while the device is idle:
// the smallest power of two the device runs at least as fast as examples
// arrive (rate × execution time ≤ size), so batches of it keep up with
// the load, and no larger than a batch that leaves a request arriving
// after it time to make the target. 1 at light load or before anything
// is measured.
func (b *Batcher) FillSize(now time.Time) int {
	b.rate.roll(now)
	return b.fill()
}

func (b *Batcher) fill() int {
	if b.rate.perSec <= 0 {
		return 1
	}
	size := 1
	for ; size < b.maxRows(); size *= 2 {
		e := b.costs.Exec(size)
		if e == 0 {
			return size
		}
		keepsUp := b.rate.perSec*e.Seconds() <= float64(size)
		// Past keeping up, a larger batch still saves the per-call work
		// of the device and of every process woken per batch (host CPU,
		// and on the CPU plugin the device's own core): worth up to
		// fillWait of the budget spent gathering and running it.
		next := 2 * size
		gather := time.Duration(float64(next-1) / b.rate.perSec * float64(time.Second))
		cheaper := gather+b.costs.Exec(next) <= b.budget()/fillWait
		if keepsUp && !cheaper || !b.leavesRoom(next) {
			return size
		}
	}
	return b.maxRows()
}

// maxRows is the most examples a batch merges: MergeRows in SLO mode.
func (b *Batcher) maxRows() int {
	if b.opts.Mode == SLO {
		return b.opts.MergeRows
	}
	return b.opts.MaxBatch
}

// fillWait: a batch grows past the size that keeps up with the load only
// while gathering and running it take at most this fraction (1/fillWait)
// of the budget.
const fillWait = 4

// waitUntil reports whether an SLO batch on an idle device waits at now
// for more requests, and until when: while it is short of the fill size,
// more are on their way (see busyArrivals) and its oldest request can
// still afford to wait (sealBy).
func (b *Batcher) waitUntil(now time.Time) (time.Time, bool) {
	b.returns.judge(false, now)
	if by, wait := b.returningBy(now); wait {
		return by, true
	}
	coming := b.busyArrivals || b.busyArrivalsBefore || b.entries < b.prevEntries
	if !coming || b.rows >= b.FillSize(now) {
		return time.Time{}, false
	}
	by := b.sealBy()
	return by, now.Before(by)
}

// sealBy is the latest moment a waiting SLO batch can be sealed at its
// fill size and still finish within its oldest request's budget.
func (b *Batcher) sealBy() time.Time {
	fill := max(b.fill(), b.rows)
	return b.first.Add(b.budget() - b.costs.Exec(fill) - b.costs.Lookup(fill-b.rows))
}

// Deadline is when the open batch must be sealed even if nothing else
// arrives: Full mode's window, or, while the device is idle, when an SLO
// batch short of its fill size stops waiting. ok is false when no timer
// is needed.
func (b *Batcher) Deadline(now time.Time, deviceIdle bool) (t time.Time, ok bool) {
	if b.entries == 0 {
		return time.Time{}, false
	}
	switch b.opts.Mode {
	case Full:
		return b.first.Add(b.opts.Window), true
	case SLO:
		if deviceIdle {
			return b.waitUntil(now)
		}
	}
	return time.Time{}, false
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
	// expect is what Exec answers, by log2 of the bucket, derived from
	// exec whenever it changes: the batcher asks for many sizes per
	// request, the accelerator's figures change a few times a second.
	expect [maxBuckets]time.Duration
	// lookupPerExample is the lookups' wall time per example with every
	// worker busy.
	lookupPerExample time.Duration
}

// maxBuckets covers buckets 1 … 2^15.
const maxBuckets = 16

// SetExec sets the expected execution time of a power-of-two bucket.
func (c *Costs) SetExec(bucket int, d time.Duration) {
	i, ok := bucketIndex(bucket)
	if !ok || c.exec[i] == max(d, 0) {
		return
	}
	c.exec[i] = max(d, 0)
	c.derive()
}

// SetLookup sets the lookups' wall time per example.
func (c *Costs) SetLookup(perExample time.Duration) { c.lookupPerExample = max(perExample, 0) }

// derive computes expect from exec. A bucket's expected time is the least
// estimate of it and every larger bucket (a larger bucket is never faster,
// so a smaller bucket's higher estimate is stale or noise: it runs rarely,
// or ran on a busy core), or failing that the largest smaller bucket's
// scaled by size (execution is at most linear in the bucket beyond the
// per-call cost). 0 when nothing is known.
func (c *Costs) derive() {
	var least time.Duration
	for i := maxBuckets - 1; i >= 0; i-- {
		if d := c.exec[i]; d > 0 && (least == 0 || d < least) {
			least = d
		}
		c.expect[i] = least
	}
	var below time.Duration // the largest smaller bucket's estimate, scaled
	for i := range maxBuckets {
		switch {
		case c.expect[i] > 0:
		case below > 0:
			c.expect[i] = 2 * below
		}
		if c.exec[i] > 0 {
			below = c.exec[i]
		} else {
			below *= 2
		}
	}
}

// Exec is the expected execution time of a batch of rows examples: that
// of the smallest power-of-two bucket that holds it (see derive).
func (c *Costs) Exec(rows int) time.Duration {
	if rows <= 0 {
		return 0
	}
	return c.expect[min(bits.Len(uint(rows-1)), maxBuckets-1)]
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
