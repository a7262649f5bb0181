package shm

import (
	"fmt"
	"math/bits"
)

// PageAllocator hands out runs of PageSize pages of a lane arena, first fit,
// tracked in a bitmap. It lives in the frontend's own (Go) memory, not in the
// segment: the frontend is the only writer of its lane's arena, and
// completions return out of order, so it needs a real allocator rather than
// a bump pointer. Not safe for concurrent use (Lane serialises it).
type PageAllocator struct {
	bits  []uint64 // bit i set: page i in use
	pages int
	free  int
}

// NewPageAllocator manages an arena of arenaBytes (whole pages only; a
// partial trailing page is never handed out).
func NewPageAllocator(arenaBytes int) *PageAllocator {
	pages := max(arenaBytes/PageSize, 0)
	return &PageAllocator{bits: make([]uint64, (pages+63)/64), pages: pages, free: pages}
}

// Pages is the number of pages managed.
func (a *PageAllocator) Pages() int { return a.pages }

// FreePages is the number of pages not in use.
func (a *PageAllocator) FreePages() int { return a.free }

// PagesFor is how many pages n bytes occupy (at least one).
func PagesFor(n int) int { return max((n+PageSize-1)/PageSize, 1) }

// Alloc reserves room for n bytes and returns its byte offset in the arena,
// or ok=false when no run of free pages is long enough.
func (a *PageAllocator) Alloc(n int) (off int, ok bool) {
	if n < 0 {
		return 0, false
	}
	need := PagesFor(n)
	if need > a.free {
		return 0, false
	}
	run, start := 0, 0
	for w := 0; w < len(a.bits); w++ {
		word := a.bits[w]
		if word == ^uint64(0) {
			run = 0
			continue
		}
		if word == 0 && run+64 < need {
			// A whole free word extends the current run without a bit walk.
			if run == 0 {
				start = w * 64
			}
			run += 64
			continue
		}
		for b := 0; b < 64; b++ {
			p := w*64 + b
			if p >= a.pages {
				return 0, false
			}
			if word&(1<<b) != 0 {
				run = 0
				continue
			}
			if run == 0 {
				start = p
			}
			run++
			if run == need {
				a.mark(start, need, true)
				return start * PageSize, true
			}
		}
	}
	return 0, false
}

// Free returns the room Alloc gave for n bytes at off. Freeing pages that
// are not allocated, or outside the arena, is an error and changes nothing.
func (a *PageAllocator) Free(off, n int) error {
	if off < 0 || off%PageSize != 0 || n < 0 {
		return fmt.Errorf("shm: page free: bad range offset %d length %d", off, n)
	}
	start, cnt := off/PageSize, PagesFor(n)
	if start+cnt > a.pages {
		return fmt.Errorf("shm: page free: pages [%d, %d) beyond %d", start, start+cnt, a.pages)
	}
	for p := start; p < start+cnt; p++ {
		if a.bits[p/64]&(1<<(p%64)) == 0 {
			return fmt.Errorf("shm: page free: page %d is not allocated", p)
		}
	}
	a.mark(start, cnt, false)
	return nil
}

// mark sets or clears cnt bits from start, a word at a time where it can.
func (a *PageAllocator) mark(start, cnt int, used bool) {
	for p := start; p < start+cnt; {
		w, b := p/64, p%64
		k := min(64-b, start+cnt-p)
		var m uint64 = ^uint64(0)
		if k < 64 {
			m = (1<<k - 1) << b
		}
		if used {
			a.bits[w] |= m
		} else {
			a.bits[w] &^= m
		}
		p += k
	}
	if used {
		a.free -= cnt
	} else {
		a.free += cnt
	}
}

// used counts set bits; tests compare it with FreePages.
func (a *PageAllocator) used() int {
	n := 0
	for _, w := range a.bits {
		n += bits.OnesCount64(w)
	}
	return n
}
