package model

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
)

// tinyConfig is a model small enough to run by hand: 2 dense features, two
// tables of width 2 (3 and 2 rows, bags of 2 and 1), a 2→2 bottom layer,
// one rank-1 cross layer over 3×2 = 6 values and a 6→2→1 top MLP.
func tinyConfig() Config {
	return Config{
		Name: "tiny", NumDense: 2, EmbeddingDim: 2,
		VocabSizes: []int{3, 2}, Hotness: []int{2, 1},
		BottomMLP: []int{2}, TopMLP: []int{2, 1},
		CrossLayers: 1, CrossRank: 1,
	}
}

func tinyReference(t *testing.T) *Reference {
	t.Helper()
	params := map[string][]float32{
		"embedding.0.weight":  {1, 2, 3, 4, 5, 6},
		"embedding.1.weight":  {0.5, -1, 2, 0},
		"bottom_mlp.0.kernel": {1, -1, 0.5, 1},
		"bottom_mlp.0.bias":   {0, -2},
		"cross.0.v":           {0.5, 1, 0, 0, 0, 0},
		"cross.0.u":           {1, 0, 0.5, 0, -1, 2},
		"cross.0.bias":        {0, 1, 0, 0, 0, 0},
		"top_mlp.0.kernel":    {0.25, 0, 0, 0, 0, 0.25, 0.125, -0.25, -0.5, 0, 0, 0},
		"top_mlp.0.bias":      {0, -0.5},
		"top_mlp.1.kernel":    {2, 3},
		"top_mlp.1.bias":      {-1},
	}
	r, err := newReference(tinyConfig(), func(name string) ([]float32, error) {
		p, ok := params[name]
		if !ok {
			return nil, fmt.Errorf("%w: %s", ErrNoTensor, name)
		}
		return p, nil
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestReferenceByHand checks the layer arithmetic against values worked
// out on paper.
func TestReferenceByHand(t *testing.T) {
	r := tinyReference(t)
	dense := []float32{
		1, 2, // example 0
		0, 0, // example 1
	}
	sparse := []int32{
		0, 2, 1, // example 0: table 0 rows 0 and 2, table 1 row 1
		1, 1, 0, // example 1: table 0 row 1 twice, table 1 row 0
	}
	pooled := make([]float32, 2*2*2)
	if err := r.Pool(sparse, 2, pooled); err != nil {
		t.Fatal(err)
	}
	// [1,2]+[5,6], [2,0]; [3,4]+[3,4], [0.5,-1].
	if want := []float32{6, 8, 2, 0, 6, 8, 0.5, -1}; !slices.Equal(pooled, want) {
		t.Fatalf("pooled = %v, want %v", pooled, want)
	}
	// The top-0 kernel [6,2] has columns c0 = [0.25,0,0,0.125,-0.5,0] and
	// c1 = [0,0,0.25,-0.25,0,0].
	// Example 0:
	//   bottom: [1,2]·[[1,-1],[0.5,1]] + [0,-2] = [2,-1] → ReLU [2,0]
	//   x0 = [2,0, 6,8, 2,0]
	//   cross: x0·v = 1; 1·u + b = [1,1,0.5,0,-1,2];
	//          x1 = x0⊙[1,1,0.5,0,-1,2] + x0 = [4,0,9,8,0,0]
	//   top 0: [x1·c0, x1·c1] + [0,-0.5] = [1+1, 2.25-2] + [0,-0.5] = [2,-0.25] → [2,0]
	//   top 1: 2·2 + 0·3 - 1 = 3
	// Example 1:
	//   bottom: [0,0] + [0,-2] → [0,0]; x0 = [0,0, 6,8, 0.5,-1]
	//   cross: x0·v = 0, so 0·u + b = [0,1,0,0,0,0] and x1 = x0 (x0[1] = 0)
	//   top 0: [1-0.25, 1.5-2] + [0,-0.5] = [0.75,-1] → [0.75,0]
	//   top 1: 1.5 - 1 = 0.5
	want := []float64{sigmoidRef(3), sigmoidRef(0.5)}
	scores := make([]float32, 2)
	if err := r.Forward(dense, pooled, 2, scores); err != nil {
		t.Fatal(err)
	}
	for i, w := range want {
		if math.Abs(float64(scores[i])-w) > 1e-7 {
			t.Errorf("score %d = %v, want %v", i, scores[i], w)
		}
	}

	// Example 2: table 0 row 0 twice, table 1 row 1: pooled [2,4],[2,0];
	// bottom [0,0]; x0 = [0,0,2,4,2,0] = x1; top 0: [0.5-1, 0.5-1] +
	// [0,-0.5] → [0,0]; top 1: -1. The last layer has no ReLU, so the
	// score is sigmoid(-1), not sigmoid(0).
	got, err := r.Predict([]float32{0, 0}, []int32{0, 0, 1}, 1)
	if err != nil {
		t.Fatal(err)
	}
	if w := sigmoidRef(-1); math.Abs(float64(got[0])-w) > 1e-7 {
		t.Errorf("negative-logit score = %v, want %v", got[0], w)
	}
}

func sigmoidRef(z float64) float64 { return 1 / (1 + math.Exp(-z)) }

func TestReferenceRejectsBadInput(t *testing.T) {
	r := tinyReference(t)
	pooled := make([]float32, 4)
	for _, tc := range []struct {
		sparse []int32
		msg    string
	}{
		{[]int32{0, 3, 1}, "example 0 table 0: id 3 outside [0, 3)"},
		{[]int32{0, 0, -1}, "example 0 table 1: id -1 outside [0, 2)"},
		{[]int32{0, 0}, "need 3 ids"},
	} {
		err := r.Pool(tc.sparse, 1, pooled)
		if !errors.Is(err, ErrBadInput) || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("Pool(%v) = %v, want %q", tc.sparse, err, tc.msg)
		}
	}
	if err := r.Forward([]float32{1}, pooled, 1, make([]float32, 1)); !errors.Is(err, ErrBadInput) {
		t.Errorf("Forward with short dense = %v", err)
	}
	if err := r.Forward([]float32{1, 2}, pooled, 1, nil); !errors.Is(err, ErrBadInput) {
		t.Errorf("Forward with no room for scores = %v", err)
	}
	if got, err := r.Predict(nil, nil, 0); err != nil || len(got) != 0 {
		t.Errorf("Predict of 0 examples = %v, %v", got, err)
	}
}

func TestNewReferenceChecksSizes(t *testing.T) {
	_, err := newReference(tinyConfig(), func(name string) ([]float32, error) {
		return make([]float32, 1), nil
	}, nil)
	if !errors.Is(err, ErrMismatch) || !strings.Contains(err.Error(), `"embedding.0.weight" has 1 values`) {
		t.Errorf("newReference with short tensors = %v", err)
	}
}

// TestMatmul compares the blocked kernel with the textbook triple loop,
// including widths that are not a multiple of the block.
func TestMatmul(t *testing.T) {
	s := newStream(1, 99, 0)
	for _, in := range []int{1, 3, 4, 9} {
		for _, out := range []int{1, 5} {
			for nb := 1; nb <= 9; nb++ {
				x := make([]float64, nb*in)
				w := make([]float32, in*out)
				bias := make([]float32, out)
				s.uniformFill(w, 0, 1)
				s.uniformFill(bias, 1000, 1)
				for i := range x {
					x[i] = float64(s.unit(uint64(2000+i))) - 0.5
				}
				y := make([]float64, nb*out)
				matmul(x, in, y, out, nb, w, bias)
				for e := range nb {
					for j := range out {
						want := float64(bias[j])
						for i := range in {
							want += x[e*in+i] * float64(w[i*out+j])
						}
						if got := y[e*out+j]; got != want {
							t.Fatalf("in %d out %d nb %d: y[%d][%d] = %v, want %v", in, out, nb, e, j, got, want)
						}
					}
				}
			}
		}
	}
}

// referencePool pools n examples of RandomInputs(seed) with b's
// reference and returns their ids and the pooled rows.
func referencePool(t *testing.T, b *Bundle, seed uint64, n int) ([]int32, []float32) {
	t.Helper()
	r, err := NewReference(b)
	if err != nil {
		t.Fatal(err)
	}
	_, sparse := RandomInputs(b.Config, seed, n)
	pooled := make([]float32, n*NumTables*EmbeddingDim)
	if err := r.Pool(sparse, n, pooled); err != nil {
		t.Fatal(err)
	}
	return sparse, pooled
}

func TestReferencePoolMatchesNaive(t *testing.T) {
	b := openT(t, exportDev(t, 1))
	cfg := b.Config
	const n = 16
	sparse, pooled := referencePool(t, b, 5, n)
	off := cfg.HotnessOffsets()
	for e := range n {
		for tb := range NumTables {
			table := b.Table(tb)
			for j := range EmbeddingDim {
				// float32 in bag order: the embedder's arithmetic, which
				// Pool defines bit for bit.
				sum := table[int(sparse[e*cfg.SparseWidth()+off[tb]])*EmbeddingDim+j]
				for k := 1; k < cfg.Hotness[tb]; k++ {
					id := sparse[e*cfg.SparseWidth()+off[tb]+k]
					sum += table[int(id)*EmbeddingDim+j]
				}
				if got := pooled[(e*NumTables+tb)*EmbeddingDim+j]; math.Float32bits(got) != math.Float32bits(sum) {
					t.Fatalf("pooled[%d][%d][%d] = %v, want %v", e, tb, j, got, sum)
				}
			}
		}
	}
}

// TestReferenceScores checks that the exported weights give scores that are
// spread out and not saturated (a parity check on scores all near 0.5 or
// all near 0/1 would prove little), and that a score does not depend on the
// batch it is computed in.
func TestReferenceScores(t *testing.T) {
	b := openT(t, exportDev(t, 1))
	r, err := NewReference(b)
	if err != nil {
		t.Fatal(err)
	}
	n := 256
	if testing.Short() {
		n = 64
	}
	dense, sparse := RandomInputs(b.Config, 1, n)
	scores, err := r.Predict(dense, sparse, n)
	if err != nil {
		t.Fatal(err)
	}
	var sum, sq float64
	for _, s := range scores {
		sum += float64(s)
		sq += float64(s) * float64(s)
	}
	mean := sum / float64(n)
	std := math.Sqrt(sq/float64(n) - mean*mean)
	lo, hi := slices.Min(scores), slices.Max(scores)
	t.Logf("%d scores: mean %.4f std %.4f min %.4f max %.4f", n, mean, std, lo, hi)
	if std <= 0.02 || lo < 1e-4 || hi > 1-1e-4 {
		t.Errorf("scores: mean %.4f std %.4f min %.4f max %.4f; want std > 0.02 inside (1e-4, 1-1e-4)", mean, std, lo, hi)
	}

	// The same examples one at a time and in an odd-sized batch give the
	// same bits.
	w := b.Config.SparseWidth()
	for _, e := range []int{0, 5, n - 1} {
		one, err := r.Predict(dense[e*NumDense:(e+1)*NumDense], sparse[e*w:(e+1)*w], 1)
		if err != nil {
			t.Fatal(err)
		}
		if one[0] != scores[e] {
			t.Errorf("example %d alone scores %v, in a batch %v", e, one[0], scores[e])
		}
	}
	part, err := r.Predict(dense[3*NumDense:14*NumDense], sparse[3*w:14*w], 11)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(part, scores[3:14]) {
		t.Error("examples 3..13 score differently in a batch of 11")
	}
}

func TestRandomInputs(t *testing.T) {
	cfg := DLRMv2(DevVocabCap)
	const n = 50
	dense, sparse := RandomInputs(cfg, 3, n)
	if len(dense) != n*NumDense || len(sparse) != n*cfg.SparseWidth() {
		t.Fatalf("lengths %d, %d", len(dense), len(sparse))
	}
	d2, s2 := RandomInputs(cfg, 3, n)
	if !slices.Equal(dense, d2) || !slices.Equal(sparse, s2) {
		t.Error("same seed, different inputs")
	}
	d3, s3 := RandomInputs(cfg, 4, n)
	if slices.Equal(dense, d3) || slices.Equal(sparse, s3) {
		t.Error("seeds 3 and 4 give the same inputs")
	}
	d4, s4 := RandomInputs(cfg, 3, 7)
	if !slices.Equal(d4, dense[:7*NumDense]) || !slices.Equal(s4, sparse[:7*cfg.SparseWidth()]) {
		t.Error("a shorter draw is not a prefix of a longer one")
	}
	for i, v := range dense {
		if v < 0 || v >= 1 {
			t.Fatalf("dense[%d] = %v outside [0, 1)", i, v)
		}
	}
	off := cfg.HotnessOffsets()
	for tb, h := range cfg.Hotness {
		seen := map[int32]bool{}
		for e := range n {
			for k := range h {
				id := sparse[e*cfg.SparseWidth()+off[tb]+k]
				if id < 0 || int(id) >= cfg.VocabSizes[tb] {
					t.Fatalf("example %d table %d: id %d outside [0, %d)", e, tb, id, cfg.VocabSizes[tb])
				}
				seen[id] = true
			}
		}
		// Every table draws from its whole vocabulary, not one id.
		if len(seen) < min(cfg.VocabSizes[tb], 2) {
			t.Errorf("table %d: only %d distinct ids", tb, len(seen))
		}
	}
	if d, s := RandomInputs(cfg, 1, 0); len(d) != 0 || len(s) != 0 {
		t.Error("n = 0 gave inputs")
	}
}

func BenchmarkReferencePredict(b *testing.B) {
	bu := openT(b, exportDev(b, 1))
	r, err := NewReference(bu)
	if err != nil {
		b.Fatal(err)
	}
	const n = 32
	dense, sparse := RandomInputs(bu.Config, 7, n)
	b.ResetTimer()
	for b.Loop() {
		if _, err := r.Predict(dense, sparse, n); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/1e3/float64(b.N*n), "ms/example")
}
