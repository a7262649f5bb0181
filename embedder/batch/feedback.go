package batch

import "time"

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
