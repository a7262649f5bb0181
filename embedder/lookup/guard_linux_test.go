package lookup

import (
	"math/rand/v2"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/recmesh/recmesh/model"
)

// guarded returns a slice of n elements of T that ends exactly where an
// inaccessible page begins, so a kernel that reads or writes one element
// too far faults instead of passing silently.
func guarded[T any](t *testing.T, n int) []T {
	t.Helper()
	page := unix.Getpagesize()
	size := n * int(unsafe.Sizeof(*new(T)))
	span := (size+page-1)/page*page + page
	mem, err := unix.Mmap(-1, 0, span, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Munmap(mem) })
	if err := unix.Mprotect(mem[span-page:], unix.PROT_NONE); err != nil {
		t.Fatal(err)
	}
	return unsafe.Slice((*T)(unsafe.Pointer(&mem[span-page-size])), n)
}

// TestGuardPages runs every kernel with ids and out ending at an
// inaccessible page: the prefetch cursor must stop at the last id.
func TestGuardPages(t *testing.T) {
	tab := newTestTables(t, 1000, 10)
	rng := rand.New(rand.NewPCG(10, 10))
	for _, n := range []int{1, 3, 128} {
		ids := guarded[int32](t, n*tab.Width())
		copy(ids, randomIDs(tab, n, rng))
		want := naivePool(tab, ids, n)
		for _, kernel := range Kernels() {
			if err := tab.SetKernel(kernel); err != nil {
				t.Fatal(err)
			}
			for _, dist := range []int{0, DefaultPrefetchRows, 10 * n * tab.Width()} {
				tab.SetPrefetchRows(dist)
				out := guarded[float32](t, tab.OutLen(n))
				if err := tab.Pool(out, ids, n); err != nil {
					t.Fatal(err)
				}
				sameBits(t, kernel, out, want)
			}
		}
	}
}

// TestGuardPagesTables runs every kernel of every precision on a table
// that ends at an inaccessible page, with bags naming its last row: a
// kernel that reads past a row's last byte faults.
func TestGuardPagesTables(t *testing.T) {
	rng := rand.New(rand.NewPCG(15, 15))
	for _, d := range model.Dtypes() {
		const vocab = 5
		rb := d.RowBytes(Dim)
		tab := guarded[byte](t, vocab*rb)
		for r := range vocab {
			for j := range rb {
				tab[r*rb+j] = byte(rng.Uint32())
			}
			if d != model.DtypeFP32 && d != model.DtypeFP16 {
				continue
			}
			// Finite float rows, so fp32 sums are compared on numbers.
			src := make([]float32, Dim)
			for j := range src {
				src[j] = float32(rng.NormFloat64())
			}
			if err := d.QuantizeRow(tab[r*rb:(r+1)*rb], src); err != nil {
				t.Fatal(err)
			}
		}
		tables, err := NewTablesOf(d, [][]byte{tab, tab}, []int{1, 3})
		if err != nil {
			t.Fatal(err)
		}
		const n = 4
		ids := make([]int32, n*tables.Width())
		for i := range ids {
			ids[i] = int32(vocab - 1 - rng.IntN(2))
		}
		want := poolWith(t, tables, "generic", ids, n)
		for _, kernel := range tables.Kernels() {
			sameBits(t, string(d)+" "+kernel, poolWith(t, tables, kernel, ids, n), want)
		}
	}
}
