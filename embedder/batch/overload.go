package batch

import (
	"math"
	"time"
)

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
	if !b.opts.Mode.Sheds() || n <= 0 {
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
