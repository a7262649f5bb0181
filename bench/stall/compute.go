package stall

import (
	"fmt"
	"time"
)

// Compute-speed probe. A core can also run slower without being taken
// away: a hypervisor may put another guest on the same physical core's
// other hardware thread, or lower the clock when the socket runs hot;
// the guest sees neither as steal. Every computeEvery-th wake-up, the
// stall probe's real-time thread, which nothing in the guest preempts,
// times a fixed piece of arithmetic: four independent multiply chains,
// enough to keep a core's multipliers busy for about a microsecond. Its
// time moves with the core's clock and with whatever shares the core's
// execution units, and with nothing the guest's own processes do.

const (
	// computeEvery: one timed kernel every that many wake-ups (every
	// 10 ms at the default period), about 0.01 % of the CPU.
	computeEvery = 10
	// computeRounds is the kernel's length: four multiplies a round.
	computeRounds = 256
)

// ComputeReport is what the compute-speed probe saw over a window.
type ComputeReport struct {
	Samples int `json:"samples"`
	// NsP50, NsP90 and NsMax are the median, 90th percentile and maximum
	// of the kernel's time in nanoseconds; a slower core, a larger time.
	NsP50 float64 `json:"ns_p50"`
	NsP90 float64 `json:"ns_p90"`
	NsMax float64 `json:"ns_max"`
}

// String is the report in one line.
func (c *ComputeReport) String() string {
	return fmt.Sprintf("compute kernel p50 %.0f ns, p90 %.0f ns, max %.0f ns (%d samples)", c.NsP50, c.NsP90, c.NsMax, c.Samples)
}

// computeKernel runs the fixed arithmetic from seed and returns its
// result, which the caller feeds into the next run so that the compiler
// cannot drop it.
//
//go:noinline
func computeKernel(seed uint64) uint64 {
	const mul, inc = 6364136223846793005, 1442695040888963407
	a, b, c, d := seed, seed+1, seed+2, seed+3
	for range computeRounds {
		a = a*mul + inc
		b = b*mul + inc
		c = c*mul + inc
		d = d*mul + inc
	}
	return a ^ b ^ c ^ d
}

// timeCompute times one run of the kernel.
func timeCompute(seed uint64) (time.Duration, uint64) {
	start := time.Now()
	v := computeKernel(seed)
	return time.Since(start), v
}

// summarizeCompute reduces the kernel's times in nanoseconds to a report.
func summarizeCompute(ns []float64) *ComputeReport {
	p50, p90, mx := quantiles(ns)
	return &ComputeReport{Samples: len(ns), NsP50: p50, NsP90: p90, NsMax: mx}
}
