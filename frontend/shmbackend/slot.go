package shmbackend

import (
	"context"
	"errors"
	"fmt"
	"time"
	"unsafe"

	"github.com/recmesh/recmesh/frontend"
	"github.com/recmesh/recmesh/model"
	"github.com/recmesh/recmesh/shm"
)

// slotHandle is a call's view of one lane slot: the frontend.Slot that
// Acquire hands out. Whether the slot is held, in flight, abandoned or free
// is the lane's to track (shm.Lane, one state machine per slot, shared
// with the completion reader); the handle keeps only what the call needs:
// the slot's payload views and the reader's delivery channel.
type slotHandle struct {
	a       *attachment
	index   int
	n       int
	payload []byte
	// views are payload's arrays, placed by the model's request layout
	// (model.RequestLayout.Payload, which the embedder decodes with).
	views   model.RequestPayload
	status  chan shm.Status // cap 1; the reader's delivery to the holder
	moved   *slotHandle     // the slot this request moved to in a newer generation
	retried bool            // this slot holds a request already moved once
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
				_, _ = a.lane.Free(slot) // just claimed, so freed at once
				a.release()
				return nil, fmt.Errorf("shmbackend: slot %d: %v: %w", slot, err, frontend.ErrUnavailable)
			}
			h := &a.slots[slot]
			h.n, h.payload, h.views, h.retried, h.moved = n, payload, views, false, nil
			select {
			case <-h.status: // left by a call that moved off a lost lane
			default:
			}
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

func (h *slotHandle) Dense() []float32 { return h.views.Dense }

func (h *slotHandle) Sparse() []int32 { return h.views.Sparse }

// Submit publishes the slot and waits for its completion.
func (h *slotHandle) Submit(ctx context.Context, call frontend.Call) ([]float32, error) {
	a := h.a
	var deadline int64
	if d, ok := ctx.Deadline(); ok {
		deadline = d.UnixNano()
	}
	err := a.lane.Commit(h.index, shm.RequestMeta{
		ID:       a.b.nextID.Add(1),
		Deadline: deadline,
		Trace:    shm.TraceContext{TraceID: call.Trace.TraceID, SpanID: call.Trace.SpanID, Flags: call.Trace.Flags},
		Arrival:  call.Arrival,
	})
	if err != nil {
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
		// Abandoned, the completion is the reader's to consume and the
		// lane's to free the slot on (with Release). Abandon raises the
		// slot's cancel flag, a write into the mapping: a fault there
		// leaves the request as it was, ended with the lost generation.
		abandoned := false
		_ = shm.GuardFaults(func() error { abandoned = a.lane.Abandon(h.index); return nil })
		if abandoned {
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

// Release drops the caller's claim on the slot. The lane frees the slot
// now, or, while its request is still in flight, once the completion is
// read (readCompletions) or the lost lane's flights are dropped
// (dropInFlight): whoever the lane tells it freed the slot drops its
// reference.
func (h *slotHandle) Release() {
	if h.moved != nil {
		h.moved.Release()
		h.moved = nil
	}
	freed, err := h.a.lane.Free(h.index)
	if err != nil {
		// A slot released twice (the lane refuses to free it again) or
		// records that do not match the allocator: a bug, never a
		// client's doing.
		h.a.b.log.Error("release slot", "generation", h.a.seg.Generation(), "slot", h.index, "err", err)
	}
	if freed {
		h.a.slotFreed()
	}
}
