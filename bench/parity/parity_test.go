package parity

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/recmesh/recmesh/bench/internal/oiptest"
	"github.com/recmesh/recmesh/model"
	"github.com/recmesh/recmesh/proto/oip"
)

// openBundle exports the small test bundle into a temporary directory.
func openBundle(t *testing.T) (*model.Bundle, *model.Reference) {
	t.Helper()
	dir := t.TempDir() + "/bundle"
	if err := model.Export(context.Background(), dir, model.DLRMv2(model.DevVocabCap), 1, nil); err != nil {
		t.Fatal(err)
	}
	b, err := model.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	ref, err := model.NewReference(b)
	if err != nil {
		t.Fatal(err)
	}
	return b, ref
}

// serve starts a fake whose scores are the reference's, passed through
// perturb (example index within the request, score) when it is not nil.
func serve(t *testing.T, cfg model.Config, ref *model.Reference, opts oiptest.Options, perturb func(i int, s float32) float32) *oip.Pool {
	t.Helper()
	opts.Scores = func(dense []float32, sparse []int32, n int) ([]float32, error) {
		s, err := ref.Predict(dense, sparse, n)
		if err != nil || perturb == nil {
			return s, err
		}
		for i := range s {
			s[i] = perturb(i, s[i])
		}
		return s, nil
	}
	srv := oiptest.Start(t, cfg, opts)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pool, err := oip.Dial(ctx, srv.Addr, 1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pool.Close() })
	return pool
}

const examples = 40

func TestParity(t *testing.T) {
	b, ref := openBundle(t)
	cfg := b.Config
	ctx := context.Background()
	opts := Options{Examples: examples, BatchSizes: []int{1, 3, 16}}

	t.Run("exact", func(t *testing.T) {
		// INT32 ids with raw scores back, INT64 ids with typed scores.
		for typ, typed := range map[string]bool{oip.TypeINT32: false, oip.TypeINT64: true} {
			pool := serve(t, cfg, ref, oiptest.Options{Typed: typed}, nil)
			o := opts
			o.SparseType = typ
			r, err := Check(ctx, pool.Client(0), cfg, ref, o)
			if err != nil {
				t.Fatal(err)
			}
			t.Log(r)
			// 40 examples in sizes 1, 3, 16, 1, 3, 16: six requests.
			if !r.Pass || r.MaxAbsDiff != 0 || r.Requests != 6 || r.Examples != examples {
				t.Errorf("%s typed=%v: %v", typ, typed, r)
			}
		}
	})

	t.Run("within tolerance", func(t *testing.T) {
		pool := serve(t, cfg, ref, oiptest.Options{}, func(i int, s float32) float32 { return s + 5e-5 })
		r, err := Check(ctx, pool.Client(0), cfg, ref, opts)
		if err != nil {
			t.Fatal(err)
		}
		if !r.Pass || r.MaxAbsDiff < 4e-5 || r.MaxAbsDiff > 6e-5 {
			t.Errorf("%v", r)
		}
	})

	t.Run("one score off", func(t *testing.T) {
		// The server is right; the reference is off by 2e-4 on example
		// 24, which is the same as the server being off there.
		pool := serve(t, cfg, ref, oiptest.Options{}, nil)
		wrong := offBy{Predictor: ref, example: 24, delta: -2e-4}
		r, err := Check(ctx, pool.Client(0), cfg, wrong, opts)
		if err != nil {
			t.Fatal(err)
		}
		t.Log(r)
		if r.Pass || r.OverTolerance != 1 || r.Worst.Example != 24 || math.Abs(r.MaxAbsDiff-2e-4) > 1e-6 {
			t.Errorf("%v", r)
		}
	})

	t.Run("NaN", func(t *testing.T) {
		pool := serve(t, cfg, ref, oiptest.Options{}, func(i int, s float32) float32 { return float32(math.NaN()) })
		r, err := Check(ctx, pool.Client(0), cfg, ref, opts)
		if err != nil {
			t.Fatal(err)
		}
		if r.Pass || r.OverTolerance != examples {
			t.Errorf("NaN scores: %v", r)
		}
	})

	t.Run("malformed answer", func(t *testing.T) {
		pool := serve(t, cfg, ref, oiptest.Options{ShortBy: 1}, nil)
		if _, err := Check(ctx, pool.Client(0), cfg, ref, opts); err == nil || !strings.Contains(err.Error(), "shape") {
			t.Errorf("short answer: err %v", err)
		}
	})

	t.Run("failed request", func(t *testing.T) {
		pool := serve(t, cfg, ref, oiptest.Options{Fail: func(k int64) codes.Code {
			if k == 2 {
				return codes.Unavailable
			}
			return codes.OK
		}}, nil)
		if _, err := Check(ctx, pool.Client(0), cfg, ref, opts); err == nil || !strings.Contains(err.Error(), "Unavailable") {
			t.Errorf("failed request: err %v", err)
		}
	})
}

// offBy is a reference that is wrong by delta on one example, which makes
// the server look wrong there.
type offBy struct {
	Predictor
	example int
	delta   float32
}

func (o offBy) Predict(dense []float32, sparse []int32, n int) ([]float32, error) {
	s, err := o.Predictor.Predict(dense, sparse, n)
	if err == nil && o.example < len(s) {
		s[o.example] += o.delta
	}
	return s, err
}
