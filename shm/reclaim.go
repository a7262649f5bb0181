package shm

import (
	"fmt"
	"sync/atomic"
	"time"
)

// ReclaimStats says what one ReclaimLanes pass did.
type ReclaimStats struct {
	Draining int // lanes that started draining in this pass
	Freed    int // lanes freed in this pass
	Owned    int // lanes owned by live frontends after the pass
}

// ReclaimLanes is the embedder's lane janitor; run it every heartbeat or
// so. A lane is reclaimed when its frontend released it with work in flight,
// or its owner pid has exited (checked when it shares the embedder's pid
// namespace), or its heartbeat is older than staleAfter (0:
// DefaultLaneStaleAfter).
//
// Reclaim has two steps. First the lane is marked draining: the frontend's
// handle sees ErrLaneLost, RequestReader stops returning its requests, its
// unread requests are dropped, and the reclaimer notes the last batch that
// may carry its work (the published seq, plus one per staging buffer being
// filled). Then, once the accelerator's completed seq reaches that batch,
// or nothing at all is in flight, no batch can still write into its arena:
// the completion ring is emptied, the epoch bumped, and the owner word set
// to 0 last, which makes the lane claimable.
//
// Call it from the goroutine that reads requests and publishes batches (or
// while that goroutine is between batches): then no request read before the
// lane was marked can reach a batch the reclaimer did not count. Owner only.
func (s *Segment) ReclaimLanes(staleAfter time.Duration) (ReclaimStats, error) {
	var st ReclaimStats
	if !s.owner {
		return st, fmt.Errorf("shm: reclaim lanes in %s: %w", s.path, ErrNotOwner)
	}
	if staleAfter <= 0 {
		staleAfter = DefaultLaneStaleAfter
	}
	for i := 0; i < s.geo.Lanes; i++ {
		c := s.lane(i)
		owner := atomic.LoadUint32(c.owner)
		if owner == noOwner {
			continue
		}
		switch ls := atomic.LoadUint32(c.state); ls {
		case laneFree, laneActive:
			// Free with an owner is a claim (or fast release) in progress:
			// judge the claimer like any owner.
			if s.peerAlive(owner, atomic.LoadUint64(c.pidNS), atomic.LoadUint64(c.heartbeat), staleAfter, linkNone) == nil {
				st.Owned++
				continue
			}
			if s.beginDrain(c, ls) {
				st.Draining++
			}
		case laneDraining:
		default: // releasing, or a state word no code writes
			if s.beginDrain(c, ls) {
				st.Draining++
			}
		}
		if atomic.LoadUint32(c.state) == laneDraining && s.drained(c) {
			s.finishDrain(c)
			st.Freed++
		}
	}
	return st, nil
}

// EvictLane starts reclaiming lane i whatever its owner's liveness: for a
// lane whose rings failed validation. ReclaimLanes finishes the job. Owner
// only.
func (s *Segment) EvictLane(i int) error {
	if !s.owner {
		return fmt.Errorf("shm: evict lane %d in %s: %w", i, s.path, ErrNotOwner)
	}
	if err := s.checkLaneIndex(i); err != nil {
		return err
	}
	c := s.lane(i)
	if atomic.LoadUint32(c.owner) == noOwner {
		return nil
	}
	if ls := atomic.LoadUint32(c.state); ls != laneDraining {
		s.beginDrain(c, ls)
	}
	return nil
}

// beginDrain moves lane c from state from to draining and drops its unread
// requests. It reports false if the state changed under it (the frontend
// released the lane meanwhile; the next pass sees the new state).
func (s *Segment) beginDrain(c *laneCtl, from uint32) bool {
	atomic.StoreUint64(c.drainSeq, s.PublishedSeq()+uint64(s.stagingCount(stagingFilling)))
	if !atomic.CompareAndSwapUint32(c.state, from, laneDraining) {
		return false
	}
	r := s.requestRing(c)
	r.drop()
	return true
}

// drained reports whether no batch can still reference lane c's arena.
func (s *Segment) drained(c *laneCtl) bool {
	completed := s.CompletedSeq()
	if completed >= atomic.LoadUint64(c.drainSeq) {
		return true
	}
	// Nothing in flight at all: every published batch is done and no
	// buffer is being filled or waiting for the accelerator.
	return s.stagingCount(stagingFilling) == 0 && s.stagingCount(stagingReady) == 0 &&
		completed >= s.PublishedSeq()
}

// finishDrain frees a drained lane. The owner word is cleared last: until
// then no frontend can claim the lane.
func (s *Segment) finishDrain(c *laneCtl) {
	req, compl := s.requestRing(c), s.completionRing(c)
	req.drop()
	compl.drop()
	c.bell.reset()
	atomic.AddUint32(c.epoch, 1)
	atomic.StoreUint64(c.heartbeat, 0)
	atomic.StoreUint64(c.pidNS, 0)
	atomic.StoreUint64(c.drainSeq, 0)
	atomic.StoreUint32(c.state, laneFree)
	atomic.StoreUint32(c.owner, noOwner)
}

// stagingCount counts staging buffers in state want.
func (s *Segment) stagingCount(want uint32) int {
	n := 0
	for i := range s.staging {
		if atomic.LoadUint32(s.staging[i].state) == want {
			n++
		}
	}
	return n
}

// LaneInfo is a snapshot of one lane for status pages and tests.
type LaneInfo struct {
	Index  int
	Owner  int // pid; 0 when free
	Epoch  uint32
	State  string // free, active, releasing, draining, or invalid(n)
	Queued int    // requests published but not yet read
}

// Lanes returns a snapshot of every lane.
func (s *Segment) Lanes() []LaneInfo {
	out := make([]LaneInfo, s.geo.Lanes)
	for i := range out {
		c := s.lane(i)
		r := s.requestRing(c)
		q := atomic.LoadUint64(r.tail) - atomic.LoadUint64(r.head)
		if q > r.cap {
			q = 0
		}
		out[i] = LaneInfo{
			Index:  i,
			Owner:  int(atomic.LoadUint32(c.owner)),
			Epoch:  atomic.LoadUint32(c.epoch),
			State:  laneStateName(atomic.LoadUint32(c.state)),
			Queued: int(q),
		}
	}
	return out
}

func laneStateName(s uint32) string {
	switch s {
	case laneFree:
		return "free"
	case laneActive:
		return "active"
	case laneReleasing:
		return "releasing"
	case laneDraining:
		return "draining"
	}
	return fmt.Sprintf("invalid(%d)", s)
}
