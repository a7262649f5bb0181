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

// exportAt writes a small bundle (hostbound, cap 200: about 2.6 MB of
// fp32 tables) with its tables at d.
func exportAt(t testing.TB, d Dtype, seed uint64) string {
	t.Helper()
	cfg, err := Preset(PresetHostbound, 200)
	if err != nil {
		t.Fatal(err)
	}
	cfg.TableDtype = d
	dir := filepath.Join(t.TempDir(), "bundle-"+string(d))
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
// existed has no table_dtype and holds fp32 tables.
func TestOpenConfigWithoutDtype(t *testing.T) {
	r := readRaw(t, exportAt(t, DtypeFP32, 1))
	cfg := bytes.Replace(r.config, []byte(`,
  "table_dtype": "fp32"`), nil, 1)
	if bytes.Equal(cfg, r.config) {
		t.Fatalf("config.json has no table_dtype to remove:\n%s", r.config)
	}
	b := openT(t, writeBundle(t, cfg, r.weights(t, 0)))
	if b.Config.TableDtype != DtypeFP32 {
		t.Errorf("TableDtype = %q, want fp32", b.Config.TableDtype)
	}
}
