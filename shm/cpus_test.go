package shm

import (
	"testing"
	"time"
)

func TestParseCPUMax(t *testing.T) {
	for in, want := range map[string]float64{"150000 100000\n": 1.5, "50000 100000": 0.5} {
		if got, ok := parseCPUMax(in); !ok || got != want {
			t.Errorf("parseCPUMax(%q) = %v, %v; want %v", in, got, ok, want)
		}
	}
	for _, in := range []string{"max 100000", "", "x y", "0 100000", "1 2 3"} {
		if _, ok := parseCPUMax(in); ok {
			t.Errorf("parseCPUMax(%q) found a quota", in)
		}
	}
}

func TestSpinFor(t *testing.T) {
	if SpinFor(1) != 0 || SpinFor(SpinMinCPUs-1) != 0 {
		t.Error("waiters spin with fewer usable CPUs than the mesh has hot processes")
	}
	if SpinFor(SpinMinCPUs) != DefaultSpin || SpinFor(64) != DefaultSpin {
		t.Error("waiters do not spin with CPUs to spare")
	}
	if n := UsableCPUs(); n < 1 {
		t.Errorf("UsableCPUs = %d", n)
	}
	var _ time.Duration = processSpin()
}

func TestExecTable(t *testing.T) {
	seg := newTestSegment(t, testGeometry())
	seg.SetExecTime(16, 3*time.Millisecond)
	seg.SetExecTime(3, time.Second)     // not a power of two: ignored
	seg.SetExecTime(1<<20, time.Second) // beyond the table: ignored
	if got := seg.ExecTime(16); got != 3*time.Millisecond {
		t.Errorf("ExecTime(16) = %v", got)
	}
	if seg.ExecTime(8) != 0 || seg.ExecTime(3) != 0 || seg.ExecTime(1<<20) != 0 || seg.ExecTime(0) != 0 {
		t.Error("an unset or invalid bucket has a time")
	}
}
