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
//
// A slot's own life (held, in flight, abandoned, free) is not tracked
// here: shm.Lane keeps it, one state machine per slot that the calls and
// the completion reader share, and tells whichever of them frees a slot
// that it did, so the attachment's reference goes exactly once.
//
// The files follow those owners: backend.go is the Backend and its
// manager, attachment.go one generation's lane with its owner goroutine
// and completion reader, slot.go a call's slot (Acquire, Submit, Release).
package shmbackend

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"sync/atomic"
	"time"

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

func (b *Backend) signalFreed() {
	select {
	case b.freed <- struct{}{}:
	default:
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
