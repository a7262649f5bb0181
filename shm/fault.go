package shm

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// GuardFaults runs fn so that a fault on a mapped segment, a SIGBUS
// because any process with write access truncated the file under the
// mapping, becomes an error wrapping ErrSegmentLost instead of killing
// the process: the last line of defence behind every validated read. It
// covers only the calling goroutine (debug.SetPanicOnFault is per
// goroutine): each goroutine that touches a mapping needs its own guard.
// Panics other than memory faults are re-raised.
func GuardFaults(fn func() error) (err error) {
	old := debug.SetPanicOnFault(true)
	defer debug.SetPanicOnFault(old)
	defer func() {
		r := recover()
		if r == nil {
			return
		}
		if addr, ok := faultAddr(r); ok {
			err = fmt.Errorf("%w: fault at %#x", ErrSegmentLost, addr)
			return
		}
		panic(r)
	}()
	return fn()
}

// faultAddr is the address of a memory fault panic (runtime errors from
// SetPanicOnFault carry one).
func faultAddr(r any) (uintptr, bool) {
	re, ok := r.(runtime.Error)
	if !ok {
		return 0, false
	}
	a, ok := re.(interface{ Addr() uintptr })
	if !ok {
		return 0, false
	}
	return a.Addr(), true
}
