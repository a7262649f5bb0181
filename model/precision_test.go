package model

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"unsafe"
)

// exportAt writes a small bundle (hostbound, cap 200: about 2.6 MB of
// fp32 tables) with its tables at d.
func exportAt(t testing.TB, d Dtype, seed uint64) string {
	t.Helper()
	return exportAtDense(t, d, DenseFP32, seed)
}

// exportAtDense is exportAt with the dense parameters at dd.
func exportAtDense(t testing.TB, d Dtype, dd DenseDtype, seed uint64) string {
	t.Helper()
	cfg, err := Preset(PresetHostbound, 200)
	if err != nil {
		t.Fatal(err)
	}
	cfg.TableDtype, cfg.DenseDtype = d, dd
	dir := filepath.Join(t.TempDir(), "bundle-"+string(d)+"-"+string(dd))
	if err := Export(context.Background(), dir, cfg, seed, nil); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestExportPrecisions checks that a bundle at every precision records it,
// holds the fp32 bundle's rows quantized row by row and its dense weights
// unchanged, and takes the expected fraction of the fp32 table bytes.
func TestExportPrecisions(t *testing.T) {
	ref := openT(t, exportAt(t, DtypeFP32, 3))
	refTables := tableBytesInFile(t, ref)
	for _, d := range Dtypes()[1:] {
		t.Run(string(d), func(t *testing.T) {
			dir := exportAt(t, d, 3)
			raw, err := os.ReadFile(filepath.Join(dir, ConfigFile))
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Contains(raw, []byte(`"table_dtype": "`+string(d)+`"`)) {
				t.Errorf("config.json does not record table_dtype %s:\n%s", d, raw)
			}
			b := openT(t, dir)
			if b.Config.TableDtype != d {
				t.Errorf("Config.TableDtype = %q", b.Config.TableDtype)
			}
			// The table bytes are exactly the row size's fraction of fp32's.
			got, want := tableBytesInFile(t, b), refTables/512*int64(d.RowBytes(EmbeddingDim))
			if got != want || b.Config.TableBytes() != want {
				t.Errorf("tables take %d bytes (Config.TableBytes %d), want %d = %d/512 of fp32's %d",
					got, b.Config.TableBytes(), want, d.RowBytes(EmbeddingDim), refTables)
			}
			row := make([]byte, d.RowBytes(EmbeddingDim))
			for i := range NumTables {
				src, data := ref.Table(i), b.TableData(i)
				for r := range len(src) / EmbeddingDim {
					if err := d.QuantizeRow(row, src[r*EmbeddingDim:(r+1)*EmbeddingDim]); err != nil {
						t.Fatal(err)
					}
					if !bytes.Equal(row, data[r*len(row):(r+1)*len(row)]) {
						t.Fatalf("table %d row %d is not the fp32 row quantized", i, r)
					}
				}
			}
			for _, s := range b.Config.DenseParams() {
				if !slices.Equal(b.Param(s.Name), ref.Param(s.Name)) {
					t.Errorf("dense %s differs from the fp32 bundle's", s.Name)
				}
			}
			if _, err := b.Tensor(TableName(0)); !errors.Is(err, ErrNotFloat32) || !strings.Contains(err.Error(), string(d)) {
				t.Errorf("Tensor(table 0) of an %s bundle = %v", d, err)
			}
		})
	}
}

// tableBytesInFile sums the data_offsets ranges of b's tables.
func tableBytesInFile(t *testing.T, b *Bundle) int64 {
	t.Helper()
	h, err := parseHeader(b.mapping)
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, s := range b.Config.Tables() {
		o := h.tensors[s.Name].DataOffsets
		n += o[1] - o[0]
	}
	return n
}

// TestReferencePoolAtEveryPrecision checks Reference.Pool against a naive
// statement of its definition: DequantizeRow, then a float32 sum in bag
// order from the first row.
func TestReferencePoolAtEveryPrecision(t *testing.T) {
	for _, d := range Dtypes() {
		b := openT(t, exportAt(t, d, 4))
		cfg := b.Config
		const n = 8
		sparse, pooled := referencePool(t, b, 6, n)
		rb, off := d.RowBytes(EmbeddingDim), cfg.HotnessOffsets()
		row := make([]float32, EmbeddingDim)
		for e := range n {
			for tb := range NumTables {
				want := make([]float32, EmbeddingDim)
				for k := range cfg.Hotness[tb] {
					id := int(sparse[e*cfg.SparseWidth()+off[tb]+k])
					d.DequantizeRow(row, b.TableData(tb)[id*rb:(id+1)*rb])
					for j := range want {
						if k == 0 {
							want[j] = row[j]
						} else {
							want[j] += row[j]
						}
					}
				}
				got := pooled[(e*NumTables+tb)*EmbeddingDim:][:EmbeddingDim]
				for j := range want {
					if math.Float32bits(got[j]) != math.Float32bits(want[j]) {
						t.Fatalf("%s: pooled[%d][%d][%d] = %v, want %v", d, e, tb, j, got[j], want[j])
					}
				}
			}
		}
	}
}

// TestOpenRefusesInconsistentPrecision: a table_dtype config.json does not
// know, or tables stored otherwise than it says, are refused with the
// field or the tensor named.
func TestOpenRefusesInconsistentPrecision(t *testing.T) {
	fp32, int8, int4 := exportAt(t, DtypeFP32, 1), exportAt(t, DtypeInt8, 1), exportAt(t, DtypeInt4, 1)
	setDtype := func(config []byte, from, to string) []byte {
		return bytes.Replace(config, []byte(`"table_dtype": "`+from+`"`), []byte(`"table_dtype": "`+to+`"`), 1)
	}
	for _, tc := range []struct {
		name string
		src  string
		edit func(r rawBundle) (config, weights []byte)
		want error
		msg  []string
	}{
		{
			name: "unknown dtype", src: fp32,
			edit: func(r rawBundle) ([]byte, []byte) { return setDtype(r.config, "fp32", "int3"), r.weights(t, 0) },
			want: ErrInvalidConfig, msg: []string{ConfigFile, `table_dtype is "int3"`, "fp32, fp16, int8, int4"},
		},
		{
			name: "config says int8, tables are fp32", src: fp32,
			edit: func(r rawBundle) ([]byte, []byte) { return setDtype(r.config, "fp32", "int8"), r.weights(t, 0) },
			want: ErrMismatch, msg: []string{`"embedding.0.weight" has dtype F32, want U8`, "table_dtype int8"},
		},
		{
			name: "config says fp16, tables are int8", src: int8,
			edit: func(r rawBundle) ([]byte, []byte) { return setDtype(r.config, "int8", "fp16"), r.weights(t, 0) },
			want: ErrMismatch, msg: []string{`"embedding.0.weight" has dtype U8, want F16`, "table_dtype fp16"},
		},
		{
			name: "config says int8, tables are int4", src: int4,
			edit: func(r rawBundle) ([]byte, []byte) { return setDtype(r.config, "int4", "int8"), r.weights(t, 0) },
			want: ErrMismatch, msg: []string{`"embedding.0.weight" has shape [200 68], want [200 136]`, "table_dtype int8"},
		},
		{
			name: "int8 table shape in elements", src: int8,
			edit: func(r rawBundle) ([]byte, []byte) {
				r.tensor(TableName(3))["shape"] = []int{4, 128}
				return r.config, r.weights(t, 0)
			},
			want: ErrMismatch, msg: []string{`"embedding.3.weight" has shape [4 128], want [200 136]`},
		},
		{
			name: "int4 table one byte short", src: int4,
			edit: func(r rawBundle) ([]byte, []byte) {
				b, e := r.offsets(TableName(25))
				r.tensor(TableName(25))["data_offsets"] = []int{b, e - 1}
				return r.config, r.weights(t, 0)
			},
			want: ErrCorrupt, msg: []string{`"embedding.25.weight"`, "hold 2447 bytes", "U8 needs 2448", "table_dtype int4"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, w := tc.edit(readRaw(t, tc.src))
			_, err := Open(writeBundle(t, cfg, w))
			if !errors.Is(err, tc.want) {
				t.Fatalf("Open = %v, want %v", err, tc.want)
			}
			for _, m := range tc.msg {
				if !strings.Contains(err.Error(), m) {
					t.Errorf("Open error %q lacks %q", err, m)
				}
			}
		})
	}
}

// TestOpenConfigWithoutDtype: a config.json written before precisions
// existed has no table_dtype and no dense_dtype and holds fp32 tables and
// dense parameters.
func TestOpenConfigWithoutDtype(t *testing.T) {
	r := readRaw(t, exportAt(t, DtypeFP32, 1))
	cfg := r.config
	for _, field := range []string{"table_dtype", "dense_dtype"} {
		was := cfg
		cfg = bytes.Replace(cfg, []byte(`,
  "`+field+`": "fp32"`), nil, 1)
		if bytes.Equal(cfg, was) {
			t.Fatalf("config.json has no %s to remove:\n%s", field, r.config)
		}
	}
	b := openT(t, writeBundle(t, cfg, r.weights(t, 0)))
	if b.Config.TableDtype != DtypeFP32 || b.Config.DenseDtype != DenseFP32 {
		t.Errorf("TableDtype = %q, DenseDtype = %q, want fp32 and fp32", b.Config.TableDtype, b.Config.DenseDtype)
	}
	if b.ParamBits("top_mlp.0.bias") != nil {
		t.Error("ParamBits of an fp32 bundle is not nil")
	}
}

// TestExportDensePrecisions checks that a bundle with half-precision dense
// parameters records the precision, stores every parameter as the float32
// weight of the fp32 bundle rounded to the nearest half in the shape it
// had, serves those halves (ParamBits) and their exact widenings (Param,
// Tensor), keeps the tables of the same table precision byte for byte,
// and scores close to, but not exactly as, the fp32 network.
func TestExportDensePrecisions(t *testing.T) {
	const seed, n = 3, 64
	fp32 := openT(t, exportAt(t, DtypeFP32, seed))
	if got := fp32.ParamBits("top_mlp.0.kernel"); got != nil {
		t.Errorf("ParamBits of an fp32 bundle = %d values, want nil", len(got))
	}
	fp32Ref, err := NewReference(fp32)
	if err != nil {
		t.Fatal(err)
	}
	dense, sparse := RandomInputs(fp32.Config, 5, n)
	for _, dd := range DenseDtypes()[1:] {
		for _, d := range []Dtype{DtypeFP32, DtypeInt4} {
			t.Run(string(dd)+"/"+string(d), func(t *testing.T) {
				dir := exportAtDense(t, d, dd, seed)
				raw, err := os.ReadFile(filepath.Join(dir, ConfigFile))
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Contains(raw, []byte(`"dense_dtype": "`+string(dd)+`"`)) {
					t.Errorf("config.json does not record dense_dtype %s:\n%s", dd, raw)
				}
				b := openT(t, dir)
				if b.Config.DenseDtype != dd || b.Config.TableDtype != d {
					t.Errorf("Config dense_dtype %q table_dtype %q, want %s and %s", b.Config.DenseDtype, b.Config.TableDtype, dd, d)
				}
				h, err := parseHeader(b.mapping)
				if err != nil {
					t.Fatal(err)
				}
				var denseBytes int64
				for _, s := range b.Config.DenseParams() {
					info := h.tensors[s.Name]
					if want := dd.tensorDtype(); info.Dtype != want || !sameShape(info.Shape, s.Shape) {
						t.Errorf("%s is stored %s %v, want %s %v", s.Name, info.Dtype, info.Shape, want, s.Shape)
					}
					denseBytes += info.DataOffsets[1] - info.DataOffsets[0]
					want, bits, got := fp32.Param(s.Name), b.ParamBits(s.Name), b.Param(s.Name)
					if len(bits) != len(want) || len(got) != len(want) {
						t.Fatalf("%s: %d halves and %d values, want %d", s.Name, len(bits), len(got), len(want))
					}
					viaTensor, err := b.Tensor(s.Name)
					if err != nil || &viaTensor[0] != &got[0] {
						t.Errorf("Tensor(%s) = %v, not Param's values", s.Name, err)
					}
					for k, w := range want {
						if bits[k] != dd.narrow(w) {
							t.Fatalf("%s[%d] is stored %#04x, the nearest %s to %v is %#04x", s.Name, k, bits[k], dd, w, dd.narrow(w))
						}
						if math.Float32bits(got[k]) != math.Float32bits(dd.widen(bits[k])) || got[k] != dd.Round(w) {
							t.Fatalf("%s[%d] reads %v, stored %#04x widens to %v", s.Name, k, got[k], bits[k], dd.widen(bits[k]))
						}
					}
				}
				if want := b.Config.DenseBytes(); denseBytes != want || want != 2*b.Config.DenseParamCount() {
					t.Errorf("dense parameters take %d bytes, DenseBytes says %d, want 2 per value", denseBytes, want)
				}
				same := openT(t, exportAt(t, d, seed))
				for i := range NumTables {
					if !bytes.Equal(b.TableData(i), same.TableData(i)) {
						t.Fatalf("table %d differs from the fp32-dense bundle's", i)
					}
				}

				ref, err := NewReference(b)
				if err != nil {
					t.Fatal(err)
				}
				want := fp32Ref
				if d != DtypeFP32 {
					if want, err = NewReference(same); err != nil {
						t.Fatal(err)
					}
				}
				got, err := ref.Predict(dense, sparse, n)
				if err != nil {
					t.Fatal(err)
				}
				wantScores, err := want.Predict(dense, sparse, n)
				if err != nil {
					t.Fatal(err)
				}
				var maxDiff float64
				for i := range got {
					maxDiff = max(maxDiff, math.Abs(float64(got[i])-float64(wantScores[i])))
				}
				t.Logf("scores within %.3g of the fp32 network's", maxDiff)
				// bf16 keeps 8 significant bits: a weight moves by up to
				// 2^-9 of itself, and the score about as much.
				if maxDiff == 0 || maxDiff > 5e-3 {
					t.Errorf("scores differ from the fp32 network's by at most %.3g, want above 0 and at most 5e-3", maxDiff)
				}
			})
		}
	}
	func() {
		defer func() {
			if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), `"embedding.0.weight"`) {
				t.Errorf("ParamBits(a table) panicked with %v, want an error naming it", r)
			}
		}()
		fp32.ParamBits(TableName(0))
	}()
}

// TestOpenRefusesInconsistentDensePrecision: a dense_dtype config.json
// does not know, dense parameters stored otherwise than it says, or a
// stored half that is not finite are refused with the field or the tensor
// named.
func TestOpenRefusesInconsistentDensePrecision(t *testing.T) {
	fp32, fp16, bf16 := exportAt(t, DtypeFP32, 1), exportAtDense(t, DtypeFP32, DenseFP16, 1), exportAtDense(t, DtypeInt8, DenseBF16, 1)
	setDense := func(config []byte, from, to string) []byte {
		return bytes.Replace(config, []byte(`"dense_dtype": "`+from+`"`), []byte(`"dense_dtype": "`+to+`"`), 1)
	}
	for _, tc := range []struct {
		name string
		src  string
		edit func(r rawBundle) (config, weights []byte)
		want error
		msg  []string
	}{
		{
			name: "unknown dense dtype", src: fp32,
			edit: func(r rawBundle) ([]byte, []byte) { return setDense(r.config, "fp32", "fp8"), r.weights(t, 0) },
			want: ErrInvalidConfig, msg: []string{ConfigFile, `dense_dtype is "fp8"`, "fp32, fp16, bf16"},
		},
		{
			name: "config says fp16, weights are fp32", src: fp32,
			edit: func(r rawBundle) ([]byte, []byte) { return setDense(r.config, "fp32", "fp16"), r.weights(t, 0) },
			want: ErrMismatch, msg: []string{`tensor "bottom_mlp.0.kernel" has dtype F32, want F16 (config.json says dense_dtype fp16)`},
		},
		{
			name: "config says bf16, weights are fp16", src: fp16,
			edit: func(r rawBundle) ([]byte, []byte) { return setDense(r.config, "fp16", "bf16"), r.weights(t, 0) },
			want: ErrMismatch, msg: []string{`"bottom_mlp.0.kernel" has dtype F16, want BF16 (config.json says dense_dtype bf16)`},
		},
		{
			name: "config says fp32, weights are bf16", src: bf16,
			edit: func(r rawBundle) ([]byte, []byte) { return setDense(r.config, "bf16", "fp32"), r.weights(t, 0) },
			want: ErrMismatch, msg: []string{`"bottom_mlp.0.kernel" has dtype BF16, want F32 (config.json says dense_dtype fp32)`},
		},
		{
			name: "config without dense_dtype, weights are bf16", src: bf16,
			edit: func(r rawBundle) ([]byte, []byte) {
				return bytes.Replace(r.config, []byte(`,
  "dense_dtype": "bf16"`), nil, 1), r.weights(t, 0)
			},
			want: ErrMismatch, msg: []string{`"bottom_mlp.0.kernel" has dtype BF16, want F32`},
		},
		{
			name: "fp16 weights in a float32 shape", src: fp16,
			edit: func(r rawBundle) ([]byte, []byte) {
				b, e := r.offsets("top_mlp.0.kernel")
				r.tensor("top_mlp.0.kernel")["data_offsets"] = []int{b, b + 2*(e-b)}
				return r.config, r.weights(t, 0)
			},
			want: ErrCorrupt, msg: []string{`"top_mlp.0.kernel"`, "hold 13824 bytes", "of F16 needs 6912", "dense_dtype fp16"},
		},
		{
			name: "NaN in an fp16 dense param", src: fp16,
			edit: func(r rawBundle) ([]byte, []byte) {
				b, _ := r.offsets("bottom_mlp.0.bias")
				binary.LittleEndian.PutUint16(r.data[b+2*7:], 0x7e00)
				return r.config, r.weights(t, 0)
			},
			want: ErrCorrupt, msg: []string{`"bottom_mlp.0.bias": element 7 is NaN`},
		},
		{
			name: "Inf in a bf16 dense param", src: bf16,
			edit: func(r rawBundle) ([]byte, []byte) {
				b, _ := r.offsets("top_mlp.0.kernel")
				binary.LittleEndian.PutUint16(r.data[b+2*3:], 0xff80)
				return r.config, r.weights(t, 0)
			},
			want: ErrCorrupt, msg: []string{`"top_mlp.0.kernel": element 3 is -Inf`},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, w := tc.edit(readRaw(t, tc.src))
			_, err := Open(writeBundle(t, cfg, w))
			if !errors.Is(err, tc.want) {
				t.Fatalf("Open = %v, want %v", err, tc.want)
			}
			for _, m := range tc.msg {
				if !strings.Contains(err.Error(), m) {
					t.Errorf("Open error %q lacks %q", err, m)
				}
			}
		})
	}
}

// TestOpenMisalignedHalves: dense halves that a foreign writer left off a
// 2-byte boundary are copied out of the mapping, with the same values.
func TestOpenMisalignedHalves(t *testing.T) {
	src := exportAtDense(t, DtypeFP16, DenseBF16, 2)
	aligned := openT(t, src)
	r := readRaw(t, src)
	b := openT(t, writeBundle(t, r.config, r.weights(t, 1)))
	inMapping := func(b *Bundle, h []uint16) bool {
		lo, p := uintptr(unsafe.Pointer(&b.mapping[0])), uintptr(unsafe.Pointer(&h[0]))
		return p >= lo && p < lo+uintptr(len(b.mapping))
	}
	for _, s := range b.Config.DenseParams() {
		got, want := b.ParamBits(s.Name), aligned.ParamBits(s.Name)
		if !slices.Equal(got, want) || !slices.Equal(b.Param(s.Name), aligned.Param(s.Name)) {
			t.Fatalf("%s differs from the aligned bundle's", s.Name)
		}
		if inMapping(b, got) || !inMapping(aligned, want) {
			t.Errorf("%s: misaligned halves in the mapping: %v, aligned ones: %v; want false and true",
				s.Name, inMapping(b, got), inMapping(aligned, want))
		}
	}
}
