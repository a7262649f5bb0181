package shmbackend

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"

	"github.com/recmesh/recmesh/frontend"
	"github.com/recmesh/recmesh/shm"
)

// attachment is one claimed lane of one generation, and its lifecycle.
type attachment struct {
	b     *Backend
	seg   *shm.Segment
	lane  *shm.Lane
	ino   uint64
	slots []slotHandle
	life  *lifecycle
	// refs counts what needs the mapping: slots the lane has not freed
	// (one released in flight stays until its completion is read, or the
	// lane is lost) and pins. It is closedRefs once the segment is
	// unmapped.
	refs atomic.Int64
	// idle gets a token when refs drops to zero after draining began: the
	// owner waits on it for the last slot to come back.
	idle chan struct{} // cap 1
	// accel says an accelerator is attached and alive, refreshed by the
	// manager every check, so Acquire refuses work nobody would run without
	// a syscall per request.
	accel atomic.Bool
	// The owner's inputs: drainReq from the manager (a newer generation
	// serves, or this one never got an accelerator); lost from whoever
	// finds the generation unusable (a loop, a fault, the backend
	// closing), with the first reason in lostErr.
	drainReq *event
	lost     *event
	lostErr  atomic.Pointer[error]
	// loops runs the heartbeat and the completion reader; the mapping is
	// unmapped only after they returned, or they would fault.
	loops sync.WaitGroup
}

// errClosing ends the attachments of a backend being closed.
var errClosing = fmt.Errorf("shmbackend: backend closed: %w", frontend.ErrUnavailable)

// attach claims a lane in the generation at the segment's path and starts
// the attachment's owner goroutine.
func (b *Backend) attach() (*attachment, error) {
	path := b.Path()
	// Any model id: a rollout switches models under the frontend. The
	// request layout is fixed by the DLRMv2 contract, and the embedder
	// bounds-checks every id against its own tables.
	seg, err := shm.Attach(path, shm.AttachOptions{OwnerUID: b.opts.OwnerUID})
	if err != nil {
		return nil, err
	}
	var lane *shm.Lane
	accel := false
	err = shm.GuardFaults(func() error {
		// A generation whose accelerator died is being replaced: claiming
		// a lane in it would only fail again.
		if err := seg.PeersAlive(); err != nil {
			return err
		}
		var err error
		if lane, err = seg.ClaimLane(os.Getpid()); err != nil {
			return err
		}
		accel = seg.AcceleratorAlive(0) == nil
		return nil
	})
	if err != nil {
		seg.Close()
		return nil, err
	}
	ino, _ := shm.FileIdentity(path)
	a := &attachment{b: b, seg: seg, lane: lane, ino: ino, life: newLifecycle(), idle: make(chan struct{}, 1),
		drainReq: newEvent(), lost: newEvent()}
	a.slots = make([]slotHandle, seg.Geometry().SlotsPerLane)
	for i := range a.slots {
		a.slots[i] = slotHandle{a: a, index: i, status: make(chan shm.Status, 1)}
	}
	a.accel.Store(accel)
	go a.run()
	return a, nil
}

// run is the attachment's owner: the one goroutine that moves it through
// its phases. Each phase ends on an event or a channel, never on a poll.
func (a *attachment) run() {
	ctx, stopLoops := context.WithCancel(context.Background())
	defer stopLoops()
	a.startLoops(ctx)

	// Attached: serve until a newer generation takes over or this one is
	// lost.
	select {
	case <-a.drainReq.Done():
	case <-a.lost.Done():
	}
	a.enter(phaseDraining)

	// Draining: Acquire refuses new calls; the ones in flight complete
	// here, unless the generation is lost under them.
	for a.refs.Load() > 0 && !a.lost.HasFired() {
		select {
		case <-a.idle:
		case <-a.lost.Done():
		}
	}
	// Stop the loops first: a loop that finds the lane given back would
	// take a drain for a loss. Then give the lane back; after a loss work
	// may still be in it, and the embedder frees the lane once no batch can
	// write there any more.
	stopLoops()
	_ = shm.GuardFaults(a.lane.Release)
	// Retired before the loops have returned: calls still waiting (after a
	// loss) move to the next generation now, not a liveness tick later.
	a.enter(phaseRetired)
	a.loops.Wait()
	a.dropInFlight()

	// Retired: wait for the calls still holding slots (Submit returned on
	// retired) and for pins, then unmap. The CAS makes any later Acquire
	// or pin see a closed attachment.
	for !a.refs.CompareAndSwap(0, closedRefs) {
		<-a.idle
	}
	if err := a.seg.Close(); err != nil {
		a.b.log.Debug("close segment", "generation", a.seg.Generation(), "err", err)
	}
	a.enter(phaseClosed)
}

// enter advances the lifecycle. Only run calls it, in order, so it cannot
// fail; an error would be a bug worth a loud log, not a crash.
func (a *attachment) enter(p phase) {
	if err := a.life.advance(p); err != nil {
		a.b.log.Error("lane lifecycle", "generation", a.seg.Generation(), "err", err)
		return
	}
	a.b.log.Debug("lane "+p.String(), "generation", a.seg.Generation(), "lane", a.lane.Index())
}

// startLoops starts the heartbeat and the completion reader; both run
// until ctx is done or the generation is lost.
func (a *attachment) startLoops(ctx context.Context) {
	a.loops.Add(2)
	// Both loops touch the mapping: a fault (the segment file truncated
	// under it) loses this generation, and the manager attaches anew.
	go func() {
		defer a.loops.Done()
		err := shm.GuardFaults(func() error { return a.lane.Heartbeat(ctx, 0) })
		if err != nil && ctx.Err() == nil {
			a.lose(err)
		}
	}()
	go func() {
		defer a.loops.Done()
		if err := shm.GuardFaults(func() error { return a.readCompletions(ctx) }); err != nil {
			a.lose(err)
		}
	}()
}

// drain asks the owner to stop taking calls and retire the attachment once
// the calls in flight are done.
func (a *attachment) drain() { a.drainReq.Fire() }

// lose tells the owner that nothing more will complete on this attachment:
// calls waiting on it move to the next generation.
func (a *attachment) lose(err error) {
	if !a.lostErr.CompareAndSwap(nil, &err) {
		return
	}
	if !errors.Is(err, errClosing) {
		a.b.log.Warn("lane failed", "generation", a.seg.Generation(), "err", err)
	}
	a.lost.Fire()
}

// serving reports whether new calls may go to a: attached, with an
// accelerator.
func (a *attachment) serving() bool {
	return a.life.phase() == phaseAttached && a.accel.Load()
}

// closedRefs marks an unmapped attachment's reference count: an Acquire or
// pin that races the close sees a negative count and backs off.
const closedRefs = -1 << 40

// pin takes a reference that keeps a mapped; false once a is closed.
// Release it with release.
func (a *attachment) pin() bool {
	if a.refs.Add(1) > 0 {
		return true
	}
	a.refs.Add(-1)
	return false
}

// release drops a reference. The last one after draining began wakes the
// owner.
func (a *attachment) release() {
	n := a.refs.Add(-1)
	if n == 0 && a.life.reached(phaseDraining) {
		select {
		case a.idle <- struct{}{}:
		default: // a token is already waiting
		}
	}
	if n < 0 && n > closedRefs/2 {
		// More releases than references: a bug, never a client's doing.
		// Left alone, every later pin would fail and the frontend would
		// answer UNAVAILABLE until restarted; losing the attachment
		// makes the manager attach anew instead.
		a.b.log.Error("lane reference count went negative", "generation", a.seg.Generation(), "refs", n)
		a.lose(errors.New("shmbackend: lane reference count went negative"))
	}
}

// slotFreed drops the reference of a slot the lane just freed and tells
// Acquire there is room. The lane reports each freed slot exactly once,
// to whichever party dropped its last claim (slot.go, readCompletions,
// dropInFlight), and that party calls this.
func (a *attachment) slotFreed() {
	a.release()
	a.b.signalFreed()
}

// dropInFlight ends the flight of every slot once the completion reader
// has stopped: their completions will never be read. The lane frees a
// slot whose holder has released it here; one still held is freed by its
// holder's Release.
func (a *attachment) dropInFlight() {
	for n := a.lane.DropInFlight(); n > 0; n-- {
		a.slotFreed()
	}
}

// maxBadCompletions is how many corrupt or stale completions in a row a
// lane tolerates before it is abandoned for a new attachment.
const maxBadCompletions = 8

// readCompletions delivers completions to waiting calls; the lane itself
// frees the slots of calls that gave up. It is the lane's only completion
// consumer.
// It returns nil once ctx is done (the owner stopped it), or the error
// that makes the lane unusable.
func (a *attachment) readCompletions(ctx context.Context) error {
	bad := 0 // bad completions in a row
	for {
		c, err := a.lane.WaitCompletion(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, shm.ErrCorrupt) || errors.Is(err, shm.ErrStaleEpoch) {
				// One bad entry is dropped; a ring that keeps yielding
				// them (a corrupt counter does, without ever advancing)
				// is given up rather than spun on.
				if bad++; bad <= maxBadCompletions {
					a.b.log.Warn("dropped a bad completion", "err", err)
					continue
				}
				err = fmt.Errorf("%d bad completions in a row, the lane's completion ring is unusable: %w", bad, err)
			}
			return err
		}
		bad = 0
		switch {
		case c.Freed:
			// Its caller gave up and released the slot: the lane freed it.
			a.slotFreed()
		case c.Abandoned:
			// Its caller gave up but holds the slot: its Release frees it.
		case c.Slot >= 0 && c.Slot < len(a.slots): // the lane checked it; never trust an index twice
			// Delivered once per Submit into a buffer of one, which
			// Acquire empties: this never blocks.
			a.slots[c.Slot].status <- c.Status
		}
	}
}
