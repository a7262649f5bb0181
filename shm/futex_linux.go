package shm

import (
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Futex operations. The plain (shared) variants are used on purpose: the
// word lives in a MAP_SHARED file mapping and the waiter and waker are
// different processes, so the kernel must key the futex on the inode and
// offset, which FUTEX_PRIVATE_FLAG would skip.
const (
	futexWait = 0 // FUTEX_WAIT
	futexWake = 1 // FUTEX_WAKE
)

// futexSleep blocks while *addr == val, for at most d. Spurious returns
// (EINTR, EAGAIN when the word already moved, ETIMEDOUT) are all fine:
// callers re-check their condition.
func futexSleep(addr *uint32, val uint32, d time.Duration) {
	ts := unix.NsecToTimespec(int64(d))
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), futexWait, uintptr(val),
		uintptr(unsafe.Pointer(&ts)), 0, 0)
}

// futexWakeAll wakes every process sleeping on addr.
func futexWakeAll(addr *uint32) {
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), futexWake, uintptr(1<<31-1), 0, 0, 0)
}
