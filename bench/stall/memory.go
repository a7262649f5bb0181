package stall

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Memory-latency probe. A machine can slow a benchmark without taking a
// CPU from it: a neighbour on the same host streaming through memory
// leaves the guest's cores running (no stall, no steal) while every cache
// miss takes longer, and a server bound by random table reads slows with
// it. The probe measures that directly: one thread, at normal priority,
// walks a random cycle through a buffer far larger than any core's private
// caches, one dependent load at a time, a short burst every
// MemoryInterval, and reports the time per load. Dependent loads cannot
// overlap, so the time per load is the latency of a miss as the machine
// serves it at that moment.

// Defaults of the memory probe.
const (
	// MemoryInterval is the time between bursts.
	MemoryInterval = 100 * time.Millisecond
	// memoryLoads is the number of dependent loads in a burst: about
	// 0.1–0.3 ms of the CPU at the latencies of a server's DRAM.
	memoryLoads = 1024
	// lineWords is the stride of the walk: one 64-byte cache line.
	lineWords = 8
)

// MemoryReport is what the memory probe saw over a window.
type MemoryReport struct {
	BufferMiB int `json:"buffer_mib"`
	// Bursts is the number of timed bursts.
	Bursts int `json:"bursts"`
	// LoadNsP50, LoadNsP90 and LoadNsMax are the median, 90th percentile
	// and maximum over the bursts of the mean nanoseconds per load.
	LoadNsP50 float64 `json:"load_ns_p50"`
	LoadNsP90 float64 `json:"load_ns_p90"`
	LoadNsMax float64 `json:"load_ns_max"`
}

// String is the report in one line.
func (m *MemoryReport) String() string {
	return fmt.Sprintf("memory load latency p50 %.0f ns, p90 %.0f ns, max %.0f ns (%d bursts over %d MiB)",
		m.LoadNsP50, m.LoadNsP90, m.LoadNsMax, m.Bursts, m.BufferMiB)
}

// cycle is a buffer whose cache lines form one random cycle: the first
// word of each line holds the index of the next line's first word.
type cycle []uint64

// newCycle builds a cycle over mib MiB of lines (Sattolo's algorithm,
// which yields a single cycle through every line), seeded so that runs
// walk the same order.
func newCycle(mib int) (cycle, error) {
	lines := mib << 20 / (lineWords * 8)
	if lines < 2 {
		return nil, fmt.Errorf("stall: memory probe buffer of %d MiB: want at least 1", mib)
	}
	mem, err := unix.Mmap(-1, 0, lines*lineWords*8, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, fmt.Errorf("stall: memory probe buffer of %d MiB: %w", mib, err)
	}
	// Huge pages where the kernel offers them, so that the walk measures
	// the memory and not page walks the tables of the server under test
	// (which are on huge pages) would not make.
	_ = unix.Madvise(mem, unix.MADV_HUGEPAGE)
	buf := cycle(unsafe.Slice((*uint64)(unsafe.Pointer(&mem[0])), lines*lineWords))
	order := make([]uint32, lines)
	for i := range order {
		order[i] = uint32(i)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for i := lines - 1; i > 0; i-- {
		j := rng.IntN(i) // j < i: Sattolo, not Fisher–Yates
		order[i], order[j] = order[j], order[i]
	}
	for i := range lines {
		buf[int(order[i])*lineWords] = uint64(order[(i+1)%lines]) * lineWords
	}
	return buf, nil
}

// free returns the buffer to the kernel; c must not be used after.
func (c cycle) free() error {
	return unix.Munmap(unsafe.Slice((*byte)(unsafe.Pointer(&c[0])), len(c)*8))
}

// walk follows n links from word at and returns where it stopped.
func (c cycle) walk(at uint64, n int) uint64 {
	for range n {
		at = c[at]
	}
	return at
}

// runMemory builds its buffer on a thread pinned to cpu at normal
// priority, closes ready, waits for begin, then times a burst of
// dependent loads every interval until stop closes. A stop before begin
// ends it with no bursts.
func runMemory(cpu, mib int, interval time.Duration, ready chan<- struct{}, begin, stop <-chan struct{}) (*MemoryReport, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var set unix.CPUSet
	set.Set(cpu)
	if err := unix.SchedSetaffinity(0, &set); err != nil {
		return nil, fmt.Errorf("stall: pin the memory probe to CPU %d: %w", cpu, err)
	}
	c, err := newCycle(mib)
	if err != nil {
		return nil, err
	}
	defer c.free()
	var (
		at  uint64
		per []float64
	)
	at = c.walk(at, memoryLoads) // fault the first pages in untimed
	close(ready)
	select {
	case <-begin:
	case <-stop:
		// Both may be there by now: the window began all the same.
		select {
		case <-begin:
		default:
			return summarizeMemory(mib, nil), nil
		}
	}
	// At least one burst, however soon the stop came: a window shorter
	// than a burst's interval still reports a latency.
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		start := time.Now()
		at = c.walk(at, memoryLoads)
		per = append(per, float64(time.Since(start).Nanoseconds())/memoryLoads)
		select {
		case <-stop:
			runtime.KeepAlive(at)
			return summarizeMemory(mib, per), nil
		case <-tick.C:
		}
	}
}

// summarizeMemory reduces the bursts' nanoseconds per load to a report.
func summarizeMemory(mib int, per []float64) *MemoryReport {
	r := &MemoryReport{BufferMiB: mib, Bursts: len(per)}
	r.LoadNsP50, r.LoadNsP90, r.LoadNsMax = quantiles(per)
	return r
}

// quantiles sorts v and returns its median, 90th percentile and maximum;
// zeros for none.
func quantiles(v []float64) (p50, p90, mx float64) {
	if len(v) == 0 {
		return 0, 0, 0
	}
	slices.Sort(v)
	at := func(q float64) float64 { return v[min(len(v)-1, int(q*float64(len(v))))] }
	return at(0.5), at(0.9), v[len(v)-1]
}
