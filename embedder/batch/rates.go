package batch

import (
	"math"
	"time"
)

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
