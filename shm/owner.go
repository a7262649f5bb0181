package shm

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// This file holds the owner's words (the owner is the embedder that
// created the segment): the state word, its heartbeat, the header's mirror
// of the accelerator's words and the batch ring's tail, and the free-space
// check Create makes. The owner's handles are in requests.go
// (RequestReader), batch.go (BatchWriter) and reclaim.go (ReclaimLanes).

// Drain marks the segment draining: frontends stop submitting and move to
// the next generation while in-flight work completes. Owner only.
func (s *Segment) Drain() error {
	if !s.owner {
		return fmt.Errorf("shm: drain %s: %w", s.path, ErrNotOwner)
	}
	atomic.CompareAndSwapUint32(s.state, uint32(StateReady), uint32(StateDraining))
	return nil
}

// Beat stamps the owner heartbeat and refreshes the header's copy of the
// accelerator's liveness words. The owner calls it at least every
// DefaultHeartbeatInterval (see Heartbeat).
func (s *Segment) Beat() {
	atomic.StoreUint64(s.ownerHB, uint64(monoNow()))
	if s.owner {
		s.mirrorAccel()
	}
}

// Heartbeat beats as owner every interval (0: DefaultHeartbeatInterval)
// while pulse is Live (nil: always), until ctx is done, and returns ctx's
// error. The caller owns the goroutine that runs it.
func (s *Segment) Heartbeat(ctx context.Context, interval time.Duration, pulse *Pulse) error {
	return beatLoop(ctx, interval, pulse, s.Beat)
}

// mirrorAccel copies the accelerator's liveness words into the header,
// where frontends read them. Owner only; every beat. The state goes last,
// so a frontend that sees "running" sees the pid it belongs to.
func (s *Segment) mirrorAccel() {
	m := s.mem
	atomic.StoreUint32(word32(m, hdrAccelPid), atomic.LoadUint32(s.accelPid))
	atomic.StoreUint64(word64(m, hdrAccelPidNS), atomic.LoadUint64(s.accelPidNS))
	atomic.StoreUint64(word64(m, hdrAccelHeartbeat), atomic.LoadUint64(s.accelHB))
	atomic.StoreUint32(word32(m, hdrAccelState), atomic.LoadUint32(s.accelState))
}

// PublishedSeq is the seq of the last batch the embedder published.
func (s *Segment) PublishedSeq() uint64 { return atomic.LoadUint64(s.batchTail) }

// checkRoom refuses a reserved segment larger than the free space of its
// directory. Memfd pages are charged to the memory cgroup, not to the
// directory's filesystem, but deployments size the segment's directory
// for it (docker --shm-size, the Kubernetes emptyDir's sizeLimit): that
// stays the knob, and a segment that does not fit is an error at start
// naming it, as when the segment was a file there.
func checkRoom(dir string, z sizes, lanes int) error {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return fmt.Errorf("statfs %s: %w", dir, err)
	}
	need := int64(z.lane) * int64(lanes)
	for _, n := range z.shared {
		need += int64(n)
	}
	if st.Bavail == ^uint64(0) {
		return nil // no limit
	}
	if free := int64(st.Bavail) * st.Bsize; free < need {
		return fmt.Errorf("reserve %d bytes: %s has %d bytes free: %w", need, dir, free, unix.ENOSPC)
	}
	return nil
}
