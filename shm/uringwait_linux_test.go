package shm

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// uringWaiterForTest returns a fresh waiter, skipping where the kernel or
// a seccomp profile refuses io_uring (the doorbells then use futex(2),
// which the doorbell tests cover).
func uringWaiterForTest(t *testing.T) *uringWaiter {
	t.Helper()
	w, err := newUringWaiter()
	if errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EPERM) || errors.Is(err, unix.EINVAL) {
		t.Skipf("io_uring futex waits unavailable here: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.close)
	return w
}

// sharedWord maps a one-page shared memfd, as the segment's doorbells
// are: the futex key is then the file and offset, not the address space.
func sharedWord(t *testing.T) *uint32 {
	t.Helper()
	fd, err := unix.MemfdCreate("uringwait-test", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Ftruncate(fd, 4096); err != nil {
		t.Fatal(err)
	}
	mem, err := unix.Mmap(fd, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(mem) })
	return (*uint32)(unsafe.Pointer(&mem[64]))
}

func TestUringWaiterWokenByFutexWake(t *testing.T) {
	w := uringWaiterForTest(t)
	word := sharedWord(t)
	done := make(chan time.Duration, 1)
	go func() {
		start := time.Now()
		if err := w.sleep(word, 0, time.Minute); err != nil {
			t.Error(err)
		}
		done <- time.Since(start)
	}()
	// The ringer's side is unchanged: bump the word, then futex wake.
	// Until the wait is armed a wake finds nobody, so keep ringing; the
	// word no longer holds 0 then, and arming returns at once.
	atomic.AddUint32(word, 1)
	for {
		futexWakeAll(word)
		select {
		case took := <-done:
			if took >= time.Minute {
				t.Fatalf("sleep ran to its timeout (%v) though woken", took)
			}
			return
		case <-time.After(10 * time.Millisecond):
		}
	}
}

func TestUringWaiterReturnsAtOnceWhenWordMoved(t *testing.T) {
	w := uringWaiterForTest(t)
	word := sharedWord(t)
	atomic.StoreUint32(word, 7)
	start := time.Now()
	if err := w.sleep(word, 6, time.Minute); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took >= time.Minute {
		t.Fatalf("sleep on a stale value waited %v", took)
	}
}

// TestUringWaiterTimeoutLeavesNothingArmed checks that a sleep that times
// out withdraws its wait: a wake issued afterwards must not end the next
// sleep, which waits on a value the word still holds.
func TestUringWaiterTimeoutLeavesNothingArmed(t *testing.T) {
	w := uringWaiterForTest(t)
	word := sharedWord(t)
	const short = 30 * time.Millisecond
	start := time.Now()
	if err := w.sleep(word, 0, short); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < short {
		t.Fatalf("sleep returned after %v, before its %v timeout, unwoken", took, short)
	}
	atomic.AddUint32(word, 1)
	futexWakeAll(word) // nobody waits: must leave no completion behind
	start = time.Now()
	if err := w.sleep(word, 1, short); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < short {
		t.Fatalf("second sleep returned after %v: a stale completion woke it", took)
	}
	if res, done := w.reap(); done {
		t.Fatalf("a completion (%d) was left in the ring", res)
	}
}

// TestDoorbellSleepsThroughUring checks that a doorbell's sleep takes the
// io_uring path wherever the kernel offers it, and returns its waiter to
// the pool for the next sleep.
func TestDoorbellSleepsThroughUring(t *testing.T) {
	uringWaiterForTest(t) // skips where io_uring is unavailable
	if !uringWaitAllowed() {
		t.Skipf("%s=off", UringWaitEnv)
	}
	s := memSegment(t, testGeometry())
	d := s.EmbedderBell()
	d.SetSpin(0)
	never := func() bool { return false }
	if ok, err := d.Wait(t.Context(), never, 20*time.Millisecond); ok || err != nil {
		t.Fatalf("Wait = %v, %v; want a timeout", ok, err)
	}
	if d.Stats().Sleeps == 0 {
		t.Fatal("Wait did not sleep")
	}
	p := &uringWaiters
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.failed || len(p.idle) == 0 {
		t.Fatalf("the sleep did not go through io_uring (failed %v, idle waiters %d)", p.failed, len(p.idle))
	}
}
