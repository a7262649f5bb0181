package shm

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// vmRange is a reserved range of address space that holds a segment's
// image. Every process reserves the whole image PROT_NONE, then maps each
// memfd piece it is entitled to over its place with MAP_FIXED, so offsets
// mean the same in every process and a piece it is not given stays
// unreadable and unwritable: touching it faults (GuardFaults turns that
// into ErrSegmentLost), and mprotect can only make it private anonymous
// memory, never another process's pages.
type vmRange struct {
	base unsafe.Pointer
	size uintptr
}

// hugeAlign is the alignment of the staging data in the address space, so
// that a huge-page memfd can be mapped there (2 MiB pages).
const hugeAlign = 2 << 20

// reserveVM reserves size bytes of address space such that base+alignAt
// is a multiple of hugeAlign.
func reserveVM(size, alignAt int) (*vmRange, error) {
	span := uintptr(size + hugeAlign)
	p, err := unix.MmapPtr(-1, 0, nil, span, unix.PROT_NONE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	if err != nil {
		return nil, fmt.Errorf("reserve %d bytes of address space: %w", size, err)
	}
	start := uintptr(p)
	at := (start + uintptr(alignAt) + hugeAlign - 1) &^ (hugeAlign - 1)
	base := at - uintptr(alignAt)
	if base < start {
		base += hugeAlign
	}
	// Give back the slack on both sides.
	if base > start {
		unix.MunmapPtr(p, base-start)
	}
	if end, rend := base+uintptr(size), start+span; rend > end {
		unix.MunmapPtr(unsafe.Add(p, end-start), rend-end)
	}
	return &vmRange{base: unsafe.Add(p, base-start), size: uintptr(size)}, nil
}

// bytes is the first n bytes of the range as a slice.
func (v *vmRange) bytes(n int) []byte { return unsafe.Slice((*byte)(v.base), n) }

// mapFixed maps n bytes of fd from fdOff at offset off of the range,
// replacing whatever was there (MAP_FIXED is atomic: a concurrent reader
// sees the old pages or the new ones, never a hole).
func (v *vmRange) mapFixed(off, n int, fd int, fdOff int64, write bool) error {
	if off < 0 || n <= 0 || uintptr(off+n) > v.size {
		return fmt.Errorf("map %d bytes at %d: outside the %d-byte range", n, off, v.size)
	}
	prot := unix.PROT_READ
	if write {
		prot |= unix.PROT_WRITE
	}
	addr := unsafe.Add(v.base, off)
	p, err := unix.MmapPtr(fd, fdOff, addr, uintptr(n), prot, unix.MAP_SHARED|unix.MAP_FIXED)
	if err != nil {
		return fmt.Errorf("map %d bytes at offset %d: %w", n, off, err)
	}
	if p != addr {
		return fmt.Errorf("map at offset %d: kernel placed it elsewhere", off)
	}
	return nil
}

// release unmaps the whole range.
func (v *vmRange) release() error {
	if v == nil || v.base == nil {
		return nil
	}
	err := unix.MunmapPtr(v.base, v.size)
	v.base = nil
	return err
}

// statPtr is stat(2) of a path already converted to a C string: unlike
// unix.Stat it allocates nothing, for loops that poll a path while idle.
func statPtr(path *byte, st *unix.Stat_t) error {
	fdcwd := unix.AT_FDCWD
	_, _, e := unix.Syscall6(unix.SYS_NEWFSTATAT, uintptr(fdcwd), uintptr(unsafe.Pointer(path)), uintptr(unsafe.Pointer(st)), 0, 0, 0)
	if e != 0 {
		return e
	}
	return nil
}
