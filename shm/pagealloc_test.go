package shm

import (
	"math/rand/v2"
	"testing"
)

func TestPageAllocatorBasics(t *testing.T) {
	a := NewPageAllocator(10 * PageSize)
	if a.Pages() != 10 || a.FreePages() != 10 {
		t.Fatalf("pages %d free %d", a.Pages(), a.FreePages())
	}
	o1, ok := a.Alloc(1)
	o2, ok2 := a.Alloc(PageSize + 1) // two pages
	o3, ok3 := a.Alloc(0)            // still one page: every request gets its own room
	if !ok || !ok2 || !ok3 || o1 != 0 || o2 != PageSize || o3 != 3*PageSize {
		t.Fatalf("first fit: %d %d %d", o1, o2, o3)
	}
	if err := a.Free(o2, PageSize+1); err != nil {
		t.Fatal(err)
	}
	if err := a.Free(o2, PageSize+1); err == nil {
		t.Fatal("double free accepted")
	}
	if err := a.Free(o2+1, 1); err == nil {
		t.Fatal("unaligned free accepted")
	}
	if err := a.Free(9*PageSize, 2*PageSize); err == nil {
		t.Fatal("free beyond the arena accepted")
	}
	// The two-page hole is reused first fit; a three-page run goes after.
	if o, _ := a.Alloc(2 * PageSize); o != PageSize {
		t.Fatalf("hole not reused: %d", o)
	}
	if o, _ := a.Alloc(3 * PageSize); o != 4*PageSize {
		t.Fatalf("three pages at %d", o)
	}
	if _, ok := a.Alloc(4 * PageSize); ok {
		t.Fatal("allocated beyond the arena")
	}
	if _, ok := a.Alloc(-1); ok {
		t.Fatal("negative size accepted")
	}
	if NewPageAllocator(PageSize-1).Pages() != 0 {
		t.Fatal("a partial page was counted")
	}
}

// TestPageAllocatorMatchesModel checks random alloc/free sequences against a
// []bool model of the pages, including runs that cross bitmap words.
func TestPageAllocatorMatchesModel(t *testing.T) {
	for _, pages := range []int{1, 63, 64, 65, 200} {
		a := NewPageAllocator(pages * PageSize)
		model := make([]bool, pages)
		type span struct{ off, n int }
		var live []span
		rng := rand.New(rand.NewPCG(7, uint64(pages)))
		firstFit := func(need int) int {
			run := 0
			for p := range model {
				if model[p] {
					run = 0
					continue
				}
				run++
				if run == need {
					return p - need + 1
				}
			}
			return -1
		}
		for op := 0; op < 20000; op++ {
			if rng.IntN(2) == 0 || len(live) == 0 {
				n := 1 + rng.IntN(min(pages, 70)*PageSize)
				want := firstFit(PagesFor(n))
				off, ok := a.Alloc(n)
				if ok != (want >= 0) || (ok && off != want*PageSize) {
					t.Fatalf("pages %d: Alloc(%d) = %d, %v; model says page %d", pages, n, off, ok, want)
				}
				if ok {
					for p := off / PageSize; p < off/PageSize+PagesFor(n); p++ {
						model[p] = true
					}
					live = append(live, span{off, n})
				}
			} else {
				i := rng.IntN(len(live))
				sp := live[i]
				live = append(live[:i], live[i+1:]...)
				if err := a.Free(sp.off, sp.n); err != nil {
					t.Fatal(err)
				}
				for p := sp.off / PageSize; p < sp.off/PageSize+PagesFor(sp.n); p++ {
					model[p] = false
				}
			}
			if a.used() != pages-a.FreePages() {
				t.Fatalf("bitmap holds %d pages, counter says %d", a.used(), pages-a.FreePages())
			}
		}
	}
}
