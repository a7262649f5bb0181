package stall

import (
	"testing"
	"time"
)

// TestCycleVisitsEveryLine: the walk is one cycle through every line of
// the buffer, so a burst never settles into a loop small enough to stay
// in a cache.
func TestCycleVisitsEveryLine(t *testing.T) {
	c, err := newCycle(1)
	if err != nil {
		t.Fatal(err)
	}
	defer c.free()
	lines := len(c) / lineWords
	seen := make([]bool, lines)
	at := uint64(0)
	for i := range lines {
		if at%lineWords != 0 {
			t.Fatalf("step %d: word %d is not the start of a line", i, at)
		}
		if seen[at/lineWords] {
			t.Fatalf("step %d: line %d again before all %d lines", i, at/lineWords, lines)
		}
		seen[at/lineWords] = true
		at = c.walk(at, 1)
	}
	if at != 0 {
		t.Fatalf("after %d steps at word %d, want back at 0", lines, at)
	}
}

func TestCycleSize(t *testing.T) {
	if _, err := newCycle(0); err == nil {
		t.Fatal("newCycle(0) = nil error, want one")
	}
}

func TestSummarizeMemory(t *testing.T) {
	r := summarizeMemory(8, []float64{90, 10, 50, 30, 70, 20, 40, 60, 80, 100})
	if r.Bursts != 10 || r.LoadNsP50 != 60 || r.LoadNsP90 != 100 || r.LoadNsMax != 100 || r.BufferMiB != 8 {
		t.Fatalf("summary %+v", r)
	}
	if r := summarizeMemory(8, nil); r.Bursts != 0 || r.LoadNsMax != 0 {
		t.Fatalf("empty summary %+v", r)
	}
}

// TestRunMemory: the probe sets its buffer up, waits to begin, then
// times bursts until stopped; stopped before it begins, it times none.
func TestRunMemory(t *testing.T) {
	cpu := allowedCPUs(t)[0]
	run := func(beginFirst bool) *MemoryReport {
		ready, begin, stop := make(chan struct{}), make(chan struct{}), make(chan struct{})
		done := make(chan *MemoryReport, 1)
		go func() {
			r, err := runMemory(cpu, 2, time.Millisecond, ready, begin, stop)
			if err != nil {
				t.Error(err)
			}
			done <- r
		}()
		<-ready
		if beginFirst {
			close(begin)
			time.Sleep(200 * time.Millisecond)
		}
		close(stop)
		return <-done
	}
	if r := run(true); r == nil || r.Bursts < 5 || !(r.LoadNsP50 > 0) {
		t.Fatalf("report %+v, want several timed bursts", r)
	} else {
		t.Logf("%s", r)
	}
	if r := run(false); r == nil || r.Bursts != 0 {
		t.Fatalf("report %+v of a probe stopped before it began, want no bursts", r)
	}
}

// TestComputeKernel: the kernel is deterministic (the same work every
// time) and the probe's report orders its quantiles.
func TestComputeKernel(t *testing.T) {
	if computeKernel(7) != computeKernel(7) || computeKernel(7) == computeKernel(8) {
		t.Fatal("the compute kernel is not a function of its seed")
	}
	d, _ := timeCompute(1)
	if d <= 0 || d > time.Second {
		t.Fatalf("kernel took %v", d)
	}
	r := summarizeCompute([]float64{300, 100, 200})
	if r.Samples != 3 || r.NsP50 != 200 || r.NsP90 != 300 || r.NsMax != 300 {
		t.Fatalf("summary %+v", r)
	}
}
