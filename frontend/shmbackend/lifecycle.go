package shmbackend

import (
	"fmt"
	"sync"
	"sync/atomic"
)

// event is a one-shot signal, as grpc-go's internal/grpcsync.Event: it
// fires at most once, and every waiter, whether it started waiting before
// or after, sees it. A closed channel is what lets waiters select on it
// beside a doorbell, a context or a timer.
type event struct {
	fired atomic.Bool
	c     chan struct{}
	once  sync.Once
}

func newEvent() *event { return &event{c: make(chan struct{})} }

// Fire fires the event. It reports whether this call fired it: exactly one
// call does, however many race.
func (e *event) Fire() bool {
	fired := false
	e.once.Do(func() {
		e.fired.Store(true)
		close(e.c)
		fired = true
	})
	return fired
}

// Done is closed once the event has fired.
func (e *event) Done() <-chan struct{} { return e.c }

// HasFired reports whether the event has fired.
func (e *event) HasFired() bool { return e.fired.Load() }

// phase is where an attachment to a generation is in its life. It only
// moves forward, one step at a time:
//
//	attached ─▶ draining ─▶ retired ─▶ closed
//
// In each phase:
//
//   - attached: the lane takes new calls.
//   - draining: no new calls; calls in flight complete here. A newer
//     generation took over, the generation was lost, or the backend closes.
//   - retired: nothing will complete on the lane any more: every call
//     finished, or the generation was lost under them and the calls still
//     waiting move to its successor. The lane is given back and its
//     heartbeat and completion reader are stopped.
//   - closed: no call holds a slot any more and the segment is unmapped.
type phase int32

const (
	phaseAttached phase = iota
	phaseDraining
	phaseRetired
	phaseClosed
)

var phaseNames = [...]string{"attached", "draining", "retired", "closed"}

func (p phase) String() string {
	if p >= 0 && int(p) < len(phaseNames) {
		return phaseNames[p]
	}
	return fmt.Sprintf("phase(%d)", int32(p))
}

// lifecycle is an attachment's state machine: the phase, and one event per
// transition, fired on entering the phase it leads to. Its owner (the
// attachment's owner goroutine) advances it; everyone else only reads the
// phase or waits for an event.
type lifecycle struct {
	cur    atomic.Int32
	events [phaseClosed]*event // events[p-1] fires on entering p
}

func newLifecycle() *lifecycle {
	l := &lifecycle{}
	for i := range l.events {
		l.events[i] = newEvent()
	}
	return l
}

// phase is the current phase.
func (l *lifecycle) phase() phase { return phase(l.cur.Load()) }

// reached reports whether the lifecycle is at p or past it.
func (l *lifecycle) reached(p phase) bool { return l.phase() >= p }

// entered is the event of entering p (p past attached).
func (l *lifecycle) entered(p phase) *event { return l.events[p-1] }

// advance moves the lifecycle from the phase before to into to and fires
// that transition's event. Any other move (skipping a phase, going back,
// entering the same phase twice) is refused with an error and changes
// nothing.
func (l *lifecycle) advance(to phase) error {
	if to <= phaseAttached || to > phaseClosed {
		return fmt.Errorf("shmbackend: no transition into %v", to)
	}
	if !l.cur.CompareAndSwap(int32(to-1), int32(to)) {
		return fmt.Errorf("shmbackend: illegal transition %v → %v", l.phase(), to)
	}
	// The phase word moves first: whoever sees the event fired also sees
	// the phase.
	l.entered(to).Fire()
	return nil
}
