// Package batch decides how the embedder groups requests into batches: how
// many examples a batch may hold, when an open batch is sealed and handed
// to the accelerator, and (in SLO mode) which requests are shed because
// they can no longer finish within the latency target; and, in Tasks, what
// becomes of each request a batch carries. It is policy and bookkeeping:
// no goroutines, no shared memory, a clock and cost estimates passed in, so
// tests drive it by hand.
package batch

import (
	"fmt"
	"strings"
	"time"

	"github.com/recmesh/recmesh/model"
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

// The embedder asks a mode what it does through the methods below rather
// than comparing modes, so what each mode implies is said here, once.

// SealsOnIdle reports whether the mode seals an open batch when the device
// goes idle (a zero-wait merger), so the embedder must wake when it does:
// Model and SLO.
func (m Mode) SealsOnIdle() bool { return m == Model || m == SLO }

// Predicts reports whether the mode plans batches with predicted costs:
// the embedder then measures its lookups and gives them, with the
// accelerator's execution times, to Costs, and tells the Batcher of each
// batch it seals (Sealed). SLO only.
func (m Mode) Predicts() bool { return m == SLO }

// Sheds reports whether the mode refuses requests predicted to miss the
// latency target (Admit, Overloaded). SLO only.
func (m Mode) Sheds() bool { return m == SLO }

// FollowsFeedback reports whether the mode moves its margin with the
// frontends' count of calls that missed the target (Feedback). SLO only.
func (m Mode) FollowsFeedback() bool { return m == SLO }

// Defaults.
const (
	DefaultMaxBatch = model.DefaultMaxBatch
	DefaultWindow   = time.Millisecond
	// DefaultLatencyTarget is the end-to-end p99 budget SLO mode keeps.
	DefaultLatencyTarget = model.DefaultLatencyTarget
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

// maxRows is the most examples a batch merges: MergeRows in SLO mode.
func (b *Batcher) maxRows() int {
	if b.opts.Mode == SLO {
		return b.opts.MergeRows
	}
	return b.opts.MaxBatch
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
