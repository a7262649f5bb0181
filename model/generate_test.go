package model

import (
	"context"
	"math"
	"path/filepath"
	"slices"
	"testing"
)

// TestGeneratedReferenceMatchesBundle checks that a Reference drawn without
// a bundle gives the bits of NewReference over the exported bundle at
// every table and dense precision, whether its tables are all in memory,
// all regenerated on every read, or some of each.
func TestGeneratedReferenceMatchesBundle(t *testing.T) {
	const seed, n = 4, 48
	type combo struct {
		d  Dtype
		dd DenseDtype
	}
	var hostbound []combo
	for _, d := range Dtypes() {
		for _, dd := range DenseDtypes() {
			hostbound = append(hostbound, combo{d, dd})
		}
	}
	for _, preset := range []string{PresetHostbound, PresetMLPerf} {
		combos := hostbound
		if preset == PresetMLPerf {
			// The dense network is what this preset adds: every dense
			// precision, and the table precisions only as a sample.
			combos = []combo{{DtypeFP32, DenseFP32}, {DtypeInt4, DenseFP32}, {DtypeFP32, DenseFP16}, {DtypeInt8, DenseBF16}}
		}
		for _, c := range combos {
			d, dd := c.d, c.dd
			t.Run(preset+"/"+string(d)+"/"+string(dd), func(t *testing.T) {
				cfg, err := Preset(preset, DevVocabCap)
				if err != nil {
					t.Fatal(err)
				}
				cfg.TableDtype, cfg.DenseDtype = d, dd
				dir := filepath.Join(t.TempDir(), "bundle")
				if err := Export(context.Background(), dir, cfg, seed, nil); err != nil {
					t.Fatal(err)
				}
				b := openT(t, dir)
				want, err := NewReference(b)
				if err != nil {
					t.Fatal(err)
				}
				dense, sparse := RandomInputs(cfg, 9, n)
				wantPooled := make([]float32, n*NumTables*EmbeddingDim)
				if err := want.Pool(sparse, n, wantPooled); err != nil {
					t.Fatal(err)
				}
				wantScores, err := want.Predict(dense, sparse, n)
				if err != nil {
					t.Fatal(err)
				}
				// 200 KB holds the small tables and leaves the big ones
				// to be regenerated.
				for _, mem := range []int64{1 << 40, 0, 200 << 10} {
					got, err := NewGeneratedReference(cfg, seed, mem)
					if err != nil {
						t.Fatal(err)
					}
					pooled := make([]float32, len(wantPooled))
					if err := got.Pool(sparse, n, pooled); err != nil {
						t.Fatal(err)
					}
					for i := range pooled {
						if math.Float32bits(pooled[i]) != math.Float32bits(wantPooled[i]) {
							t.Fatalf("table memory %d: pooled[%d] = %v, the bundle's %v", mem, i, pooled[i], wantPooled[i])
						}
					}
					scores, err := got.Predict(dense, sparse, n)
					if err != nil {
						t.Fatal(err)
					}
					if !slices.Equal(scores, wantScores) {
						t.Fatalf("table memory %d: scores %v, the bundle's %v", mem, scores[:4], wantScores[:4])
					}
				}
			})
		}
	}
}

// TestGenerateRowAndTensor checks the exported generators against an
// exported fp32 bundle.
func TestGenerateRowAndTensor(t *testing.T) {
	const seed = 6
	b := openT(t, exportAt(t, DtypeFP32, seed))
	cfg := b.Config
	row := make([]float32, EmbeddingDim)
	for _, tb := range []int{0, 5, 20, NumTables - 1} {
		vocab := cfg.VocabSizes[tb]
		for _, r := range []int{0, vocab / 2, vocab - 1} {
			if err := GenerateRow(cfg, seed, tb, r, row); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(row, b.Table(tb)[r*EmbeddingDim:(r+1)*EmbeddingDim]) {
				t.Errorf("GenerateRow(table %d, row %d) differs from the bundle's", tb, r)
			}
		}
	}
	for _, s := range append(cfg.DenseParams(), cfg.Tables()[3]) {
		got, err := GenerateTensor(cfg, seed, s.Name)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, b.Param(s.Name)) {
			t.Errorf("GenerateTensor(%s) differs from the bundle's", s.Name)
		}
	}
	for _, bad := range [][3]int{{-1, 0, EmbeddingDim}, {NumTables, 0, EmbeddingDim}, {2, cfg.VocabSizes[2], EmbeddingDim}, {2, -1, EmbeddingDim}, {2, 0, 3}} {
		if err := GenerateRow(cfg, seed, bad[0], bad[1], make([]float32, bad[2])); err == nil {
			t.Errorf("GenerateRow(table %d, row %d, %d values) accepted", bad[0], bad[1], bad[2])
		}
	}
	if _, err := GenerateTensor(cfg, seed, "no.such"); err == nil {
		t.Error("GenerateTensor of an unknown name accepted")
	}
}

// TestRandomInputsAt checks that blocks of a draw are the slices of the
// whole draw.
func TestRandomInputsAt(t *testing.T) {
	cfg := DLRMv2(DevVocabCap)
	const n = 40
	dense, sparse := RandomInputs(cfg, 8, n)
	w := cfg.SparseWidth()
	for _, blk := range [][2]int{{0, 40}, {0, 1}, {7, 13}, {39, 1}, {20, 0}} {
		d, s := RandomInputsAt(cfg, 8, blk[0], blk[1])
		lo, hi := blk[0], blk[0]+blk[1]
		if !slices.Equal(d, dense[lo*NumDense:hi*NumDense]) || !slices.Equal(s, sparse[lo*w:hi*w]) {
			t.Errorf("RandomInputsAt(%d, %d) is not examples %d..%d of the draw", blk[0], blk[1], lo, hi-1)
		}
	}
}

// TestQuantizeRowSignedZero checks that a row's minimum and maximum order
// -0 below +0, as the builtin min and max do: int8 stores the minimum as
// its bias, so the sign of a zero minimum is in the bytes.
func TestQuantizeRowSignedZero(t *testing.T) {
	negZero := float32(math.Copysign(0, -1))
	for _, c := range []struct {
		row  []float32
		bias float32
	}{
		{[]float32{0, negZero, 0.5, 0.25}, negZero},
		{[]float32{negZero, 0, 0.5, 0.25}, negZero},
		{[]float32{0, 0.5, 0, 0.25}, 0},
		{[]float32{-0.5, negZero, 0, 0.25}, -0.5},
	} {
		buf := make([]byte, DtypeInt8.RowBytes(len(c.row)))
		if err := DtypeInt8.QuantizeRow(buf, c.row); err != nil {
			t.Fatal(err)
		}
		l := DtypeInt8.Layout(len(c.row))
		bias := math.Float32frombits(uint32(buf[l.Bias]) | uint32(buf[l.Bias+1])<<8 | uint32(buf[l.Bias+2])<<16 | uint32(buf[l.Bias+3])<<24)
		want := min(c.row[0], c.row[1], c.row[2], c.row[3])
		if math.Float32bits(bias) != math.Float32bits(c.bias) || math.Float32bits(want) != math.Float32bits(c.bias) {
			t.Errorf("row %v: bias %v (bits %#x), builtin min %v; want %v", c.row, bias, math.Float32bits(bias), want, c.bias)
		}
	}
}

// TestGeneratedReferenceUncapped pools examples of the uncapped tables
// (104 GB in float32), which no bundle here can hold: the big tables'
// rows are regenerated per read and must equal GenerateRow's quantized.
func TestGeneratedReferenceUncapped(t *testing.T) {
	cfg, err := Preset(PresetHostbound, 0)
	if err != nil {
		t.Fatal(err)
	}
	cfg.TableDtype = DtypeInt4
	r, err := NewGeneratedReference(cfg, 2, 64<<20)
	if err != nil {
		t.Fatal(err)
	}
	const n = 2
	_, sparse := RandomInputs(cfg, 3, n)
	pooled := make([]float32, n*NumTables*EmbeddingDim)
	if err := r.Pool(sparse, n, pooled); err != nil {
		t.Fatal(err)
	}
	vals, row := make([]float32, EmbeddingDim), make([]float32, EmbeddingDim)
	buf := make([]byte, DtypeInt4.RowBytes(EmbeddingDim))
	off := cfg.HotnessOffsets()
	for e := range n {
		for tb, h := range cfg.Hotness {
			want := make([]float32, EmbeddingDim)
			for k := range h {
				if err := GenerateRow(cfg, 2, tb, int(sparse[e*cfg.SparseWidth()+off[tb]+k]), vals); err != nil {
					t.Fatal(err)
				}
				if err := DtypeInt4.QuantizeRow(buf, vals); err != nil {
					t.Fatal(err)
				}
				DtypeInt4.DequantizeRow(row, buf)
				for j := range want {
					if k == 0 {
						want[j] = row[j]
					} else {
						want[j] += row[j]
					}
				}
			}
			got := pooled[(e*NumTables+tb)*EmbeddingDim:][:EmbeddingDim]
			if !slices.Equal(got, want) {
				t.Fatalf("example %d table %d (vocab %d): pooled differs from GenerateRow's rows", e, tb, cfg.VocabSizes[tb])
			}
		}
	}
}
