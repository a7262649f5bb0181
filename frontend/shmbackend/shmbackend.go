// Package shmbackend is the production frontend.Backend: a lane of the
// mesh's shared-memory segment. It attaches to the embedder's current
// generation, claims a lane, writes each request straight into a lane slot,
// and waits for the accelerator's completion. When the embedder or the
// accelerator dies it fails in-flight calls with UNAVAILABLE at once and
// re-attaches to the next generation by itself; when a new generation
// replaces the current one (a model rollout), new calls go to it while the
// old lane drains.
package shmbackend

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
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
	// checkInterval is how often the manager looks for a new generation.
	checkInterval = 50 * time.Millisecond
)

// Options configure a Backend.
type Options struct {
	ShmDir, Segment string
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

	cur    atomic.Pointer[attachment]
	freed  chan struct{} // a slot was freed somewhere (cap 1)
	cancel context.CancelFunc
	done   chan struct{}
	closed atomic.Bool
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
	if a == nil || a.isDead() || a.seg.State() != shm.StateReady {
		return false
	}
	return a.accel.Load()
}

// attachment is one claimed lane of one generation.
type attachment struct {
	b       *Backend
	seg     *shm.Segment
	lane    *shm.Lane
	ino     uint64
	slots   []slotHandle
	dead    chan struct{}
	deadErr atomic.Pointer[error]
	refs    atomic.Int64 // slots handed out and not released
	// accel says an accelerator is attached and alive, refreshed by the
	// manager every check, so Acquire refuses work nobody would run without
	// a syscall per request.
	accel   atomic.Bool
	retired atomic.Bool
	once    sync.Once
	stop    context.CancelFunc
	// loops runs the heartbeat and completion goroutines; the mapping is
	// unmapped only after they returned (quiet), or they would fault.
	loops   sync.WaitGroup
	quiet   atomic.Bool
	closeMu sync.Mutex
	closedX bool
}

// Slot states, so a call that gives up and the completion reader agree on
// who frees the slot.
const (
	stIdle      = iota // acquired, not submitted
	stWaiting          // submitted, caller waiting
	stAbandoned        // submitted, caller gone: the reader frees it
	stDone             // completion delivered to the caller
)

type slotHandle struct {
	a       *attachment
	index   int
	n       int
	payload []byte
	// views are payload's arrays, placed by the model's request layout
	// (model.RequestLayout.Payload, which the embedder decodes with).
	views   model.RequestPayload
	state   atomic.Int32
	status  chan shm.Status // cap 1
	moved   *slotHandle     // the slot this request moved to in a newer generation
	retried bool            // this slot holds a request already moved once
}

func (b *Backend) attach(ctx context.Context) (*attachment, error) {
	path := b.Path()
	// Any model id: a rollout switches models under the frontend. The
	// request layout is fixed by the DLRMv2 contract, and the embedder
	// bounds-checks every id against its own tables.
	seg, err := shm.Attach(path, shm.AttachOptions{})
	if err != nil {
		return nil, err
	}
	// A generation whose accelerator died is being replaced: claiming a
	// lane in it would only fail again.
	if err := seg.PeersAlive(); err != nil {
		seg.Close()
		return nil, err
	}
	lane, err := seg.ClaimLane(os.Getpid())
	if err != nil {
		seg.Close()
		return nil, err
	}
	ino, _ := shm.FileIdentity(path)
	actx, stop := context.WithCancel(ctx)
	a := &attachment{b: b, seg: seg, lane: lane, ino: ino, dead: make(chan struct{}), stop: stop}
	a.slots = make([]slotHandle, seg.Geometry().SlotsPerLane)
	for i := range a.slots {
		a.slots[i] = slotHandle{a: a, index: i, status: make(chan shm.Status, 1)}
	}
	a.loops.Add(2)
	// Both loops touch the mapping: a fault (the segment file truncated
	// under it) fails this attachment, and the manager attaches anew.
	go func() {
		defer a.loops.Done()
		if err := shm.GuardFaults(func() error { return lane.Heartbeat(actx, 0) }); errors.Is(err, shm.ErrSegmentLost) {
			a.fail(err)
		}
	}()
	go func() {
		defer a.loops.Done()
		if err := shm.GuardFaults(func() error { a.readCompletions(actx); return nil }); err != nil {
			a.fail(err)
		}
	}()
	a.accel.Store(seg.AcceleratorAlive(0) == nil)
	return a, nil
}

// manage keeps an attachment to the newest live generation.
func (b *Backend) manage(ctx context.Context) {
	defer close(b.done)
	t := time.NewTicker(checkInterval)
	defer t.Stop()
	logged := false
	for {
		a := b.cur.Load()
		switch {
		case a == nil:
			na, err := b.attach(ctx)
			if err == nil {
				b.cur.Store(na)
				b.log.Info("attached", "path", na.seg.Path(), "generation", na.seg.Generation(), "lane", na.lane.Index())
				logged = false
			} else if !logged {
				b.log.Info("waiting for the embedder's segment", "path", b.Path(), "reason", err)
				logged = true
			}
		case a.isDead():
			b.cur.CompareAndSwap(a, nil)
			a.retire()
			continue
		default:
			a.accel.Store(a.seg.AcceleratorAlive(0) == nil)
			if b.replaced(a) {
				na, err := b.attach(ctx)
				if err == nil && !na.accel.Load() {
					// Switch only once the new generation can run
					// requests; until then the old one serves, or
					// requests wait in move.
					na.retire()
					err = errors.New("no accelerator attached yet")
				}
				if err == nil {
					b.cur.Store(na)
					b.log.Info("switched generation", "from", a.seg.Generation(), "to", na.seg.Generation())
					a.retire()
					logged = false
				} else if !logged {
					b.log.Warn("a newer generation exists but attaching failed", "path", b.Path(), "err", err)
					logged = true
				}
			}
		}
		select {
		case <-ctx.Done():
			if a := b.cur.Swap(nil); a != nil {
				a.retire()
			}
			return
		case <-t.C:
		case <-b.opts.Notify:
		case <-b.curDead():
		}
	}
}

// curDead is the current attachment's dead channel (nil blocks forever).
func (b *Backend) curDead() <-chan struct{} {
	if a := b.cur.Load(); a != nil {
		return a.dead
	}
	return nil
}

// replaced reports whether a newer generation took the segment's path, or
// the attached one is draining.
func (b *Backend) replaced(a *attachment) bool {
	if a.seg.State() != shm.StateReady {
		return true
	}
	ino, err := shm.FileIdentity(b.Path())
	return err == nil && ino != a.ino
}

func (a *attachment) isDead() bool {
	select {
	case <-a.dead:
		return true
	default:
		return false
	}
}

func (a *attachment) fail(err error) {
	a.once.Do(func() {
		a.deadErr.Store(&err)
		close(a.dead)
		a.b.log.Warn("lane failed", "generation", a.seg.Generation(), "err", err)
	})
}

// maxBadCompletions is how many corrupt or stale completions in a row a
// lane tolerates before it is abandoned for a new attachment.
const maxBadCompletions = 8

// readCompletions delivers completions to waiting calls and frees the
// slots of calls that gave up. It is the lane's only completion consumer.
func (a *attachment) readCompletions(ctx context.Context) {
	bad := 0 // bad completions in a row
	for {
		c, err := a.lane.WaitCompletion(ctx)
		if err != nil {
			if ctx.Err() != nil {
				a.fail(frontend.ErrUnavailable)
				return
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
			a.fail(err)
			return
		}
		bad = 0
		h := &a.slots[c.Slot]
		if h.state.CompareAndSwap(stWaiting, stDone) {
			h.status <- c.Status
			continue
		}
		if h.state.CompareAndSwap(stAbandoned, stIdle) {
			_ = a.lane.Free(c.Slot)
			a.release()
			a.b.signalFreed()
		}
	}
}

func (b *Backend) signalFreed() {
	select {
	case b.freed <- struct{}{}:
	default:
	}
}

// retire stops new work on a and, once its calls are done, releases the
// lane and unmaps the segment.
func (a *attachment) retire() {
	if !a.retired.CompareAndSwap(false, true) {
		return
	}
	go func() {
		t := time.NewTicker(time.Millisecond)
		defer t.Stop()
		for a.refs.Load() > 0 && !a.isDead() {
			<-t.C
		}
		if !a.isDead() {
			_ = a.lane.Release()
		}
		a.stop()
		a.loops.Wait()
		a.quiet.Store(true)
		a.fail(frontend.ErrUnavailable)
		a.maybeClose()
	}()
}

// release drops one slot reference; the last one of a dead attachment
// unmaps the segment (no call can touch its memory any more).
func (a *attachment) release() {
	if a.refs.Add(-1) == 0 {
		a.maybeClose()
	}
}

// closedRefs marks an unmapped attachment's reference count: an Acquire
// that races the close sees a negative count and backs off.
const closedRefs = -1 << 40

func (a *attachment) maybeClose() {
	if !a.quiet.Load() || !a.isDead() || !a.refs.CompareAndSwap(0, closedRefs) {
		return
	}
	a.closeMu.Lock()
	defer a.closeMu.Unlock()
	if !a.closedX {
		a.closedX = true
		_ = a.seg.Close()
	}
}

// Acquire claims a slot with room for n examples.
func (b *Backend) Acquire(ctx context.Context, n int) (frontend.Slot, error) {
	lay := b.cfg.Request(n)
	size := lay.Size
	var timer *time.Timer
	for {
		a := b.cur.Load()
		if a == nil || a.isDead() || a.retired.Load() {
			return nil, fmt.Errorf("shmbackend: no live generation: %w", frontend.ErrUnavailable)
		}
		if !a.accel.Load() {
			return nil, fmt.Errorf("shmbackend: no accelerator attached to generation %d: %w", a.seg.Generation(), frontend.ErrUnavailable)
		}
		if a.refs.Add(1) < 0 {
			a.refs.Add(-1)
			return nil, fmt.Errorf("shmbackend: generation closed: %w", frontend.ErrUnavailable)
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
			h.n, h.payload, h.views, h.retried = n, payload, views, false
			h.state.Store(stIdle)
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

// Close stops the manager and releases the lanes.
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
	h.state.Store(stWaiting)
	err := a.lane.Commit(h.index, shm.RequestMeta{
		ID:       a.b.nextID.Add(1),
		Deadline: deadline,
		Trace:    shm.TraceContext{TraceID: call.Trace.TraceID, SpanID: call.Trace.SpanID, Flags: call.Trace.Flags},
		Arrival:  call.Arrival,
	})
	if err != nil {
		h.state.Store(stIdle)
		if errors.Is(err, shm.ErrDraining) {
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
	case <-a.dead:
		// The generation is gone (its accelerator died, or the segment was
		// truncated or corrupted) and nothing will complete here. Scoring
		// is idempotent: the request moves to the generation that replaces
		// it, if one serves within moveWait and the call's deadline, so a
		// lost generation costs honest callers latency, not errors.
		// Release must not touch the old lane.
		if h.retried {
			return nil, fmt.Errorf("shmbackend: embedder or accelerator gone: %w", frontend.ErrUnavailable)
		}
		return h.move(ctx, call)
	case <-ctx.Done():
		if h.state.CompareAndSwap(stWaiting, stAbandoned) {
			_ = a.lane.Cancel(h.index)
			return nil, ctx.Err()
		}
		// The completion won the race: take it so the slot is clean.
		<-h.status
		return nil, ctx.Err()
	}
}

// moveWait bounds how long a request waits for the generation that
// replaces a draining one.
const moveWait = 2 * time.Second

// move resubmits a request whose generation started draining before it
// was committed (a rollout): it waits for the manager to attach the new
// generation, copies the payload into a slot there and submits it, so a
// model switch fails no request.
func (h *slotHandle) move(ctx context.Context, call frontend.Call) ([]float32, error) {
	b := h.a.b
	deadline := time.Now().Add(moveWait)
	for {
		if na := b.cur.Load(); na != nil && na != h.a && !na.isDead() && !na.retired.Load() && na.accel.Load() {
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("shmbackend: generation %d is draining and no newer one appeared: %w", h.a.seg.Generation(), frontend.ErrUnavailable)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(time.Millisecond):
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

// Release frees the slot, unless the completion reader owns it now.
func (h *slotHandle) Release() {
	if h.moved != nil {
		h.moved.Release()
		h.moved = nil
	}
	a := h.a
	switch h.state.Load() {
	case stAbandoned:
		return // the reader frees it when the completion arrives
	case stWaiting:
		// Only after a dead segment: nothing will ever complete it.
	default:
		if !a.isDead() {
			_ = a.lane.Free(h.index)
		}
		h.state.Store(stIdle)
	}
	a.release()
	a.b.signalFreed()
}
