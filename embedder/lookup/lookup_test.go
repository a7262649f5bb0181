package lookup

import (
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"unsafe"

	"github.com/recmesh/recmesh/model"
)

// newTestTables builds DLRMv2-shaped tables (26 tables, the real hotness)
// with every vocabulary capped at vocabCap, filled with values of mixed
// sign and magnitude so that a change of summation order shows up in the
// low bits.
func newTestTables(tb testing.TB, vocabCap int, seed uint64) *Tables {
	tb.Helper()
	cfg := model.DLRMv2(vocabCap)
	rng := rand.New(rand.NewPCG(seed, 1))
	data := make([][]float32, len(cfg.VocabSizes))
	for i, v := range cfg.VocabSizes {
		data[i] = make([]float32, v*Dim)
		for j := range data[i] {
			data[i][j] = float32(rng.NormFloat64() * math.Exp2(float64(rng.IntN(20)-10)))
		}
	}
	t, err := NewTables(data, cfg.Hotness)
	if err != nil {
		tb.Fatal(err)
	}
	return t
}

// randomIDs returns n examples of uniform random valid ids.
func randomIDs(t *Tables, n int, rng *rand.Rand) []int32 {
	ids := make([]int32, n*t.Width())
	for e := range n {
		for i := range t.NumTables() {
			for j := range t.Hotness(i) {
				ids[e*t.Width()+t.Offset(i)+j] = int32(rng.IntN(t.Vocab(i)))
			}
		}
	}
	return ids
}

// naivePool is an independent, index-by-index statement of what a pooled
// row is, adding in bag order (so it must match every kernel bit for bit).
func naivePool(t *Tables, ids []int32, n int) []float32 {
	out := make([]float32, t.OutLen(n))
	for e := range n {
		for i := range t.NumTables() {
			for d := range Dim {
				var s float32
				for j := range t.Hotness(i) {
					id := int(ids[e*t.Width()+t.Offset(i)+j])
					v := t.rows[i][id*Dim+d]
					if j == 0 {
						s = v
					} else {
						s += v
					}
				}
				out[(e*t.NumTables()+i)*Dim+d] = s
			}
		}
	}
	return out
}

// poolWith pools with the named kernel into a fresh buffer.
func poolWith(tb testing.TB, t *Tables, kernel string, ids []int32, n int) []float32 {
	tb.Helper()
	if err := t.SetKernel(kernel); err != nil {
		tb.Fatal(err)
	}
	out := make([]float32, t.OutLen(n))
	if err := t.Pool(out, ids, n); err != nil {
		tb.Fatalf("%s: Pool: %v", kernel, err)
	}
	return out
}

// sameBits reports the first element where a and b differ bitwise.
func sameBits(tb testing.TB, what string, got, want []float32) {
	tb.Helper()
	if len(got) != len(want) {
		tb.Fatalf("%s: len %d, want %d", what, len(got), len(want))
	}
	for i := range got {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			row := i / Dim
			tb.Fatalf("%s: element %d (pooled row %d, lane %d) = %v (%#08x), want %v (%#08x)", what, i, row, i%Dim,
				got[i], math.Float32bits(got[i]), want[i], math.Float32bits(want[i]))
		}
	}
}

func TestDimMatchesModel(t *testing.T) {
	if Dim != model.EmbeddingDim {
		t.Fatalf("Dim = %d, model.EmbeddingDim = %d", Dim, model.EmbeddingDim)
	}
}

func TestKernels(t *testing.T) {
	ks := Kernels()
	if ks[len(ks)-1] != "generic" {
		t.Errorf("Kernels() = %v, want generic last", ks)
	}
	if Kernel() != ks[0] {
		t.Errorf("Kernel() = %q, want the fastest of %v", Kernel(), ks)
	}
	tab := newTestTables(t, 50, 1)
	if tab.Kernel() != Kernel() {
		t.Errorf("new Tables kernel %q, want %q", tab.Kernel(), Kernel())
	}
	if err := tab.SetKernel("sse9"); err == nil {
		t.Error("SetKernel(sse9) succeeded")
	}
	t.Logf("kernels on this machine: %v", ks)
}

func TestGenericMatchesNaive(t *testing.T) {
	tab := newTestTables(t, 1000, 2)
	rng := rand.New(rand.NewPCG(2, 2))
	for _, n := range []int{1, 3, 17} {
		ids := randomIDs(tab, n, rng)
		sameBits(t, "generic", poolWith(t, tab, "generic", ids, n), naivePool(tab, ids, n))
	}
}

// TestKernelsMatchGeneric compares every kernel this machine runs with the
// generic one, bit for bit, over odd batch sizes and prefetch distances
// (including none, and more rows than the batch holds).
func TestKernelsMatchGeneric(t *testing.T) {
	tab := newTestTables(t, 1000, 3)
	rng := rand.New(rand.NewPCG(3, 3))
	sizes := []int{1, 2, 3, 5, 7, 8, 15, 16, 31, 63, 64, 127, 128, 129, 255, 257}
	for _, kernel := range Kernels() {
		for _, dist := range []int{0, 1, 7, DefaultPrefetchRows, 5000} {
			tab.SetPrefetchRows(dist)
			for _, n := range sizes {
				ids := randomIDs(tab, n, rng)
				want := poolWith(t, tab, "generic", ids, n)
				sameBits(t, kernel, poolWith(t, tab, kernel, ids, n), want)
			}
		}
	}
}

// TestEdgeIDs covers the first and last row of every table, and every id
// of an example naming one row.
func TestEdgeIDs(t *testing.T) {
	tab := newTestTables(t, 1000, 4)
	const n = 5
	fill := func(f func(table, j int) int32) []int32 {
		ids := make([]int32, n*tab.Width())
		for e := range n {
			for i := range tab.NumTables() {
				for j := range tab.Hotness(i) {
					ids[e*tab.Width()+tab.Offset(i)+j] = f(i, j)
				}
			}
		}
		return ids
	}
	cases := map[string][]int32{
		"zero":      fill(func(int, int) int32 { return 0 }),
		"last":      fill(func(i, _ int) int32 { return int32(tab.Vocab(i) - 1) }),
		"alternate": fill(func(i, j int) int32 { return int32((tab.Vocab(i) - 1) * (j % 2)) }),
		"one row":   fill(func(i, _ int) int32 { return int32(tab.Vocab(i) / 2) }),
	}
	for name, ids := range cases {
		want := naivePool(tab, ids, n)
		for _, kernel := range Kernels() {
			sameBits(t, name+"/"+kernel, poolWith(t, tab, kernel, ids, n), want)
		}
	}
}

// TestBoundsOfOut checks that a kernel writes exactly n pooled rows per
// table and nothing past them.
func TestBoundsOfOut(t *testing.T) {
	tab := newTestTables(t, 100, 5)
	rng := rand.New(rand.NewPCG(5, 5))
	const n, guard = 9, 3 * Dim
	ids := randomIDs(tab, n, rng)
	want := naivePool(tab, ids, n)
	for _, kernel := range Kernels() {
		if err := tab.SetKernel(kernel); err != nil {
			t.Fatal(err)
		}
		buf := make([]float32, tab.OutLen(n)+guard)
		for i := range buf {
			buf[i] = float32(math.NaN())
		}
		if err := tab.Pool(buf, ids, n); err != nil {
			t.Fatal(err)
		}
		sameBits(t, kernel, buf[:tab.OutLen(n)], want)
		for i, v := range buf[tab.OutLen(n):] {
			if !math.IsNaN(float64(v)) {
				t.Fatalf("%s wrote %v at %d past the end of out", kernel, v, i)
			}
		}
	}
}

func TestBadIDs(t *testing.T) {
	tab := newTestTables(t, 1000, 6)
	rng := rand.New(rand.NewPCG(6, 6))
	const n = 7
	hot100 := slices.Index(model.Hotness[:], 100)
	for _, tc := range []struct {
		name            string
		example, table  int
		j               int
		id              func(vocab int) int32
		wantID, wantPos int32
	}{
		{name: "negative first", example: 0, table: 0, j: 0, id: func(int) int32 { return -1 }},
		{name: "vocab", example: 3, table: 5, j: 0, id: func(v int) int32 { return int32(v) }},
		{name: "hot-100 last id", example: 5, table: hot100, j: 99, id: func(v int) int32 { return int32(v) }},
		{name: "min int32", example: 2, table: 25, j: 0, id: func(int) int32 { return math.MinInt32 }},
		{name: "max int32", example: 4, table: 11, j: 3, id: func(int) int32 { return math.MaxInt32 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ids := randomIDs(tab, n, rng)
			pos := tab.Offset(tc.table) + tc.j
			bad := tc.id(tab.Vocab(tc.table))
			ids[tc.example*tab.Width()+pos] = bad
			// A second bad id later must not hide the first.
			ids[(n-1)*tab.Width()] = -5

			for _, kernel := range Kernels() {
				if err := tab.SetKernel(kernel); err != nil {
					t.Fatal(err)
				}
				out := make([]float32, tab.OutLen(n))
				for i := range out {
					out[i] = 42
				}
				err := tab.Pool(out, ids, n)
				var ie *IDError
				if !errors.As(err, &ie) || !errors.Is(err, ErrBadID) {
					t.Fatalf("%s: Pool error %v, want an *IDError wrapping ErrBadID", kernel, err)
				}
				want := IDError{Example: tc.example, Table: tc.table, Position: pos, ID: bad, Vocab: tab.Vocab(tc.table)}
				if *ie != want {
					t.Errorf("%s: got %+v, want %+v", kernel, *ie, want)
				}
				for i, v := range out {
					if v != 42 {
						t.Fatalf("%s: Pool wrote out[%d] despite a bad id", kernel, i)
					}
				}
			}
			if err := tab.Validate(ids, n); !errors.Is(err, ErrBadID) {
				t.Errorf("Validate = %v, want ErrBadID", err)
			}
		})
	}
}

func TestPoolEach(t *testing.T) {
	tab := newTestTables(t, 1000, 7)
	rng := rand.New(rand.NewPCG(7, 7))
	const n = 11
	ids := randomIDs(tab, n, rng)
	badAt := map[int]int{0: 3, 4: 20, 5: 25, 10: 0} // example -> table
	for e, table := range badAt {
		ids[e*tab.Width()+tab.Offset(table)] = int32(tab.Vocab(table))
	}
	// Examples pooled alone give the expected rows of the good ones.
	want := make([]float32, tab.OutLen(n))
	for e := range n {
		if _, bad := badAt[e]; bad {
			continue
		}
		one := naivePool(tab, ids[e*tab.Width():(e+1)*tab.Width()], 1)
		copy(want[e*tab.NumTables()*Dim:], one)
	}
	for _, kernel := range Kernels() {
		if err := tab.SetKernel(kernel); err != nil {
			t.Fatal(err)
		}
		out := make([]float32, tab.OutLen(n))
		for i := range out {
			out[i] = 42
		}
		status := make([]int32, n)
		nbad, err := tab.PoolEach(out, ids, n, status)
		if err != nil {
			t.Fatal(err)
		}
		if nbad != len(badAt) {
			t.Errorf("%s: %d bad examples, want %d", kernel, nbad, len(badAt))
		}
		for e := range n {
			wantStatus := int32(-1)
			if table, bad := badAt[e]; bad {
				wantStatus = int32(table)
			}
			if status[e] != wantStatus {
				t.Errorf("%s: status[%d] = %d, want %d", kernel, e, status[e], wantStatus)
			}
		}
		sameBits(t, kernel, out, want)
	}
}

func TestBufferChecks(t *testing.T) {
	tab := newTestTables(t, 10, 8)
	ids := make([]int32, 2*tab.Width())
	out := make([]float32, tab.OutLen(2))
	if err := tab.Pool(out, ids[:len(ids)-1], 2); err == nil {
		t.Error("Pool with short ids succeeded")
	}
	if err := tab.Pool(out[:len(out)-1], ids, 2); err == nil {
		t.Error("Pool with short out succeeded")
	}
	if err := tab.Pool(out, ids, -1); err == nil {
		t.Error("Pool with n = -1 succeeded")
	}
	if _, err := tab.PoolEach(out, ids, 2, make([]int32, 1)); err == nil {
		t.Error("PoolEach with short status succeeded")
	}
	if err := tab.Pool(nil, nil, 0); err != nil {
		t.Errorf("Pool of an empty batch: %v", err)
	}
}

func TestNewTablesErrors(t *testing.T) {
	row := make([]float32, Dim)
	for name, tc := range map[string]struct {
		data [][]float32
		hot  []int
	}{
		"no tables":     {nil, nil},
		"count differs": {[][]float32{row}, []int{1, 1}},
		"ragged table":  {[][]float32{row[:Dim-1]}, []int{1}},
		"empty table":   {[][]float32{{}}, []int{1}},
		"zero hotness":  {[][]float32{row}, []int{0}},
	} {
		if _, err := NewTables(tc.data, tc.hot); err == nil {
			t.Errorf("%s: NewTables succeeded", name)
		}
	}
}

func TestLayoutTables(t *testing.T) {
	vocab := []int{3, 1, 5}
	if got, want := TableBytes(vocab), 9*Dim*4; got != want {
		t.Fatalf("TableBytes = %d, want %d", got, want)
	}
	// A []float32 backing store keeps the buffer 4-byte aligned; offset it
	// to a cache line by hand.
	raw := make([]byte, TableBytes(vocab)+2*rowAlign)
	skip := 0
	for (uintptrOf(raw[skip:]) % rowAlign) != 0 {
		skip++
	}
	buf := raw[skip:]
	tables, err := LayoutTables(buf, vocab)
	if err != nil {
		t.Fatal(err)
	}
	off := 0
	for i, tb := range tables {
		if len(tb) != vocab[i]*Dim {
			t.Errorf("table %d has %d floats, want %d", i, len(tb), vocab[i]*Dim)
		}
		if got := uintptrOf(buf[off:]); got != uintptrOfF(tb) {
			t.Errorf("table %d does not start at byte %d", i, off)
		}
		off += vocab[i] * Dim * 4
	}
	if _, err := LayoutTables(buf[:TableBytes(vocab)-1], vocab); err == nil {
		t.Error("LayoutTables with a short buffer succeeded")
	}
	if _, err := LayoutTables(buf[1:], vocab); err == nil {
		t.Error("LayoutTables with a misaligned buffer succeeded")
	}
	if _, err := LayoutTables(buf, []int{1, 0}); err == nil {
		t.Error("LayoutTables with an empty table succeeded")
	}
}

// TestNoAllocs checks that pooling allocates nothing, for every kernel.
func TestNoAllocs(t *testing.T) {
	tab := newTestTables(t, 1000, 9)
	rng := rand.New(rand.NewPCG(9, 9))
	const n = 128
	ids := randomIDs(tab, n, rng)
	out := make([]float32, tab.OutLen(n))
	status := make([]int32, n)
	for _, kernel := range Kernels() {
		if err := tab.SetKernel(kernel); err != nil {
			t.Fatal(err)
		}
		if a := testing.AllocsPerRun(20, func() {
			if err := tab.Pool(out, ids, n); err != nil {
				t.Fatal(err)
			}
		}); a != 0 {
			t.Errorf("%s: Pool allocates %v times per call", kernel, a)
		}
		if a := testing.AllocsPerRun(20, func() {
			if _, err := tab.PoolEach(out, ids, n, status); err != nil {
				t.Fatal(err)
			}
		}); a != 0 {
			t.Errorf("%s: PoolEach allocates %v times per call", kernel, a)
		}
	}
}

func uintptrOf(b []byte) uintptr     { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }
func uintptrOfF(f []float32) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(f))) }

// TestPrefetchRows checks each kernel's default distance at float32 and
// at a narrower precision, and that a distance set by hand wins over
// every kernel's.
func TestPrefetchRows(t *testing.T) {
	tables := []*Tables{newTestTables(t, 50, 3)}
	for _, d := range []model.Dtype{model.DtypeFP16, model.DtypeInt8, model.DtypeInt4} {
		tables = append(tables, newQuantTables(t, d, 50, 3))
	}
	for _, tab := range tables {
		for _, k := range tab.Kernels() {
			if err := tab.SetKernel(k); err != nil {
				t.Fatal(err)
			}
			want := DefaultPrefetchRows
			switch d := tab.Dtype(); {
			case k == "avx2" && d == model.DtypeFP32:
				want = AVX2FP32PrefetchRows
			case k == "avx512" && (d == model.DtypeInt8 || d == model.DtypeInt4):
				want = AVX512NarrowPrefetchRows
			}
			if got := tab.PrefetchRows(); got != want {
				t.Errorf("%s %s: %d rows ahead by default, want %d", tab.Dtype(), k, got, want)
			}
		}
		tab.SetPrefetchRows(5)
		for _, k := range tab.Kernels() {
			if err := tab.SetKernel(k); err != nil {
				t.Fatal(err)
			}
			if got := tab.PrefetchRows(); got != 5 {
				t.Errorf("%s %s: %d rows ahead after SetPrefetchRows(5)", tab.Dtype(), k, got)
			}
		}
	}
}
