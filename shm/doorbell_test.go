package shm

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/recmesh/recmesh/shm/sched"
)

func TestDoorbellWakesSleeper(t *testing.T) {
	s := memSegment(t, testGeometry())
	d := s.EmbedderBell()
	d.SetSpin(0) // go straight to the futex
	var flag atomic.Bool
	cond := flag.Load
	woke := make(chan bool, 1)
	go func() {
		ok, _ := d.Wait(context.Background(), cond, 10*time.Second)
		woke <- ok
	}()
	waitFor(t, 5*time.Second, "waiter registered", func() bool { return atomic.LoadUint32(d.waiters) == 1 })
	flag.Store(true)
	d.Ring()
	select {
	case ok := <-woke:
		if !ok {
			t.Fatal("Wait returned without its condition")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("sleeper not woken")
	}
	if st := d.Stats(); st.Wakes != 1 || st.Sleeps == 0 {
		t.Fatalf("stats %+v", st)
	}
	if atomic.LoadUint32(d.waiters) != 0 {
		t.Fatal("waiter count not restored")
	}
}

func TestDoorbellRingWithoutWaiterIsFree(t *testing.T) {
	s := memSegment(t, testGeometry())
	d := s.BatchBell()
	w := atomic.LoadUint32(d.word)
	for i := 0; i < 1000; i++ {
		d.Ring()
	}
	if d.Stats().Wakes != 0 || atomic.LoadUint32(d.word) != w {
		t.Fatalf("Ring without waiters made %d wake calls", d.Stats().Wakes)
	}
}

func TestDoorbellTimeoutAndCancel(t *testing.T) {
	s := memSegment(t, testGeometry())
	d := s.StagingBell()
	never := func() bool { return false }
	start := time.Now()
	ok, err := d.Wait(context.Background(), never, 20*time.Millisecond)
	if ok || err != nil || time.Since(start) < 20*time.Millisecond {
		t.Fatalf("timeout: %v %v after %v", ok, err, time.Since(start))
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		time.Sleep(5 * time.Millisecond)
		cancel()
	}()
	// The futex slice is bounded by timeout, so cancellation is seen
	// within it even without a ctx deadline.
	for {
		ok, err = d.Wait(ctx, never, 10*time.Millisecond)
		if err != nil {
			break
		}
	}
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("cancel: %v", err)
	}
	dctx, dcancel := context.WithTimeout(context.Background(), 5*time.Millisecond)
	defer dcancel()
	if _, err := d.Wait(dctx, never, time.Hour); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("deadline: %v", err)
	}
	if ok, _ := d.Wait(context.Background(), func() bool { return true }, 0); !ok {
		t.Fatal("a true condition must return at once")
	}
}

func TestSpinFor(t *testing.T) {
	if SpinFor(1) != 0 || SpinFor(SpinMinCPUs-1) != 0 {
		t.Error("waiters spin with fewer usable CPUs than the mesh has hot processes")
	}
	if SpinFor(SpinMinCPUs) != DefaultSpin || SpinFor(64) != DefaultSpin {
		t.Error("waiters do not spin with CPUs to spare")
	}
	if processSpin() != SpinFor(sched.UsableCPUs().Usable) {
		t.Error("the process's spin budget is not derived from its usable CPUs")
	}
}
