package cpuset

import (
	"runtime"
	"slices"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

func TestParseFormat(t *testing.T) {
	for in, want := range map[string]string{
		"0":            "0",
		"0-3":          "0-3",
		"0-3,8,10-11":  "0-3,8,10-11",
		" 3 , 1-2 ":    "1-3",
		"5,4,4":        "4-5",
		"8-23":         "8-23",
		"0-1,3,5-6,63": "0-1,3,5-6,63",
	} {
		set, err := Parse(in)
		if err != nil {
			t.Errorf("Parse(%q): %v", in, err)
			continue
		}
		if got := Format(set); got != want {
			t.Errorf("Format(Parse(%q)) = %q, want %q", in, got, want)
		}
	}
	for _, bad := range []string{"", "a", "3-1", "-1", "1-", "1,,2", "100000"} {
		if _, err := Parse(bad); err == nil {
			t.Errorf("Parse(%q) succeeded", bad)
		}
	}
}

func TestCPUs(t *testing.T) {
	for in, want := range map[string][]int{"0": {0}, "3,1-2": {1, 2, 3}, "0-1,63,1000": {0, 1, 63, 1000}} {
		set, err := Parse(in)
		if err != nil {
			t.Fatal(err)
		}
		if got := CPUs(set); !slices.Equal(got, want) {
			t.Errorf("CPUs(%q) = %v, want %v", in, got, want)
		}
	}
	if got := CPUs(unix.CPUSet{}); len(got) != 0 {
		t.Errorf("CPUs(empty) = %v", got)
	}
}

// TestPinProcess pins the whole test process to one CPU, checks that every
// thread, including one started afterwards, has the mask, and restores the
// original mask.
func TestPinProcess(t *testing.T) {
	orig, err := Current()
	if err != nil {
		t.Fatal(err)
	}
	procs := runtime.GOMAXPROCS(0)
	t.Cleanup(func() {
		if err := PinProcess(orig); err != nil {
			t.Errorf("restore: %v", err)
		}
		runtime.GOMAXPROCS(procs)
	})
	// Pin to the highest CPU this process may use, so the test works under
	// any outer restriction.
	target := -1
	for c := range maxCPU {
		if orig.IsSet(c) {
			target = c
		}
	}
	var set unix.CPUSet
	set.Set(target)
	if err := PinProcess(set); err != nil {
		t.Fatal(err)
	}
	if got := runtime.GOMAXPROCS(0); got != 1 {
		t.Errorf("GOMAXPROCS %d after pinning to one CPU", got)
	}
	// Threads locked by goroutines force the runtime to start new ones.
	var wg sync.WaitGroup
	newThreads := make(chan unix.CPUSet, 4)
	for range 4 {
		wg.Go(func() {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			s, err := Current()
			if err != nil {
				t.Error(err)
			}
			newThreads <- s
		})
	}
	wg.Wait()
	close(newThreads)
	for s := range newThreads {
		if s != set {
			t.Errorf("a thread started after pinning has %s, want %s", Format(s), Format(set))
		}
	}
	sets, err := ThreadSets()
	if err != nil {
		t.Fatal(err)
	}
	for tid, s := range sets {
		if s != set {
			t.Errorf("thread %d has %s, want %s", tid, Format(s), Format(set))
		}
	}
	if len(sets) < 2 {
		t.Errorf("saw %d threads; the runtime always has several", len(sets))
	}
	var empty unix.CPUSet
	if err := PinProcess(empty); err == nil {
		t.Error("pinning to an empty set succeeded")
	}

	// A set naming CPUs that do not exist pins to the ones that do.
	wide := set
	wide.Set(maxCPU - 1)
	if err := PinProcess(wide); err != nil {
		t.Fatalf("pin to %s: %v", Format(wide), err)
	}
	if got, _ := Current(); got != set || runtime.GOMAXPROCS(0) != 1 {
		t.Errorf("pinned to %s with GOMAXPROCS %d, want %s and 1", Format(got), runtime.GOMAXPROCS(0), Format(set))
	}
	var offline unix.CPUSet
	offline.Set(maxCPU - 1)
	if err := PinProcess(offline); err == nil {
		t.Error("pinning to only an offline CPU succeeded")
	}
}
