// Package shmbackend is the production frontend.Backend: a lane of the
// mesh's shared-memory segment. It attaches to the embedder's current
// generation, claims a lane, writes each request straight into a lane slot,
// and waits for the accelerator's completion. When the embedder or the
// accelerator dies it fails in-flight calls with UNAVAILABLE at once and
// re-attaches to the next generation by itself; when a new generation
// replaces the current one (a model rollout), new calls go to it while the
// old lane drains.
//
// Each attachment to a generation is one state machine, attached →
// draining → retired → closed (see phase), driven by one owner goroutine;
// every transition is an event that calls and the manager select on. The
// manager goroutine owns the attachments: it makes them, tells the current
// one to drain when a newer generation serves, and on Close waits until
// every one of them is closed.
package shmbackend

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/recmesh/recmesh/frontend"
	"github.com/recmesh/recmesh/model"
	"github.com/recmesh/recmesh/shm"
)

// Defaults for Options.
const (
	DefaultSegment = shm.DefaultSegment
	// DefaultFullWait is how long Acquire waits for lane room before it
	// answers ErrFull (RESOURCE_EXHAUSTED): long enough to ride out a burst,
	// short against any client deadline.
	DefaultFullWait = 2 * time.Millisecond
	// checkInterval is how often the manager looks for a new generation
	// and rechecks that the current one has an accelerator. Both are words
	// other processes write (the file at the segment's path, the segment's
	// state and accelerator words) with no doorbell a frontend sleeps on,
	// so they are polled; Options.Notify wakes the manager sooner.
	checkInterval = 50 * time.Millisecond
)

// Options configure a Backend.
type Options struct {
	ShmDir, Segment string
	// OwnerUID is the embedder's uid when this frontend runs as another
	// user (shm.AttachOptions.OwnerUID); 0: this process's own.
	OwnerUID int
	// Model is the served model's config (request layout, model id).
	Model    model.Config
	FullWait time.Duration
	// LatencyTarget is a call's end-to-end budget. Each call served is
	// counted in its lane, and whether it missed the target, so the
	// embedder's SLO batching can correct its plans. Zero: count no miss.
	LatencyTarget time.Duration
	Log           *slog.Logger
	// Notify, when non-nil, wakes the manager at once (the control plane
	// sends on it when the embedder announces a new generation).
	Notify <-chan struct{}
}

// Backend implements frontend.Backend over shared-memory lanes.
type Backend struct {
	opts   Options
	cfg    model.Config
	log    *slog.Logger
	nextID atomic.Uint64

	// cur is the attachment new calls go to; only the manager sets it.
	cur atomic.Pointer[attachment]
	// changed fires, and is replaced, whenever cur or its accelerator's
	// presence changes: calls moving off a lost generation wait on it.
	changed atomic.Pointer[event]
	freed   chan struct{} // a slot was freed somewhere (cap 1)
	cancel  context.CancelFunc
	done    chan struct{}
	closed  atomic.Bool
}

// New starts the manager goroutine that attaches to the segment; Ready
// turns true once a lane is claimed and an accelerator is attached.
func New(opts Options) (*Backend, error) {
	if err := opts.Model.Validate(); err != nil {
		return nil, fmt.Errorf("shmbackend: %w", err)
	}
	if opts.ShmDir == "" {
		opts.ShmDir = shm.DefaultDir
	}
	if opts.Segment == "" {
		opts.Segment = DefaultSegment
	}
	if opts.FullWait <= 0 {
		opts.FullWait = DefaultFullWait
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	b := &Backend{opts: opts, cfg: opts.Model, log: opts.Log, freed: make(chan struct{}, 1), cancel: cancel, done: make(chan struct{})}
	b.changed.Store(newEvent())
	go b.manage(ctx)
	return b, nil
}

// Path is the segment file.
func (b *Backend) Path() string { return filepath.Join(b.opts.ShmDir, b.opts.Segment) }

// Generation is the generation new calls go to (0 when detached).
func (b *Backend) Generation() uint64 {
	if a := b.cur.Load(); a != nil {
		return a.seg.Generation()
	}
	return 0
}

// Ready reports whether calls can be served now.
func (b *Backend) Ready() bool {
	a := b.cur.Load()
	if a == nil || !a.serving() || !a.pin() {
		return false
	}
	defer a.release()
	ready := false
	_ = shm.GuardFaults(func() error { ready = a.seg.State() == shm.StateReady; return nil })
	return ready
}

// attachment is one claimed lane of one generation, and its lifecycle.
type attachment struct {
	b     *Backend
	seg   *shm.Segment
	lane  *shm.Lane
	ino   uint64
	slots []slotHandle
	life  *lifecycle
	// refs counts what needs the mapping: slots handed out and not
	// released (an abandoned slot's until its completion is read) and
	// pins. It is closedRefs once the segment is unmapped.
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

type slotHandle struct {
	a       *attachment
	index   int
	n       int
	payload []byte
	// views are payload's arrays, placed by the model's request layout
	// (model.RequestLayout.Payload, which the embedder decodes with).
	views   model.RequestPayload
	state   slotState
	status  chan shm.Status // cap 1; the reader's delivery to the holder
	moved   *slotHandle     // the slot this request moved to in a newer generation
	retried bool            // this slot holds a request already moved once
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

// releaseSlot drops a slot's reference and tells Acquire there is room.
func (a *attachment) releaseSlot() {
	a.release()
	a.b.signalFreed()
}

// freeSlot gives a slot whose last claim was just dropped back to the lane
// (unless the lane was given back already) and drops its reference. The
// reference goes even when freeing faults (the segment file was truncated
// under it): the owner unmaps only after the last one.
func (a *attachment) freeSlot(h *slotHandle) {
	defer a.releaseSlot()
	if !a.life.reached(phaseRetired) {
		if err := shm.GuardFaults(func() error { return a.lane.Free(h.index) }); err != nil {
			a.b.log.Debug("free slot", "generation", a.seg.Generation(), "slot", h.index, "err", err)
		}
	}
}

// dropInFlight ends the in-flight claim of every slot once the completion
// reader has stopped: their completions will never be read. A slot whose
// holder has released it is freed here; one still held is freed by its
// holder's Release.
func (a *attachment) dropInFlight() {
	for i := range a.slots {
		if _, last, ok := a.slots[i].state.complete(); ok && last {
			a.releaseSlot()
		}
	}
}

// manage keeps an attachment to the newest live generation. It owns every
// attachment it makes and, when ctx ends, closes them all before it
// returns.
func (b *Backend) manage(ctx context.Context) {
	defer close(b.done)
	var owned []*attachment // every attachment not yet closed
	defer func() {
		b.setCurrent(nil)
		for _, a := range owned {
			a.lose(errClosing)
		}
		for _, a := range owned {
			<-a.life.entered(phaseClosed).Done()
		}
	}()
	t := time.NewTicker(checkInterval)
	defer t.Stop()
	logged := false
	for {
		owned = slices.DeleteFunc(owned, func(a *attachment) bool { return a.life.reached(phaseClosed) })
		a := b.cur.Load()
		switch {
		case a == nil:
			na, err := b.attach()
			if err == nil {
				owned = append(owned, na)
				b.setCurrent(na)
				b.log.Info("attached", "path", na.seg.Path(), "generation", na.seg.Generation(), "lane", na.lane.Index())
				logged = false
			} else if !logged {
				b.log.Info("waiting for the embedder's segment", "path", b.Path(), "reason", err)
				logged = true
			}
		case a.lost.HasFired():
			// Its owner retires it; new calls wait for the next generation.
			b.setCurrent(nil)
			continue
		default:
			replaced, ok := b.examine(a)
			if !ok {
				continue // lost under the check
			}
			if replaced {
				na, err := b.attach()
				if err == nil {
					owned = append(owned, na)
					if !na.accel.Load() {
						// Switch only once the new generation can run
						// requests; until then the old one serves, or
						// requests wait in move.
						na.drain()
						err = errors.New("no accelerator attached yet")
					}
				}
				if err == nil {
					b.setCurrent(na)
					b.log.Info("switched generation", "from", a.seg.Generation(), "to", na.seg.Generation())
					a.drain()
					logged = false
				} else if !logged {
					b.log.Warn("a newer generation exists but attaching failed", "path", b.Path(), "err", err)
					logged = true
				}
			}
		}
		var lost <-chan struct{} // nil blocks forever
		if a := b.cur.Load(); a != nil {
			lost = a.lost.Done()
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-b.opts.Notify:
		case <-lost:
		}
	}
}

// setCurrent makes a the attachment new calls go to and wakes the calls
// waiting for a generation to move to.
func (b *Backend) setCurrent(a *attachment) {
	b.cur.Store(a)
	b.announce()
}

// announce wakes whoever waits for the current attachment to change.
func (b *Backend) announce() { b.changed.Swap(newEvent()).Fire() }

// examine refreshes whether a's generation has an accelerator and reports
// whether a newer generation took the segment's path or a's is draining.
// ok is false when a was lost. It pins a, so its owner cannot unmap it
// under the reads, and guards them: the file may have been truncated.
func (b *Backend) examine(a *attachment) (replaced, ok bool) {
	if !a.pin() {
		// Only a closed attachment refuses a pin, and the manager's
		// current one is never closed unless lost: make sure it is, so
		// the next turn attaches anew instead of looking again.
		a.lose(errors.New("shmbackend: attachment closed under the manager"))
		return false, false
	}
	defer a.release()
	accel := false
	err := shm.GuardFaults(func() error {
		accel = a.seg.AcceleratorAlive(0) == nil
		replaced = a.seg.State() != shm.StateReady
		return nil
	})
	if err != nil {
		a.lose(err)
		return false, false
	}
	if a.accel.Swap(accel) != accel {
		b.announce()
	}
	if !replaced {
		ino, err := shm.FileIdentity(b.Path())
		replaced = err == nil && ino != a.ino
	}
	return replaced, true
}

// maxBadCompletions is how many corrupt or stale completions in a row a
// lane tolerates before it is abandoned for a new attachment.
const maxBadCompletions = 8

// readCompletions delivers completions to waiting calls and frees the
// slots of calls that gave up. It is the lane's only completion consumer.
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
		if c.Slot < 0 || c.Slot >= len(a.slots) {
			continue // the lane validated it; never trust an index twice
		}
		h := &a.slots[c.Slot]
		deliver, last, ok := h.state.complete()
		switch {
		case !ok:
			// Not in flight: a stale or forged completion.
		case deliver:
			h.status <- c.Status
		case last:
			a.freeSlot(h)
		}
	}
}

func (b *Backend) signalFreed() {
	select {
	case b.freed <- struct{}{}:
	default:
	}
}

// Acquire claims a slot with room for n examples.
func (b *Backend) Acquire(ctx context.Context, n int) (frontend.Slot, error) {
	lay := b.cfg.Request(n)
	size := lay.Size
	var timer *time.Timer
	for {
		a := b.cur.Load()
		if a == nil {
			return nil, fmt.Errorf("shmbackend: no live generation: %w", frontend.ErrUnavailable)
		}
		if !a.accel.Load() {
			return nil, fmt.Errorf("shmbackend: no accelerator attached to generation %d: %w", a.seg.Generation(), frontend.ErrUnavailable)
		}
		// The reference first, then the phase: the owner moves the phase
		// first, then counts references, so either it counts this one or
		// this call sees it draining.
		if !a.pin() {
			return nil, fmt.Errorf("shmbackend: generation %d closed: %w", a.seg.Generation(), frontend.ErrUnavailable)
		}
		if a.life.phase() != phaseAttached {
			a.release()
			return nil, fmt.Errorf("shmbackend: no live generation (generation %d is %v): %w", a.seg.Generation(), a.life.phase(), frontend.ErrUnavailable)
		}
		slot, payload, err := a.lane.Claim(n, size)
		if err == nil {
			views, err := lay.Payload(payload)
			if err != nil {
				// Claim hands out page-aligned room of the asked size: only
				// a bug gets here.
				_ = a.lane.Free(slot)
				a.release()
				return nil, fmt.Errorf("shmbackend: slot %d: %v: %w", slot, err, frontend.ErrUnavailable)
			}
			h := &a.slots[slot]
			h.n, h.payload, h.views, h.retried, h.moved = n, payload, views, false, nil
			select {
			case <-h.status: // left by a call that moved off a lost lane
			default:
			}
			h.state.acquire()
			return h, nil
		}
		a.release()
		if !errors.Is(err, shm.ErrFull) {
			return nil, fmt.Errorf("shmbackend: %v: %w", err, frontend.ErrUnavailable)
		}
		if timer == nil {
			timer = time.NewTimer(b.opts.FullWait)
			defer timer.Stop()
		}
		select {
		case <-b.freed:
		case <-timer.C:
			return nil, fmt.Errorf("shmbackend: lane full: %w", frontend.ErrFull)
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// Guard runs fn so that a fault on a segment's mapping (the file truncated
// under it) comes back as an error wrapping frontend.ErrMemoryLost.
func (b *Backend) Guard(fn func() error) error {
	if err := shm.GuardFaults(fn); err != nil {
		return fmt.Errorf("shmbackend: %w: %v", frontend.ErrMemoryLost, err)
	}
	return nil
}

var _ frontend.MemoryGuard = (*Backend)(nil)

// Close stops the manager, which closes every attachment: their lanes are
// given back and their segments unmapped when Close returns.
func (b *Backend) Close() error {
	if !b.closed.CompareAndSwap(false, true) {
		return nil
	}
	b.cancel()
	<-b.done
	return nil
}

func (h *slotHandle) Dense() []float32 { return h.views.Dense }

func (h *slotHandle) Sparse() []int32 { return h.views.Sparse }

// Submit publishes the slot and waits for its completion.
func (h *slotHandle) Submit(ctx context.Context, call frontend.Call) ([]float32, error) {
	a := h.a
	var deadline int64
	if d, ok := ctx.Deadline(); ok {
		deadline = d.UnixNano()
	}
	h.state.commit()
	err := a.lane.Commit(h.index, shm.RequestMeta{
		ID:       a.b.nextID.Add(1),
		Deadline: deadline,
		Trace:    shm.TraceContext{TraceID: call.Trace.TraceID, SpanID: call.Trace.SpanID, Flags: call.Trace.Flags},
		Arrival:  call.Arrival,
	})
	if err != nil {
		h.state.uncommit()
		// A draining segment (a rollout) or a generation lost since
		// Acquire: the request moves to the successor. A closed segment
		// or a lost lane is a loss the attachment may not have noticed
		// yet; telling it now moves this call and the next ones sooner.
		if !h.retried && (errors.Is(err, shm.ErrClosed) || errors.Is(err, shm.ErrLaneLost)) {
			a.lose(err)
		}
		if errors.Is(err, shm.ErrDraining) || (a.lost.HasFired() && !h.retried) {
			return h.move(ctx, call)
		}
		if errors.Is(err, shm.ErrFull) {
			return nil, fmt.Errorf("shmbackend: request ring full: %w", frontend.ErrFull)
		}
		return nil, fmt.Errorf("shmbackend: %v: %w", err, frontend.ErrUnavailable)
	}
	select {
	case st := <-h.status:
		scores, err := h.result(st)
		if err == nil {
			target := a.b.opts.LatencyTarget
			a.lane.CountServed(target > 0 && !call.Arrival.IsZero() && time.Since(call.Arrival) > target)
		}
		return scores, err
	case <-a.life.entered(phaseRetired).Done():
		// A retired attachment with a call still waiting was lost (its
		// accelerator died, or the segment was truncated or corrupted):
		// nothing will complete here. Scoring is idempotent: the request
		// moves to the generation that replaces it, if one serves within
		// moveWait and the call's deadline, so a lost generation costs
		// honest callers latency, not errors.
		if h.retried {
			return nil, fmt.Errorf("shmbackend: embedder or accelerator gone: %w", frontend.ErrUnavailable)
		}
		return h.move(ctx, call)
	case <-ctx.Done():
		if h.state.abandon() {
			// The slot stays held until Release, so its room and the
			// mapping are still ours for the cancel flag.
			_ = shm.GuardFaults(func() error { return a.lane.Cancel(h.index) })
			return nil, ctx.Err()
		}
		// The completion was consumed first: it is on its way to h.status,
		// unless the generation was lost and nothing will deliver it.
		select {
		case <-h.status:
		case <-a.life.entered(phaseRetired).Done():
		}
		return nil, ctx.Err()
	}
}

// moveWait bounds how long a request waits for the generation that
// replaces a draining or lost one.
const moveWait = 2 * time.Second

// move resubmits a request whose generation started draining before it
// was committed (a rollout), or was lost under it: it waits for the
// manager to attach the next generation, copies the payload into a slot
// there and submits it, so a model switch fails no request.
func (h *slotHandle) move(ctx context.Context, call frontend.Call) ([]float32, error) {
	b := h.a.b
	var timer *time.Timer
	for {
		// Take the change event before looking, so a switch between the
		// look and the wait still wakes us.
		changed := b.changed.Load()
		if na := b.cur.Load(); na != nil && na != h.a && na.serving() {
			break
		}
		if timer == nil {
			timer = time.NewTimer(moveWait)
			defer timer.Stop()
		}
		select {
		case <-changed.Done():
		case <-timer.C:
			return nil, fmt.Errorf("shmbackend: generation %d is draining and no newer one appeared: %w", h.a.seg.Generation(), frontend.ErrUnavailable)
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	next, err := b.Acquire(ctx, h.n)
	if err != nil {
		return nil, err
	}
	nh := next.(*slotHandle)
	copy(nh.payload, h.payload)
	nh.retried = true // one move per call: a mesh that keeps failing fails it
	h.moved = nh
	return nh.Submit(ctx, call)
}

func (h *slotHandle) result(st shm.Status) ([]float32, error) {
	switch st {
	case shm.StatusOK:
		raw, err := h.a.lane.Scores(h.index)
		if err != nil || len(raw) != 4*h.n {
			return nil, fmt.Errorf("shmbackend: scores of slot %d: %v", h.index, err)
		}
		return unsafe.Slice((*float32)(unsafe.Pointer(&raw[0])), h.n), nil
	case shm.StatusExpired:
		return nil, context.DeadlineExceeded
	case shm.StatusCanceled:
		return nil, context.Canceled
	case shm.StatusInvalid:
		return nil, &frontend.BadInputError{Row: 0, Table: -1, Reason: "the embedder refused the request's ids (does the frontend's --bundle match the served model?)"}
	case shm.StatusUnavailable:
		return nil, fmt.Errorf("shmbackend: serving side could not run the request: %w", frontend.ErrUnavailable)
	case shm.StatusOverloaded:
		return nil, fmt.Errorf("shmbackend: shed by the embedder: it cannot finish within the latency target now: %w", frontend.ErrFull)
	}
	return nil, fmt.Errorf("shmbackend: request failed on the serving side (status %v)", st)
}

// Release drops the caller's claim on the slot. The slot is freed now, or
// by whoever drops its last claim: the completion reader when the request
// is still in flight, or the attachment's owner once the lane is retired.
func (h *slotHandle) Release() {
	if h.moved != nil {
		h.moved.Release()
		h.moved = nil
	}
	if h.state.release() {
		h.a.freeSlot(h)
	}
}
