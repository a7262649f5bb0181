package stall

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"time"

	"github.com/recmesh/recmesh/bench/cpuset"
)

// ProbeCommand is the subcommand every benchmark binary that starts probes
// serves (with Command): `<binary> stall-probe -cpu N`.
const ProbeCommand = "stall-probe"

// ReadyTimeout bounds a probe's set-up: pinning, priority and the memory
// probe's buffer (a few hundred MiB to fault in and link) on a loaded
// machine.
const ReadyTimeout = time.Minute

// readyLine is what a probe process prints once it can watch at once;
// beginLine, with the window's first instant in Unix nanoseconds, is what
// its parent writes to begin the window (the probe may read it late: that
// lateness is a stall it must count).
const (
	readyLine = "ready\n"
	beginLine = "begin %d\n"
)

// Process is a probe running in a process of its own: its real-time thread
// and the raw sleeps it needs share no Go scheduler with the load
// generator's goroutines, and an exit of the parent ends it (its stdin
// closes).
type Process struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stdout *bufio.Reader
}

// StartProcess starts `<this executable> stall-probe -cpu cpu
// -memory-mib memoryMiB` and waits until it is set up (at most
// ReadyTimeout); the executable must dispatch ProbeCommand to Command.
// The probe watches from Begin to Stop.
func StartProcess(cpu, memoryMiB int) (*Process, error) {
	p, err := startProcess(cpu, memoryMiB)
	if err != nil {
		return nil, err
	}
	if err := p.waitReady(ReadyTimeout); err != nil {
		return nil, err
	}
	return p, nil
}

// startProcess starts the probe without waiting for it.
func startProcess(cpu, memoryMiB int) (*Process, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("stall: find this executable: %w", err)
	}
	p := &Process{cmd: exec.Command(exe, ProbeCommand, "-cpu", strconv.Itoa(cpu), "-memory-mib", strconv.Itoa(memoryMiB))}
	if p.stdin, err = p.cmd.StdinPipe(); err != nil {
		return nil, fmt.Errorf("stall: %w", err)
	}
	stdout, err := p.cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("stall: %w", err)
	}
	p.stdout = bufio.NewReader(stdout)
	p.cmd.Stderr = os.Stderr
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("stall: start the probe of CPU %d: %w", cpu, err)
	}
	return p, nil
}

// waitReady waits for the probe's ready line; on a failure or a timeout
// the probe is ended and the error names it.
func (p *Process) waitReady(timeout time.Duration) error {
	got := make(chan error, 1)
	go func() {
		line, err := p.stdout.ReadString('\n')
		if err == nil && line != readyLine {
			err = fmt.Errorf("printed %q before it was ready", line)
		}
		got <- err
	}()
	var err error
	select {
	case err = <-got:
	case <-time.After(timeout):
		_ = p.cmd.Process.Kill()
		err = fmt.Errorf("not set up within %v", timeout)
		<-got
	}
	if err == nil {
		return nil
	}
	p.stdin.Close()
	if werr := p.cmd.Wait(); werr != nil {
		err = werr
	}
	return fmt.Errorf("stall: probe %v: %w", p.cmd.Args[1:], err)
}

// Begin starts the probe's window.
func (p *Process) Begin() error {
	if _, err := fmt.Fprintf(p.stdin, beginLine, time.Now().UnixNano()); err != nil {
		return fmt.Errorf("stall: begin probe %v: %w", p.cmd.Args[1:], err)
	}
	return nil
}

// Stop ends the probe (by closing its stdin) and returns its report: what
// it saw from Begin, empty when it never began.
func (p *Process) Stop() (*Report, error) {
	p.stdin.Close()
	out, readErr := io.ReadAll(p.stdout)
	if err := p.cmd.Wait(); err != nil {
		return nil, fmt.Errorf("stall: probe %v: %w", p.cmd.Args[1:], err)
	}
	if readErr != nil {
		return nil, fmt.Errorf("stall: probe %v: read its report: %w", p.cmd.Args[1:], readErr)
	}
	var r Report
	if err := json.Unmarshal(out, &r); err != nil {
		return nil, fmt.Errorf("stall: probe %v: read its report %q: %w", p.cmd.Args[1:], out, err)
	}
	return &r, nil
}

// Command is the probe process's side, ProbeCommand with its arguments
// (-cpu N, -period D); prog names the binary in the usage text.
func Command(prog string, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet(prog+" "+ProbeCommand, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: %s %s -cpu N: watch CPU N for stalls until stdin closes, then print the report as JSON\n", prog, ProbeCommand)
		fs.PrintDefaults()
	}
	cpu := fs.Int("cpu", -1, "the `CPU` to watch")
	period := fs.Duration("period", DefaultPeriod, "sleep between the probe's wake-ups")
	memoryMiB := fs.Int("memory-mib", 0, "also time dependent loads through a buffer of this many `MiB` on the CPU (0: not)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%s: unexpected arguments %q", ProbeCommand, fs.Args())
	}
	return serve(Options{CPU: *cpu, Period: *period, MemoryMiB: *memoryMiB}, stdin, stdout)
}

// serve sets a probe up on the CPU of opts, prints readyLine to out, and
// watches from the first line read from in until in closes; then it
// writes the report to out as JSON.
func serve(opts Options, in io.Reader, out io.Writer) error {
	// No check against runtime.NumCPU: it counts the CPUs this process may
	// use, and the probe starts with its parent's (perhaps others); a CPU
	// the machine does not have fails the probe's pinning.
	if opts.CPU < 0 {
		return fmt.Errorf("stall: CPU %d: want the CPU to watch", opts.CPU)
	}
	if opts.MemoryMiB < 0 {
		return fmt.Errorf("stall: memory probe of %d MiB: want 0 (none) or more", opts.MemoryMiB)
	}
	// The probe's thread holds a P through its raw sleeps: give the
	// goroutine that watches in, and the memory probe, their own.
	runtime.GOMAXPROCS(max(runtime.GOMAXPROCS(0), 3))
	begin, stop := make(chan time.Time, 1), make(chan struct{})
	go func() {
		r := bufio.NewReader(in)
		if line, err := r.ReadString('\n'); err == nil {
			var ns int64
			if _, err := fmt.Sscanf(line, beginLine, &ns); err == nil {
				begin <- time.Unix(0, ns)
			} else {
				begin <- time.Now() // a parent that sends no instant
			}
			_, _ = io.Copy(io.Discard, r)
		}
		close(stop)
	}()
	var readyErr error
	r, err := Run(opts, func() { _, readyErr = io.WriteString(out, readyLine) }, begin, stop)
	if err != nil {
		return err
	}
	if readyErr != nil {
		return fmt.Errorf("stall: say ready: %w", readyErr)
	}
	return json.NewEncoder(out).Encode(r)
}

// Summary is the worst of reports in one line, for a benchmark's
// per-point output: ", host stall max <ms> ms (CPU <n>), steal max <pct> %";
// empty for none.
func Summary(reports []*Report) string {
	worst := Worst(reports)
	steal := 0.0
	for _, r := range reports {
		if r != nil {
			steal = max(steal, r.StealPct)
		}
	}
	if worst == nil {
		return ""
	}
	return fmt.Sprintf(", host stall max %.1f ms (CPU %d), steal max %.1f %%", worst.MaxDelayMs, worst.CPU, steal)
}

// Worst is the report with the longest stall among reports (nil entries
// skipped), or nil when there is none.
func Worst(reports []*Report) *Report {
	var worst *Report
	for _, r := range reports {
		if r != nil && (worst == nil || r.MaxDelayMs > worst.MaxDelayMs) {
			worst = r
		}
	}
	return worst
}

// ParseCPUs reads a -stall-cpus list: CPUs this machine has (counted by
// runtime.NumCPU, at the process's start); empty, none.
func ParseCPUs(list string) ([]int, error) {
	if list == "" {
		return nil, nil
	}
	set, err := cpuset.Parse(list)
	if err != nil {
		return nil, fmt.Errorf("-stall-cpus: %w", err)
	}
	cpus := cpuset.CPUs(set)
	if len(cpus) == 0 {
		return nil, nil
	}
	if last := cpus[len(cpus)-1]; last >= runtime.NumCPU() {
		return nil, fmt.Errorf("-stall-cpus %s: this machine has CPUs 0 to %d", list, runtime.NumCPU()-1)
	}
	return cpus, nil
}

// Probes is a probe process per CPU of a set, started and stopped
// together over a benchmark's measured window.
type Probes struct {
	procs []*Process
}

// StartProbes starts a probe process on each of cpus and waits until all
// are set up (Begin starts their windows); on an error the ones already
// started are stopped. No cpus, no probes (and nothing to stop).
// When memoryMiB is positive, the probe of the last CPU also runs the
// memory-latency probe: a benchmark lists the server's CPU first and the
// load generator's last, so the probe's loads never run on the server's.
func StartProbes(cpus []int, memoryMiB int) (*Probes, error) {
	ps := &Probes{}
	// All start at once, so that their set-ups overlap.
	for i, cpu := range cpus {
		mib := 0
		if i == len(cpus)-1 {
			mib = memoryMiB
		}
		p, err := startProcess(cpu, mib)
		if err != nil {
			_, _ = ps.Stop()
			return nil, err
		}
		ps.procs = append(ps.procs, p)
	}
	for i, p := range ps.procs {
		if err := p.waitReady(ReadyTimeout); err != nil {
			ps.procs = slices.Delete(ps.procs, i, i+1)
			_, _ = ps.Stop()
			return nil, err
		}
	}
	return ps, nil
}

// Begin starts every probe's window.
func (ps *Probes) Begin() error {
	if ps == nil {
		return nil
	}
	for _, p := range ps.procs {
		if err := p.Begin(); err != nil {
			return err
		}
	}
	return nil
}

// Stop ends every probe and returns their reports in the order of the
// CPUs, with the first error. It may be called more than once (and on
// nil): after the first call it returns nothing, so a deferred Stop
// cleans up after a run that never reached its own.
func (ps *Probes) Stop() ([]*Report, error) {
	if ps == nil {
		return nil, nil
	}
	var (
		reports []*Report
		first   error
	)
	for _, p := range ps.procs {
		r, err := p.Stop()
		reports = append(reports, r)
		if first == nil {
			first = err
		}
	}
	ps.procs = nil
	return reports, first
}
