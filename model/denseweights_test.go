package model

import (
	"bytes"
	"context"
	"errors"
	"math"
	"path/filepath"
	"strings"
	"testing"
)

// denseDraw is the float32 draw of every dense parameter of cfg from seed,
// before any rounding (what Export rounds at a half precision).
func denseDraw(t *testing.T, cfg Config, seed uint64) map[string][]float32 {
	t.Helper()
	out, err := GenerateDenseWeights(cfg, seed)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func writeDense(t *testing.T, cfg Config, params map[string][]float32) []byte {
	t.Helper()
	var buf bytes.Buffer
	n, err := WriteDenseWeights(&buf, cfg, params)
	if err != nil {
		t.Fatal(err)
	}
	if n != int64(buf.Len()) {
		t.Fatalf("WriteDenseWeights reported %d bytes, wrote %d", n, buf.Len())
	}
	return buf.Bytes()
}

// TestDenseWeightsRoundTrip writes a bundle's dense parameters and reads
// them back, bit for bit; the file is a safetensors file of the dense
// tensors alone, in float32.
func TestDenseWeightsRoundTrip(t *testing.T) {
	cfg := DLRMv2(DevVocabCap)
	dir := filepath.Join(t.TempDir(), "b")
	if err := Export(context.Background(), dir, cfg, 4, nil); err != nil {
		t.Fatal(err)
	}
	b, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	want := DenseWeightsOf(b)
	file := writeDense(t, b.Config, want)
	if size := int64(len(file)); size < 4*cfg.DenseParamCount() || size > 4*cfg.DenseParamCount()+4096 {
		t.Errorf("file is %d bytes for %d float32 values", size, cfg.DenseParamCount())
	}
	h, err := parseHeader(file)
	if err != nil {
		t.Fatal(err)
	}
	if h.meta["format"] != DenseWeightsFormat || h.meta["model"] != b.Config.ID() {
		t.Errorf("metadata %v", h.meta)
	}
	for name, info := range h.tensors {
		if info.Dtype != dtypeF32 {
			t.Errorf("tensor %s written as %s", name, info.Dtype)
		}
	}
	got, err := ReadDenseWeights(b.Config, file)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(cfg.DenseParams()) {
		t.Fatalf("read %d tensors, want %d", len(got), len(cfg.DenseParams()))
	}
	for name, w := range want {
		g := got[name]
		if len(g) != len(w) {
			t.Fatalf("%s: %d values, want %d", name, len(g), len(w))
		}
		for i := range w {
			if math.Float32bits(g[i]) != math.Float32bits(w[i]) {
				t.Fatalf("%s[%d] = %v, want %v", name, i, g[i], w[i])
			}
		}
	}
}

// TestDenseWeightsRefused: every way a file can fail to fit the serving
// model is refused with the tensor's name and what differs.
func TestDenseWeightsRefused(t *testing.T) {
	cfg := tinyConfig()
	good := denseDraw(t, cfg, 1)
	wider := cfg
	wider.NumDense = 3 // bottom_mlp.0.kernel [3 2] instead of [2 2]
	deeper := cfg
	deeper.TopMLP = []int{2, 2, 1}
	shallower := cfg
	shallower.CrossLayers = 0
	nan := denseDraw(t, cfg, 1)
	nan["top_mlp.0.bias"][1] = float32(math.NaN())
	nanFile := writeDense(t, cfg, good)
	// Patch the NaN in after the writer's own check.
	patched := bytes.Replace(nanFile, f32le(good["top_mlp.1.bias"][0]), f32le(float32(math.Inf(-1))), 1)
	file := writeDense(t, cfg, good)
	for _, tc := range []struct {
		name string
		file []byte
		want string
	}{
		{"shape", writeDense(t, wider, denseDraw(t, wider, 1)), "tensor bottom_mlp.0.kernel has shape [3 2], the serving model's is [2 2]"},
		{"extra", writeDense(t, deeper, denseDraw(t, deeper, 1)), `tensor "top_mlp.2.bias" is not a dense parameter of the serving model (2 unexpected in all)`},
		{"missing", writeDense(t, shallower, denseDraw(t, shallower, 1)), "tensor cross.0.v is missing"},
		{"infinite", patched, "tensor top_mlp.1.bias element 0 is -Inf"},
		{"truncated", file[:len(file)-4], "tensor top_mlp.1.bias: corrupt bundle: data_offsets end"},
		{"empty", nil, "dense weights: corrupt bundle: file is 0 bytes"},
		{"not safetensors", []byte("12345678{oops"), "dense weights: corrupt bundle"},
	} {
		_, err := ReadDenseWeights(cfg, tc.file)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: ReadDenseWeights = %v, want an error containing %q", tc.name, err, tc.want)
		}
	}
	if _, err := ReadDenseWeights(cfg, file[:len(file)-1]); !errors.Is(err, ErrCorrupt) {
		t.Errorf("a truncated file: %v, want ErrCorrupt", err)
	}
	if _, err := WriteDenseWeights(&bytes.Buffer{}, cfg, nan); err == nil || !strings.Contains(err.Error(), "tensor top_mlp.0.bias element 1 is NaN") {
		t.Errorf("writing a NaN: %v", err)
	}
	short := denseDraw(t, cfg, 1)
	short["cross.0.u"] = short["cross.0.u"][1:]
	if _, err := WriteDenseWeights(&bytes.Buffer{}, cfg, short); err == nil || !strings.Contains(err.Error(), "tensor cross.0.u has 5 values, the model's shape [1 6] holds 6") {
		t.Errorf("writing a short tensor: %v", err)
	}
	delete(short, "cross.0.u")
	if _, err := WriteDenseWeights(&bytes.Buffer{}, cfg, short); err == nil || !strings.Contains(err.Error(), "tensor cross.0.u is missing") {
		t.Errorf("writing without a tensor: %v", err)
	}
	short["embedding.0.weight"] = []float32{1}
	if _, err := WriteDenseWeights(&bytes.Buffer{}, cfg, short); err == nil || !strings.Contains(err.Error(), `"embedding.0.weight" is not a dense parameter`) {
		t.Errorf("writing a table: %v", err)
	}
}

func f32le(v float32) []byte {
	b := math.Float32bits(v)
	return []byte{byte(b), byte(b >> 8), byte(b >> 16), byte(b >> 24)}
}

// TestDenseWeightsHalf: for a model whose dense weights are fp16 or bf16,
// float32 values are rounded as Export rounds them (Stored gives exactly
// what the bundle of that draw holds), the bundle's own half dtype is
// accepted too, and a value the half cannot hold is refused.
func TestDenseWeightsHalf(t *testing.T) {
	for _, dd := range []DenseDtype{DenseFP16, DenseBF16} {
		cfg := DLRMv2(DevVocabCap)
		cfg.BottomMLP, cfg.TopMLP, cfg.CrossLayers, cfg.CrossRank = []int{32, 128}, []int{16, 1}, 1, 3
		cfg.DenseDtype = dd
		dir := filepath.Join(t.TempDir(), string(dd))
		if err := Export(context.Background(), dir, cfg, 7, nil); err != nil {
			t.Fatal(err)
		}
		b, err := Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		draw := denseDraw(t, cfg, 7)
		for _, s := range cfg.DenseParams() {
			vals, halves, err := dd.Stored(draw[s.Name])
			if err != nil {
				t.Fatal(err)
			}
			wantV, wantH := b.Param(s.Name), b.ParamBits(s.Name)
			for i := range wantV {
				if halves[i] != wantH[i] || math.Float32bits(vals[i]) != math.Float32bits(wantV[i]) {
					t.Fatalf("%s %s[%d]: Stored gives %#04x (%v), the bundle holds %#04x (%v)", dd, s.Name, i, halves[i], vals[i], wantH[i], wantV[i])
				}
			}
		}

		// A file of the bundle's own halves, as its model.safetensors
		// stores the dense tensors.
		specs := cfg.DenseParams()
		places := make([]placed, len(specs))
		var data []byte
		for i, s := range specs {
			for _, h := range b.ParamBits(s.Name) {
				data = append(data, byte(h), byte(h>>8))
			}
			end := int64(len(data))
			places[i] = placed{spec: s, dtype: dd.tensorDtype(), shape: s.Shape, begin: end - 2*s.Elements(), end: end}
		}
		halfFile := append(encodeHeader(places, nil), data...)
		got, err := ReadDenseWeights(cfg, halfFile)
		if err != nil {
			t.Fatalf("%s: reading the bundle's own halves: %v", dd, err)
		}
		for _, s := range specs {
			for i, w := range b.Param(s.Name) {
				if got[s.Name][i] != w {
					t.Fatalf("%s %s[%d] = %v, want %v", dd, s.Name, i, got[s.Name][i], w)
				}
			}
		}
		// The other half dtype is not this model's.
		fp32 := cfg
		fp32.DenseDtype = DenseFP32
		if _, err := ReadDenseWeights(fp32, halfFile); err == nil || !strings.Contains(err.Error(), "has dtype "+dd.tensorDtype()+", want F32 (the serving model's dense_dtype is fp32)") {
			t.Errorf("%s file for an fp32 model: %v", dd, err)
		}

		big := denseDraw(t, cfg, 7)
		big["cross.0.bias"][3] = 1e30
		_, err = ReadDenseWeights(cfg, writeDense(t, cfg, big))
		if dd == DenseFP16 {
			if err == nil || !strings.Contains(err.Error(), "tensor cross.0.bias element 3 is 1e+30, which fp16 stores as +Inf") {
				t.Errorf("fp16: a value beyond the half's range: %v", err)
			}
		} else if err != nil {
			t.Errorf("bf16 holds 1e30: %v", err)
		}
	}
	if _, _, err := DenseFP32.Stored([]float32{1, float32(math.NaN())}); err == nil || err.Error() != "element 1 is NaN" {
		t.Errorf("Stored of a NaN: %v", err)
	}
	if v, h, err := DenseFP32.Stored([]float32{1, 2}); err != nil || h != nil || v[1] != 2 {
		t.Errorf("fp32 Stored = %v, %v, %v", v, h, err)
	}
}
