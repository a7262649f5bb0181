// Package refbackend is a frontend.Backend that scores in-process with the
// plain-Go reference forward pass (model.Reference). It is the development
// and test backend: real scores from a real bundle with no shared memory,
// embedder or accelerator, at reference speed (tens of milliseconds per
// example). It is not meant for production traffic.
package refbackend

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/recmesh/recmesh/frontend"
	"github.com/recmesh/recmesh/model"
)

// DefaultMaxInflight bounds the slots held at once: enough for tests that
// push concurrent load, few enough that a flood gets RESOURCE_EXHAUSTED
// rather than an unbounded queue of reference computations.
const DefaultMaxInflight = 64

// Predictor scores n examples; *model.Reference is one.
type Predictor interface {
	Predict(dense []float32, sparse []int32, n int) ([]float32, error)
}

// Options configure a Backend. Zero values mean the defaults.
type Options struct {
	// Delay is added to every Submit before scoring, honouring the call's
	// context: it makes calls slow on purpose, to test deadlines and
	// drains. Default 0.
	Delay time.Duration
	// MaxInflight bounds the slots held at once; Acquire beyond it fails
	// with frontend.ErrFull. Default DefaultMaxInflight.
	MaxInflight int
	// OnClose, when set, runs once in Close (to close the bundle the
	// Predictor reads).
	OnClose func() error
}

// Backend implements frontend.Backend over a Predictor.
type Backend struct {
	p        Predictor
	width    int
	opts     Options
	inflight atomic.Int64
	closed   atomic.Bool
	once     sync.Once
	slots    sync.Pool // *slot
}

// New returns a Backend scoring with p for a model of configuration cfg.
func New(p Predictor, cfg model.Config, opts Options) *Backend {
	if opts.MaxInflight <= 0 {
		opts.MaxInflight = DefaultMaxInflight
	}
	return &Backend{p: p, width: cfg.SparseWidth(), opts: opts}
}

// Ready is true until Close.
func (b *Backend) Ready() bool { return !b.closed.Load() }

// Acquire returns a slot for n examples, ErrFull past MaxInflight and
// ErrUnavailable once closed.
func (b *Backend) Acquire(_ context.Context, n int) (frontend.Slot, error) {
	if b.closed.Load() {
		return nil, fmt.Errorf("reference backend: %w: closed", frontend.ErrUnavailable)
	}
	if b.inflight.Add(1) > int64(b.opts.MaxInflight) {
		b.inflight.Add(-1)
		return nil, fmt.Errorf("reference backend: %w: %d calls in flight", frontend.ErrFull, b.opts.MaxInflight)
	}
	s, _ := b.slots.Get().(*slot)
	if s == nil {
		s = &slot{b: b}
	}
	s.n = n
	s.dense = grow(s.dense, n*model.NumDense)
	s.sparse = grow(s.sparse, n*b.width)
	return s, nil
}

// Close makes the backend unready and runs Options.OnClose.
func (b *Backend) Close() error {
	var err error
	b.once.Do(func() {
		b.closed.Store(true)
		if b.opts.OnClose != nil {
			err = b.opts.OnClose()
		}
	})
	return err
}

func grow[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}

type slot struct {
	b      *Backend
	n      int
	dense  []float32
	sparse []int32
	scores []float32
}

func (s *slot) Dense() []float32 { return s.dense }
func (s *slot) Sparse() []int32  { return s.sparse }

// Submit waits Options.Delay (or until ctx ends), then scores. The forward
// pass itself is not interruptible; the frontend drops late results.
func (s *slot) Submit(ctx context.Context, _ frontend.Call) ([]float32, error) {
	if d := s.b.opts.Delay; d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-t.C:
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	scores, err := s.b.p.Predict(s.dense, s.sparse, s.n)
	if err != nil {
		if errors.Is(err, model.ErrBadInput) {
			// The frontend checks every id first, so this is a bug, not
			// the client's fault.
			return nil, fmt.Errorf("reference backend: input passed the frontend's checks but not the model's: %w", err)
		}
		return nil, fmt.Errorf("reference backend: %w", err)
	}
	s.scores = scores
	return scores, nil
}

func (s *slot) Release() {
	b := s.b
	s.scores = nil
	b.slots.Put(s)
	b.inflight.Add(-1)
}
