package model

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// adviseHuge asks for transparent huge pages under the whole 2 MiB pages
// of b, before anything touches them. A table read at random rows then
// costs a TLB entry per 2 MiB rather than a page walk per row read; at the
// benchmark's 3.2 GB the walk is a second miss to memory. It is a hint:
// where THP is off nothing changes.
func adviseHuge(b []byte) {
	const huge = 2 << 20
	if len(b) < 2*huge {
		return
	}
	base := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	lo := int((base+huge-1)&^(huge-1) - base)
	hi := int((base+uintptr(len(b)))&^(huge-1) - base)
	if hi > lo {
		_ = unix.Madvise(b[lo:hi], unix.MADV_HUGEPAGE)
	}
}
