package monitor

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// The test binary doubles as the child process: with helperEnv set,
// TestMain burns CPU and holds memory instead of running tests.
const (
	helperEnv = "RECMESH_MONITOR_HELPER"
	// helperMB is what the child allocates and touches.
	helperMB = 96
	// helperBurn is how much CPU time the child spins for. CPU time, not
	// wall time: the machine may be shared, and a test that spins for a
	// wall-clock time gets whatever CPU the scheduler leaves it.
	helperBurn = 600 * time.Millisecond
)

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) == "1" {
		helper()
		return
	}
	os.Exit(m.Run())
}

// helper allocates and touches helperMB, spins for helperBurn of CPU,
// says "done" on stdout, then waits (bounded) to be killed, holding the
// memory.
func helper() {
	mem := make([]byte, helperMB<<20)
	for i := 0; i < len(mem); i += 4096 {
		mem[i] = 1
	}
	spin(helperBurn)
	os.Stdout.WriteString("done\n")
	time.Sleep(20 * time.Second)
	runtime.KeepAlive(mem)
}

// cpuTime is this process's user+system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		panic(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// minorFaults is this process's minor page faults so far, as getrusage
// counts them.
func minorFaults() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		panic(err)
	}
	return ru.Minflt
}

// spin keeps one core busy until this process has used d more CPU time.
func spin(d time.Duration) uint64 {
	var x uint64
	for end := cpuTime() + d; cpuTime() < end; {
		for i := range 100000 {
			x += uint64(i) * x
		}
	}
	return x
}

// startHelper starts the child (the caller's cleanup kills it) and returns
// it with a channel that is closed once it has spun.
func startHelper(t *testing.T) (*exec.Cmd, <-chan struct{}) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"=1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start helper: %v", err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	spun := make(chan struct{})
	go func() {
		if bufio.NewScanner(out).Scan() {
			close(spun)
		}
	}()
	return cmd, spun
}

// cpuTick is one clock tick of /proc/<pid>/stat's CPU times (USER_HZ is
// 100 on Linux): the monitor's figures and the kernel's rusage of the same
// process may differ by that rounding.
const cpuTick = 0.01

// childCPU ends the helper and returns the CPU time the kernel charged
// it, user and system, over its whole life.
func childCPU(t *testing.T, cmd *exec.Cmd) float64 {
	t.Helper()
	cmd.Process.Kill()
	cmd.Wait() // killed: the error only says so
	if cmd.ProcessState == nil {
		t.Fatal("helper has no exit state")
	}
	return charged(cmd.ProcessState)
}

// charged is the CPU time, user and system, of an ended process.
func charged(ps *os.ProcessState) float64 {
	return ps.UserTime().Seconds() + ps.SystemTime().Seconds()
}

// waitSpun waits for the helper to have spun, failing after a bound.
func waitSpun(t *testing.T, spun <-chan struct{}) {
	t.Helper()
	select {
	case <-spun:
	case <-time.After(30 * time.Second):
		t.Fatal("helper did not finish spinning in 30 s")
	}
}

func TestSelf(t *testing.T) {
	m, err := Start(Options{PIDs: []int{os.Getpid()}, Interval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	before := cpuTime()
	fltBefore := minorFaults()
	const mb = 64
	mem := make([]byte, mb<<20)
	for i := 0; i < len(mem); i += 4096 {
		mem[i] = 1
	}
	spin(400 * time.Millisecond)
	time.Sleep(100 * time.Millisecond) // let a sample see the memory
	used := cpuTime() - before
	faulted := minorFaults() - fltBefore
	r, err := m.Stop()
	runtime.KeepAlive(mem)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("self: cpu %.3f s over %.3f s, rss %d MB, pss %d MB (%d samples, %d Hz from %s)",
		r.CPUSeconds, r.WallSeconds, r.PeakRSSBytes>>20, r.PeakPSSBytes>>20, len(r.Samples), r.ClockTicks, r.ClockTicksSource)
	// The monitor's window holds getrusage's, give or take a few ticks
	// and the sampler's own CPU.
	if got, want := r.CPUSeconds, used.Seconds(); got < want-0.03 || got > want+0.1 {
		t.Errorf("monitor says %.3f s of CPU, getrusage %.3f s", got, want)
	}
	// Touching fresh memory faults: the monitor's window holds getrusage's.
	if len(r.Processes) == 1 && (faulted <= 0 || r.Processes[0].MinorFaults < faulted) {
		t.Errorf("monitor says %d minor faults, getrusage %d over a window inside it", r.Processes[0].MinorFaults, faulted)
	}
	if r.PeakRSSBytes < mb<<20 {
		t.Errorf("peak rss %d B, want ≥ %d MB", r.PeakRSSBytes, mb)
	}
	if r.PSSAvailable && r.PeakPSSBytes < mb<<20 {
		t.Errorf("peak pss %d B, want ≥ %d MB", r.PeakPSSBytes, mb)
	}
	if len(r.Samples) < 5 {
		t.Errorf("%d samples in %.3f s at 50 ms", len(r.Samples), r.WallSeconds)
	}
	if len(r.Processes) != 1 || r.Processes[0].PID != os.Getpid() {
		t.Errorf("processes %+v, want only this one", r.Processes)
	}
	r.SetExamples(2000)
	if want := r.CPUSeconds / 2; r.CPUSecondsPer1kExamples != want {
		t.Errorf("cpu per 1k examples %v, want %v", r.CPUSecondsPer1kExamples, want)
	}
}

// TestDescendants watches this process with descendants; a child started
// after the first sample burns CPU and holds memory, and both must appear
// in the sums.
func TestDescendants(t *testing.T) {
	m, err := Start(Options{PIDs: []int{os.Getpid()}, Descendants: true, Interval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	cmd, spun := startHelper(t)
	waitSpun(t, spun)
	time.Sleep(150 * time.Millisecond) // a sample after the spin
	r, err := m.Stop()
	if err != nil {
		t.Fatal(err)
	}
	var child *ProcessReport
	for i, p := range r.Processes {
		if p.PID == cmd.Process.Pid {
			child = &r.Processes[i]
		}
	}
	if child == nil {
		t.Fatalf("child %d not in %+v", cmd.Process.Pid, r.Processes)
	}
	t.Logf("child: cpu %.3f s rss %d MB pss %d MB; total cpu %.3f s rss %d MB pss %d MB",
		child.CPUSeconds, child.PeakRSSBytes>>20, child.PeakPSSBytes>>20, r.CPUSeconds, r.PeakRSSBytes>>20, r.PeakPSSBytes>>20)
	// The child spun 0.6 s of CPU and also ran its start-up and
	// allocation; it started after the first sample, so all of it counts.
	// What the kernel charged the child in all bounds it from above: its
	// start-up alone took over half a second on a loaded machine, so a
	// fixed allowance over the spin failed there.
	used := childCPU(t, cmd)
	if child.CPUSeconds < helperBurn.Seconds()-0.02 || child.CPUSeconds > used+cpuTick {
		t.Errorf("child cpu %.3f s after spinning %v; the kernel charged it %.3f s in all", child.CPUSeconds, helperBurn, used)
	}
	if child.PeakRSSBytes < helperMB<<20 {
		t.Errorf("child peak rss %d MB, want ≥ %d", child.PeakRSSBytes>>20, helperMB)
	}
	if r.PSSAvailable && child.PeakPSSBytes < (helperMB-8)<<20 {
		t.Errorf("child peak pss %d MB, want about %d (private memory)", child.PeakPSSBytes>>20, helperMB)
	}
	if r.PeakRSSBytes < child.PeakRSSBytes || r.CPUSeconds < child.CPUSeconds {
		t.Errorf("sums (cpu %.3f, rss %d) below the child's share", r.CPUSeconds, r.PeakRSSBytes)
	}
}

// TestExitedProcess watches a child directly; it is killed mid-window and
// its CPU up to the last sample must still count.
func TestExitedProcess(t *testing.T) {
	cmd, spun := startHelper(t)
	m, err := Start(Options{PIDs: []int{cmd.Process.Pid}, Interval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	waitSpun(t, spun)
	time.Sleep(150 * time.Millisecond) // a sample after the spin
	cmd.Process.Kill()
	cmd.Wait()
	time.Sleep(150 * time.Millisecond)
	r, err := m.Stop()
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Processes) != 1 || !r.Processes[0].Exited {
		t.Fatalf("processes %+v, want the one child, exited", r.Processes)
	}
	// The first sample may already include part of the spin; what the
	// kernel charged the child in all bounds it from above.
	used := charged(cmd.ProcessState)
	if r.CPUSeconds < 0.1 || r.CPUSeconds > used+cpuTick {
		t.Errorf("cpu %.3f s for a child that spun %v; the kernel charged it %.3f s in all", r.CPUSeconds, helperBurn, used)
	}
	if last := r.Samples[len(r.Samples)-1]; last.Processes != 0 || last.RSSBytes != 0 {
		t.Errorf("last sample %+v, want no process alive", last)
	}
}

func TestMissingPID(t *testing.T) {
	// PID 2^22+1 is above the kernel's pid_max limit, so it never exists.
	if _, err := Start(Options{PIDs: []int{1<<22 + 1}}); err == nil {
		t.Fatal("Start on a missing process succeeded")
	}
	if _, err := Start(Options{}); err == nil {
		t.Fatal("Start with no PIDs succeeded")
	}
}

func TestParseStat(t *testing.T) {
	// A command name with spaces and parentheses, as a process may set.
	line := "4242 (a (b) c) S 17 4242 4242 0 -1 4194560 100 0 0 0 250 75 0 0 20 0 3 0 987654 1000 200 18446744073709551615"
	s, err := parseStat([]byte(line))
	if err != nil {
		t.Fatal(err)
	}
	if s.comm != "a (b) c" || s.ppid != 17 || s.minflt != 100 || s.utime != 250 || s.stime != 75 || s.start != 987654 {
		t.Errorf("parsed %+v", s)
	}
	if _, err := parseStat([]byte("4242 (x) S 1 2")); err == nil {
		t.Error("short stat parsed")
	}
}

func TestClockTicks(t *testing.T) {
	hz, src := ClockTicks()
	if src != "auxv" || hz <= 0 {
		t.Errorf("clock ticks %d from %s, want a value from auxv on Linux", hz, src)
	}
	// A synthetic vector: AT_PAGESZ(6)=4096, AT_CLKTCK=250, AT_NULL.
	var b []byte
	for _, w := range []uint64{6, 4096, atClkTck, 250, 0, 0} {
		b = binary.NativeEndian.AppendUint64(b, w)
	}
	if v, ok := auxvLookup(b, atClkTck); !ok || v != 250 {
		t.Errorf("auxvLookup = %d, %v; want 250", v, ok)
	}
	if _, ok := auxvLookup(b, 99); ok {
		t.Error("found a key that is not there")
	}
}

// TestHugetlbCountedOnce builds a /proc with two processes that both map
// one 1 GiB hugetlbfs file shared, one of them also 2 MiB of private
// hugetlb memory: the sum must hold the shared file once, the private
// memory, and each process's Pss, which leaves all hugetlb pages out.
func TestHugetlbCountedOnce(t *testing.T) {
	root := t.TempDir()
	const gib, mib2 = 1 << 30, 2 << 20
	write := func(pid int, name, body string) {
		dir := filepath.Join(root, strconv.Itoa(pid))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	proc := func(pid int, pssKB, privHugeKB int) {
		write(pid, "stat", fmt.Sprintf("%d (srv) S 1 %d %d 0 -1 0 0 0 0 0 10 5 0 0 20 0 1 0 %d 0 0", pid, pid, pid, 1000+pid))
		write(pid, "status", "Name:\tsrv\nVmRSS:\t  4096 kB\n")
		write(pid, "smaps_rollup", fmt.Sprintf("00400000-7fff00000000 ---p 00000000 00:00 0  [rollup]\n"+
			"Rss:  4096 kB\nPss:  %d kB\nShared_Hugetlb: %d kB\nPrivate_Hugetlb: %d kB\nSwap: 0 kB\n",
			pssKB, gib/1024, privHugeKB))
		write(pid, "smaps", fmt.Sprintf("7f0000000000-7f0040000000 rw-s 00000000 00:2f 4242   /dev/hugepages/tables\n"+
			"Size:  1048576 kB\nShared_Hugetlb: %d kB\nPrivate_Hugetlb: 0 kB\nVmFlags: rd wr sh mr mw me ms de ht\n"+
			"7f1000000000-7f1000200000 rw-p 00000000 00:00 0\nSize: 2048 kB\nShared_Hugetlb: 0 kB\nPrivate_Hugetlb: %d kB\n",
			gib/1024, privHugeKB))
	}
	proc(100, 1000, 0)
	proc(101, 3000, mib2/1024)
	m, err := Start(Options{PIDs: []int{100, 101}, ProcRoot: root, Interval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	r, err := m.Stop()
	if err != nil {
		t.Fatal(err)
	}
	want := int64(1000+3000)*1024 + mib2 + gib
	if r.PeakPSSBytes != want {
		t.Errorf("peak PSS %d, want %d (Pss of both + private hugetlb + the shared file once)", r.PeakPSSBytes, want)
	}
	if got := r.Processes[1].PeakPSSBytes; got != 3000*1024+mib2+gib {
		t.Errorf("process 101's own PSS %d, want its Pss, private and shared hugetlb", got)
	}
}

// TestPSSReadWhenDue: between the first and the last sample, PSS is read
// again only once PSSInterval passed or RSS grew; samples in between keep
// the last value read.
func TestPSSReadWhenDue(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "200")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	write := func(name, body string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	setRSS := func(mib int) { write("status", fmt.Sprintf("Name:\tsrv\nVmRSS:\t%d kB\n", mib<<10)) }
	setPSS := func(mib int) { write("smaps_rollup", fmt.Sprintf("Rss: 0 kB\nPss: %d kB\n", mib<<10)) }
	write("stat", "200 (srv) S 1 200 200 0 -1 0 0 0 0 0 10 5 0 0 20 0 1 0 1200 0 0")
	setRSS(100)
	setPSS(50)
	m, err := Start(Options{PIDs: []int{200}, ProcRoot: root, Interval: time.Hour, PSSInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	lastPSS := func() int64 {
		m.mu.Lock()
		defer m.mu.Unlock()
		return m.samples[len(m.samples)-1].PSSBytes >> 20
	}
	if got := lastPSS(); got != 50 {
		t.Fatalf("first sample PSS %d MiB, want 50", got)
	}
	setPSS(80)
	if err := m.sample(false); err != nil {
		t.Fatal(err)
	}
	if got := lastPSS(); got != 50 {
		t.Errorf("PSS %d MiB with RSS unchanged and the interval not over, want the last read, 50", got)
	}
	setRSS(101) // under the growth that triggers a read
	if err := m.sample(false); err != nil {
		t.Fatal(err)
	}
	if got := lastPSS(); got != 50 {
		t.Errorf("PSS %d MiB after RSS grew 1 MiB, want 50 still", got)
	}
	setRSS(200)
	if err := m.sample(false); err != nil {
		t.Fatal(err)
	}
	if got := lastPSS(); got != 80 {
		t.Errorf("PSS %d MiB after RSS doubled, want it read again, 80", got)
	}
	setPSS(90)
	r, err := m.Stop()
	if err != nil {
		t.Fatal(err)
	}
	if got := r.PeakPSSBytes >> 20; got != 90 {
		t.Errorf("peak PSS %d MiB, want 90 from the last sample, which always reads it", got)
	}
}
