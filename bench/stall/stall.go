// Package stall measures how long a machine withholds a CPU from a thread
// that should run at once: the stalls a benchmark's server suffers that no
// process of its own causes, such as a hypervisor running another guest on
// the core (steal), or the kernel running long with preemption off.
//
// The probe is one thread pinned to the CPU, at real-time priority
// (SCHED_FIFO) where it may have it, sleeping a period at a time to an
// absolute deadline and recording how late each wake-up comes. A
// real-time thread preempts every ordinary thread at once, so the server's
// own load does not delay it: a late wake-up is time the CPU was not the
// guest's to give. Without real-time priority (no CAP_SYS_NICE) it runs at
// normal priority and its delays include the guest's own scheduling; the
// report says which. Beside it, the kernel's steal time for the CPU
// (/proc/stat) says how much of the window the hypervisor took, when it
// accounts for it.
//
// The probe costs one short wake-up per period (1 ms by default) on the
// CPU it watches.
//
// A probe may also time the host's memory (Options.MemoryMiB, memory.go):
// a neighbour loading it slows a server of random table reads without
// taking a CPU, which neither the wake-ups nor steal time show.
//
// A benchmark runs each probe in a process of its own (StartProcess, and
// Command on the probe's side), so that the probe's thread shares no Go
// scheduler with the load generator's goroutines. It starts the probes
// before its warm-up, and they say when they are set up; Begin starts
// their window and Stop ends it, so the report covers exactly the
// benchmark's measured window.
package stall

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// DefaultPeriod is how long the probe sleeps between wake-ups.
const DefaultPeriod = time.Millisecond

// realtimePriority is the probe's SCHED_FIFO priority: above every
// ordinary thread, just below the kernel's threaded interrupt handlers
// (50), which it must not delay.
const realtimePriority = 49

// Options selects what to probe.
type Options struct {
	// CPU is the CPU to watch.
	CPU int
	// Period is the sleep between wake-ups (default DefaultPeriod).
	Period time.Duration
	// ProcRoot is the proc filesystem's mount point (default /proc).
	ProcRoot string
	// MemoryMiB, when positive, also runs the memory-latency probe on
	// the CPU over a buffer of that many MiB (Report.Memory).
	MemoryMiB int
}

// Report is what a probe saw.
type Report struct {
	CPU int `json:"cpu"`
	// RealTime is whether the probe ran at SCHED_FIFO priority; when
	// false its delays include the guest's own scheduling.
	RealTime bool    `json:"realtime"`
	PeriodMs float64 `json:"period_ms"`
	WallS    float64 `json:"wall_s"`
	Wakeups  int64   `json:"wakeups"`
	// MaxDelayMs is the latest a wake-up came after its deadline.
	MaxDelayMs float64 `json:"max_delay_ms"`
	// LateOver1ms and LateOver10ms count wake-ups later than that.
	LateOver1ms  int64 `json:"late_over_1ms"`
	LateOver10ms int64 `json:"late_over_10ms"`
	// LateMs is the sum of every wake-up's delay: the window is covered
	// by Wakeups periods plus LateMs, so a probe kept off its CPU for
	// most of the window still accounts for all of it.
	LateMs float64 `json:"late_ms"`
	// StealPct is the CPU's steal time over the window, in percent of the
	// CPU's accounted time; -1 when /proc/stat could not be read or
	// counted no tick while the probe ran.
	StealPct float64 `json:"steal_pct"`
	// Compute is what the compute-speed probe saw (compute.go).
	Compute *ComputeReport `json:"compute,omitempty"`
	// Memory is what the memory-latency probe saw, when it ran.
	Memory *MemoryReport `json:"memory,omitempty"`
}

// String is the report in one line.
func (r *Report) String() string {
	prio := "real-time"
	if !r.RealTime {
		prio = "normal priority"
	}
	s := fmt.Sprintf("CPU %d stalls: max %.1f ms, %d wake-ups late by > 10 ms, %d by > 1 ms, of %d (%s probe); steal %.1f %%",
		r.CPU, r.MaxDelayMs, r.LateOver10ms, r.LateOver1ms, r.Wakeups, prio, r.StealPct)
	if r.Compute != nil && r.Compute.Samples > 0 {
		s += "; " + r.Compute.String()
	}
	if r.Memory != nil {
		s += "; " + r.Memory.String()
	}
	return s
}

// Run sets a probe up on its CPU, calls ready (when not nil) once it can
// watch at once, waits for the window's first instant on begin, and
// probes until stop closes; it returns what it saw between that instant
// and stop. A stop before begin ends it with an empty report. Set-up
// (pinning, priority, the memory probe's buffer) can take a while on a
// loaded machine: the split lets a benchmark start the probe before its
// measured window and begin it on the window's first instant.
//
// The window starts at the instant received, not when the probe hears of
// it: a probe kept off its CPU when the window began (the stall it is
// there to see) counts that time as its first wake-up's delay, and it
// wakes up at least once in a window even when stop came meanwhile. A
// begin closed without a value starts the window when it is seen. Run locks the calling goroutine to its
// thread for good (the thread is pinned and may be real-time, so the
// runtime must not reuse it): call it on a goroutine of its own, in a
// process with nothing else latency-sensitive to do.
func Run(opts Options, ready func(), begin <-chan time.Time, stop <-chan struct{}) (*Report, error) {
	if opts.Period <= 0 {
		opts.Period = DefaultPeriod
	}
	if opts.ProcRoot == "" {
		opts.ProcRoot = "/proc"
	}
	runtime.LockOSThread() // never unlocked: the thread exits with the goroutine
	var set unix.CPUSet
	set.Set(opts.CPU)
	if err := unix.SchedSetaffinity(0, &set); err != nil {
		return nil, fmt.Errorf("stall: pin to CPU %d: %w", opts.CPU, err)
	}
	// RESET_ON_FORK: a thread the runtime might start from this one must
	// not inherit real-time priority.
	realtime := unix.SchedSetAttr(0, &unix.SchedAttr{
		Size: unix.SizeofSchedAttr, Policy: unix.SCHED_FIFO, Priority: realtimePriority,
		Flags: unix.SCHED_FLAG_RESET_ON_FORK,
	}, 0) == nil

	var stopped atomic.Bool
	go func() { <-stop; stopped.Store(true) }()
	type memResult struct {
		r   *MemoryReport
		err error
	}
	var memDone chan memResult
	// The memory probe watches the span the wake-ups do.
	memBegin, memStop := make(chan struct{}), make(chan struct{})
	if opts.MemoryMiB > 0 {
		memDone = make(chan memResult, 1)
		memReady := make(chan struct{})
		go func() {
			r, err := runMemory(opts.CPU, opts.MemoryMiB, MemoryInterval, memReady, memBegin, memStop)
			memDone <- memResult{r, err}
		}()
		select {
		case <-memReady:
		case m := <-memDone: // it returns before ready only on an error
			close(memStop)
			return nil, m.err
		}
	}
	if ready != nil {
		ready()
	}
	// When begin and stop are both there (the probe was kept from running
	// through the whole window), the window still happened: begin wins.
	var start time.Time
	began := true
	select {
	case start = <-begin:
	default:
		select {
		case start = <-begin:
		case <-stop:
			select {
			case start = <-begin:
			default:
				began = false
			}
		}
	}
	if start.IsZero() {
		start = time.Now()
	}
	if began {
		close(memBegin)
	}

	r := &Report{CPU: opts.CPU, RealTime: realtime, PeriodMs: float64(opts.Period) / float64(time.Millisecond)}
	steal0, total0, statErr := readSteal(opts.ProcRoot, opts.CPU)
	var maxLate, lateSum time.Duration
	deadline := start.Add(opts.Period)
	var (
		computeNs []float64
		sink      uint64 // each kernel's result seeds the next: none is dead code
	)
	for began {
		sleepUntil(deadline)
		now := time.Now()
		late := max(now.Sub(deadline), 0)
		lateSum += late
		r.Wakeups++
		if r.Wakeups%computeEvery == 0 {
			d, v := timeCompute(sink)
			computeNs, sink = append(computeNs, float64(d.Nanoseconds())), v
		}
		maxLate = max(maxLate, late)
		if late > time.Millisecond {
			r.LateOver1ms++
		}
		if late > 10*time.Millisecond {
			r.LateOver10ms++
		}
		// After a stall, the next deadline is a period from now: the
		// missed ones would only count the same stall again.
		deadline = now.Add(opts.Period)
		if stopped.Load() {
			break
		}
	}
	if began {
		r.WallS = time.Since(start).Seconds()
	}
	r.LateMs = float64(lateSum) / float64(time.Millisecond)
	close(memStop)
	r.Compute = summarizeCompute(computeNs)
	r.MaxDelayMs = float64(maxLate) / float64(time.Millisecond)
	r.StealPct = -1
	if statErr == nil {
		if steal1, total1, err := readSteal(opts.ProcRoot, opts.CPU); err == nil && total1 > total0 {
			r.StealPct = 100 * float64(steal1-steal0) / float64(total1-total0)
		}
	}
	if memDone != nil {
		m := <-memDone
		if m.err != nil {
			return nil, m.err
		}
		r.Memory = m.r
	}
	return r, nil
}

// sleepUntil sleeps the thread to deadline on the monotonic clock. It is a
// raw system call, outside the runtime's view: the thread keeps its P, so
// waking up is the kernel's scheduling alone, never a wait for the Go
// scheduler to hand a P back. A signal (the runtime's preemption) ends it
// early; the loop sleeps again.
func sleepUntil(deadline time.Time) {
	for {
		d := time.Until(deadline)
		if d <= 0 {
			return
		}
		ts := unix.NsecToTimespec(d.Nanoseconds())
		_, _, _ = unix.RawSyscall6(unix.SYS_CLOCK_NANOSLEEP, unix.CLOCK_MONOTONIC, 0,
			uintptr(unsafe.Pointer(&ts)), 0, 0, 0)
	}
}

// readSteal returns the CPU's steal time and all its accounted time, in
// clock ticks, from /proc/stat.
func readSteal(procRoot string, cpu int) (steal, total uint64, err error) {
	b, err := os.ReadFile(filepath.Join(procRoot, "stat"))
	if err != nil {
		return 0, 0, fmt.Errorf("stall: %w", err)
	}
	return parseSteal(b, cpu)
}

// parseSteal finds the "cpuN" line of /proc/stat: user nice system idle
// iowait irq softirq steal [guest guest_nice]. Guest time is already in
// user and nice, so it is not added again.
func parseSteal(stat []byte, cpu int) (steal, total uint64, err error) {
	prefix := []byte("cpu" + strconv.Itoa(cpu) + " ")
	for line := range bytes.Lines(stat) {
		if !bytes.HasPrefix(line, prefix) {
			continue
		}
		f := bytes.Fields(line[len(prefix):])
		if len(f) < 8 {
			return 0, 0, fmt.Errorf("stall: /proc/stat cpu%d has %d fields, want at least 8 (with steal)", cpu, len(f))
		}
		for i := range 8 {
			v, err := strconv.ParseUint(string(f[i]), 10, 64)
			if err != nil {
				return 0, 0, fmt.Errorf("stall: /proc/stat cpu%d field %d: %w", cpu, i+1, err)
			}
			total += v
			if i == 7 {
				steal = v
			}
		}
		return steal, total, nil
	}
	return 0, 0, errors.New("stall: /proc/stat has no line for cpu" + strconv.Itoa(cpu))
}
