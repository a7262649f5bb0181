//go:build linux

package hugepage

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// thpEnabledPath tells whether transparent huge pages may back a madvised
// range: "always" and "madvise" allow it, "never" does not.
const thpEnabledPath = "/sys/kernel/mm/transparent_hugepage/enabled"

// Region is one private anonymous mapping. Its memory lives outside the Go
// heap, so the garbage collector neither scans nor moves it; it stays valid
// until Close.
type Region struct {
	mem       []byte // the 2 MiB aligned mapping, len = size asked for
	mapped    uintptr
	mode      Mode
	fallbacks []error
}

// Map maps a private, zeroed region of at least size bytes, aligned to
// HugePageSize, trying opts.Modes in order. The error of every backing that
// was tried and refused is kept (FallbackReasons), so a caller can log why it
// did not get huge pages; Map fails only when every backing fails.
func Map(size int, opts Options) (*Region, error) {
	if size <= 0 {
		return nil, fmt.Errorf("hugepage: map %d bytes: size must be positive", size)
	}
	var errs []error
	for _, m := range opts.modes() {
		r, err := mapMode(size, m, opts.Populate)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", m, err))
			continue
		}
		r.fallbacks = errs
		return r, nil
	}
	return nil, fmt.Errorf("hugepage: map %d bytes: %w", size, errors.Join(errs...))
}

func mapMode(size int, m Mode, populate bool) (*Region, error) {
	mapped := roundUp(size)
	switch m {
	case ModeHugeTLB:
		return mapHugeTLB(size, mapped, m, unix.MAP_HUGE_2MB, populate)
	case ModeHugeTLB1G:
		mapped = roundUpGiant(size)
		if waste := mapped - size; waste > size/giantWaste {
			return nil, fmt.Errorf("%w: %d bytes in 1 GiB pages would leave %d of them unused", ErrUnavailable, size, waste)
		}
		return mapHugeTLB(size, mapped, m, unix.MAP_HUGE_1GB, populate)
	case ModeTHP:
		if err := thpAvailable(); err != nil {
			return nil, err
		}
		r, err := mapAligned(size, mapped, m, unix.MADV_HUGEPAGE)
		if err != nil {
			return nil, err
		}
		if populate {
			r.populate()
		}
		return r, nil
	case Mode4K:
		// MADV_NOHUGEPAGE keeps "4k" honest when THP is set to "always".
		r, err := mapAligned(size, mapped, m, unix.MADV_NOHUGEPAGE)
		if err != nil {
			return nil, err
		}
		if populate {
			r.populate()
		}
		return r, nil
	}
	return nil, fmt.Errorf("%w: unknown mode %d", ErrUnavailable, int(m))
}

// mapHugeTLB maps mapped bytes from the hugetlb pool of the page size
// pageFlag names (MAP_HUGE_2MB, MAP_HUGE_1GB). The kernel aligns hugetlb
// mappings itself. MAP_POPULATE makes a short pool fail here rather than
// SIGBUS on a later touch.
func mapHugeTLB(size, mapped int, m Mode, pageFlag int, populate bool) (*Region, error) {
	flags := unix.MAP_PRIVATE | unix.MAP_ANONYMOUS | unix.MAP_HUGETLB | pageFlag
	if populate {
		flags |= unix.MAP_POPULATE
	}
	p, err := unix.MmapPtr(-1, 0, nil, uintptr(mapped), unix.PROT_READ|unix.PROT_WRITE, flags)
	if err != nil {
		return nil, fmt.Errorf("%w: mmap MAP_HUGETLB (%s): %w", ErrUnavailable, m, err)
	}
	return newRegion(p, size, mapped, m), nil
}

// mapAligned maps mapped bytes of anonymous memory starting on a
// HugePageSize boundary: it over-maps by one huge page and unmaps the
// unaligned head and the tail, because THP can only back whole, aligned
// 2 MiB extents.
func mapAligned(size, mapped int, m Mode, advice int) (*Region, error) {
	total := uintptr(mapped + HugePageSize)
	p, err := unix.MmapPtr(-1, 0, nil, total, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, fmt.Errorf("mmap %d bytes: %w", total, err)
	}
	head := -uintptr(p) & (HugePageSize - 1)
	ap := unsafe.Add(p, head)
	if head > 0 {
		if err := unix.MunmapPtr(p, head); err != nil {
			_ = unix.MunmapPtr(p, total)
			return nil, fmt.Errorf("munmap alignment head: %w", err)
		}
	}
	if tail := total - head - uintptr(mapped); tail > 0 {
		if err := unix.MunmapPtr(unsafe.Add(ap, mapped), tail); err != nil {
			_ = unix.MunmapPtr(ap, uintptr(mapped)+tail)
			return nil, fmt.Errorf("munmap alignment tail: %w", err)
		}
	}
	r := newRegion(ap, size, mapped, m)
	if err := unix.Madvise(unsafe.Slice((*byte)(ap), mapped), advice); err != nil {
		_ = r.Close()
		return nil, fmt.Errorf("madvise: %w", err)
	}
	return r, nil
}

func newRegion(p unsafe.Pointer, size, mapped int, m Mode) *Region {
	return &Region{mem: unsafe.Slice((*byte)(p), size), mapped: uintptr(mapped), mode: m}
}

// thpAvailable reports whether the kernel will back a madvised range with
// transparent huge pages.
func thpAvailable() error {
	b, err := os.ReadFile(thpEnabledPath)
	if err != nil {
		return fmt.Errorf("%w: transparent huge pages: %w", ErrUnavailable, err)
	}
	if strings.Contains(string(b), "[never]") {
		return fmt.Errorf("%w: transparent huge pages are disabled (%s is %q)",
			ErrUnavailable, thpEnabledPath, strings.TrimSpace(string(b)))
	}
	return nil
}

// populate faults every page of the mapping in. MADV_POPULATE_WRITE
// (Linux 5.14) does it in one call; older kernels get one write per 4 KiB
// page, which a huge page fault turns into one fault per 2 MiB.
func (r *Region) populate() {
	all := unsafe.Slice(unsafe.SliceData(r.mem), r.mapped)
	if unix.Madvise(all, unix.MADV_POPULATE_WRITE) == nil {
		return
	}
	for i := 0; i < len(all); i += 4096 {
		all[i] = 0
	}
}

// Bytes returns the region's memory: len is the size given to Map, and the
// first byte is HugePageSize aligned. It is nil after Close.
func (r *Region) Bytes() []byte { return r.mem }

// Mode returns the backing Map settled on.
func (r *Region) Mode() Mode { return r.mode }

// FallbackReasons returns why each better backing tried before Mode was
// refused, best first; empty when the first choice mapped.
func (r *Region) FallbackReasons() []error { return r.fallbacks }

// HugePageFraction returns the share of the region's resident memory that
// is backed by huge pages, read from /proc/self/smaps (AnonHugePages over
// Rss of the mappings inside the region). It is 1 for hugetlb, whose pages
// are huge by construction (smaps counts them apart, not in Rss), and 0 when
// nothing is resident yet: populate or write the region first.
func (r *Region) HugePageFraction() (float64, error) {
	if r.mem == nil {
		return 0, errors.New("hugepage: fraction of a closed region")
	}
	if r.mode == ModeHugeTLB || r.mode == ModeHugeTLB1G {
		return 1, nil
	}
	u, err := r.smaps()
	if err != nil {
		return 0, err
	}
	if u.rss == 0 {
		return 0, nil
	}
	return float64(u.anonHuge) / float64(u.rss), nil
}

// PageSize returns the largest page size the kernel backs the region with,
// read from /proc/self/smaps (KernelPageSize): what the mode asked for,
// as the kernel granted it.
func (r *Region) PageSize() (int, error) {
	if r.mem == nil {
		return 0, errors.New("hugepage: page size of a closed region")
	}
	u, err := r.smaps()
	if err != nil {
		return 0, err
	}
	return int(u.kernelPage), nil
}

// smaps sums the /proc/self/smaps counters of the region's mappings.
func (r *Region) smaps() (smapsUsage, error) {
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		return smapsUsage{}, fmt.Errorf("hugepage: read smaps: %w", err)
	}
	defer f.Close()
	start := uintptr(unsafe.Pointer(unsafe.SliceData(r.mem)))
	u, err := parseSmaps(f, start, start+r.mapped)
	if err != nil {
		return smapsUsage{}, fmt.Errorf("hugepage: read smaps: %w", err)
	}
	return u, nil
}

// Close unmaps the region. Slices obtained from Bytes must not be used
// afterwards. Closing twice is a no-op.
func (r *Region) Close() error {
	if r.mem == nil {
		return nil
	}
	p := unsafe.Pointer(unsafe.SliceData(r.mem))
	r.mem = nil
	if err := unix.MunmapPtr(p, r.mapped); err != nil {
		return fmt.Errorf("hugepage: munmap: %w", err)
	}
	return nil
}
