package refbackend

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/recmesh/recmesh/frontend"
	"github.com/recmesh/recmesh/model"
)

// sumPredictor scores each example with the sum of its dense features.
type sumPredictor struct{ calls int }

func (p *sumPredictor) Predict(dense []float32, sparse []int32, n int) ([]float32, error) {
	p.calls++
	out := make([]float32, n)
	for i := range out {
		for _, v := range dense[i*model.NumDense : (i+1)*model.NumDense] {
			out[i] += v
		}
	}
	return out, nil
}

func TestBackend(t *testing.T) {
	cfg := model.DLRMv2(model.DevVocabCap)
	closed := 0
	b := New(&sumPredictor{}, cfg, Options{MaxInflight: 2, OnClose: func() error { closed++; return nil }})
	ctx := context.Background()
	if !b.Ready() {
		t.Fatal("new backend not ready")
	}
	s1, err := b.Acquire(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	if len(s1.Dense()) != 2*model.NumDense || len(s1.Sparse()) != 2*cfg.SparseWidth() {
		t.Fatalf("slot sizes %d, %d", len(s1.Dense()), len(s1.Sparse()))
	}
	for i := range s1.Dense() {
		s1.Dense()[i] = 1
	}
	scores, err := s1.Submit(ctx, frontend.Call{Arrival: time.Now()})
	if err != nil || !slices.Equal(scores, []float32{13, 13}) {
		t.Fatalf("Submit = %v, %v", scores, err)
	}
	s2, err := b.Acquire(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Acquire(ctx, 1); !errors.Is(err, frontend.ErrFull) {
		t.Errorf("third Acquire past MaxInflight 2: %v, want ErrFull", err)
	}
	s1.Release()
	s2.Release()
	s3, err := b.Acquire(ctx, 1)
	if err != nil {
		t.Fatalf("Acquire after Release: %v", err)
	}
	s3.Release()

	if err := b.Close(); err != nil || closed != 1 {
		t.Fatalf("Close = %v, OnClose ran %d times", err, closed)
	}
	b.Close()
	if closed != 1 {
		t.Errorf("OnClose ran %d times", closed)
	}
	if b.Ready() {
		t.Error("closed backend ready")
	}
	if _, err := b.Acquire(ctx, 1); !errors.Is(err, frontend.ErrUnavailable) {
		t.Errorf("Acquire after Close: %v, want ErrUnavailable", err)
	}
}

func TestDelayHonoursDeadline(t *testing.T) {
	p := &sumPredictor{}
	b := New(p, model.DLRMv2(model.DevVocabCap), Options{Delay: time.Hour})
	s, err := b.Acquire(context.Background(), 1)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Release()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if _, err := s.Submit(ctx, frontend.Call{Arrival: time.Now()}); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Submit past its deadline: %v", err)
	}
	if p.calls != 0 {
		t.Errorf("expired call was scored")
	}
}
