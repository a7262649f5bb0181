package shm

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/recmesh/recmesh/shm/sched"
)

// Doorbell wakes a consumer in another process. It is a 32-bit futex word
// and a waiter count in shared memory (see the doorbell block in layout.go).
//
// The consumer waits adaptively: it spins on its condition for a bounded
// time, which catches replies already on their way at no syscall cost, then
// registers as a waiter and sleeps on the futex. The producer calls Ring
// after publishing; Ring costs one atomic load unless a waiter is
// registered, and only then bumps the word and makes the wake syscall.
//
// No wake-up is lost: Go's atomics are sequentially consistent, the waiter
// increments the count before its last look at the condition, and the
// producer publishes before it reads the count. Either the producer sees
// the waiter and wakes it, or the waiter's last look sees the publication.
//
// A Doorbell handle is safe for concurrent use.
type Doorbell struct {
	word    *uint32
	waiters *uint32
	spin    atomic.Int64 // spin budget in ns
	wakes   atomic.Uint64
	sleeps  atomic.Uint64
}

// DoorbellStats counts this handle's slow paths.
type DoorbellStats struct {
	Wakes  uint64 // wake syscalls issued by Ring
	Sleeps uint64 // futex sleeps entered by Wait
}

func newDoorbell(mem []byte, off int) *Doorbell {
	return newSplitDoorbell(mem, off+bellWord, off+bellWaiters)
}

// newSplitDoorbell keeps the futex word and the waiter count apart: the
// embedder doorbell's word is bumped by frontends, which may write only
// the bell page, while its count, which ringers trust to decide whether
// to wake, is written by the embedder alone and lives in the header.
func newSplitDoorbell(mem []byte, wordOff, waitersOff int) *Doorbell {
	d := &Doorbell{word: word32(mem, wordOff), waiters: word32(mem, waitersOff)}
	d.spin.Store(int64(processSpin()))
	return d
}

// processSpin is the spin budget of this process's waiters, derived once
// from the CPUs it may use (SpinFor): the affinity mask and cgroup quota do
// not change under a running mesh process, and reading them per doorbell
// would cost a syscall per lane.
var processSpin = sync.OnceValue(func() time.Duration { return SpinFor(sched.UsableCPUs().Usable) })

// SpinMinCPUs is the fewest usable CPUs at which waiters spin before they
// sleep. A mesh has three hot processes (a frontend, the embedder, the
// accelerator) besides its clients: with fewer CPUs than that and one to
// spare, a waiter that spins takes the core from the process whose work it
// is waiting for, so it sleeps on the futex at once.
const SpinMinCPUs = 4

// SpinFor is the spin budget for a process that may use cpus CPUs:
// DefaultSpin with SpinMinCPUs or more, none below.
func SpinFor(cpus int) time.Duration {
	if cpus >= SpinMinCPUs {
		return DefaultSpin
	}
	return 0
}

// SetSpin sets how long Wait spins before it sleeps (0: sleep at once).
func (d *Doorbell) SetSpin(spin time.Duration) { d.spin.Store(int64(spin)) }

// Ring wakes the waiters, if any. Call it after the release store that
// published the work.
func (d *Doorbell) Ring() {
	if atomic.LoadUint32(d.waiters) == 0 {
		return
	}
	atomic.AddUint32(d.word, 1)
	futexWakeAll(d.word)
	d.wakes.Add(1)
}

// Wait returns (true, nil) as soon as cond reports true, (false, nil) once
// timeout has passed without it, and (false, ctx.Err()) when ctx is done.
// It spins for the handle's spin budget, then sleeps on the futex in slices
// no longer than the time left, so a cancelled ctx without a deadline is
// noticed within timeout. cond must be cheap and must not block; a method
// value stored once keeps Wait allocation-free.
func (d *Doorbell) Wait(ctx context.Context, cond func() bool, timeout time.Duration) (bool, error) {
	if cond() {
		return true, nil
	}
	start := time.Now()
	done := ctx.Done()
	if spin := time.Duration(d.spin.Load()); spin > 0 {
		for i := 1; ; i++ {
			if cond() {
				return true, nil
			}
			// Reading the clock every iteration would dominate a
			// sub-microsecond spin. There is deliberately no
			// runtime.Gosched here: it parks this goroutine on the global
			// run queue, where it can wait a whole preemption slice
			// (10 ms) behind a busy goroutine; the spin is short, and the
			// scheduler preempts it if another goroutine needs the P.
			if i%128 == 0 {
				if el := time.Since(start); el >= spin || el >= timeout {
					break
				}
				select {
				case <-done:
					return false, ctx.Err()
				default:
				}
			}
		}
	}
	for {
		select {
		case <-done:
			return false, ctx.Err()
		default:
		}
		left := timeout - time.Since(start)
		if dl, ok := ctx.Deadline(); ok {
			left = min(left, time.Until(dl))
		}
		if left <= 0 {
			return cond(), nil
		}
		atomic.AddUint32(d.waiters, 1)
		seq := atomic.LoadUint32(d.word)
		if cond() {
			atomic.AddUint32(d.waiters, ^uint32(0))
			return true, nil
		}
		d.sleeps.Add(1)
		sleepOn(d.word, seq, left)
		atomic.AddUint32(d.waiters, ^uint32(0))
		if cond() {
			return true, nil
		}
	}
}

// Stats returns this handle's counters.
func (d *Doorbell) Stats() DoorbellStats {
	return DoorbellStats{Wakes: d.wakes.Load(), Sleeps: d.sleeps.Load()}
}

// reset clears a waiter count that a killed waiter left behind. Only the
// reclaimer calls it, for a lane whose only waiter (its frontend) is gone.
func (d *Doorbell) reset() { atomic.StoreUint32(d.waiters, 0) }
