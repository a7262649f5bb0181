package lookup

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"regexp"
	"slices"
	"strings"
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
			if ks := tab.Kernels(); tab.Dtype() != d || tab.Kernel() != ks[0] || ks[len(ks)-1] != "generic" {
				t.Errorf("%s tables: dtype %s, kernel %s of %v; want the first, generic last", d, tab.Dtype(), tab.Kernel(), ks)
			}
			if tab.SetKernel("sse9") == nil {
				t.Errorf("SetKernel(sse9) on %s tables succeeded", d)
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

// mixedHotness are the bag sizes of the tables newMixedTables builds: one
// of each size the kernels' loops treat differently, and 1 again last.
var mixedHotness = []int{1, 2, 3, 7, 20, 100, 1}

// newMixedTables builds tables at precision d, laid out as the embedder
// lays them (each on a cache line, rows unpadded), whose rows are of four
// kinds: quantized float32 rows, random bytes, random bytes whose scale
// and bias (fp16: whose values) are mostly NaN, ±Inf, zeros and
// subnormals, and rows of one quantized value (all 0 or all the maximum).
// Random bytes mean any scale, bias and value bits, signaling NaNs
// included: the kernels must agree on whatever a file holds.
func newMixedTables(tb testing.TB, d model.Dtype, seed uint64) *Tables {
	tb.Helper()
	vocab := []int{50, 1, 200, 7, 300, 120, 3}
	rng := rand.New(rand.NewPCG(seed, 3))
	buf := make([]byte, TableBytesOf(d, vocab)+rowAlign)
	skip := int(-uintptrOf(buf) & (rowAlign - 1))
	data, err := LayoutTablesOf(d, buf[skip:], vocab)
	if err != nil {
		tb.Fatal(err)
	}
	rb, l := d.RowBytes(Dim), d.Layout(Dim)
	src := make([]float32, Dim)
	for _, tab := range data {
		for r := range len(tab) / rb {
			row := tab[r*rb : (r+1)*rb]
			for j := range row {
				row[j] = byte(rng.Uint32())
			}
			switch r % 4 {
			case 0:
				for j := range src {
					src[j] = float32(rng.NormFloat64() * math.Exp2(float64(rng.IntN(16)-12)))
				}
				if err := d.QuantizeRow(row, src); err != nil {
					tb.Fatal(err)
				}
			case 2:
				if l.ScaleBytes == 0 { // fp16: special halves among the values
					for j := 0; j < len(row); j += 2 {
						putSpecial(row[j:j+2], rng)
					}
					continue
				}
				putSpecial(row[l.Scale:l.Scale+l.ScaleBytes], rng)
				putSpecial(row[l.Bias:l.Bias+l.ScaleBytes], rng)
			case 3:
				fill := byte(0)
				if rng.IntN(2) == 0 {
					fill = 0xff
				}
				for j := range l.Values {
					row[j] = fill
				}
			}
		}
	}
	t, err := NewTablesOf(d, data, mixedHotness)
	if err != nil {
		tb.Fatal(err)
	}
	return t
}

// putSpecial writes, with probability 3/4, a float of len(b) bytes (2 or
// 4) that is a NaN (quiet or signaling, random payload and sign), an
// infinity, a zero or a subnormal; else b keeps its random bits.
func putSpecial(b []byte, rng *rand.Rand) {
	expBits, mantBits := 5, 10
	if len(b) == 4 {
		expBits, mantBits = 8, 23
	}
	bits := rng.Uint32()
	sign := bits & (1 << (expBits + mantBits))
	mant := bits & (1<<mantBits - 1)
	var v uint32
	switch rng.IntN(8) {
	case 0, 1, 2: // NaN: force a nonzero payload
		v = sign | (1<<expBits-1)<<mantBits | max(mant, 1)
	case 3: // ±Inf
		v = sign | (1<<expBits-1)<<mantBits
	case 4: // ±0
		v = sign
	case 5: // subnormal
		v = sign | mant
	default:
		return
	}
	for i := range b {
		b[i] = byte(v >> (8 * i))
	}
}

// TestQuantKernelsMatchGeneric compares every kernel this machine runs at
// each precision with the generic one, bit for bit (NaNs included), over
// batch sizes, prefetch distances and bag sizes 1 to 100, on rows of
// every kind newMixedTables writes.
func TestQuantKernelsMatchGeneric(t *testing.T) {
	for _, d := range quantDtypes {
		t.Run(string(d), func(t *testing.T) {
			tab := newMixedTables(t, d, 11)
			rng := rand.New(rand.NewPCG(11, 11))
			t.Logf("%s kernels: %v", d, tab.Kernels())
			for _, kernel := range tab.Kernels() {
				for _, dist := range []int{0, 1, 7, DefaultPrefetchRows, 5000} {
					tab.SetPrefetchRows(dist)
					for _, n := range []int{1, 2, 3, 16, 17, 40} {
						ids := randomIDs(tab, n, rng)
						want := poolWith(t, tab, "generic", ids, n)
						sameBits(t, fmt.Sprintf("%s %s dist %d n %d", d, kernel, dist, n), poolWith(t, tab, kernel, ids, n), want)
					}
				}
			}
			// Quantized rows alone: the kernels equal model's dequantization too.
			q := newQuantTables(t, d, 300, 12)
			ids := randomIDs(q, 9, rng)
			want := naiveDequantPool(q, ids, 9)
			for _, kernel := range q.Kernels() {
				sameBits(t, string(d)+" "+kernel+" vs model", poolWith(t, q, kernel, ids, 9), want)
			}
		})
	}
}

// TestQuantKernelsBadIDsAndAllocs checks that every kernel of every
// precision refuses a batch with a bad id before writing anything, pools
// the good examples of PoolEach, and allocates nothing.
func TestQuantKernelsBadIDsAndAllocs(t *testing.T) {
	for _, d := range quantDtypes {
		tab := newMixedTables(t, d, 13)
		rng := rand.New(rand.NewPCG(13, 13))
		const n = 6
		good := randomIDs(tab, n, rng)
		want := poolWith(t, tab, "generic", good, n)
		per := tab.NumTables() * Dim
		clear(want[2*per : 3*per])
		for _, kernel := range tab.Kernels() {
			ids := slices.Clone(good)
			pos := tab.Offset(5) + 99 // the last id of the hot-100 bag
			ids[2*tab.Width()+pos] = int32(tab.Vocab(5))
			out := make([]float32, tab.OutLen(n))
			for i := range out {
				out[i] = 42
			}
			if err := tab.SetKernel(kernel); err != nil {
				t.Fatal(err)
			}
			var ie *IDError
			if err := tab.Pool(out, ids, n); !errors.As(err, &ie) ||
				*ie != (IDError{Example: 2, Table: 5, Position: pos, ID: int32(tab.Vocab(5)), Vocab: tab.Vocab(5)}) {
				t.Fatalf("%s %s: Pool = %v", d, kernel, err)
			}
			if slices.ContainsFunc(out, func(v float32) bool { return v != 42 }) {
				t.Fatalf("%s %s: Pool wrote out despite a bad id", d, kernel)
			}
			status := make([]int32, n)
			if bad, err := tab.PoolEach(out, ids, n, status); bad != 1 || err != nil || status[2] != 5 {
				t.Fatalf("%s %s: PoolEach = %d, %v; status %v", d, kernel, bad, err, status)
			}
			sameBits(t, string(d)+" "+kernel+" PoolEach", out, want)
			if a := testing.AllocsPerRun(10, func() {
				if err := tab.Pool(out, good, n); err != nil {
					t.Fatal(err)
				}
			}); a != 0 {
				t.Errorf("%s %s: Pool allocates %v times per call", d, kernel, a)
			}
		}
	}
}

// TestKernelsAtEveryPrecision checks the kernels each precision gets: the
// fp32 list at every precision on this machine (amd64 with AVX2 has F16C),
// and SetKernel accepting each of them.
func TestKernelsAtEveryPrecision(t *testing.T) {
	for _, d := range quantDtypes {
		tab := newMixedTables(t, d, 14)
		if !slices.Equal(tab.Kernels(), Kernels()) {
			t.Errorf("%s kernels %v, fp32 kernels %v", d, tab.Kernels(), Kernels())
		}
		for _, k := range tab.Kernels() {
			if err := tab.SetKernel(k); err != nil || tab.Kernel() != k {
				t.Errorf("%s: SetKernel(%s) = %v, kernel %s", d, k, err, tab.Kernel())
			}
		}
	}
}

// TestAVX2KernelUsesVEXRegisters guards the generated assembly: the AVX2
// kernel runs on CPUs without AVX-512, so its loops must not touch the
// registers only AVX-512 has (X16-X31, Y16-Y31, Z*, K*), which the avo
// allocator would hand out if a loop held more than 16 vectors live. This
// machine runs such code anyway, so only the text can tell.
func TestAVX2KernelUsesVEXRegisters(t *testing.T) {
	src, err := os.ReadFile("pool_amd64.s")
	if err != nil {
		t.Fatal(err)
	}
	text := string(src)
	start := strings.Index(text, "TEXT ·poolAVX2(SB)")
	if start < 0 {
		t.Fatal("pool_amd64.s has no poolAVX2")
	}
	body := text[start:]
	if end := strings.Index(body[1:], "\nTEXT "); end >= 0 {
		body = body[:end+1]
	}
	if r := regexp.MustCompile(`\b([XY](1[6-9]|2[0-9]|3[01])|Z[0-9]+|K[0-7])\b`).FindString(body); r != "" {
		t.Errorf("poolAVX2 uses %s, an AVX-512 register", r)
	}
}
