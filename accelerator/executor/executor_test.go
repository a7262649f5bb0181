package executor_test

import (
	"context"
	"math"
	"os"
	"runtime"
	"sync"
	"testing"

	"github.com/recmesh/recmesh/accelerator/dcn"
	"github.com/recmesh/recmesh/accelerator/device"
	"github.com/recmesh/recmesh/accelerator/executor"
	"github.com/recmesh/recmesh/accelerator/parity"
	"github.com/recmesh/recmesh/accelerator/stripdot"
	"github.com/recmesh/recmesh/model"
)

// The compiled executor is shared by the tests of this package: compiling
// thirteen buckets is the slow part, and every test only reads it.
var (
	shared     sharedState
	sharedOnce sync.Once
)

type sharedState struct {
	ex     *executor.Executor
	rt     *device.Runtime
	bundle *model.Bundle
	ref    *model.Reference
	err    error
}

func setup(t *testing.T) sharedState {
	t.Helper()
	if _, err := device.FindPlugin(""); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI needs the PJRT plugin: %v", err)
		}
		t.Skipf("no PJRT plugin (run make deps): %v", err)
	}
	sharedOnce.Do(func() {
		dir, err := os.MkdirTemp("", "recmesh-executor-test-")
		if err != nil {
			shared.err = err
			return
		}
		if err := model.Export(context.Background(), dir, model.DLRMv2(model.DevVocabCap), 3, nil); err != nil {
			shared.err = err
			return
		}
		if shared.bundle, err = model.Open(dir); err != nil {
			shared.err = err
			return
		}
		if shared.ref, err = model.NewReference(shared.bundle); err != nil {
			shared.err = err
			return
		}
		if shared.rt, err = device.Open("", nil); err != nil {
			shared.err = err
			return
		}
		shared.ex, shared.err = executor.New(context.Background(), shared.rt, shared.bundle, executor.Options{})
	})
	if shared.err != nil {
		t.Fatal(shared.err)
	}
	return shared
}

func TestBuckets(t *testing.T) {
	got := executor.Buckets(4096)
	if len(got) != 13 || got[0] != 1 || got[12] != 4096 {
		t.Fatalf("Buckets(4096) = %v, want 1..4096 (13 buckets)", got)
	}
	if got := executor.Buckets(100); got[len(got)-1] != 128 {
		t.Fatalf("Buckets(100) ends at %d, want 128", got[len(got)-1])
	}
}

// TestParityEveryBucket runs every bucket full and compares it with the
// float64 reference.
func TestParityEveryBucket(t *testing.T) {
	s := setup(t)
	in, err := s.ex.NewHostInputs(s.ex.MaxBucket())
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	for i, b := range s.ex.Buckets() {
		res, err := parity.Bucket(s.ex, s.ref, in, b, uint64(100+i))
		if err != nil {
			t.Fatalf("bucket %d: %v", b, err)
		}
		if res.MaxAbsDiff > 1e-4 {
			t.Errorf("bucket %d: max|Δ| = %g > 1e-4", b, res.MaxAbsDiff)
		}
	}
}

// TestPaddingNeverLeaks runs partial batches whose padding rows hold NaN:
// parity.Bucket reports a NaN difference as +Inf, so any leak fails.
func TestPaddingNeverLeaks(t *testing.T) {
	s := setup(t)
	in, err := s.ex.NewHostInputs(s.ex.MaxBucket())
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	for _, n := range []int{1, 3, 5, 17, 100, 129, 1000, 2049} {
		res, err := parity.Bucket(s.ex, s.ref, in, n, uint64(n))
		if err != nil {
			t.Fatalf("n=%d: %v", n, err)
		}
		if res.Bucket < n || res.Bucket >= 2*n && n > 1 {
			t.Errorf("n=%d ran in bucket %d, want the smallest power of two ≥ n", n, res.Bucket)
		}
		if res.MaxAbsDiff > 1e-4 {
			t.Errorf("n=%d (bucket %d): max|Δ| = %g; padding leaked or parity broke", n, res.Bucket, res.MaxAbsDiff)
		}
	}
}

// TestRunIsRepeatable checks that buffers reused across runs give the same
// scores for the same inputs, and different rows give different scores.
func TestRunIsRepeatable(t *testing.T) {
	s := setup(t)
	in, err := s.ex.NewHostInputs(64)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	dense, sparse := model.RandomInputs(s.ex.Config(), 9, 64)
	copy(in.Dense(), dense)
	if err := s.ref.Pool(sparse, 64, in.Pooled()); err != nil {
		t.Fatal(err)
	}
	a := make([]float32, 64)
	b := make([]float32, 64)
	if err := s.ex.Run(in, 64, a); err != nil {
		t.Fatal(err)
	}
	if err := s.ex.Run(in, 64, b); err != nil {
		t.Fatal(err)
	}
	distinct := map[float32]bool{}
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("row %d: %v then %v on identical inputs", i, a[i], b[i])
		}
		distinct[a[i]] = true
	}
	if len(distinct) < 32 {
		t.Fatalf("only %d distinct scores over 64 random examples", len(distinct))
	}
}

func TestRunRejectsBadSizes(t *testing.T) {
	s := setup(t)
	in, err := s.ex.NewHostInputs(8)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	scores := make([]float32, 16)
	for _, n := range []int{0, -1, 9, s.ex.MaxBucket() + 1} {
		if err := s.ex.Run(in, n, scores); err == nil {
			t.Errorf("Run(n=%d) on an 8-row region succeeded, want an error", n)
		}
	}
	if err := s.ex.Run(in, 8, scores[:4]); err == nil {
		t.Error("Run with a 4-score output for 8 rows succeeded, want an error")
	}
}

func TestSampleRows(t *testing.T) {
	rows := parity.SampleRows(4096, 64)
	if len(rows) != 64 || rows[0] != 0 || rows[63] != 4095 {
		t.Fatalf("SampleRows(4096,64) = %v…, want 64 rows from 0 to 4095", rows[:3])
	}
	if got := parity.SampleRows(5, 64); len(got) != 5 {
		t.Fatalf("SampleRows(5,64) has %d rows, want 5", len(got))
	}
}

func TestMain(m *testing.M) {
	code := m.Run()
	if shared.ex != nil {
		shared.ex.Close()
	}
	if shared.rt != nil {
		shared.rt.Close()
	}
	if shared.bundle != nil {
		os.RemoveAll(shared.bundle.Dir)
		shared.bundle.Close()
	}
	os.Exit(code)
}

// TestOtherShapes compiles dense networks other than MLPerf's (the
// hostbound preset, which has no cross layers, and one with a deeper bottom
// MLP and two rank-3 cross layers) and checks a few buckets against the
// reference: the program takes every width from the bundle's config.
func TestOtherShapes(t *testing.T) {
	if _, err := device.FindPlugin(""); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI needs the PJRT plugin: %v", err)
		}
		t.Skipf("no PJRT plugin (run make deps): %v", err)
	}
	hostbound, err := model.Preset(model.PresetHostbound, model.DevVocabCap)
	if err != nil {
		t.Fatal(err)
	}
	small := model.DLRMv2(model.DevVocabCap)
	small.Name, small.CrossLayers, small.CrossRank = "small", 2, 3
	small.BottomMLP, small.TopMLP = []int{32, 64, 128}, []int{16, 1}
	rt, err := device.Open("", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	for _, cfg := range []model.Config{hostbound, small} {
		dir := t.TempDir()
		if err := model.Export(context.Background(), dir, cfg, 4, nil); err != nil {
			t.Fatal(err)
		}
		bundle, err := model.Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		defer bundle.Close()
		ref, err := model.NewReference(bundle)
		if err != nil {
			t.Fatal(err)
		}
		// With the strip kernel on, some products of these networks have
		// strips (widths 32k) and some do not (16, the rank 3): both kinds
		// in one program.
		for _, mode := range []executor.StripDotMode{executor.StripDotOff, executor.StripDotOn} {
			ex, err := executor.New(context.Background(), rt, bundle, executor.Options{MaxBatch: 16, StripDot: mode})
			if err != nil {
				t.Fatalf("%s: %v", cfg.Name, err)
			}
			defer ex.Close()
			if want := mode == executor.StripDotOn && stripdot.Supported(); ex.StripDot(16) != want {
				t.Errorf("%s mode %d: bucket 16 uses the strip kernel: %t, want %t", cfg.Name, mode, ex.StripDot(16), want)
			}
			in, err := ex.NewHostInputs(ex.MaxBucket())
			if err != nil {
				t.Fatal(err)
			}
			defer in.Close()
			for _, n := range []int{1, 5, 16} {
				res, err := parity.Bucket(ex, ref, in, n, uint64(n))
				if err != nil {
					t.Fatalf("%s n=%d: %v", cfg.Name, n, err)
				}
				if res.MaxAbsDiff > 1e-4 {
					t.Errorf("%s mode %d n=%d: max|Δ| = %g > 1e-4", cfg.Name, mode, n, res.MaxAbsDiff)
				}
			}
		}
	}
}

// TestFormulationsAgree runs the default program (split first product on
// a network without cross layers) and the plain one (the model's math op
// for op), each with the CPU plugin's in-place paths (weights in the
// executor's huge-page mapping, scores read from the output buffer) and
// with the plain ones (weights uploaded, scores copied out with
// ToHostBuffer), on the same inputs: the programs may
// differ only by float32 rounding, and the in-place paths must give exactly
// what the copies give.
func TestFormulationsAgree(t *testing.T) {
	if _, err := device.FindPlugin(""); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI needs the PJRT plugin: %v", err)
		}
		t.Skipf("no PJRT plugin (run make deps): %v", err)
	}
	hostbound, err := model.Preset(model.PresetHostbound, model.DevVocabCap)
	if err != nil {
		t.Fatal(err)
	}
	rt, err := device.Open("", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	plain, def := dcn.PlainOptions(), dcn.DefaultOptions()
	off := executor.StripDotOff
	for _, cfg := range []model.Config{model.DLRMv2(model.DevVocabCap), hostbound} {
		dir := t.TempDir()
		if err := model.Export(context.Background(), dir, cfg, 5, nil); err != nil {
			t.Fatal(err)
		}
		bundle, err := model.Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		defer bundle.Close()
		ref, err := model.NewReference(bundle)
		if err != nil {
			t.Fatal(err)
		}
		variants := []struct {
			name string
			opts executor.Options
		}{
			{"plain+copy", executor.Options{MaxBatch: 128, Program: &plain, CopyScores: true, CopyWeights: true, StripDot: off}},
			{"plain", executor.Options{MaxBatch: 128, Program: &plain, StripDot: off}},
			{"default+copy", executor.Options{MaxBatch: 128, Program: &def, CopyScores: true, CopyWeights: true, StripDot: off}},
			{"default", executor.Options{MaxBatch: 128, Program: &def, StripDot: off}},
			// Every bucket by the strip kernel, its weights in the mapping
			// and uploaded: only rounding may differ.
			{"default+strip", executor.Options{MaxBatch: 128, Program: &def, StripDot: executor.StripDotOn, StripDotMaxBucket: 128}},
			{"default+strip+copy", executor.Options{MaxBatch: 128, Program: &def, CopyWeights: true, StripDot: executor.StripDotOn, StripDotMaxBucket: 128}},
		}
		const n = 128
		dense, sparse := model.RandomInputs(cfg, 11, n)
		scores := make([][]float32, len(variants))
		for i, v := range variants {
			ex, err := executor.New(context.Background(), rt, bundle, v.opts)
			if err != nil {
				t.Fatalf("%s %s: %v", cfg.Name, v.name, err)
			}
			defer ex.Close()
			in, err := ex.NewHostInputs(n)
			if err != nil {
				t.Fatal(err)
			}
			defer in.Close()
			copy(in.Dense(), dense)
			if err := ref.Pool(sparse, n, in.Pooled()); err != nil {
				t.Fatal(err)
			}
			if want := v.opts.StripDot == executor.StripDotOn && stripdot.Supported(); ex.StripDot(n) != want {
				t.Errorf("%s %s: bucket %d uses the strip kernel: %t, want %t", cfg.Name, v.name, n, ex.StripDot(n), want)
			}
			scores[i] = make([]float32, n)
			if err := ex.Run(in, n, scores[i]); err != nil {
				t.Fatalf("%s %s bucket %d: %v", cfg.Name, v.name, n, err)
			}
			// Smaller buckets hold the first rows: same math, other shapes.
			for _, b := range []int{1, 16} {
				out := make([]float32, b)
				if err := ex.Run(in, b, out); err != nil {
					t.Fatalf("%s %s bucket %d: %v", cfg.Name, v.name, b, err)
				}
				for r := range out {
					if d := math.Abs(float64(out[r] - scores[i][r])); d > 1e-6 {
						t.Errorf("%s %s: row %d scores %v in bucket %d, %g away from bucket %d", cfg.Name, v.name, r, out[r], b, d, n)
					}
				}
			}
			res, err := parity.Bucket(ex, ref, in, n, 21)
			if err != nil {
				t.Fatal(err)
			}
			if res.MaxAbsDiff > 1e-4 {
				t.Errorf("%s %s: max|Δ| to the reference %g > 1e-4", cfg.Name, v.name, res.MaxAbsDiff)
			}
		}
		for i := range variants {
			maxDiff := 0.0
			for r := range scores[i] {
				maxDiff = math.Max(maxDiff, math.Abs(float64(scores[i][r]-scores[0][r])))
			}
			if maxDiff > 1e-6 {
				t.Errorf("%s: %s differs from %s by %g", cfg.Name, variants[i].name, variants[0].name, maxDiff)
			}
		}
		for r := range scores[0] {
			if scores[0][r] != scores[1][r] || scores[2][r] != scores[3][r] {
				t.Fatalf("%s row %d: scores read in place differ from copied ones: plain %v/%v default %v/%v",
					cfg.Name, r, scores[1][r], scores[0][r], scores[3][r], scores[2][r])
			}
			if scores[4][r] != scores[5][r] {
				t.Fatalf("%s row %d: strip kernel reading weights in place gives %v, uploaded %v", cfg.Name, r, scores[4][r], scores[5][r])
			}
		}
	}
}

// TestHalfDenseWeights serves bundles whose dense weights are stored as
// fp16 and bf16: the strip kernel streams the stored halves (from the
// mapping and uploaded) and XLA's buckets the halves widened at load, and
// both must compute the model of the widened weights, which the reference
// computes.
func TestHalfDenseWeights(t *testing.T) {
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
	for _, dd := range []model.DenseDtype{model.DenseFP16, model.DenseBF16} {
		cfg := model.DLRMv2(model.DevVocabCap)
		cfg.DenseDtype = dd
		dir := t.TempDir()
		if err := model.Export(context.Background(), dir, cfg, 6, nil); err != nil {
			t.Fatal(err)
		}
		bundle, err := model.Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		defer bundle.Close()
		ref, err := model.NewReference(bundle)
		if err != nil {
			t.Fatal(err)
		}
		variants := []struct {
			name string
			opts executor.Options
		}{
			{"xla", executor.Options{MaxBatch: 32, StripDot: executor.StripDotOff}},
			{"strip", executor.Options{MaxBatch: 32, StripDot: executor.StripDotOn, StripDotMaxBucket: 32}},
			{"strip+copy", executor.Options{MaxBatch: 32, CopyWeights: true, StripDot: executor.StripDotOn, StripDotMaxBucket: 32}},
		}
		const n = 32
		dense, sparse := model.RandomInputs(cfg, 12, n)
		scores := make([][]float32, len(variants))
		for i, v := range variants {
			ex, err := executor.New(context.Background(), rt, bundle, v.opts)
			if err != nil {
				t.Fatalf("%s %s: %v", dd, v.name, err)
			}
			defer ex.Close()
			if want := v.opts.StripDot == executor.StripDotOn && stripdot.Supported(); ex.StripDot(n) != want {
				t.Errorf("%s %s: bucket %d uses the strip kernel: %t, want %t", dd, v.name, n, ex.StripDot(n), want)
			}
			in, err := ex.NewHostInputs(n)
			if err != nil {
				t.Fatal(err)
			}
			defer in.Close()
			copy(in.Dense(), dense)
			if err := ref.Pool(sparse, n, in.Pooled()); err != nil {
				t.Fatal(err)
			}
			scores[i] = make([]float32, n)
			if err := ex.Run(in, n, scores[i]); err != nil {
				t.Fatalf("%s %s: %v", dd, v.name, err)
			}
			for _, b := range []int{1, 3} {
				res, err := parity.Bucket(ex, ref, in, b, uint64(b))
				if err != nil {
					t.Fatalf("%s %s n=%d: %v", dd, v.name, b, err)
				}
				if res.MaxAbsDiff > 1e-4 {
					t.Errorf("%s %s n=%d: max|Δ| to the reference %g > 1e-4", dd, v.name, b, res.MaxAbsDiff)
				}
			}
		}
		for r := range scores[0] {
			if d := math.Abs(float64(scores[1][r] - scores[0][r])); d > 1e-6 {
				t.Errorf("%s row %d: the strip kernel scores %v, XLA %v", dd, r, scores[1][r], scores[0][r])
			}
			if scores[1][r] != scores[2][r] {
				t.Fatalf("%s row %d: strip kernel reading weights in place gives %v, uploaded %v", dd, r, scores[1][r], scores[2][r])
			}
		}
	}
}

// TestRunAfterReleasingCode releases the plugin's code pages, as the
// accelerator does once it has compiled, and checks that the compiled
// programs still run and score as the reference does (the pages they need
// fault back in from the file), and that a program compiled afterwards
// does too.
func TestRunAfterReleasingCode(t *testing.T) {
	if _, err := device.FindPlugin(""); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI needs the PJRT plugin: %v", err)
		}
		t.Skipf("no PJRT plugin (run make deps): %v", err)
	}
	s := setup(t)
	ex, err := executor.New(context.Background(), s.rt, s.bundle, executor.Options{MaxBatch: 8})
	if err != nil {
		t.Fatal(err)
	}
	defer ex.Close()
	n, err := s.rt.ReleaseCode()
	if err != nil {
		t.Fatal(err)
	}
	if runtime.GOOS == "linux" && n <= 0 {
		t.Errorf("released %d bytes of the plugin's code, want some", n)
	}
	later, err := executor.New(context.Background(), s.rt, s.bundle, executor.Options{MaxBatch: 4})
	if err != nil {
		t.Fatalf("compiling after the release: %v", err)
	}
	defer later.Close()
	for _, e := range []*executor.Executor{ex, later} {
		in, err := e.NewHostInputs(e.MaxBucket())
		if err != nil {
			t.Fatal(err)
		}
		defer in.Close()
		res, err := parity.Bucket(e, s.ref, in, e.MaxBucket(), 3)
		if err != nil {
			t.Fatal(err)
		}
		if res.MaxAbsDiff > 1e-4 {
			t.Errorf("max bucket %d after the release: max|Δ| %g > 1e-4", e.MaxBucket(), res.MaxAbsDiff)
		}
	}
}
