// Package cpuset parses CPU lists ("0-7", "8-23,40") and pins a whole
// process to one, as `taskset -a -p` does.
//
// Pinning a Go process from inside is subtle: sched_setaffinity(2) acts on
// one thread, and the Go runtime already runs several (sysmon, the GC
// workers, idle Ms) before main starts. PinProcess therefore sets the mask
// on every thread listed in /proc/self/task, and repeats until a pass finds
// every thread already pinned; from then on every new thread inherits the
// mask, since clone(2) copies the creating thread's affinity. Call it first
// thing in main, before starting goroutines, so few threads are being born
// while it runs. It also sets GOMAXPROCS to the number of CPUs in the set,
// which the runtime would otherwise have sized from the mask it started
// with.
package cpuset

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Parse reads a CPU list in the kernel's format (cpuset(7)): comma-
// separated CPU numbers and inclusive ranges, for example "0-3,8,10-11".
func Parse(s string) (unix.CPUSet, error) {
	var set unix.CPUSet
	set.Zero()
	s = strings.TrimSpace(s)
	if s == "" {
		return set, errors.New("cpuset: empty CPU list")
	}
	for part := range strings.SplitSeq(s, ",") {
		lo, hi, isRange := strings.Cut(strings.TrimSpace(part), "-")
		a, err := cpuNumber(lo)
		if err != nil {
			return set, fmt.Errorf("cpuset: %q: %w", s, err)
		}
		b := a
		if isRange {
			if b, err = cpuNumber(hi); err != nil {
				return set, fmt.Errorf("cpuset: %q: %w", s, err)
			}
			if b < a {
				return set, fmt.Errorf("cpuset: %q: range %d-%d runs backwards", s, a, b)
			}
		}
		for c := a; c <= b; c++ {
			set.Set(c)
		}
	}
	return set, nil
}

// maxCPU is the number of CPUs a unix.CPUSet holds.
const maxCPU = len(unix.CPUSet{}) * 64

func cpuNumber(s string) (int, error) {
	n, err := strconv.Atoi(strings.TrimSpace(s))
	if err != nil || n < 0 || n >= maxCPU {
		return 0, fmt.Errorf("bad CPU number %q (want 0..%d)", s, maxCPU-1)
	}
	return n, nil
}

// Format writes set in the kernel's list format, ranges collapsed.
func Format(set unix.CPUSet) string {
	var parts []string
	for c := 0; c < maxCPU; c++ {
		if !set.IsSet(c) {
			continue
		}
		end := c
		for end+1 < maxCPU && set.IsSet(end+1) {
			end++
		}
		if end == c {
			parts = append(parts, strconv.Itoa(c))
		} else {
			parts = append(parts, fmt.Sprintf("%d-%d", c, end))
		}
		c = end
	}
	return strings.Join(parts, ",")
}

// CPUs lists the CPUs of set in ascending order.
func CPUs(set unix.CPUSet) []int {
	var cpus []int
	for c := 0; c < maxCPU && len(cpus) < set.Count(); c++ {
		if set.IsSet(c) {
			cpus = append(cpus, c)
		}
	}
	return cpus
}

// maxPasses bounds PinProcess's passes over the threads; threads are born
// only rarely, so the second pass normally finds nothing to do.
const maxPasses = 10

// PinProcess restricts every thread of this process, and so every thread
// it starts later, to set, and sets GOMAXPROCS to the number of CPUs it
// may then run on. CPUs of set that are not online are ignored, as the
// kernel ignores them; a set with no online CPU is an error.
func PinProcess(set unix.CPUSet) error {
	if set.Count() == 0 {
		return errors.New("cpuset: pin: empty CPU set")
	}
	eff, err := pinSelf(set)
	if err != nil {
		return fmt.Errorf("cpuset: pin to %s: %w", Format(set), err)
	}
	for range maxPasses {
		tids, err := threads()
		if err != nil {
			return fmt.Errorf("cpuset: pin: %w", err)
		}
		changed := false
		for _, tid := range tids {
			var cur unix.CPUSet
			if err := unix.SchedGetaffinity(tid, &cur); err != nil {
				continue // the thread exited
			}
			if cur == eff {
				continue
			}
			if err := unix.SchedSetaffinity(tid, &set); err != nil {
				if errors.Is(err, unix.ESRCH) {
					continue
				}
				return fmt.Errorf("cpuset: pin thread %d to %s: %w", tid, Format(set), err)
			}
			changed = true
		}
		if !changed {
			runtime.GOMAXPROCS(eff.Count())
			return nil
		}
	}
	return fmt.Errorf("cpuset: pin: threads kept appearing after %d passes", maxPasses)
}

// pinSelf pins the calling thread and returns the mask the kernel actually
// applied: set less the CPUs that are not online, the mask every thread
// has once pinned.
func pinSelf(set unix.CPUSet) (unix.CPUSet, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var eff unix.CPUSet
	if err := unix.SchedSetaffinity(0, &set); err != nil {
		return eff, err
	}
	if err := unix.SchedGetaffinity(0, &eff); err != nil {
		return eff, err
	}
	return eff, nil
}

// Current returns the affinity of the calling thread.
func Current() (unix.CPUSet, error) {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return set, fmt.Errorf("cpuset: get affinity: %w", err)
	}
	return set, nil
}

// ThreadSets returns the affinity of every thread of this process, by
// thread id (for tests and diagnostics).
func ThreadSets() (map[int]unix.CPUSet, error) {
	tids, err := threads()
	if err != nil {
		return nil, fmt.Errorf("cpuset: %w", err)
	}
	out := make(map[int]unix.CPUSet, len(tids))
	for _, tid := range tids {
		var s unix.CPUSet
		if err := unix.SchedGetaffinity(tid, &s); err == nil {
			out[tid] = s
		}
	}
	return out, nil
}

func threads() ([]int, error) {
	ents, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return nil, fmt.Errorf("list threads: %w", err)
	}
	var tids []int
	for _, e := range ents {
		if tid, err := strconv.Atoi(e.Name()); err == nil {
			tids = append(tids, tid)
		}
	}
	slices.Sort(tids)
	return tids, nil
}
