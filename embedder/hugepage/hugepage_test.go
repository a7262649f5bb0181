//go:build linux

package hugepage

import (
	"errors"
	"os"
	"strconv"
	"strings"
	"testing"
	"unsafe"
)

const testSize = 64 << 20

// thpMode returns the bracketed THP setting ("always", "madvise", "never")
// or "" when the kernel has no THP.
func thpMode(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(thpEnabledPath)
	if err != nil {
		return ""
	}
	s := string(b)
	i, j := strings.IndexByte(s, '['), strings.IndexByte(s, ']')
	if i < 0 || j < i {
		return ""
	}
	return s[i+1 : j]
}

func mapT(t *testing.T, size int, opts Options) *Region {
	t.Helper()
	r, err := Map(size, opts)
	if err != nil {
		t.Fatalf("Map(%d, %+v): %v", size, opts, err)
	}
	t.Cleanup(func() {
		if err := r.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return r
}

func checkRegion(t *testing.T, r *Region, size int) {
	t.Helper()
	b := r.Bytes()
	if len(b) != size {
		t.Fatalf("len(Bytes()) = %d, want %d", len(b), size)
	}
	if p := uintptr(unsafe.Pointer(&b[0])); p%HugePageSize != 0 {
		t.Fatalf("region starts at %#x, not %d aligned", p, HugePageSize)
	}
	// Write a pattern over every page and read it back.
	for i := 0; i < len(b); i += 4096 {
		b[i] = byte(i >> 12)
	}
	b[len(b)-1] = 0xAB
	for i := 0; i < len(b); i += 4096 {
		if b[i] != byte(i>>12) {
			t.Fatalf("byte %d = %d, want %d", i, b[i], byte(i>>12))
		}
	}
	if b[len(b)-1] != 0xAB {
		t.Fatal("last byte lost")
	}
	f, err := r.HugePageFraction()
	if err != nil {
		t.Fatalf("HugePageFraction: %v", err)
	}
	if f < 0 || f > 1 {
		t.Fatalf("HugePageFraction = %v, want within [0, 1]", f)
	}
	t.Logf("mode %s, huge page fraction %.3f, fallbacks %v", r.Mode(), f, r.FallbackReasons())
}

func TestMapDefault(t *testing.T) {
	r := mapT(t, testSize, Options{Populate: true})
	checkRegion(t, r, testSize)
	f, err := r.HugePageFraction()
	if err != nil {
		t.Fatal(err)
	}
	switch m := thpMode(t); {
	case r.Mode() == ModeHugeTLB:
		if f != 1 {
			t.Errorf("hugetlb fraction = %v, want 1", f)
		}
	case m == "always" || m == "madvise":
		if r.Mode() != ModeTHP {
			t.Fatalf("mode = %s with THP %q, want thp (fallbacks %v)", r.Mode(), m, r.FallbackReasons())
		}
		if f <= 0.5 {
			t.Errorf("huge page fraction = %.3f with THP %q, want > 0.5", f, m)
		}
	default:
		t.Logf("THP is %q: not asserting a huge page fraction", m)
	}
}

func TestMapOddSize(t *testing.T) {
	// Not a multiple of the huge page size nor of the page size.
	const size = 3*HugePageSize + 12345
	for _, m := range []Mode{ModeTHP, Mode4K} {
		t.Run(m.String(), func(t *testing.T) {
			if m == ModeTHP && thpMode(t) == "never" {
				t.Skip("THP disabled")
			}
			r := mapT(t, size, Options{Modes: []Mode{m}})
			if r.Mode() != m {
				t.Fatalf("mode = %s, want %s", r.Mode(), m)
			}
			checkRegion(t, r, size)
		})
	}
}

func TestMode4KHasNoHugePages(t *testing.T) {
	r := mapT(t, testSize, Options{Modes: []Mode{Mode4K}, Populate: true})
	if r.Mode() != Mode4K {
		t.Fatalf("mode = %s, want 4k", r.Mode())
	}
	f, err := r.HugePageFraction()
	if err != nil {
		t.Fatal(err)
	}
	if f != 0 {
		t.Errorf("4k region huge page fraction = %v, want 0", f)
	}
}

func TestFallback(t *testing.T) {
	// hugetlb alone either works (pages reserved) or fails with
	// ErrUnavailable; with a fallback listed it must always map.
	r, err := Map(testSize, Options{Modes: []Mode{ModeHugeTLB}, Populate: true})
	hugetlbFailed := err != nil
	if hugetlbFailed {
		if !errors.Is(err, ErrUnavailable) {
			t.Fatalf("hugetlb-only Map error %v does not wrap ErrUnavailable", err)
		}
		t.Logf("hugetlb unavailable: %v", err)
	} else {
		checkRegion(t, r, testSize)
		r.Close()
	}
	r = mapT(t, testSize, Options{Modes: []Mode{ModeHugeTLB, Mode4K}})
	if hugetlbFailed {
		if r.Mode() != Mode4K {
			t.Errorf("mode = %s, want 4k after hugetlb failed", r.Mode())
		}
		if len(r.FallbackReasons()) != 1 {
			t.Errorf("FallbackReasons = %v, want the hugetlb failure", r.FallbackReasons())
		}
	}
	checkRegion(t, r, testSize)
}

func TestMapErrors(t *testing.T) {
	if _, err := Map(0, Options{}); err == nil {
		t.Error("Map(0) succeeded")
	}
	if _, err := Map(testSize, Options{Modes: []Mode{Mode(42)}}); err == nil {
		t.Error("Map with an unknown mode succeeded")
	}
}

func TestClose(t *testing.T) {
	r, err := Map(HugePageSize, Options{Modes: []Mode{Mode4K}})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if r.Bytes() != nil {
		t.Error("Bytes after Close is not nil")
	}
	if _, err := r.HugePageFraction(); err == nil {
		t.Error("HugePageFraction after Close succeeded")
	}
}

func TestModeString(t *testing.T) {
	for m, want := range map[Mode]string{Mode4K: "4k", ModeTHP: "thp", ModeHugeTLB: "hugetlb", ModeHugeTLB1G: "hugetlb-1g", Mode(9): "Mode(9)"} {
		if got := m.String(); got != want {
			t.Errorf("%d.String() = %q, want %q", int(m), got, want)
		}
	}
}

// TestGiantPagesLeftToLargeRegions: 1 GiB pages are not spent on a region
// that would leave most of one unused; Map says so and falls back.
func TestGiantPagesLeftToLargeRegions(t *testing.T) {
	_, err := Map(testSize, Options{Modes: []Mode{ModeHugeTLB1G}})
	if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "unused") {
		t.Fatalf("a %d-byte region in 1 GiB pages: error %v, want ErrUnavailable naming the unused part", testSize, err)
	}
	r := mapT(t, testSize, Options{Modes: []Mode{ModeHugeTLB1G, Mode4K}})
	if r.Mode() != Mode4K || len(r.FallbackReasons()) != 1 {
		t.Fatalf("mode %s, fallbacks %v; want 4k after refusing 1 GiB pages", r.Mode(), r.FallbackReasons())
	}
}

// TestGiantPages maps a region in a 1 GiB page and checks with the kernel
// that one backs it. Where the pool has no free page it reserves one for
// the test when it may (root) and gives it back after; it skips where the
// kernel has no 1 GiB pages or cannot find a free gigabyte.
func TestGiantPages(t *testing.T) {
	reserveGiantPage(t)
	r := mapT(t, GiantPageSize, Options{Modes: []Mode{ModeHugeTLB1G}, Populate: true})
	checkRegion(t, r, GiantPageSize)
	if r.Mode() != ModeHugeTLB1G {
		t.Fatalf("mode = %s, want hugetlb-1g", r.Mode())
	}
	got, err := r.PageSize()
	if err != nil {
		t.Fatal(err)
	}
	if got != GiantPageSize {
		t.Fatalf("the kernel backs the region with %d-byte pages, want %d", got, GiantPageSize)
	}
	if f, err := r.HugePageFraction(); err != nil || f != 1 {
		t.Fatalf("HugePageFraction = %v, %v; want 1", f, err)
	}
}

const giantPool = "/sys/kernel/mm/hugepages/hugepages-1048576kB/"

// reserveGiantPage makes sure the 1 GiB pool has a free page, growing it
// by one for the test's duration if needed, or skips.
func reserveGiantPage(t *testing.T) {
	t.Helper()
	read := func(name string) int {
		b, err := os.ReadFile(giantPool + name)
		if err != nil {
			t.Skipf("no 1 GiB huge pages on this kernel: %v", err)
		}
		n, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil {
			t.Fatalf("%s%s: %v", giantPool, name, err)
		}
		return n
	}
	if read("free_hugepages") > 0 {
		return
	}
	total := read("nr_hugepages")
	set := func(n int) error {
		return os.WriteFile(giantPool+"nr_hugepages", []byte(strconv.Itoa(n)), 0o644)
	}
	if err := set(total + 1); err != nil {
		t.Skipf("no free 1 GiB page and cannot reserve one: %v", err)
	}
	t.Cleanup(func() {
		if err := set(total); err != nil {
			t.Errorf("give the reserved 1 GiB page back: %v", err)
		}
	})
	if read("free_hugepages") == 0 {
		t.Skip("the kernel found no free gigabyte to reserve")
	}
}
