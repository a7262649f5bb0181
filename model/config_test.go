package model

import (
	"bytes"
	"context"
	"errors"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestValidateAcceptsConsistentShapes(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*Config)
	}{
		{"mlperf", func(*Config) {}},
		{"one bottom layer", func(c *Config) { c.BottomMLP = []int{128} }},
		{"top is one logit", func(c *Config) { c.TopMLP = []int{1} }},
		{"narrow layers", func(c *Config) { c.BottomMLP = []int{1, 128}; c.TopMLP = []int{1, 1, 1} }},
		{"no cross layers", func(c *Config) { c.CrossLayers = 0 }},
		{"no cross layers, rank 0", func(c *Config) { c.CrossLayers, c.CrossRank = 0, 0 }},
		{"rank 1", func(c *Config) { c.CrossRank = 1 }},
		{"rank above the interaction width", func(c *Config) { c.CrossLayers, c.CrossRank = 1, 4096 }},
		{"most cross layers", func(c *Config) { c.CrossLayers, c.CrossRank = MaxCrossLayers, 4 }},
		{"widest layer", func(c *Config) { c.BottomMLP = []int{MaxLayerWidth, 128} }},
		{"most layers", func(c *Config) { c.TopMLP = slices.Repeat([]int{1}, MaxMLPLayers) }},
		{"uncapped", func(c *Config) { *c = DLRMv2(0) }},
	} {
		cfg := DLRMv2(DevVocabCap)
		tc.edit(&cfg)
		if err := cfg.Validate(); err != nil {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
}

func TestValidateRefusals(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*Config)
		msg  string // the message must hold it; it names the field
	}{
		{"num_dense", func(c *Config) { c.NumDense = 12 }, "num_dense is 12, want 13"},
		{"embedding_dim", func(c *Config) { c.EmbeddingDim = 64 }, "embedding_dim is 64, want 128"},
		{"table count", func(c *Config) { c.VocabSizes = c.VocabSizes[:25] }, "vocab_sizes has 25 tables"},
		{"hotness count", func(c *Config) { c.Hotness = c.Hotness[:25] }, "hotness has 25 tables"},
		{"empty vocabulary", func(c *Config) { c.VocabSizes[4] = 0 }, "vocab_sizes[4] is 0"},
		{"vocabulary above MLPerf", func(c *Config) { c.VocabSizes[5] = 4 }, "vocab_sizes[5] is 4, want 1..3"},
		{"hotness", func(c *Config) { c.Hotness[20] = 99 }, "hotness[20] is 99, want 100"},
		{"no bottom MLP", func(c *Config) { c.BottomMLP = nil }, "bottom_mlp has 0 layers"},
		{"bottom MLP too deep", func(c *Config) { c.BottomMLP = slices.Repeat([]int{128}, MaxMLPLayers+1) }, "bottom_mlp has 65 layers, want 1..64"},
		{"zero bottom width", func(c *Config) { c.BottomMLP = []int{512, 0, 128} }, "bottom_mlp[1] is 0"},
		{"negative bottom width", func(c *Config) { c.BottomMLP = []int{-4, 128} }, "bottom_mlp[0] is -4"},
		{"bottom width too big", func(c *Config) { c.BottomMLP = []int{MaxLayerWidth + 1, 128} }, "bottom_mlp[0] is 65537, want 1..65536"},
		{"bottom ends off the embedding width", func(c *Config) { c.BottomMLP = []int{512, 256} }, "bottom_mlp ends at width 256 (bottom_mlp[1]), want 128 (embedding_dim)"},
		{"no top MLP", func(c *Config) { c.TopMLP = []int{} }, "top_mlp has 0 layers"},
		{"top MLP too deep", func(c *Config) { c.TopMLP = slices.Repeat([]int{1}, MaxMLPLayers+1) }, "top_mlp has 65 layers"},
		{"zero top width", func(c *Config) { c.TopMLP = []int{0, 1} }, "top_mlp[0] is 0"},
		{"top width too big", func(c *Config) { c.TopMLP = []int{1 << 20, 1} }, "top_mlp[0] is 1048576"},
		{"top ends in two outputs", func(c *Config) { c.TopMLP = []int{1024, 2} }, "top_mlp ends at width 2 (top_mlp[1]), want 1"},
		{"negative cross layers", func(c *Config) { c.CrossLayers = -1 }, "cross_layers is -1, want 0..64"},
		{"too many cross layers", func(c *Config) { c.CrossLayers = MaxCrossLayers + 1 }, "cross_layers is 65"},
		{"cross rank 0", func(c *Config) { c.CrossRank = 0 }, "cross_rank is 0, want 1..65536 with 3 cross layers"},
		{"negative cross rank", func(c *Config) { c.CrossRank = -2 }, "cross_rank is -2"},
		{"cross rank too big", func(c *Config) { c.CrossRank = MaxLayerWidth + 1 }, "cross_rank is 65537"},
		{"negative unused cross rank", func(c *Config) { c.CrossLayers, c.CrossRank = 0, -1 }, "cross_rank is -1, want 0..65536 (unused: cross_layers is 0)"},
		{"too many dense parameters", func(c *Config) { c.CrossLayers, c.CrossRank = MaxCrossLayers, MaxLayerWidth },
			"bottom_mlp, cross_layers, cross_rank and top_mlp give 28996667777 dense parameters"},
		{"unknown table dtype", func(c *Config) { c.TableDtype = "int2" }, `table_dtype is "int2", want one of fp32, fp16, int8, int4`},
		{"unknown dense dtype", func(c *Config) { c.DenseDtype = "fp8" }, `dense_dtype is "fp8", want one of fp32, fp16, bf16`},
		{"table dtype as dense dtype", func(c *Config) { c.DenseDtype = DenseDtype(DtypeInt8) }, `dense_dtype is "int8"`},
	} {
		cfg := DLRMv2(DevVocabCap)
		tc.edit(&cfg)
		err := cfg.Validate()
		if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%s: Validate() = %v, want ErrInvalidConfig with %q", tc.name, err, tc.msg)
		}
		// The field is the message's first word (up to any index), but for
		// a network too big as a whole.
		field, _, _ := strings.Cut(strings.Fields(tc.msg)[0], "[")
		if strings.Contains(tc.msg, "dense parameters") {
			field = FieldDense
		}
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field != field {
			t.Errorf("%s: Validate() = %#v, want a FieldError for %q", tc.name, err, field)
		}
	}
}

func TestDenseParamCount(t *testing.T) {
	for _, name := range PresetNames() {
		cfg, err := Preset(name, DevVocabCap)
		if err != nil {
			t.Fatal(err)
		}
		var want int64
		for _, p := range cfg.DenseParams() {
			want += p.Elements()
		}
		if got := cfg.DenseParamCount(); got != want {
			t.Errorf("%s: DenseParamCount() = %d, DenseParams hold %d", name, got, want)
		}
		for _, d := range []DenseDtype{"", DenseFP32, DenseFP16, DenseBF16} {
			cfg.DenseDtype = d
			if got, per := cfg.DenseBytes(), int64(d.ValueBytes()); got != want*per {
				t.Errorf("%s at dense dtype %q: DenseBytes() = %d, want %d values of %d bytes", name, d, got, want, per)
			}
		}
	}
}

func TestPresets(t *testing.T) {
	if names := PresetNames(); !slices.Equal(names, []string{PresetMLPerf, PresetHostbound}) {
		t.Errorf("PresetNames() = %v", names)
	}
	mlperf, err := Preset(PresetMLPerf, BenchVocabCap)
	if err != nil {
		t.Fatal(err)
	}
	if want := DLRMv2(BenchVocabCap); !equalConfigs(mlperf, want) {
		t.Errorf("mlperf preset %+v, want DLRMv2 %+v", mlperf, want)
	}
	host, err := Preset(PresetHostbound, BenchVocabCap)
	if err != nil {
		t.Fatal(err)
	}
	if err := host.Validate(); err != nil {
		t.Fatal(err)
	}
	if host.Name != "dlrm-dcnv2-hostbound" || mlperf.Name != "dlrm-dcnv2" {
		t.Errorf("names %q and %q", mlperf.Name, host.Name)
	}
	// hostbound keeps the whole input side: tables, vocabularies, hotness.
	if !slices.Equal(host.VocabSizes, mlperf.VocabSizes) || !slices.Equal(host.Hotness, mlperf.Hotness) ||
		host.SparseWidth() != 214 || host.NumDense != mlperf.NumDense || host.EmbeddingDim != mlperf.EmbeddingDim ||
		host.MaxVocabSize != BenchVocabCap {
		t.Errorf("hostbound input side %+v differs from mlperf's", host)
	}
	// …and its dense network is much smaller.
	if h, m := host.DenseParamCount(), mlperf.DenseParamCount(); h*100 > m {
		t.Errorf("hostbound has %d dense parameters, mlperf %d: want under 1%%", h, m)
	}
	// Presets hand out copies: editing one does not edit the next.
	host.BottomMLP[0], host.TopMLP[0] = 7, 7
	mlperf.BottomMLP[0], mlperf.TopMLP[0] = 7, 7
	again, _ := Preset(PresetHostbound, BenchVocabCap)
	if !slices.Equal(again.BottomMLP, HostboundBottomMLP) || !slices.Equal(again.TopMLP, HostboundTopMLP) ||
		BottomMLP[0] != 512 || TopMLP[0] != 1024 {
		t.Error("a preset shares its width slices")
	}
	if _, err := Preset("huge", 0); err == nil || !strings.Contains(err.Error(), `unknown preset "huge", want one of mlperf, hostbound`) {
		t.Errorf("unknown preset: %v", err)
	}
}

func equalConfigs(a, b Config) bool {
	return a.Name == b.Name && a.NumDense == b.NumDense && a.EmbeddingDim == b.EmbeddingDim &&
		slices.Equal(a.VocabSizes, b.VocabSizes) && slices.Equal(a.Hotness, b.Hotness) &&
		slices.Equal(a.BottomMLP, b.BottomMLP) && slices.Equal(a.TopMLP, b.TopMLP) &&
		a.CrossLayers == b.CrossLayers && a.CrossRank == b.CrossRank &&
		a.MaxVocabSize == b.MaxVocabSize && a.Seed == b.Seed
}

// TestOtherShapesExportAndRun exports bundles of shapes other than MLPerf's,
// reopens them and runs the reference: every component takes the widths
// from config.json.
func TestOtherShapesExportAndRun(t *testing.T) {
	host, err := Preset(PresetHostbound, DevVocabCap)
	if err != nil {
		t.Fatal(err)
	}
	noCross := DLRMv2(DevVocabCap)
	noCross.Name, noCross.CrossLayers, noCross.CrossRank = "no-cross", 0, 0
	noCross.BottomMLP, noCross.TopMLP = []int{64, 128}, []int{32, 1}
	deep := DLRMv2(DevVocabCap)
	deep.Name, deep.CrossLayers, deep.CrossRank = "deep", 5, 3
	deep.BottomMLP, deep.TopMLP = []int{7, 9, 128}, []int{5, 4, 3, 1}
	for _, cfg := range []Config{host, noCross, deep} {
		dir := filepath.Join(t.TempDir(), "b")
		if err := Export(context.Background(), dir, cfg, 2, nil); err != nil {
			t.Fatalf("%s: %v", cfg.Name, err)
		}
		b := openT(t, dir)
		if !slices.Equal(b.Config.BottomMLP, cfg.BottomMLP) || !slices.Equal(b.Config.TopMLP, cfg.TopMLP) ||
			b.Config.CrossLayers != cfg.CrossLayers || b.Config.CrossRank != cfg.CrossRank || b.Config.Name != cfg.Name {
			t.Errorf("%s: reopened as %+v", cfg.Name, b.Config)
		}
		r, err := NewReference(b)
		if err != nil {
			t.Fatalf("%s: %v", cfg.Name, err)
		}
		const n = 64
		dense, sparse := RandomInputs(b.Config, 3, n)
		scores, err := r.Predict(dense, sparse, n)
		if err != nil {
			t.Fatalf("%s: %v", cfg.Name, err)
		}
		lo, hi := 1.0, 0.0
		for _, s := range scores {
			if math.IsNaN(float64(s)) || s <= 0 || s >= 1 {
				t.Fatalf("%s: score %v", cfg.Name, s)
			}
			lo, hi = min(lo, float64(s)), max(hi, float64(s))
		}
		// A score that does not depend on the inputs would prove little.
		if hi-lo < 1e-3 {
			t.Errorf("%s: scores all in [%v, %v]", cfg.Name, lo, hi)
		}
		// Scores do not depend on the batch.
		one, err := r.Predict(dense[5*NumDense:6*NumDense], sparse[5*cfg.SparseWidth():6*cfg.SparseWidth()], 1)
		if err != nil || one[0] != scores[5] {
			t.Errorf("%s: example 5 alone scores %v (%v), in the batch %v", cfg.Name, one, err, scores[5])
		}
	}
}

// TestReferenceWithoutCrossLayers checks by hand that zero cross layers
// feed x0 straight into the top MLP.
func TestReferenceWithoutCrossLayers(t *testing.T) {
	cfg := tinyConfig()
	cfg.CrossLayers, cfg.CrossRank = 0, 0
	params := map[string][]float32{
		"embedding.0.weight":  {1, 2, 3, 4, 5, 6},
		"embedding.1.weight":  {0.5, -1, 2, 0},
		"bottom_mlp.0.kernel": {1, -1, 0.5, 1},
		"bottom_mlp.0.bias":   {0, -2},
		"top_mlp.0.kernel":    {0.25, 0, 0, 0, 0, 0.25, 0.125, -0.25, -0.5, 0, 0, 0},
		"top_mlp.0.bias":      {0, -0.5},
		"top_mlp.1.kernel":    {2, 3},
		"top_mlp.1.bias":      {-1},
	}
	r, err := newReference(cfg, func(name string) ([]float32, error) {
		p, ok := params[name]
		if !ok {
			return nil, ErrNoTensor
		}
		return p, nil
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	// The examples of TestReferenceByHand. Example 0: x0 = [2,0, 6,8, 2,0];
	// top 0: [0.5+1-1, 1.5-2] + [0,-0.5] = [0.5,-1] → ReLU [0.5,0];
	// top 1: 2·0.5 - 1 = 0 (with the cross layer it was 3).
	// Example 1: x0 = [0,0, 6,8, 0.5,-1]; top 0: [1-0.25, 1.5-2] + [0,-0.5]
	// → [0.75,0]; top 1: 1.5 - 1 = 0.5 (the cross layer left it alone).
	got, err := r.Predict([]float32{1, 2, 0, 0}, []int32{0, 2, 1, 1, 1, 0}, 2)
	if err != nil {
		t.Fatal(err)
	}
	for i, w := range []float64{sigmoidRef(0), sigmoidRef(0.5)} {
		if math.Abs(float64(got[i])-w) > 1e-7 {
			t.Errorf("score %d = %v, want %v", i, got[i], w)
		}
	}
}

// TestPresetExportIsDeterministic: same preset, cap and seed, same bytes.
func TestPresetExportIsDeterministic(t *testing.T) {
	cfg, err := Preset(PresetHostbound, DevVocabCap)
	if err != nil {
		t.Fatal(err)
	}
	var files [2][2][]byte
	for i := range files {
		dir := filepath.Join(t.TempDir(), "b")
		if err := Export(context.Background(), dir, cfg, 9, nil); err != nil {
			t.Fatal(err)
		}
		for j, name := range []string{ConfigFile, WeightsFile} {
			if files[i][j], err = os.ReadFile(filepath.Join(dir, name)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if !bytes.Equal(files[0][0], files[1][0]) || !bytes.Equal(files[0][1], files[1][1]) {
		t.Error("two exports of the hostbound preset with one seed differ")
	}
}

// TestIDNamesThePrecisions: the bundles of one seed at other precisions
// are other models, so their ids differ, while a float32 bundle keeps the
// id it had before bundles had precisions.
func TestIDNamesThePrecisions(t *testing.T) {
	cfg := DLRMv2(1000)
	cfg.Seed = 1
	base := cfg.ID()
	if base != "dlrm-dcnv2-cap1000-seed1" {
		t.Errorf("float32 id %q changed", base)
	}
	seen := map[string]bool{}
	for _, td := range Dtypes() {
		for _, dd := range DenseDtypes() {
			c := cfg
			c.TableDtype, c.DenseDtype = td, dd
			id := c.ID()
			if seen[id] {
				t.Errorf("table %s dense %s: id %q already names another precision", td, dd, id)
			}
			seen[id] = true
			// shm.ModelIDBytes: the segment header's field.
			if len(id) > 64 {
				t.Errorf("id %q is longer than a segment header holds", id)
			}
		}
	}
	full := cfg
	full.Name, full.TableDtype, full.DenseDtype = "dlrm-dcnv2-hostbound", DtypeInt4, DenseBF16
	if len(full.ID()) > 64 {
		t.Errorf("id %q is longer than a segment header holds", full.ID())
	}
}
