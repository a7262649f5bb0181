package model

import (
	"os"
	"path/filepath"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// residentPages counts the pages of path's bytes [off, off+n) that are in
// the page cache, through a mapping of its own that never touches them.
func residentPages(t *testing.T, path string, off, n int64) int {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	m, err := unix.Mmap(int(f.Fd()), 0, int(fi.Size()), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(m)
	page := int64(os.Getpagesize())
	start, end := off/page*page, (off+n+page-1)/page*page
	vec := make([]byte, (end-start)/page)
	// x/sys/unix has no wrapper for mincore(2).
	region := m[start:end]
	if _, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&region[0])), uintptr(len(region)), uintptr(unsafe.Pointer(&vec[0]))); errno != 0 {
		t.Fatalf("mincore: %v", errno)
	}
	resident := 0
	for _, v := range vec {
		resident += int(v & 1)
	}
	return resident
}

// A bundle bigger than half of memory loads only if the file's copy of
// each table leaves the page cache once the table is copied out.
func TestReleaseTableDropsItsPages(t *testing.T) {
	dir := exportDev(t, 1)
	b := openT(t, dir)
	path := filepath.Join(dir, WeightsFile)
	base := uintptr(unsafe.Pointer(&b.mapping[0]))
	span := func(i int) (int64, int64) {
		d := b.TableData(i)
		return int64(uintptr(unsafe.Pointer(&d[0])) - base), int64(len(d))
	}
	first, _ := span(0)
	lastOff, lastLen := span(len(b.Config.VocabSizes) - 1)
	tablesLen := lastOff + lastLen - first

	var sum byte
	for i := range b.Config.VocabSizes {
		for _, v := range b.TableData(i) {
			sum += v
		}
	}
	_ = sum
	before := residentPages(t, path, first, tablesLen)
	if before == 0 {
		t.Fatalf("no page of the tables is cached after reading them all; the check below would prove nothing")
	}
	for i := range b.Config.VocabSizes {
		if err := b.ReleaseTable(i); err != nil {
			t.Fatalf("ReleaseTable(%d): %v", i, err)
		}
	}
	// Each table may keep the partial pages it shares with its neighbours.
	after := residentPages(t, path, first, tablesLen)
	if limit := 2 * len(b.Config.VocabSizes); after > limit {
		t.Errorf("%d of the tables' pages still cached after ReleaseTable (was %d), want at most %d", after, before, limit)
	}
	// The tables still read correctly: the pages come back from the file.
	d := b.TableData(0)
	if got, want := len(d), int(b.Config.VocabSizes[0])*b.Config.TableDtype.RowBytes(b.Config.EmbeddingDim); got != want {
		t.Fatalf("table 0 has %d bytes after release, want %d", got, want)
	}
}

func TestReleaseTableRefusesBadIndex(t *testing.T) {
	b := openT(t, exportDev(t, 1))
	if err := b.ReleaseTable(len(b.Config.VocabSizes)); err == nil {
		t.Error("ReleaseTable past the last table: no error")
	}
	b.Close()
	if err := b.ReleaseTable(0); err == nil {
		t.Error("ReleaseTable on a closed bundle: no error")
	}
}
