package device

/*
#include <malloc.h>
*/
import "C"

import (
	"fmt"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
)

// ReleaseHeap returns to the kernel what the process's two heaps hold
// free once programs are compiled and their weights placed, and reports
// whether glibc gave back any pages. Both heaps keep their freed pages
// otherwise:
//
//   - Go's: the weights' staging copies are dead once placed, but the
//     collector paced itself on them while they lived, so with little
//     allocated while serving it would not run again for a long time
//     (MLPerf's network: 68 MiB of Go heap held for nothing);
//   - the C one: XLA's compiler allocates and frees in glibc's per-thread
//     arenas, which keep a freed page unless it is at an arena's top
//     (MLPerf's network: 153 MB of arena memory, 15 MB of it in use).
//
// Call it after rare events that leave garbage (a compile, a weights
// swap), from a goroutine of its own, never per request: it stops the
// world for a collection and walks every arena, which takes each arena's
// lock while a batch may be allocating in it.
func ReleaseHeap() bool {
	debug.FreeOSMemory()
	return C.malloc_trim(0) == 1
}

// Resident is the process's resident memory in bytes (/proc/self/statm),
// for a log line saying what ReleaseHeap gave back.
func Resident() (int64, error) {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0, fmt.Errorf("device: resident memory: %w", err)
	}
	f := strings.Fields(string(b))
	if len(f) < 2 {
		return 0, fmt.Errorf("device: resident memory: /proc/self/statm %q has no resident field", b)
	}
	pages, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("device: resident memory: /proc/self/statm: %w", err)
	}
	return pages * int64(os.Getpagesize()), nil
}
