package device

import (
	"os"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/recmesh/recmesh/accelerator/device/internal/mallocfrag"
)

// resident is the process's resident memory in bytes.
func resident(t *testing.T) int64 {
	t.Helper()
	n, err := Resident()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

const heapTestBytes = 48 << 20

// TestReleaseHeapC checks that freed glibc heap pages, which free itself
// keeps, go back to the kernel.
func TestReleaseHeapC(t *testing.T) {
	free, err := mallocfrag.Fill(heapTestBytes)
	if err != nil {
		t.Fatal(err)
	}
	defer free()
	before := resident(t)
	if !ReleaseHeap() {
		t.Error("ReleaseHeap reported that glibc released nothing")
	}
	after := resident(t)
	if got := before - after; got < heapTestBytes*2/3 {
		t.Errorf("resident memory fell by %d MiB, want at least %d MiB of the %d MiB freed",
			got>>20, heapTestBytes*2/3>>20, heapTestBytes>>20)
	}
}

// TestReleaseHeapGo checks that a dead Go allocation's pages go back to
// the kernel without waiting for the collector's pace.
func TestReleaseHeapGo(t *testing.T) {
	b := make([]byte, heapTestBytes)
	for i := 0; i < len(b); i += os.Getpagesize() {
		b[i] = 1
	}
	runtime.KeepAlive(b)
	b = nil
	before := resident(t)
	ReleaseHeap()
	after := resident(t)
	if got := before - after; got < heapTestBytes*2/3 {
		t.Errorf("resident memory fell by %d MiB, want at least %d MiB of the %d MiB dropped",
			got>>20, heapTestBytes*2/3>>20, heapTestBytes>>20)
	}
}

// TestThreadArenaTopKept shows why the accelerator imports onearena:
// with glibc's arena per thread, what a new thread freed at the top of its
// arena stays resident whatever ReleaseHeap does (onearena's
// TestTopReleased checks that it goes back with one arena).
func TestThreadArenaTopKept(t *testing.T) {
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "MALLOC_ARENA_MAX=") || strings.HasPrefix(kv, "GLIBC_TUNABLES=") {
			t.Skipf("%s changes glibc's arenas for this test", kv)
		}
	}
	const top = 24 << 20
	if err := mallocfrag.ThreadTop(top); err != nil {
		t.Fatal(err)
	}
	// The Go heap's free pages first, so that only the C heap's count.
	debug.FreeOSMemory()
	before := resident(t)
	ReleaseHeap()
	if got := before - resident(t); got >= top/3 {
		t.Errorf("resident memory fell by %d MiB of the %d MiB a thread freed at its arena's top: "+
			"ReleaseHeap reaches thread arenas now, and onearena may no longer be needed", got>>20, top>>20)
	}
}
