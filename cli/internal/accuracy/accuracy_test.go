package accuracy

import (
	"context"
	"math"
	"math/rand/v2"
	"runtime"
	"strings"
	"testing"

	"github.com/recmesh/recmesh/model"
)

func TestAUCByHand(t *testing.T) {
	for _, c := range []struct {
		name   string
		scores []float32
		labels []bool
		want   float64
	}{
		{"perfect", []float32{0.1, 0.2, 0.8, 0.9}, []bool{false, false, true, true}, 1},
		{"inverted", []float32{0.1, 0.2, 0.8, 0.9}, []bool{true, true, false, false}, 0},
		{"all equal", []float32{0.5, 0.5, 0.5, 0.5, 0.5}, []bool{true, false, true, false, false}, 0.5},
		// Pairs (pos, neg): (0.4, 0.2) right, (0.4, 0.4) tie, (0.4, 0.6)
		// wrong, (0.9, ·) right three times: 4.5 of 6.
		{"ties count half", []float32{0.2, 0.4, 0.4, 0.6, 0.9}, []bool{false, true, false, false, true}, 4.5 / 6},
		// One positive above one negative, tied with the other: 1.5 of 2.
		{"tie at the top", []float32{0.3, 0.7, 0.7}, []bool{false, true, false}, 0.75},
		// (0.9, 0.1), (0.9, 0.8), (0.2, 0.1) right, (0.2, 0.8) wrong.
		{"unsorted input", []float32{0.9, 0.1, 0.8, 0.2}, []bool{true, false, false, true}, 0.75},
	} {
		got, err := AUC(c.scores, c.labels)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if got != c.want {
			t.Errorf("%s: AUC = %v, want %v", c.name, got, c.want)
		}
	}
	if _, err := AUC([]float32{0.1, 0.2}, []bool{true, true}); err == nil {
		t.Error("AUC with no negatives accepted")
	}
	if _, err := AUC([]float32{0.1, float32(math.NaN())}, []bool{true, false}); err == nil {
		t.Error("AUC of a NaN score accepted")
	}
	if _, err := AUC([]float32{0.1}, []bool{true, false}); err == nil {
		t.Error("AUC of mismatched lengths accepted")
	}
}

// TestAUCMatchesPairCount checks the rank form against counting every
// pair, on scores with many ties.
func TestAUCMatchesPairCount(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	const n = 500
	scores, labels := make([]float32, n), make([]bool, n)
	for i := range n {
		scores[i] = float32(rng.IntN(40)) / 40
		labels[i] = rng.Float64() < 0.3+0.4*float64(scores[i])
	}
	var num, pairs float64
	for i := range n {
		for j := range n {
			if labels[i] && !labels[j] {
				pairs++
				switch {
				case scores[i] > scores[j]:
					num++
				case scores[i] == scores[j]:
					num += 0.5
				}
			}
		}
	}
	got, err := AUC(scores, labels)
	if err != nil {
		t.Fatal(err)
	}
	if want := num / pairs; math.Abs(got-want) > 1e-15 {
		t.Errorf("AUC = %v, counting pairs gives %v", got, want)
	}
}

// TestCalibrate checks that the calibration reaches 0.80 ± 0.01 on
// score distributions as narrow as the seeded model's and as wide as a
// trained one's, and that its labels are the ones its AUC was measured on.
func TestCalibrate(t *testing.T) {
	for _, spread := range []float64{0.01, 0.3, 3} {
		rng := rand.New(rand.NewPCG(3, uint64(spread*100)))
		const n = 20000
		scores := make([]float32, n)
		for i := range scores {
			scores[i] = float32(sigmoid(0.9 + spread*rng.NormFloat64()))
		}
		u := Uniforms(5, n)
		c, err := Calibrate(scores, u, CalibrationAUC, CalibrationTolerance)
		if err != nil {
			t.Fatalf("spread %v: %v", spread, err)
		}
		got, err := AUC(scores, c.Labels(scores, u))
		if err != nil {
			t.Fatal(err)
		}
		if got != c.AUC || math.Abs(got-CalibrationAUC) > CalibrationTolerance {
			t.Errorf("spread %v: calibration AUC %v, its labels give %v; want 0.80 ± 0.01", spread, c.AUC, got)
		}
		c2, _ := Calibrate(scores, u, CalibrationAUC, CalibrationTolerance)
		if c2 != c {
			t.Errorf("spread %v: calibrating twice gave %+v and %+v", spread, c, c2)
		}
	}
	// Scores that carry no ranking cannot reach 0.80.
	if _, err := Calibrate(make([]float32, 100), Uniforms(1, 100), CalibrationAUC, CalibrationTolerance); err == nil {
		t.Error("constant scores calibrated")
	}
}

// TestRun is the short form on the small tables: every combination of
// table and dense precision meets its target, float32's AUC is 0.80 ±
// 0.01, and the lines do not depend on the number of goroutines.
func TestRun(t *testing.T) {
	n := 20000
	if testing.Short() {
		n = 4000
	}
	o := Options{Preset: model.PresetHostbound, MaxVocab: model.DevVocabCap, Seed: 1, InputSeed: 1,
		Examples: n, LabelSeed: 1, Dtypes: model.Dtypes(), DenseDtypes: model.DenseDtypes(), TableMemory: 1 << 30}
	var emitted []string
	res, err := Run(context.Background(), o, func(l Line) { emitted = append(emitted, l.String()) })
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range emitted {
		t.Log(s)
	}
	if len(res.Lines) != 12 || res.Lines[0].Dtype != model.DtypeFP32 || res.Lines[0].DenseDtype != model.DenseFP32 || res.Lines[0].Ratio() != 1 {
		t.Fatalf("lines %v; want fp32 with dense fp32 first at ratio 1, then eleven more", emitted)
	}
	for i, l := range res.Lines {
		if d, dd := model.Dtypes()[i/3], model.DenseDtypes()[i%3]; l.Dtype != d || l.DenseDtype != dd {
			t.Errorf("line %d is %s with dense %s, want %s with dense %s", i, l.Dtype, l.DenseDtype, d, dd)
		}
		if l.DenseDtype != model.DenseFP32 && l.MaxAbsDiff == 0 {
			t.Errorf("%s with dense %s scores exactly as dense fp32: the weights were not rounded", l.Dtype, l.DenseDtype)
		}
	}
	if a := res.Calibration.AUC; math.Abs(a-CalibrationAUC) > CalibrationTolerance {
		t.Errorf("fp32 AUC %v outside 0.80 ± 0.01", a)
	}
	if f := res.Failures(); len(f) > 0 {
		t.Errorf("below target: %v", f)
	}
	for _, s := range emitted {
		if !strings.HasPrefix(s, "accuracy: dtype=") || !strings.Contains(s, " dense_dtype=") || strings.Count(s, "=") != 8 {
			t.Errorf("line %q is not the accuracy line", s)
		}
	}

	// One goroutine, and the generated tables regenerated per read.
	prev := runtime.GOMAXPROCS(1)
	defer runtime.GOMAXPROCS(prev)
	o.Dtypes, o.DenseDtypes, o.Examples, o.TableMemory = []model.Dtype{model.DtypeInt4}, []model.DenseDtype{model.DenseBF16}, 2000, 0
	one, err := Run(context.Background(), o, nil)
	if err != nil {
		t.Fatal(err)
	}
	runtime.GOMAXPROCS(prev)
	o.TableMemory = 1 << 30
	many, err := Run(context.Background(), o, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := range one.Lines {
		if one.Lines[i] != many.Lines[i] {
			t.Errorf("one goroutine: %v; %d: %v", one.Lines[i], prev, many.Lines[i])
		}
	}
}

func TestFailuresNameThePrecision(t *testing.T) {
	r := Result{Lines: []Line{
		{Dtype: model.DtypeFP32, DenseDtype: model.DenseFP32, AUC: 0.8, FP32AUC: 0.8},
		{Dtype: model.DtypeFP16, DenseDtype: model.DenseFP32, AUC: 0.7995, FP32AUC: 0.8}, // 0.99938: passes 99.9 %
		{Dtype: model.DtypeInt8, DenseDtype: model.DenseFP32, AUC: 0.799, FP32AUC: 0.8},  // 0.99875: fails 99.9 %
		{Dtype: model.DtypeInt4, DenseDtype: model.DenseFP32, AUC: 0.795, FP32AUC: 0.8},  // 0.99375: passes 99 %
		{Dtype: model.DtypeFP32, DenseDtype: model.DenseBF16, AUC: 0.7985, FP32AUC: 0.8}, // 0.998125: fails 99.9 %
		{Dtype: model.DtypeFP32, DenseDtype: model.DenseFP16, AUC: 0.7996, FP32AUC: 0.8}, // 0.9995: passes 99.9 %
		{Dtype: model.DtypeInt4, DenseDtype: model.DenseBF16, AUC: 0.795, FP32AUC: 0.8},  // 0.99375: passes int4's 99 %
	}}
	f := r.Failures()
	if len(f) != 2 || !strings.HasPrefix(f[0], "dtype=int8 dense_dtype=fp32 auc_ratio=0.998750 below 0.999") ||
		!strings.HasPrefix(f[1], "dtype=fp32 dense_dtype=bf16 ") {
		t.Errorf("Failures() = %v, want int8 with dense fp32 and fp32 with dense bf16", f)
	}
}

func TestTarget(t *testing.T) {
	for _, tc := range []struct {
		d    model.Dtype
		dd   model.DenseDtype
		want float64
	}{
		{model.DtypeFP32, model.DenseFP32, 1},
		{model.DtypeFP32, model.DenseFP16, TargetHigh},
		{model.DtypeFP32, model.DenseBF16, TargetHigh},
		{model.DtypeFP16, model.DenseFP32, TargetHigh},
		{model.DtypeInt8, model.DenseBF16, TargetHigh},
		{model.DtypeInt4, model.DenseFP32, TargetLow},
		{model.DtypeInt4, model.DenseFP16, TargetLow},
		{model.DtypeInt4, model.DenseBF16, TargetLow},
		{"", "", 1}, // the empty precisions are fp32
	} {
		if got := Target(tc.d, tc.dd); got != tc.want {
			t.Errorf("Target(%q, %q) = %v, want %v", tc.d, tc.dd, got, tc.want)
		}
	}
}

func TestLineString(t *testing.T) {
	l := Line{Dtype: model.DtypeInt8, DenseDtype: model.DenseBF16, Examples: 10, AUC: 0.75, FP32AUC: 0.8, MaxAbsDiff: 1e-3, MeanAbsDiff: 2e-4}
	want := "accuracy: dtype=int8 dense_dtype=bf16 examples=10 auc=0.750000 fp32_auc=0.800000 auc_ratio=0.937500 max_abs_diff=1.000e-03 mean_abs_diff=2.000e-04"
	if got := l.String(); got != want {
		t.Errorf("String() = %q\nwant        %q", got, want)
	}
}

func TestParseDenseDtypes(t *testing.T) {
	got, err := ParseDenseDtypes("fp32, bf16,fp16")
	if err != nil || len(got) != 3 || got[0] != model.DenseFP32 || got[1] != model.DenseBF16 || got[2] != model.DenseFP16 {
		t.Errorf(`ParseDenseDtypes("fp32, bf16,fp16") = %v, %v`, got, err)
	}
	for _, s := range []string{"", "fp16,", "int8", "fp16,fp8"} {
		if _, err := ParseDenseDtypes(s); err == nil || !strings.Contains(err.Error(), "is not one of fp32, fp16, bf16") {
			t.Errorf("ParseDenseDtypes(%q) = %v, want an error listing the precisions", s, err)
		}
	}
}
