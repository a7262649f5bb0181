package e2e

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/recmesh/recmesh/bench/monitor"
)

// coreTicks is where one core's /proc/stat counters stood: ticks not idle
// (nor waiting on I/O), and all ticks.
type coreTicks struct{ busy, steal, all uint64 }

func readCoreTicks(cpu int) (coreTicks, error) {
	stat, err := os.ReadFile("/proc/stat")
	if err != nil {
		return coreTicks{}, fmt.Errorf("core ticks: %w", err)
	}
	prefix := fmt.Sprintf("cpu%d ", cpu)
	for line := range strings.Lines(string(stat)) {
		if !strings.HasPrefix(line, prefix) {
			continue
		}
		var c coreTicks
		// user nice system idle iowait irq softirq steal ...
		for i, v := range strings.Fields(line)[1:] {
			n, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				return coreTicks{}, fmt.Errorf("core ticks: %s field %d: %w", prefix, i, err)
			}
			c.all += n
			if i != 3 && i != 4 {
				c.busy += n
			}
			if i == 7 {
				c.steal = n
			}
		}
		return c, nil
	}
	return coreTicks{}, fmt.Errorf("core ticks: /proc/stat has no %q line", prefix)
}

// coreWindow measures one window on one core: how busy the core was and
// each named process's CPU (bench/monitor), in percent of one core.
type coreWindow struct {
	cpu   int
	names map[int]string // pid → name
	from  coreTicks
	mon   *monitor.Monitor
}

func startCoreWindow(cpu int, names map[int]string) (*coreWindow, error) {
	w := &coreWindow{cpu: cpu, names: names}
	var err error
	if w.from, err = readCoreTicks(cpu); err != nil {
		return nil, err
	}
	pids := make([]int, 0, len(names))
	for pid := range names {
		pids = append(pids, pid)
	}
	if w.mon, err = monitor.Start(monitor.Options{PIDs: pids}); err != nil {
		return nil, fmt.Errorf("core window: %w", err)
	}
	return w, nil
}

// cpuShares is what a coreWindow saw.
type cpuShares struct {
	coreBusy float64
	// coreStolen is the part of coreBusy the hypervisor gave to another
	// guest while this core had work: a noisy neighbour, not the mesh.
	coreStolen float64
	procs      map[string]float64
	// faults is each process's minor page faults a second.
	faults map[string]float64
}

func (w *coreWindow) stop() (cpuShares, error) {
	r, err := w.mon.Stop()
	if err != nil {
		return cpuShares{}, fmt.Errorf("core window: %w", err)
	}
	to, err := readCoreTicks(w.cpu)
	if err != nil {
		return cpuShares{}, err
	}
	sh := cpuShares{procs: map[string]float64{}, faults: map[string]float64{}}
	if to.all > w.from.all {
		sh.coreBusy = 100 * float64(to.busy-w.from.busy) / float64(to.all-w.from.all)
		sh.coreStolen = 100 * float64(to.steal-w.from.steal) / float64(to.all-w.from.all)
	}
	for _, p := range r.Processes {
		if r.WallSeconds > 0 {
			sh.procs[w.names[p.PID]] = 100 * p.CPUSeconds / r.WallSeconds
			sh.faults[w.names[p.PID]] = float64(p.MinorFaults) / r.WallSeconds
		}
	}
	return sh, nil
}

// String lists the core's busy share, then each process's, by name.
func (sh cpuShares) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "busy %.0f%% (stolen %.1f%%)", sh.coreBusy, sh.coreStolen)
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
