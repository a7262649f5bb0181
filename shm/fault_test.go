package shm

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestGuardFaultsTruncated: reading and writing a mapping whose file was
// truncated under it is an ErrSegmentLost error, not a dead process, and
// other panics still propagate.
func TestGuardFaultsTruncated(t *testing.T) {
	path := filepath.Join(t.TempDir(), "seg")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	const size = 1 << 20
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(mem)
	if err := GuardFaults(func() error { mem[size-1] = 1; return nil }); err != nil {
		t.Fatalf("access to an intact mapping: %v", err)
	}
	if err := f.Truncate(4096); err != nil {
		t.Fatal(err)
	}
	var sum byte
	err = GuardFaults(func() error { sum += mem[size-1]; return nil })
	if !errors.Is(err, ErrSegmentLost) {
		t.Fatalf("read past the truncated end: %v; want ErrSegmentLost", err)
	}
	err = GuardFaults(func() error { mem[size/2] = 7; return nil })
	if !errors.Is(err, ErrSegmentLost) {
		t.Fatalf("write past the truncated end: %v; want ErrSegmentLost", err)
	}
	// What is left of the file still works.
	if err := GuardFaults(func() error { mem[0] = 1; return nil }); err != nil {
		t.Fatalf("access inside the truncated file: %v", err)
	}
	defer func() {
		if r := recover(); r != "boom" {
			t.Errorf("a non-fault panic became %v", r)
		}
	}()
	_ = GuardFaults(func() error { panic("boom") })
}
