// Package sched owns how a mesh process uses the machine's CPUs: how many
// it may use (UsableCPUs: the affinity mask capped by the cgroup CPU
// quota), which sizes the shared-memory waiters' spinning and the
// accelerator's XLA threads, and the scheduling policy its threads run
// under (UseBatchScheduling).
package sched

import (
	"bufio"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// CPUs is how many cores the process may use, and what limits it.
type CPUs struct {
	// Usable is min(Affinity, Quota rounded up), at least 1.
	Usable int
	// Affinity is the number of cores in the process's CPU affinity mask
	// (taskset, cpusets).
	Affinity int
	// Quota is the tightest cgroup CPU bandwidth limit on the process's
	// cgroup and its ancestors, in cores (cpu.max, or cfs_quota_us /
	// cfs_period_us on cgroup v1); 0 when there is none.
	Quota float64
}

func (c CPUs) String() string {
	s := fmt.Sprintf("%d usable (affinity %d", c.Usable, c.Affinity)
	if c.Quota > 0 {
		s += fmt.Sprintf(", cgroup quota %.2f", c.Quota)
	}
	return s + ")"
}

// UsableCPUs returns the cores this process may use: the CPU affinity mask,
// capped by the cgroup CPU quota. A quota of 1.5 cores counts as 2: the
// threads then share the quota rather than leave half a core unused.
func UsableCPUs() CPUs {
	var set unix.CPUSet
	affinity := 0
	if err := unix.SchedGetaffinity(0, &set); err == nil {
		affinity = set.Count()
	}
	return usableCPUs(affinity, cgroupQuota("/proc/self/cgroup", "/sys/fs/cgroup"))
}

func usableCPUs(affinity int, quota float64) CPUs {
	c := CPUs{Affinity: affinity, Quota: quota}
	if c.Affinity <= 0 {
		c.Affinity = 1
	}
	c.Usable = c.Affinity
	if quota > 0 {
		if q := int(math.Ceil(quota - 1e-9)); q < c.Usable {
			c.Usable = q
		}
	}
	if c.Usable < 1 {
		c.Usable = 1
	}
	return c
}

// cgroupQuota reads the process's cgroups from procCgroup (the format of
// /proc/self/cgroup) and returns the tightest CPU quota, in cores, found on
// its cgroup or any ancestor under the cgroup file system mounted at root;
// 0 when there is none or it cannot be read. Both cgroup v2 (cpu.max) and
// v1 (cpu.cfs_quota_us and cpu.cfs_period_us, in a "cpu" or "cpu,cpuacct"
// hierarchy) are understood.
func cgroupQuota(procCgroup, root string) float64 {
	f, err := os.Open(procCgroup)
	if err != nil {
		return 0
	}
	defer f.Close()
	best := 0.0
	tighter := func(q float64) {
		if q > 0 && (best == 0 || q < best) {
			best = q
		}
	}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// hierarchy-ID:controller-list:cgroup-path
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		controllers, path := parts[1], parts[2]
		switch {
		case parts[0] == "0" && controllers == "":
			forEachAncestor(root, path, func(dir string) { tighter(readCPUMax(filepath.Join(dir, "cpu.max"))) })
		case hasController(controllers, "cpu"):
			for _, mount := range []string{controllers, "cpu", "cpu,cpuacct", "cpuacct,cpu"} {
				base := filepath.Join(root, mount)
				if st, err := os.Stat(base); err != nil || !st.IsDir() {
					continue
				}
				forEachAncestor(base, path, func(dir string) { tighter(readCFS(dir)) })
				break
			}
		}
	}
	return best
}

func hasController(list, name string) bool {
	for _, c := range strings.Split(list, ",") {
		if c == name {
			return true
		}
	}
	return false
}

// forEachAncestor calls fn for root/path and each of its parents up to
// root, skipping the ones that do not exist (in a container the cgroup
// namespace often makes path "/", the mount's own root).
func forEachAncestor(root, path string, fn func(dir string)) {
	p := filepath.Clean("/" + path)
	for {
		dir := filepath.Join(root, p)
		if st, err := os.Stat(dir); err == nil && st.IsDir() {
			fn(dir)
		}
		if p == "/" {
			return
		}
		p = filepath.Dir(p)
	}
}

// readCPUMax parses a cgroup v2 cpu.max ("max 100000" or "150000 100000").
func readCPUMax(file string) float64 {
	b, err := os.ReadFile(file)
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) != 2 || f[0] == "max" {
		return 0
	}
	quota, err1 := strconv.ParseFloat(f[0], 64)
	period, err2 := strconv.ParseFloat(f[1], 64)
	if err1 != nil || err2 != nil || quota <= 0 || period <= 0 {
		return 0
	}
	return quota / period
}

// readCFS parses cgroup v1's cpu.cfs_quota_us (-1: none) and
// cpu.cfs_period_us in dir.
func readCFS(dir string) float64 {
	read := func(name string) float64 {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			return 0
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(string(b)), 64)
		if err != nil {
			return 0
		}
		return v
	}
	quota, period := read("cpu.cfs_quota_us"), read("cpu.cfs_period_us")
	if quota <= 0 || period <= 0 {
		return 0
	}
	return quota / period
}
