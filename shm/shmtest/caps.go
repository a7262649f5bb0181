// Package shmtest holds helpers for tests that play a hostile process
// against a shared-memory segment.
package shmtest

import (
	"os"
	"runtime"
	"syscall"

	"golang.org/x/sys/unix"
)

// NoCapsEnv marks a process re-executed by DropCapabilities.
const NoCapsEnv = "RECMESH_SHMTEST_NOCAPS"

// DropCapabilities re-executes the calling process (same arguments and
// environment, plus NoCapsEnv) with an empty capability bounding set, so
// it keeps its uid but has no privilege over other processes of that uid:
// tests run as root, whose CAP_SYS_PTRACE would reach into any process,
// while a compromised frontend of the mesh's user has none. It returns
// without re-executing in the re-executed process, and when there is
// nothing to drop (not root: no CAP_SETPCAP).
func DropCapabilities() {
	if os.Getenv(NoCapsEnv) != "" {
		return
	}
	runtime.LockOSThread() // the bounding set is per thread; Exec inherits this one's
	for c := 0; c < 64; c++ {
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil && c == 0 {
			runtime.UnlockOSThread()
			return // EPERM: nothing to drop
		}
	}
	_ = syscall.Exec(os.Args[0], os.Args, append(os.Environ(), NoCapsEnv+"=1"))
	runtime.UnlockOSThread()
}
