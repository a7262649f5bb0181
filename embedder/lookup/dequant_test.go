package lookup

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/recmesh/recmesh/model"
)

// quantDtypes are the precisions the plain-Go dequantizing kernels serve.
var quantDtypes = []model.Dtype{model.DtypeFP16, model.DtypeInt8, model.DtypeInt4}

// TestHalfToFloatMatchesModel checks the branch-light widening on every
// half, NaN payloads included, against model's textbook one.
func TestHalfToFloatMatchesModel(t *testing.T) {
	for i := range 1 << 16 {
		h := uint16(i)
		if got, want := halfToFloat(h), model.HalfToFloat32(h); math.Float32bits(got) != math.Float32bits(want) {
			t.Fatalf("half %#04x: %#08x, model says %#08x", h, math.Float32bits(got), math.Float32bits(want))
		}
	}
}

// dequantRow runs this package's dequantization of one row.
func dequantRow(d model.Dtype, row []byte) [Dim]float32 {
	var v [Dim]float32
	switch d {
	case model.DtypeFP16:
		dequantFP16(&v, row)
	case model.DtypeInt8:
		dequantInt8(&v, row)
	case model.DtypeInt4:
		dequantInt4(&v, row)
	}
	return v
}

// TestDequantMatchesModel checks every precision's row dequantization
// against model.Dtype.DequantizeRow bit for bit, on rows the quantizer
// writes and on rows of random bytes (any scale, bias and values, NaN
// and Inf included), so that the kernels agree on whatever a file holds.
func TestDequantMatchesModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	want := make([]float32, Dim)
	src := make([]float32, Dim)
	for _, d := range quantDtypes {
		row := make([]byte, d.RowBytes(Dim))
		for r := range 2000 {
			if r%2 == 0 {
				mag := math.Exp2(float64(rng.IntN(20) - 14))
				for j := range src {
					src[j] = float32(rng.NormFloat64() * mag)
				}
				if err := d.QuantizeRow(row, src); err != nil {
					t.Fatal(err)
				}
			} else {
				for j := range row {
					row[j] = byte(rng.Uint32())
				}
			}
			d.DequantizeRow(want, row)
			got := dequantRow(d, row)
			for j := range want {
				if math.Float32bits(got[j]) != math.Float32bits(want[j]) {
					t.Fatalf("%s row %d element %d: %v, model says %v", d, r, j, got[j], want[j])
				}
			}
		}
	}
}

// newQuantTables builds DLRMv2-shaped tables at precision d from float32
// rows of mixed magnitude, quantized by model.
func newQuantTables(tb testing.TB, d model.Dtype, vocabCap int, seed uint64) *Tables {
	tb.Helper()
	cfg := model.DLRMv2(vocabCap)
	rng := rand.New(rand.NewPCG(seed, 2))
	rb := d.RowBytes(Dim)
	src := make([]float32, Dim)
	data := make([][]byte, len(cfg.VocabSizes))
	for i, v := range cfg.VocabSizes {
		data[i] = make([]byte, v*rb)
		for r := range v {
			mag := math.Exp2(float64(rng.IntN(16) - 12))
			for j := range src {
				src[j] = float32(rng.NormFloat64() * mag)
			}
			if err := d.QuantizeRow(data[i][r*rb:(r+1)*rb], src); err != nil {
				tb.Fatal(err)
			}
		}
	}
	t, err := NewTablesOf(d, data, cfg.Hotness)
	if err != nil {
		tb.Fatal(err)
	}
	return t
}

// naiveDequantPool states a pooled row through model's dequantization:
// each bag's rows widened by DequantizeRow and summed in float32 in bag
// order from the first, as model.Reference.Pool defines.
func naiveDequantPool(t *Tables, ids []int32, n int) []float32 {
	out := make([]float32, t.OutLen(n))
	row := make([]float32, Dim)
	for e := range n {
		for i := range t.NumTables() {
			dst := out[(e*t.NumTables()+i)*Dim:][:Dim]
			for j := range t.Hotness(i) {
				id := int(ids[e*t.Width()+t.Offset(i)+j])
				t.dtype.DequantizeRow(row, t.raw[i][id*t.rowB:(id+1)*t.rowB])
				for k := range dst {
					if j == 0 {
						dst[k] = row[k]
					} else {
						dst[k] += row[k]
					}
				}
			}
		}
	}
	return out
}

func TestPoolQuantized(t *testing.T) {
	for _, d := range quantDtypes {
		t.Run(string(d), func(t *testing.T) {
			tab := newQuantTables(t, d, 300, 7)
			if tab.Dtype() != d || tab.Kernel() != "generic" || len(tab.Kernels()) != 1 {
				t.Errorf("%s tables: dtype %s, kernel %s of %v; want the generic kernel alone", d, tab.Dtype(), tab.Kernel(), tab.Kernels())
			}
			for _, k := range Kernels() {
				if k != "generic" && tab.SetKernel(k) == nil {
					t.Errorf("SetKernel(%s) on %s tables succeeded", k, d)
				}
			}
			if tab.Vocab(0) != 300 || tab.Vocab(5) != 3 {
				t.Errorf("Vocab = %d, %d, want 300, 3", tab.Vocab(0), tab.Vocab(5))
			}
			rng := rand.New(rand.NewPCG(7, 7))
			const n = 40
			ids := randomIDs(tab, n, rng)
			sameBits(t, string(d), poolWith(t, tab, "generic", ids, n), naiveDequantPool(tab, ids, n))

			// PoolEach pools the good examples the same way.
			ids[3*tab.Width()+5] = -1
			out := make([]float32, tab.OutLen(n))
			status := make([]int32, n)
			if bad, err := tab.PoolEach(out, ids, n, status); bad != 1 || err != nil || status[3] != int32(tab.tableOf(5)) {
				t.Fatalf("PoolEach = %d, %v; status[3] = %d", bad, err, status[3])
			}
			ids[3*tab.Width()+5] = 0
			want := naiveDequantPool(tab, ids, n)
			per := tab.NumTables() * Dim
			clear(want[3*per : 4*per])
			sameBits(t, string(d)+" PoolEach", out, want)

			if a := testing.AllocsPerRun(10, func() {
				if err := tab.Pool(out, ids, n); err != nil {
					t.Fatal(err)
				}
			}); a != 0 {
				t.Errorf("%s: Pool allocates %v times per call", d, a)
			}
		})
	}
}

func TestNewTablesOfErrors(t *testing.T) {
	row := make([]byte, model.DtypeInt8.RowBytes(Dim))
	for name, tc := range map[string]struct {
		d    model.Dtype
		data [][]byte
	}{
		"unknown dtype":   {"int3", [][]byte{row}},
		"ragged int8":     {model.DtypeInt8, [][]byte{row[:len(row)-1]}},
		"ragged int4":     {model.DtypeInt4, [][]byte{row[:70]}},
		"misaligned fp32": {model.DtypeFP32, [][]byte{make([]byte, 4*Dim+1)[1:]}},
	} {
		if _, err := NewTablesOf(tc.d, tc.data, []int{1}); err == nil {
			t.Errorf("%s: NewTablesOf succeeded", name)
		}
	}
}

// TestLayoutTablesOf checks that every table starts on a cache line and
// that the quantized layouts take their row size's share of fp32's.
func TestLayoutTablesOf(t *testing.T) {
	vocab := []int{3, 1, 5}
	for _, tc := range []struct {
		d    model.Dtype
		want int
	}{
		{model.DtypeFP32, 9 * 512},
		{model.DtypeFP16, 9 * 256},
		{model.DtypeInt8, 448 + 192 + 704}, // 408, 136, 680 bytes, each to a line
		{model.DtypeInt4, 256 + 128 + 384}, // 204, 68, 340
	} {
		if got := TableBytesOf(tc.d, vocab); got != tc.want {
			t.Errorf("TableBytesOf(%s) = %d, want %d", tc.d, got, tc.want)
		}
		raw := make([]byte, tc.want+rowAlign)
		skip := 0
		for uintptrOf(raw[skip:])%rowAlign != 0 {
			skip++
		}
		buf := raw[skip : skip+tc.want]
		tables, err := LayoutTablesOf(tc.d, buf, vocab)
		if err != nil {
			t.Fatal(err)
		}
		for i, tb := range tables {
			if len(tb) != vocab[i]*tc.d.RowBytes(Dim) || uintptrOf(tb)%rowAlign != 0 {
				t.Errorf("%s table %d: %d bytes at %#x", tc.d, i, len(tb), uintptrOf(tb))
			}
		}
		if _, err := LayoutTablesOf(tc.d, buf[:tc.want-1], vocab); err == nil {
			t.Errorf("%s: LayoutTablesOf with a short buffer succeeded", tc.d)
		}
	}
	big := []int{1 << 20}
	for _, d := range quantDtypes {
		if got, want := float64(TableBytesOf(d, big))/float64(TableBytes(big)), float64(d.RowBytes(Dim))/512; got != want {
			t.Errorf("%s tables take %.4f of fp32's bytes, want %.4f", d, got, want)
		}
	}
}
