package e2e

import (
	"bytes"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// userHz is the unit of /proc's CPU times: USER_HZ, 100 on every Linux
// architecture Go supports (it is part of the kernel's user ABI).
const userHz = 100

// cpuSample is where the CPU time of one core and of some processes stood
// at one instant, so two samples give each one's share of the interval.
type cpuSample struct {
	at        time.Time
	busy, all uint64            // the core's ticks: not idle or iowait, and all
	procTicks map[string]uint64 // utime+stime of each named process
}

// sampleCPU reads core cpu's counters from /proc/stat and each process's
// from /proc/<pid>/stat. A process that cannot be read (it exited) is left
// out.
func sampleCPU(cpu int, pids map[string]int) (cpuSample, error) {
	s := cpuSample{at: time.Now(), procTicks: map[string]uint64{}}
	stat, err := os.ReadFile("/proc/stat")
	if err != nil {
		return s, fmt.Errorf("cpu sample: %w", err)
	}
	prefix := fmt.Sprintf("cpu%d ", cpu)
	for line := range strings.Lines(string(stat)) {
		if !strings.HasPrefix(line, prefix) {
			continue
		}
		// user nice system idle iowait irq softirq steal ...
		f := strings.Fields(line)[1:]
		for i, v := range f {
			n, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				return s, fmt.Errorf("cpu sample: %s field %d: %w", prefix, i, err)
			}
			s.all += n
			if i != 3 && i != 4 {
				s.busy += n
			}
		}
	}
	if s.all == 0 {
		return s, fmt.Errorf("cpu sample: /proc/stat has no %q line", prefix)
	}
	for name, pid := range pids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		// After the command name, which may hold spaces: state is field 3,
		// utime and stime fields 14 and 15.
		f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
		if len(f) < 13 {
			continue
		}
		u, err1 := strconv.ParseUint(f[11], 10, 64)
		k, err2 := strconv.ParseUint(f[12], 10, 64)
		if err1 == nil && err2 == nil {
			s.procTicks[name] = u + k
		}
	}
	return s, nil
}

// cpuShares is the interval between two samples: how busy the core was
// and each process's CPU, in percent of one core.
type cpuShares struct {
	coreBusy float64
	procs    map[string]float64
}

func sharesBetween(a, b cpuSample) cpuShares {
	sh := cpuShares{procs: map[string]float64{}}
	if b.all > a.all {
		sh.coreBusy = 100 * float64(b.busy-a.busy) / float64(b.all-a.all)
	}
	secs := b.at.Sub(a.at).Seconds()
	for name, t := range b.procTicks {
		if t0, ok := a.procTicks[name]; ok && secs > 0 {
			sh.procs[name] = 100 * float64(t-t0) / userHz / secs
		}
	}
	return sh
}

// String lists the core's busy share, then each process's, by name.
func (sh cpuShares) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "busy %.0f%%", sh.coreBusy)
	names := make([]string, 0, len(sh.procs))
	for n := range sh.procs {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		fmt.Fprintf(&b, ", %s %.0f%%", n, sh.procs[n])
	}
	return b.String()
}
