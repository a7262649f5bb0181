//go:build !linux

package device

import (
	"errors"
	"runtime/debug"
)

// ReleaseCode does nothing where the kernel has no MADV_PAGEOUT.
func (r *Runtime) ReleaseCode() (int64, error) { return 0, nil }

// ReleaseHeap returns the Go heap's free pages; the C heap's stay.
func ReleaseHeap() bool {
	debug.FreeOSMemory()
	return false
}

// Resident is not read where there is no /proc/self/statm.
func Resident() (int64, error) {
	return 0, errors.New("device: resident memory: not read on this system")
}
