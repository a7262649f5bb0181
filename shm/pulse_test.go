package shm

import (
	"context"
	"sync/atomic"
	"testing"
	"time"
)

func TestPulse(t *testing.T) {
	p := NewPulse()
	if !p.Live(50 * time.Millisecond) {
		t.Fatal("a new pulse is not live")
	}
	time.Sleep(80 * time.Millisecond)
	if p.Live(50 * time.Millisecond) {
		t.Error("live 80 ms after its last tick with a 50 ms gap")
	}
	if d := p.Stalled(50 * time.Millisecond); d <= 0 {
		t.Errorf("Stalled = %v after missing the gap", d)
	}
	p.Expect(200 * time.Millisecond)
	time.Sleep(80 * time.Millisecond)
	if !p.Live(50 * time.Millisecond) {
		t.Error("not live inside a long step's allowance")
	}
	p.Tick()
	time.Sleep(80 * time.Millisecond)
	if p.Live(50 * time.Millisecond) {
		t.Error("Tick did not end the long step's allowance")
	}
}

// TestStuckLoopStopsHeartbeat: with a pulse, the owner's heartbeat stops
// when the loop it stands for stops ticking, and a peer's liveness check
// then fails; it resumes once the loop ticks again.
func TestStuckLoopStopsHeartbeat(t *testing.T) {
	owner := newQuietSegment(t, testGeometry())
	peer := attachTest(t, owner)
	age := func() time.Duration { return time.Duration(monoNow() - int64(atomic.LoadUint64(peer.ownerHB))) }
	pulse := NewPulse()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- owner.Heartbeat(ctx, 5*time.Millisecond, pulse) }()
	defer func() { cancel(); <-done }()

	// A live loop: ticks keep the heartbeat young.
	deadline := time.Now().Add(400 * time.Millisecond)
	for time.Now().Before(deadline) {
		pulse.Tick()
		time.Sleep(5 * time.Millisecond)
	}
	if age := age(); age > 100*time.Millisecond {
		t.Fatalf("heartbeat %v old while the loop ticks", age)
	}
	// The loop stops: after the gap, beats stop and the heartbeat ages.
	waitFor(t, 2*time.Second, "the heartbeat to stop", func() bool {
		return age() > DefaultPulseGap/2
	})
	// The process is alive (this one), yet its peers declare it hung:
	// after DefaultHungAfter when its threads sleep, DefaultStarvedAfter
	// at the latest when one of this test's threads happens to run.
	waitFor(t, DefaultStarvedAfter+2*time.Second, "the owner declared hung", func() bool {
		return peer.OwnerAlive(0) != nil
	})
	pulse.Tick()
	waitFor(t, 2*time.Second, "the heartbeat to resume", func() bool {
		return age() < 50*time.Millisecond
	})
}
