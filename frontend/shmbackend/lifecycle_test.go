package shmbackend

import (
	"sync"
	"sync/atomic"
	"testing"
)

// TestEventFiresOnce: of many racing Fire calls exactly one fires the
// event, and waiters that started before and after it are all released.
func TestEventFiresOnce(t *testing.T) {
	e := newEvent()
	if e.HasFired() {
		t.Fatal("a new event has fired")
	}
	select {
	case <-e.Done():
		t.Fatal("a new event's Done is closed")
	default:
	}
	var waiters sync.WaitGroup
	for range 4 {
		waiters.Go(func() { <-e.Done() })
	}
	var fired atomic.Int32
	var firers sync.WaitGroup
	for range 8 {
		firers.Go(func() {
			if e.Fire() {
				fired.Add(1)
			}
		})
	}
	firers.Wait()
	waiters.Wait()
	if n := fired.Load(); n != 1 {
		t.Fatalf("%d Fire calls fired the event, want 1", n)
	}
	if !e.HasFired() {
		t.Fatal("HasFired false after Fire")
	}
	<-e.Done() // a waiter after the fact is released at once
	if e.Fire() {
		t.Fatal("Fire fired an event twice")
	}
}

// TestLifecycleInOrder: the phases follow one another, each transition's
// event fires when its phase is entered and not before, and every move
// other than to the next phase is refused without changing anything.
func TestLifecycleInOrder(t *testing.T) {
	l := newLifecycle()
	if p := l.phase(); p != phaseAttached {
		t.Fatalf("a new lifecycle is %v, want attached", p)
	}
	for _, to := range []phase{phaseDraining, phaseRetired, phaseClosed} {
		// Everything but the next phase is refused.
		for _, bad := range []phase{phaseAttached, phaseDraining, phaseRetired, phaseClosed, phaseClosed + 1, -1} {
			if bad == to {
				continue
			}
			before := l.phase()
			if err := l.advance(bad); err == nil {
				t.Fatalf("from %v, advance(%v) was allowed", before, bad)
			}
			if l.phase() != before {
				t.Fatalf("a refused advance(%v) moved the lifecycle from %v to %v", bad, before, l.phase())
			}
		}
		for p := to; p <= phaseClosed; p++ {
			if l.entered(p).HasFired() || l.reached(p) {
				t.Fatalf("before entering %v: %v already fired or reached", to, p)
			}
		}
		if err := l.advance(to); err != nil {
			t.Fatalf("advance(%v): %v", to, err)
		}
		if l.phase() != to || !l.reached(to) {
			t.Fatalf("after advance(%v) the phase is %v", to, l.phase())
		}
		for p := phaseDraining; p <= to; p++ {
			select {
			case <-l.entered(p).Done():
			default:
				t.Fatalf("in %v, the event of entering %v has not fired", to, p)
			}
		}
		if err := l.advance(to); err == nil {
			t.Fatalf("entering %v twice was allowed", to)
		}
	}
}

// TestLifecycleReleasesWaiters: goroutines waiting for a phase are
// released when it is entered, in order, and not earlier.
func TestLifecycleReleasesWaiters(t *testing.T) {
	l := newLifecycle()
	order := make(chan phase, 3)
	var wg sync.WaitGroup
	for _, p := range []phase{phaseClosed, phaseRetired, phaseDraining} {
		wg.Go(func() {
			<-l.entered(p).Done()
			// Whoever sees the event sees the phase it led to.
			if !l.reached(p) {
				t.Errorf("released for %v in %v", p, l.phase())
			}
			order <- p
		})
	}
	for _, p := range []phase{phaseDraining, phaseRetired, phaseClosed} {
		if err := l.advance(p); err != nil {
			t.Fatal(err)
		}
		if got := <-order; got != p {
			t.Fatalf("entering %v released the waiter for %v", p, got)
		}
	}
	wg.Wait()
}

// TestLifecycleRacingAdvance: of goroutines racing the same transition,
// exactly one makes it.
func TestLifecycleRacingAdvance(t *testing.T) {
	l := newLifecycle()
	var ok atomic.Int32
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			if l.advance(phaseDraining) == nil {
				ok.Add(1)
			}
		})
	}
	wg.Wait()
	if n := ok.Load(); n != 1 || l.phase() != phaseDraining {
		t.Fatalf("%d racing advances into draining succeeded (phase %v), want 1", n, l.phase())
	}
}

func TestPhaseString(t *testing.T) {
	for p, want := range map[phase]string{phaseAttached: "attached", phaseDraining: "draining", phaseRetired: "retired", phaseClosed: "closed", 9: "phase(9)"} {
		if got := p.String(); got != want {
			t.Errorf("phase %d: %q, want %q", int32(p), got, want)
		}
	}
}
