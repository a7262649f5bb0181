package shm

import (
	"sync/atomic"
	"time"
)

// DefaultPulseGap is how long a work loop may go without a Tick before its
// process stops beating: well above the loops' own wake-up period
// (DefaultLivenessTick), well below DefaultHungAfter.
const DefaultPulseGap = 250 * time.Millisecond

// Pulse is a work loop's proof of progress. A heartbeat goroutine alone
// keeps beating while the loop it stands for is deadlocked or stuck in a
// device call, so peers would wait on a process that will never answer.
// With a Pulse, the loop Ticks every iteration (it wakes at least every
// DefaultLivenessTick even when idle) and calls Expect before a step that
// may legitimately take long; the heartbeat beats only while the pulse is
// Live, so a stuck loop stops the beats and peers declare the process hung
// within DefaultHungAfter of the gap or the step's allowance running out.
//
// Its methods are safe for concurrent use: the loop writes, the heartbeat
// goroutine and health endpoints read.
type Pulse struct {
	last  atomic.Int64 // monotonic ns of the last Tick or Expect
	until atomic.Int64 // monotonic ns the current long step may run until; 0: none
}

// NewPulse returns a pulse that has just ticked.
func NewPulse() *Pulse {
	p := &Pulse{}
	p.Tick()
	return p
}

// Tick records an iteration of the loop and ends any long step.
func (p *Pulse) Tick() {
	p.last.Store(monoNow())
	p.until.Store(0)
}

// Expect records that the loop starts a step that may take up to d.
func (p *Pulse) Expect(d time.Duration) {
	now := monoNow()
	p.last.Store(now)
	p.until.Store(now + int64(d))
}

// Live reports whether the loop ticked within gap (0: DefaultPulseGap) or
// is inside the allowance of its current long step.
func (p *Pulse) Live(gap time.Duration) bool {
	if gap <= 0 {
		gap = DefaultPulseGap
	}
	now := monoNow()
	return now-p.last.Load() <= int64(gap) || now <= p.until.Load()
}

// Stalled is how long the loop has gone past its gap or allowance (0 while
// Live), for logs and health endpoints.
func (p *Pulse) Stalled(gap time.Duration) time.Duration {
	if p.Live(gap) {
		return 0
	}
	if gap <= 0 {
		gap = DefaultPulseGap
	}
	end := max(p.last.Load()+int64(gap), p.until.Load())
	return time.Duration(monoNow() - end)
}
