package onearena_test

import (
	"os"
	"strings"
	"testing"

	"github.com/recmesh/recmesh/accelerator/device"
	"github.com/recmesh/recmesh/accelerator/device/internal/mallocfrag"
	"github.com/recmesh/recmesh/accelerator/device/onearena"
)

const topBytes = 24 << 20

// TestTopReleased checks that what a new thread frees at the top of the
// arena it allocates from goes back to the kernel with ReleaseHeap (the
// device package's TestThreadArenaTopKept shows it does not without this
// package).
func TestTopReleased(t *testing.T) {
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "MALLOC_ARENA_MAX=") || strings.HasPrefix(kv, "GLIBC_TUNABLES=") {
			t.Skipf("%s sets glibc's arenas for this test", kv)
		}
	}
	if !onearena.Set() {
		t.Fatal("the constructor set no arena limit")
	}
	if err := mallocfrag.ThreadTop(topBytes); err != nil {
		t.Fatal(err)
	}
	before, err := device.Resident()
	if err != nil {
		t.Fatal(err)
	}
	device.ReleaseHeap()
	after, err := device.Resident()
	if err != nil {
		t.Fatal(err)
	}
	if got := before - after; got < topBytes*2/3 {
		t.Errorf("resident memory fell by %d MiB, want at least %d MiB of the %d MiB freed",
			got>>20, topBytes*2/3>>20, topBytes>>20)
	}
}
