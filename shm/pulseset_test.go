package shm

import (
	"sync"
	"testing"
	"time"
)

// TestPulseSet: an empty set is live, one stalled loop makes it not live,
// and forgetting that loop makes it live again.
func TestPulseSet(t *testing.T) {
	const gap = 20 * time.Millisecond
	var s PulseSet
	if !s.Live(gap) {
		t.Fatal("an empty set is not live")
	}
	stalled, ticking := NewPulse(), NewPulse()
	s.Add(stalled)
	s.Add(ticking)
	time.Sleep(2 * gap)
	ticking.Tick()
	if s.Live(gap) {
		t.Error("live with a loop that missed its gap")
	}
	s.Remove(stalled)
	if !s.Live(gap) {
		t.Error("not live once the stalled loop was removed")
	}
}

// TestPulseSetConcurrent registers, removes and reads from several
// goroutines at once, for the race detector.
func TestPulseSetConcurrent(t *testing.T) {
	var s PulseSet
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 100 {
				p := NewPulse()
				s.Add(p)
				s.Live(0)
				s.Remove(p)
			}
		}()
	}
	wg.Wait()
	if !s.Live(0) {
		t.Fatal("not live once every loop was removed")
	}
}
