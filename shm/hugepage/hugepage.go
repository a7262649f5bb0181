// Package hugepage owns large private memory regions backed by huge pages
// where the kernel allows it: a hugetlbfs reservation (MAP_HUGETLB), else
// anonymous memory advised for transparent huge pages (MADV_HUGEPAGE), else
// plain 4 KiB pages. The embedder keeps its embedding tables in one such
// region, because random row reads over gigabytes of tables spend most of
// their time in TLB misses when each 4 KiB page needs its own TLB entry.
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
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// Options tunes Map. The zero value tries every backing, best first, and
// leaves pages to be faulted in on first touch.
type Options struct {
	// Modes lists the backings to try, in order; the first that maps wins.
	// Nil or empty means hugetlb, then thp, then 4k.
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
	return []Mode{ModeHugeTLB, ModeTHP, Mode4K}
}

// ErrUnavailable is wrapped when a backing cannot be used on this machine
// (for example THP switched to "never", or no hugetlbfs pages reserved).
var ErrUnavailable = errors.New("backing unavailable")

// roundUp rounds n up to a multiple of HugePageSize.
func roundUp(n int) int {
	return (n + HugePageSize - 1) &^ (HugePageSize - 1)
}
