// Package hugepage owns large private memory regions backed by huge pages
// where the kernel allows it: a hugetlbfs reservation of 1 GiB pages, else
// of 2 MiB pages (MAP_HUGETLB), else anonymous memory advised for
// transparent huge pages (MADV_HUGEPAGE), else plain 4 KiB pages. The
// embedder keeps its embedding tables in one such region, because random
// row reads over gigabytes of tables spend most of their time in TLB misses
// when each 4 KiB page needs its own TLB entry; with 2 MiB pages 3 GB of
// tables still need 1,500 entries, more than the second-level TLB keeps
// beside everything else a shared core runs, and with 1 GiB pages they need
// three.
//
// A Region reports which backing it got (Mode) and, read back from
// /proc/self/smaps, how much of its resident memory really is huge pages
// (HugePageFraction): with THP the kernel may hand out small pages when it
// cannot find free 2 MiB extents, and only the kernel knows.
package hugepage

import (
	"errors"
	"fmt"
)

// HugePageSize is the huge page size the package asks for and aligns to:
// 2 MiB, the x86-64 and arm64 (4 KiB granule) PMD size.
const HugePageSize = 2 << 20

// GiantPageSize is the size of the pages of ModeHugeTLB1G: 1 GiB, the
// x86-64 and arm64 PUD size.
const GiantPageSize = 1 << 30

// giantWaste is the largest share of a region's size that rounding it up to
// whole 1 GiB pages may add: beyond it (a region much smaller than a few
// GiB) the pool's pages are better left to a region that fills them.
const giantWaste = 8

// Mode is the kind of pages that back a Region.
type Mode int

const (
	// Mode4K is plain anonymous memory with transparent huge pages
	// switched off for the range, so it is honestly small pages.
	Mode4K Mode = iota
	// ModeTHP is anonymous memory advised with MADV_HUGEPAGE: the kernel
	// backs it with 2 MiB pages when it can find (or compact) them.
	ModeTHP
	// ModeHugeTLB is memory from the hugetlbfs pool (MAP_HUGETLB): always
	// huge pages, but only when an administrator reserved enough of them
	// (vm.nr_hugepages).
	ModeHugeTLB
	// ModeHugeTLB1G is memory from the pool of 1 GiB hugetlbfs pages
	// (MAP_HUGE_1GB), reserved by an administrator
	// (/sys/kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages, or
	// hugepagesz=1G hugepages=N at boot). It is tried only for a region
	// that whole pages fit within an eighth of its size.
	ModeHugeTLB1G
)

// String returns the name used in logs and benchmark reports.
func (m Mode) String() string {
	switch m {
	case Mode4K:
		return "4k"
	case ModeTHP:
		return "thp"
	case ModeHugeTLB:
		return "hugetlb"
	case ModeHugeTLB1G:
		return "hugetlb-1g"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// Options tunes Map. The zero value tries every backing, best first, and
// leaves pages to be faulted in on first touch.
type Options struct {
	// Modes lists the backings to try, in order; the first that maps wins.
	// Nil or empty means hugetlb-1g, then hugetlb, then thp, then 4k.
	Modes []Mode
	// Populate faults every page in before Map returns, so the cost of
	// zeroing (and, for THP, of finding huge pages) is paid once up front
	// instead of on the serving path, and HugePageFraction has something
	// to measure.
	Populate bool
}

// modes returns the backings to try.
func (o Options) modes() []Mode {
	if len(o.Modes) > 0 {
		return o.Modes
	}
	return []Mode{ModeHugeTLB1G, ModeHugeTLB, ModeTHP, Mode4K}
}

// ErrUnavailable is wrapped when a backing cannot be used on this machine
// (for example THP switched to "never", or no hugetlbfs pages reserved).
var ErrUnavailable = errors.New("backing unavailable")

// roundUpGiant rounds n up to a multiple of GiantPageSize.
func roundUpGiant(n int) int {
	return (n + GiantPageSize - 1) &^ (GiantPageSize - 1)
}

// roundUp rounds n up to a multiple of HugePageSize.
func roundUp(n int) int {
	return (n + HugePageSize - 1) &^ (HugePageSize - 1)
}
