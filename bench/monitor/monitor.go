// Package monitor samples the CPU time and memory of a set of processes
// while a benchmark's measured window runs: the server under test (its root
// PIDs and, optionally, every descendant), read from /proc every ~200 ms.
//
// What it reports and how it is read:
//
//   - CPU seconds: utime+stime from /proc/<pid>/stat (all threads of the
//     process), in clock ticks converted with the kernel's tick rate, which
//     is sysconf(_SC_CLK_TCK). Go has no sysconf without cgo, so the rate
//     is read where the C library reads it, the AT_CLKTCK entry of
//     /proc/self/auxv; when that cannot be read, 100 is assumed (the value
//     on every mainstream Linux architecture), and the report says which.
//     A process's CPU over the window is its last sample minus its first.
//     A process first seen after the first sample (a child started inside
//     the window) counts from zero; one that exits keeps the CPU of its
//     last sample, so up to one interval of its CPU is lost. Children's
//     cutime/cstime are never added: a tracked child is counted by itself.
//   - RSS: VmRSS from /proc/<pid>/status. PSS: from
//     /proc/<pid>/smaps_rollup (Linux ≥ 4.14; needs the same user or
//     CAP_SYS_PTRACE); when it cannot be read, PSS is reported unavailable.
//     The kernel's Pss already splits every shared page (a /dev/shm
//     segment, shared libraries) among its mappers and includes
//     transparent huge pages, so summing it counts a shared segment once.
//     It leaves out hugetlbfs pages, which a server holding its tables in
//     explicit huge pages would hide that way: Private_Hugetlb is added per
//     process, and Shared_Hugetlb once per mapped file over all watched
//     processes (read from /proc/<pid>/smaps, keyed by device and inode,
//     the largest any process maps), so the memory check sees every byte.
//     Peaks are of the sum over the processes alive at one sample, the
//     maximum over samples: the memory the whole server held at once.
//     smaps_rollup walks every page table of a process: milliseconds for
//     a process mapping 3 GB of tables, tens of them on a busy machine,
//     for each process at each sample, on the CPUs of the load generator
//     it shares a process with. So PSS is read at the first and the last
//     sample, every PSSInterval, and whenever the sampled RSS has grown
//     past what it was at the last read (or a process appeared); between
//     reads a process keeps its last PSS. RSS (VmRSS, a counter) is read
//     at every sample.
//
// Processes are keyed by PID and start time, so a PID reused during the
// window is a new process.
package monitor

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"time"
)

// DefaultInterval is the sampling period.
const DefaultInterval = 200 * time.Millisecond

// DefaultPSSInterval is the longest time between two PSS reads.
const DefaultPSSInterval = time.Second

// pssRSSGrowth is how much the watched processes' RSS must grow past its
// value at the last PSS read (a fraction of it, at least pssRSSGrowthMin)
// to read PSS again before PSSInterval.
const (
	pssRSSGrowth    = 0.01
	pssRSSGrowthMin = 16 << 20
)

// Options selects what to watch.
type Options struct {
	// PIDs are the root processes.
	PIDs []int
	// Descendants adds every descendant of the roots, found anew at each
	// sample (so workers forked or spawned later are included).
	Descendants bool
	// Interval is the sampling period (default DefaultInterval).
	Interval time.Duration
	// PSSInterval is the longest time between two PSS reads (default
	// DefaultPSSInterval); see the package comment.
	PSSInterval time.Duration
	// ProcRoot is the proc filesystem's mount point (default /proc); tests
	// point it elsewhere.
	ProcRoot string
}

// Report is what a monitor saw between Start and Stop.
type Report struct {
	// WallSeconds is the time from the first to the last sample.
	WallSeconds float64 `json:"wall_s"`
	// CPUSeconds is user+system CPU over the window, summed over processes,
	// and CPUCores it over WallSeconds (cores busy on average).
	CPUSeconds    float64 `json:"cpu_s"`
	UserSeconds   float64 `json:"user_s"`
	SystemSeconds float64 `json:"system_s"`
	CPUCores      float64 `json:"cpu_cores"`
	// Examples and CPUSecondsPer1kExamples are set by SetExamples.
	Examples                int64   `json:"examples,omitempty"`
	CPUSecondsPer1kExamples float64 `json:"cpu_s_per_1k_examples,omitempty"`
	// PeakRSSBytes and PeakPSSBytes are the peaks of the per-sample sums.
	PeakRSSBytes int64 `json:"peak_rss_bytes"`
	PeakPSSBytes int64 `json:"peak_pss_bytes"`
	// PSSAvailable is false when no process's smaps_rollup could be read.
	PSSAvailable bool `json:"pss_available"`
	// ClockTicks is the tick rate used, and ClockTicksSource "auxv" or
	// "default" (the 100 Hz assumption).
	ClockTicks       int64  `json:"clock_ticks"`
	ClockTicksSource string `json:"clock_ticks_source"`
	// IntervalMs is the sampling period asked for, and PSSIntervalMs the
	// longest time between two PSS reads.
	IntervalMs    float64 `json:"interval_ms"`
	PSSIntervalMs float64 `json:"pss_interval_ms"`
	// Processes has one entry per process seen, in order of first sight.
	Processes []ProcessReport `json:"processes"`
	// Samples is the time series of the sums.
	Samples []Sample `json:"samples"`
}

// ProcessReport is one process's share.
type ProcessReport struct {
	PID        int     `json:"pid"`
	Comm       string  `json:"comm"`
	CPUSeconds float64 `json:"cpu_s"`
	// MinorFaults is the process's minor page faults over the window,
	// counted as CPUSeconds is.
	MinorFaults  int64 `json:"minor_faults"`
	PeakRSSBytes int64 `json:"peak_rss_bytes"`
	PeakPSSBytes int64 `json:"peak_pss_bytes"`
	// Exited is true when the process was gone before the last sample.
	Exited bool `json:"exited,omitempty"`
}

// Sample is one sampling instant, summed over the processes alive then.
type Sample struct {
	// TS is seconds since the first sample.
	TS float64 `json:"t_s"`
	// CPUSeconds is cumulative since the first sample.
	CPUSeconds float64 `json:"cpu_s"`
	RSSBytes   int64   `json:"rss_bytes"`
	PSSBytes   int64   `json:"pss_bytes"`
	Processes  int     `json:"processes"`
}

// SetExamples records how many examples the window served and derives the
// CPU cost per 1,000 of them.
func (r *Report) SetExamples(n int64) {
	r.Examples = n
	if n > 0 {
		r.CPUSecondsPer1kExamples = r.CPUSeconds / float64(n) * 1000
	}
}

// procKey identifies a process across PID reuse.
type procKey struct {
	pid   int
	start uint64 // starttime, clock ticks since boot
}

// track is one process's history.
type track struct {
	comm                string
	firstUser, firstSys uint64 // ticks at first sight (0 if first seen after the first sample)
	lastUser, lastSys   uint64
	firstFlt, lastFlt   uint64 // minor page faults, counted as the ticks are
	peakRSS, peakPSS    int64
	seenLast            bool
	order               int
	// mem is the process's memory at the last PSS read; memOK is false
	// until one succeeded, memTried until one was attempted.
	mem             memory
	memOK, memTried bool
}

// Monitor samples processes until Stop.
type Monitor struct {
	opts   Options
	ticks  int64
	source string

	stop chan struct{}
	done chan struct{}

	mu       sync.Mutex // guards everything below, shared with the sampler
	t0       time.Time
	last     time.Time
	tracks   map[procKey]*track
	samples  []Sample
	peakRSS  int64
	peakPSS  int64
	pssOK    bool
	nSamples int
	// lastPSS is when PSS was last read, and pssRSS the summed RSS then.
	lastPSS time.Time
	pssRSS  int64
	err     error
}

// Start takes the first sample at once (the baseline) and then one every
// interval until Stop.
func Start(opts Options) (*Monitor, error) {
	if len(opts.PIDs) == 0 {
		return nil, errors.New("monitor: no PIDs to watch")
	}
	if opts.Interval <= 0 {
		opts.Interval = DefaultInterval
	}
	if opts.PSSInterval <= 0 {
		opts.PSSInterval = DefaultPSSInterval
	}
	if opts.ProcRoot == "" {
		opts.ProcRoot = "/proc"
	}
	ticks, source := ClockTicks()
	m := &Monitor{
		opts:   opts,
		ticks:  ticks,
		source: source,
		stop:   make(chan struct{}),
		done:   make(chan struct{}),
		tracks: map[procKey]*track{},
	}
	if err := m.sample(true); err != nil {
		return nil, err
	}
	go m.loop()
	return m, nil
}

func (m *Monitor) loop() {
	defer close(m.done)
	tick := time.NewTicker(m.opts.Interval)
	defer tick.Stop()
	for {
		select {
		case <-m.stop:
			return
		case <-tick.C:
			if err := m.sample(false); err != nil {
				m.mu.Lock()
				m.err = err
				m.mu.Unlock()
				return
			}
		}
	}
}

// Stop takes a last sample and returns the report. It may be called once.
func (m *Monitor) Stop() (*Report, error) {
	close(m.stop)
	<-m.done
	m.mu.Lock()
	err := m.err
	m.mu.Unlock()
	if err != nil {
		return nil, err
	}
	if err := m.sample(true); err != nil {
		return nil, err
	}
	return m.report(), nil
}

// sample reads every watched process once; PSS only when forced or due
// (see the package comment).
func (m *Monitor) sample(forcePSS bool) error {
	now := time.Now()
	pids, err := m.pids()
	if err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	first := m.nSamples == 0
	if first {
		m.t0 = now
	}
	for _, tr := range m.tracks {
		tr.seenLast = false
	}
	var rss, pss int64
	alive := 0
	var seen []*track
	var seenPIDs []int
	for _, pid := range pids {
		st, err := readStat(m.opts.ProcRoot, pid)
		if err != nil {
			continue // exited between listing and reading
		}
		key := procKey{pid: pid, start: st.start}
		tr, ok := m.tracks[key]
		if !ok {
			tr = &track{comm: st.comm, order: len(m.tracks)}
			if first {
				tr.firstUser, tr.firstSys = st.utime, st.stime
				tr.firstFlt = st.minflt
			}
			m.tracks[key] = tr
		}
		tr.lastUser, tr.lastSys = st.utime, st.stime
		tr.lastFlt = st.minflt
		tr.seenLast = true
		alive++
		if r, err := readRSS(m.opts.ProcRoot, pid); err == nil {
			rss += r
			tr.peakRSS = max(tr.peakRSS, r)
		}
		if !tr.memTried {
			forcePSS = true // a process never read yet
		}
		seen, seenPIDs = append(seen, tr), append(seenPIDs, pid)
	}
	growth := max(int64(float64(m.pssRSS)*pssRSSGrowth), pssRSSGrowthMin)
	readNow := forcePSS || now.Sub(m.lastPSS) >= m.opts.PSSInterval || rss > m.pssRSS+growth
	if readNow {
		m.lastPSS, m.pssRSS = now, rss
	}
	// Shared hugetlb mappings, counted once per file over all processes.
	sharedHuge := map[hugeFile]int64{}
	for i, tr := range seen {
		pid := seenPIDs[i]
		if readNow {
			tr.memTried = true
			if mem, err := readPSS(m.opts.ProcRoot, pid); err == nil {
				tr.mem, tr.memOK = mem, true
			}
		}
		if !tr.memOK {
			continue
		}
		mem := tr.mem
		own := mem.pss + mem.privateHugetlb
		for f, n := range mem.sharedHugetlb {
			sharedHuge[f] = max(sharedHuge[f], n)
			own += n // a process's own view holds the whole mapping
		}
		pss += mem.pss + mem.privateHugetlb
		tr.peakPSS = max(tr.peakPSS, own)
		m.pssOK = true
	}
	for _, n := range sharedHuge {
		pss += n
	}
	if first && alive == 0 {
		return fmt.Errorf("monitor: none of the processes %v exists", m.opts.PIDs)
	}
	m.nSamples++
	m.last = now
	m.peakRSS = max(m.peakRSS, rss)
	m.peakPSS = max(m.peakPSS, pss)
	m.samples = append(m.samples, Sample{
		TS:         now.Sub(m.t0).Seconds(),
		CPUSeconds: m.cpuSeconds(),
		RSSBytes:   rss,
		PSSBytes:   pss,
		Processes:  alive,
	})
	return nil
}

// cpuSeconds sums every process's CPU since its baseline; m.mu is held.
func (m *Monitor) cpuSeconds() float64 {
	var t uint64
	for _, tr := range m.tracks {
		t += (tr.lastUser - tr.firstUser) + (tr.lastSys - tr.firstSys)
	}
	return float64(t) / float64(m.ticks)
}

func (m *Monitor) report() *Report {
	m.mu.Lock()
	defer m.mu.Unlock()
	hz := float64(m.ticks)
	r := &Report{
		WallSeconds:      m.last.Sub(m.t0).Seconds(),
		PeakRSSBytes:     m.peakRSS,
		PeakPSSBytes:     m.peakPSS,
		PSSAvailable:     m.pssOK,
		ClockTicks:       m.ticks,
		ClockTicksSource: m.source,
		IntervalMs:       float64(m.opts.Interval) / float64(time.Millisecond),
		PSSIntervalMs:    float64(m.opts.PSSInterval) / float64(time.Millisecond),
		Samples:          m.samples,
	}
	type entry struct {
		key procKey
		tr  *track
	}
	var entries []entry
	for k, tr := range m.tracks {
		entries = append(entries, entry{k, tr})
	}
	slices.SortFunc(entries, func(a, b entry) int { return a.tr.order - b.tr.order })
	for _, e := range entries {
		u := float64(e.tr.lastUser-e.tr.firstUser) / hz
		s := float64(e.tr.lastSys-e.tr.firstSys) / hz
		r.UserSeconds += u
		r.SystemSeconds += s
		r.Processes = append(r.Processes, ProcessReport{
			PID:          e.key.pid,
			Comm:         e.tr.comm,
			CPUSeconds:   u + s,
			MinorFaults:  int64(e.tr.lastFlt - e.tr.firstFlt),
			PeakRSSBytes: e.tr.peakRSS,
			PeakPSSBytes: e.tr.peakPSS,
			Exited:       !e.tr.seenLast,
		})
	}
	r.CPUSeconds = r.UserSeconds + r.SystemSeconds
	if r.WallSeconds > 0 {
		r.CPUCores = r.CPUSeconds / r.WallSeconds
	}
	return r
}

// pids lists the roots and, with Descendants, every process below them.
func (m *Monitor) pids() ([]int, error) {
	if !m.opts.Descendants {
		return m.opts.PIDs, nil
	}
	ents, err := os.ReadDir(m.opts.ProcRoot)
	if err != nil {
		return nil, fmt.Errorf("monitor: list processes: %w", err)
	}
	children := map[int][]int{}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		st, err := readStat(m.opts.ProcRoot, pid)
		if err != nil {
			continue
		}
		children[st.ppid] = append(children[st.ppid], pid)
	}
	seen := map[int]bool{}
	var out []int
	queue := slices.Clone(m.opts.PIDs)
	for len(queue) > 0 {
		pid := queue[0]
		queue = queue[1:]
		if seen[pid] {
			continue
		}
		seen[pid] = true
		out = append(out, pid)
		queue = append(queue, children[pid]...)
	}
	return out, nil
}
