package shm

import (
	"context"
	"fmt"
	"math/bits"
	"sync/atomic"
	"time"
)

// This file holds the accelerator's words: its pid, state and heartbeat
// (in the accelerator page, mirrored into the header for frontends), the
// batch seqs it has executed and completed, and the execution time table
// the embedder plans batches with (a counters record, counters.go). The accelerator's handles are in
// batch.go (BatchReader) and requests.go (CompletionWriter).

// ExecEstimate is one bucket's expected execution time (SetExecTime).
type ExecEstimate struct {
	Bucket int
	Time   time.Duration
}

// SetAccelerator records pid as the segment's accelerator. It fails with
// ErrAcceleratorPresent while another live accelerator holds the segment;
// a dead or detached one is replaced. The execution time estimates are
// published before the accelerator shows as running, so the embedder's
// first batch after it is planned with them.
func (s *Segment) SetAccelerator(pid int, exec ...ExecEstimate) error {
	// An attacher first needs the accelerator's memory from the broker,
	// which refuses while a live accelerator holds the segment.
	if s.cl != nil {
		if err := s.becomeAccelerator(pid); err != nil {
			return err
		}
	}
	cur := atomic.LoadUint32(s.accelPid)
	if cur != 0 && cur != uint32(pid) && atomic.LoadUint32(s.accelState) == accelRunning &&
		s.peerAlive(cur, atomic.LoadUint64(s.accelPidNS), atomic.LoadUint64(s.accelHB), 0, linkAccel) == nil {
		return fmt.Errorf("shm: %s: %w: pid %d", s.path, ErrAcceleratorPresent, cur)
	}
	if !atomic.CompareAndSwapUint32(s.accelPid, cur, uint32(pid)) {
		return fmt.Errorf("shm: %s: %w: lost the race to attach", s.path, ErrAcceleratorPresent)
	}
	// The accelerator is the batch doorbell's only waiter; a predecessor
	// killed in its sleep left its registration behind.
	s.batchBell.reset()
	// Namespace and heartbeat before the state, so a frontend that sees
	// "running" judges a fresh heartbeat.
	atomic.StoreUint64(s.accelPidNS, s.pidNS)
	for _, e := range exec {
		s.SetExecTime(e.Bucket, e.Time)
	}
	s.AcceleratorBeat()
	atomic.StoreUint32(s.accelState, accelRunning)
	s.isAccel.Store(true)
	return nil
}

// DetachAccelerator marks the accelerator gone after a clean shutdown, so
// frontends fail in-flight work at once instead of waiting for staleness.
// Close does it for a process that called SetAccelerator.
func (s *Segment) DetachAccelerator() {
	if s.isAccel.CompareAndSwap(true, false) {
		atomic.StoreUint32(s.accelState, accelGone)
	}
}

// AcceleratorBeat stamps the accelerator heartbeat.
func (s *Segment) AcceleratorBeat() { atomic.StoreUint64(s.accelHB, uint64(monoNow())) }

// AcceleratorHeartbeat beats as accelerator every interval while pulse is
// Live (nil: always) until ctx is done, and returns ctx's error.
func (s *Segment) AcceleratorHeartbeat(ctx context.Context, interval time.Duration, pulse *Pulse) error {
	return beatLoop(ctx, interval, pulse, s.AcceleratorBeat)
}

// AcceleratorAlive returns nil while an accelerator is running and alive,
// an error wrapping ErrNoAccelerator before one has attached, and an error
// wrapping ErrAcceleratorDead when it detached, exited or stopped beating.
func (s *Segment) AcceleratorAlive(staleAfter time.Duration) error {
	switch st := atomic.LoadUint32(s.accelState); st {
	case accelNone:
		return fmt.Errorf("shm: %s: %w", s.path, ErrNoAccelerator)
	case accelGone:
		return fmt.Errorf("shm: %s: %w: detached", s.path, ErrAcceleratorDead)
	case accelRunning:
	default:
		return fmt.Errorf("shm: %s: %w: accelerator state %d", s.path, ErrCorrupt, st)
	}
	pid := atomic.LoadUint32(s.accelPid)
	if err := s.peerAlive(pid, atomic.LoadUint64(s.accelPidNS), atomic.LoadUint64(s.accelHB), staleAfter, linkAccel); err != nil {
		return fmt.Errorf("shm: %s: %w: pid %d %v", s.path, ErrAcceleratorDead, pid, err)
	}
	return nil
}

// SetExecTime publishes the accelerator's expected execution time of a
// power-of-two bucket (0: unknown), an estimate of the execution
// estimates record (counters.go). Buckets beyond the table are ignored.
func (s *Segment) SetExecTime(bucket int, d time.Duration) {
	if i, ok := execIndex(bucket); ok {
		writeEstimate(s.exec, i, d)
	}
}

// ExecTime is the expected execution time of a power-of-two bucket, 0 when
// the accelerator has not published one. The words are read from shared
// memory another process writes, so a value is only ever a prediction:
// callers bound what they do with it. A word that is no duration reads 0.
func (s *Segment) ExecTime(bucket int) time.Duration {
	if i, ok := execIndex(bucket); ok {
		return readEstimate(s.exec, i)
	}
	return 0
}

func execIndex(bucket int) (int, bool) {
	if bucket < 1 || bucket&(bucket-1) != 0 {
		return 0, false
	}
	i := bits.TrailingZeros(uint(bucket))
	return i, i < ExecTableBuckets
}

// CompletedSeq is the seq of the last batch the accelerator finished.
func (s *Segment) CompletedSeq() uint64 { return atomic.LoadUint64(s.completed) }

// ExecutedSeq is the seq of the last batch the device finished executing
// (BatchReader.Executed); its completions may still be being written. At
// least CompletedSeq.
func (s *Segment) ExecutedSeq() uint64 {
	return max(atomic.LoadUint64(s.executed), atomic.LoadUint64(s.completed))
}

// useAccelPage points the accelerator's words at the accelerator page,
// where the accelerator writes them: the owner's and the accelerator's
// view.
func (s *Segment) useAccelPage() { s.pointAccel(s.lay.accel) }

// useAccelMirror points them at the header's copy, the only one a
// frontend maps.
func (s *Segment) useAccelMirror() { s.pointAccel(0) }

func (s *Segment) pointAccel(base int) {
	s.accelPid = word32(s.mem, base+hdrAccelPid)
	s.accelState = word32(s.mem, base+hdrAccelState)
	s.accelPidNS = word64(s.mem, base+hdrAccelPidNS)
	s.accelHB = word64(s.mem, base+hdrAccelHeartbeat)
}
