package shm

import (
	"math"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// SpinMinCPUs is the fewest usable CPUs at which waiters spin before they
// sleep. A mesh has three hot processes (a frontend, the embedder, the
// accelerator) besides its clients: with fewer CPUs than that and one to
// spare, a waiter that spins takes the core from the process whose work it
// is waiting for, so it sleeps on the futex at once.
const SpinMinCPUs = 4

// UsableCPUs is how many CPUs this process may actually use: its affinity
// mask, bounded by the cgroup v2 CPU quota (cpu.max) rounded up. It is at
// least 1.
func UsableCPUs() int {
	n := 0
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err == nil {
		n = set.Count()
	}
	if n <= 0 {
		n = 1
	}
	if q, ok := cgroupQuota("/sys/fs/cgroup/cpu.max"); ok {
		n = min(n, max(1, int(math.Ceil(q))))
	}
	return n
}

// cgroupQuota reads a cgroup v2 cpu.max file ("quota period" or "max
// period") as CPUs; ok is false without a limit.
func cgroupQuota(path string) (float64, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	return parseCPUMax(string(b))
}

func parseCPUMax(s string) (float64, bool) {
	f := strings.Fields(s)
	if len(f) != 2 || f[0] == "max" {
		return 0, false
	}
	quota, err1 := strconv.ParseFloat(f[0], 64)
	period, err2 := strconv.ParseFloat(f[1], 64)
	if err1 != nil || err2 != nil || quota <= 0 || period <= 0 {
		return 0, false
	}
	return quota / period, true
}

// SpinFor is the spin budget for a process that may use cpus CPUs:
// DefaultSpin with SpinMinCPUs or more, none below.
func SpinFor(cpus int) time.Duration {
	if cpus >= SpinMinCPUs {
		return DefaultSpin
	}
	return 0
}
