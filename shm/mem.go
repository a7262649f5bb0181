package shm

import (
	"encoding/binary"
	"unsafe"
)

// This file, vm_linux.go, futex_linux.go and uringwait_linux.go are the
// only users of unsafe outside tests. Everything else reads the mapping
// through byte slices (bounds-checked) and the word pointers made here.

// word32 returns the 4-byte word at off in b for sync/atomic. The slice
// expression bounds-checks the whole word, so a bad offset panics inside
// this package's tests instead of touching memory outside the mapping;
// callers only pass offsets built from validated geometry. Offsets are
// 4-aligned by construction (layout.go) and mappings are page-aligned.
func word32(b []byte, off int) *uint32 {
	w := b[off : off+4 : off+4]
	return (*uint32)(unsafe.Pointer(&w[0]))
}

// word64 is word32 for 8-byte words (8-aligned offsets).
func word64(b []byte, off int) *uint64 {
	w := b[off : off+8 : off+8]
	return (*uint64)(unsafe.Pointer(&w[0]))
}

// words64 returns the n ≥ 1 8-byte words at off in b as one slice for
// sync/atomic (a counters record): the whole block is bounds-checked here,
// each word again by the slice index.
func words64(b []byte, off, n int) []uint64 {
	w := b[off : off+8*n : off+8*n]
	return unsafe.Slice((*uint64)(unsafe.Pointer(&w[0])), n)
}

// aligned reports whether b starts on a boundary of align bytes. Attach
// checks it once, so every aligned offset is an aligned address.
func aligned(b []byte, align uintptr) bool {
	return len(b) > 0 && uintptr(unsafe.Pointer(&b[0]))%align == 0
}

// Plain fields are native-endian: a segment never leaves the machine that
// wrote it, and the atomic words beside them are native too. The slice
// expressions bounds-check every access.

func get32(b []byte, off int) uint32    { return binary.NativeEndian.Uint32(b[off : off+4]) }
func get64(b []byte, off int) uint64    { return binary.NativeEndian.Uint64(b[off : off+8]) }
func put32(b []byte, off int, v uint32) { binary.NativeEndian.PutUint32(b[off:off+4], v) }
func put64(b []byte, off int, v uint64) { binary.NativeEndian.PutUint64(b[off:off+8], v) }
