package executor_test

import (
	"context"
	"math"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/recmesh/recmesh/accelerator/device"
	"github.com/recmesh/recmesh/accelerator/executor"
	"github.com/recmesh/recmesh/model"
)

// swapConfig is a small network with a cross layer whose widths give the
// strip kernel's packed twins (32k columns) and plain weights (rank 3).
func swapConfig(dd model.DenseDtype) model.Config {
	cfg := model.DLRMv2(model.DevVocabCap)
	cfg.Name, cfg.CrossLayers, cfg.CrossRank = "swap", 1, 3
	cfg.BottomMLP, cfg.TopMLP = []int{32, 128}, []int{64, 1}
	cfg.DenseDtype = dd
	return cfg
}

// drawDense is Export's float32 draw of cfg's dense parameters from seed.
func drawDense(t *testing.T, cfg model.Config, seed uint64) map[string][]float32 {
	t.Helper()
	out, err := model.GenerateDenseWeights(cfg, seed)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// exportBundle exports cfg with seed into a temporary directory and opens
// it until the test ends.
func exportBundle(t *testing.T, cfg model.Config, seed uint64) *model.Bundle {
	t.Helper()
	dir := t.TempDir()
	if err := model.Export(context.Background(), dir, cfg, seed, nil); err != nil {
		t.Fatal(err)
	}
	b, err := model.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

// TestSwapWeights serves a bundle, swaps in the dense weights of another
// seed and checks the scores against that seed's reference, refuses weights
// that do not fit and keeps serving the old ones, swaps back to exactly
// the first scores, and compiles nothing throughout; and while runs go on
// in another goroutine, every run scores with one set of weights whole.
func TestSwapWeights(t *testing.T) {
	if _, err := device.FindPlugin(""); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI needs the PJRT plugin: %v", err)
		}
		t.Skipf("no PJRT plugin (run make deps): %v", err)
	}
	rt, err := device.Open("", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	const n = 8
	for _, v := range []struct {
		name string
		dd   model.DenseDtype
		opts executor.Options
	}{
		{"fp32 strip", model.DenseFP32, executor.Options{MaxBatch: n, StripDot: executor.StripDotOn}},
		{"fp32 xla+copy", model.DenseFP32, executor.Options{MaxBatch: n, StripDot: executor.StripDotOff, CopyWeights: true}},
		{"fp16 strip", model.DenseFP16, executor.Options{MaxBatch: n, StripDot: executor.StripDotOn}},
		{"bf16 strip+copy", model.DenseBF16, executor.Options{MaxBatch: n, StripDot: executor.StripDotOn, CopyWeights: true}},
	} {
		t.Run(v.name, func(t *testing.T) {
			cfg := swapConfig(v.dd)
			bundle := exportBundle(t, cfg, 3)
			ref, err := model.NewReference(bundle)
			if err != nil {
				t.Fatal(err)
			}
			// The model of seed 7's dense weights at this precision (its
			// tables are not used: the inputs are pooled with seed 3's).
			ref7, err := model.NewGeneratedReference(bundle.Config, 7, 0)
			if err != nil {
				t.Fatal(err)
			}
			ex, err := executor.New(context.Background(), rt, bundle, v.opts)
			if err != nil {
				t.Fatal(err)
			}
			defer ex.Close()
			compiles := ex.Compiles()
			if compiles < len(ex.Buckets()) {
				t.Fatalf("Compiles = %d for %d buckets", compiles, len(ex.Buckets()))
			}
			in, err := ex.NewHostInputs(n)
			if err != nil {
				t.Fatal(err)
			}
			defer in.Close()
			dense, sparse := model.RandomInputs(cfg, 13, n)
			copy(in.Dense(), dense)
			if err := ref.Pool(sparse, n, in.Pooled()); err != nil {
				t.Fatal(err)
			}
			run := func() []float32 {
				t.Helper()
				s := make([]float32, n)
				if err := ex.Run(in, n, s); err != nil {
					t.Fatal(err)
				}
				return s
			}
			near := func(what string, got []float32, r *model.Reference) {
				t.Helper()
				want := make([]float32, n)
				if err := r.Forward(in.Dense()[:n*cfg.NumDense], in.Pooled(), n, want); err != nil {
					t.Fatal(err)
				}
				for i := range got {
					if d := math.Abs(float64(got[i] - want[i])); !(d <= 1e-4) {
						t.Fatalf("%s: row %d scores %v, the reference %v", what, i, got[i], want[i])
					}
				}
			}
			same := func(what string, got, want []float32) {
				t.Helper()
				for i := range got {
					if got[i] != want[i] {
						t.Fatalf("%s: row %d scores %v, want %v exactly", what, i, got[i], want[i])
					}
				}
			}
			before := run()
			near("bundle weights", before, ref)

			seven := drawDense(t, cfg, 7)
			if err := ex.SwapWeights(seven); err != nil {
				t.Fatal(err)
			}
			after := run()
			near("seed 7's weights", after, ref7)
			differ := 0
			for i := range after {
				if after[i] != before[i] {
					differ++
				}
			}
			if differ == 0 {
				t.Fatal("the scores did not change with the weights")
			}

			// Refused: the old (seed 7) weights keep serving.
			bad := drawDense(t, cfg, 8)
			bad["cross.0.u"] = bad["cross.0.u"][:10]
			if err := ex.SwapWeights(bad); err == nil || !strings.Contains(err.Error(), "tensor cross.0.u has 10 values, the model's shape [3 3456] holds 10368") {
				t.Errorf("a short tensor: SwapWeights = %v", err)
			}
			nan := drawDense(t, cfg, 8)
			nan["top_mlp.1.bias"][0] = float32(math.NaN())
			if err := ex.SwapWeights(nan); err == nil || !strings.Contains(err.Error(), "tensor top_mlp.1.bias element 0 is NaN") {
				t.Errorf("a NaN: SwapWeights = %v", err)
			}
			extra := drawDense(t, cfg, 8)
			extra["top_mlp.2.kernel"] = []float32{1}
			if err := ex.SwapWeights(extra); err == nil || !strings.Contains(err.Error(), `tensor "top_mlp.2.kernel" is not a dense parameter`) {
				t.Errorf("an extra tensor: SwapWeights = %v", err)
			}
			same("after refusals", run(), after)

			// Back to the bundle's own weights: exactly the first scores.
			if err := ex.SwapWeights(model.DenseWeightsOf(bundle)); err != nil {
				t.Fatal(err)
			}
			same("the bundle's weights again", run(), before)

			// Runs racing swaps score with one set of weights or the other.
			var wg sync.WaitGroup
			stop := make(chan struct{})
			errs := make(chan string, 1)
			wg.Go(func() {
				s := make([]float32, n)
				for {
					select {
					case <-stop:
						return
					default:
					}
					if err := ex.Run(in, n, s); err != nil {
						errs <- err.Error()
						return
					}
					a, b := true, true
					for i := range s {
						a = a && s[i] == before[i]
						b = b && s[i] == after[i]
					}
					if !a && !b {
						errs <- "a run scored with neither set of weights whole"
						return
					}
				}
			})
			bundleWeights := model.DenseWeightsOf(bundle)
			for i := range 6 {
				w := seven
				if i%2 == 1 {
					w = bundleWeights
				}
				if err := ex.SwapWeights(w); err != nil {
					t.Error(err)
				}
			}
			close(stop)
			wg.Wait()
			select {
			case e := <-errs:
				t.Fatal(e)
			default:
			}
			same("after the racing swaps", run(), before)
			if got := ex.Compiles(); got != compiles {
				t.Errorf("Compiles went from %d to %d across swaps", compiles, got)
			}
		})
	}
	// After Close a swap is refused.
	bundle := exportBundle(t, swapConfig(model.DenseFP32), 3)
	ex, err := executor.New(context.Background(), rt, bundle, executor.Options{MaxBatch: 1, StripDot: executor.StripDotOff})
	if err != nil {
		t.Fatal(err)
	}
	ex.Close()
	if err := ex.SwapWeights(model.DenseWeightsOf(bundle)); err != executor.ErrClosed {
		t.Errorf("SwapWeights after Close = %v, want ErrClosed", err)
	}
}
