package stall

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/recmesh/recmesh/bench/cpuset"
)

const statFixture = `cpu  2046268 2965 318801 2587157 14321 0 46367 28968 0 0
cpu0 1349832 2965 191113 937321 8527 0 17327 10667 0 0
cpu1 696436 0 127688 1649836 5794 0 29040 18301 0 0
intr 1 2 3
`

func TestParseSteal(t *testing.T) {
	steal, total, err := parseSteal([]byte(statFixture), 1)
	if err != nil {
		t.Fatal(err)
	}
	if want := uint64(696436 + 127688 + 1649836 + 5794 + 29040 + 18301); steal != 18301 || total != want {
		t.Fatalf("cpu1: steal %d total %d, want 18301 and %d", steal, total, want)
	}
	if _, _, err := parseSteal([]byte(statFixture), 2); err == nil || !strings.Contains(err.Error(), "no line for cpu2") {
		t.Fatalf("cpu2: %v, want no line", err)
	}
	// "cpu1" must not match "cpu10".
	if steal, _, err := parseSteal([]byte("cpu10 1 2 3 4 5 6 7 99\ncpu1 1 2 3 4 5 6 7 8\n"), 1); err != nil || steal != 8 {
		t.Fatalf("cpu1 beside cpu10: steal %d, %v; want 8", steal, err)
	}
	if _, _, err := parseSteal([]byte("cpu0 1 2 3 4\n"), 0); err == nil {
		t.Fatal("a line without steal parsed")
	}
}

// allowedCPUs are the CPUs this process may run on, in order: the probe
// can pin only to one of them (a container's cpuset need not hold CPU 0).
func allowedCPUs(t *testing.T) []int {
	t.Helper()
	set, err := cpuset.Current()
	if err != nil {
		t.Fatal(err)
	}
	return cpuset.CPUs(set)
}

// probe runs Run on its own goroutine, begins it once it is ready, runs
// during, and stops it d later; it returns the report.
func probe(t *testing.T, opts Options, d time.Duration, during func()) *Report {
	t.Helper()
	ready, begin, stop := make(chan struct{}), make(chan time.Time, 1), make(chan struct{})
	type result struct {
		r   *Report
		err error
	}
	done := make(chan result, 1)
	go func() {
		r, err := Run(opts, func() { close(ready) }, begin, stop)
		done <- result{r, err}
	}()
	select {
	case <-ready:
	case res := <-done:
		t.Fatalf("the probe ended before it was ready: %v", res.err)
	}
	begin <- time.Now()
	if during != nil {
		during()
	}
	time.Sleep(d)
	close(stop)
	res := <-done
	if res.err != nil {
		t.Fatal(res.err)
	}
	return res.r
}

// checkCovers fails unless the report's wake-ups and their delays account
// for its whole window, as they must whatever the load: each wake-up is a
// period plus its delay after the one before.
func checkCovers(t *testing.T, r *Report) {
	t.Helper()
	window, covered := r.WallS*1000, float64(r.Wakeups)*r.PeriodMs+r.LateMs
	if gap := window - covered; gap < -0.5 || gap > 0.1*window+5 {
		t.Fatalf("%d wake-ups of %g ms plus %.1f ms of delays cover %.1f ms of a %.1f ms window", r.Wakeups, r.PeriodMs, r.LateMs, covered, window)
	}
}

// TestRunCountsWakeups: every period a wake-up, the window's length
// measured, steal read from the real /proc/stat.
func TestRunCountsWakeups(t *testing.T) {
	r := probe(t, Options{CPU: allowedCPUs(t)[0], Period: 2 * time.Millisecond}, 300*time.Millisecond, nil)
	t.Logf("%s", r)
	if r.WallS < 0.29 || r.WallS > 5 {
		t.Fatalf("window %.3f s, want about 0.3", r.WallS)
	}
	// At most one wake-up per period; a loaded machine may give fewer,
	// and then their delays make up the difference.
	if max := int64(r.WallS/0.002) + 1; r.Wakeups < 1 || r.Wakeups > max {
		t.Fatalf("%d wake-ups in %.3f s at 2 ms, want 1..%d", r.Wakeups, r.WallS, max)
	}
	checkCovers(t, r)
	if r.StealPct < 0 || r.StealPct > 100 {
		t.Fatalf("steal %.2f %%, want a share of the CPU's time", r.StealPct)
	}
	if r.LateOver10ms > r.LateOver1ms || r.LateOver1ms > r.Wakeups {
		t.Fatalf("inconsistent counts: %+v", r)
	}
}

// TestRunSeesAStall: a process of higher real-time priority that spins on
// the probed CPU takes it from the probe as a hypervisor would, and the
// probe reports a wake-up about as late as the spin was long. The spinner
// is a process of its own whose spin the Go scheduler cannot interrupt
// (see runHog), so the stall is one piece of known length. Needs the right
// to real-time priority (root or CAP_SYS_NICE).
func TestRunSeesAStall(t *testing.T) {
	var spun float64 // ms
	cpu := allowedCPUs(t)[0]
	hog := func() {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), hogEnv+"="+strconv.Itoa(cpu), "GOMAXPROCS=1", "GODEBUG=asyncpreemptoff=1")
		out, err := cmd.CombinedOutput()
		if err != nil {
			if strings.Contains(string(out), "no real-time priority") {
				t.Skipf("%s", out)
			}
			t.Fatalf("hog: %v\n%s", err, out)
		}
		if _, err := fmt.Sscanf(string(out), "spun %f ms", &spun); err != nil {
			t.Fatalf("hog printed %q: %v", out, err)
		}
	}
	r := probe(t, Options{CPU: cpu}, 20*time.Millisecond, hog)
	t.Logf("hog spun %.1f ms; %s", spun, r)
	if !r.RealTime {
		t.Skip("the probe got no real-time priority here")
	}
	// The probe is asleep when the spin starts, its next deadline about a
	// period later: it wakes nearly as late as the spin is long (measured
	// within 3.5 ms of it under load).
	if spun < 20 || r.MaxDelayMs < 0.8*spun || r.LateOver10ms < 1 {
		t.Fatalf("a %.1f ms stall of CPU %d seen as max %.2f ms, %d wake-ups late by > 10 ms", spun, cpu, r.MaxDelayMs, r.LateOver10ms)
	}
}

// hogEnv makes the test binary the spinner of TestRunSeesAStall, on the
// CPU it names.
const hogEnv = "RECMESH_STALL_TEST_HOG"

func TestMain(m *testing.M) {
	// StartProcess runs this binary as the probe.
	if len(os.Args) > 1 && os.Args[1] == ProbeCommand {
		if err := Command("stall.test", os.Args[2:], os.Stdin, os.Stdout, os.Stderr); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	if v := os.Getenv(hogEnv); v != "" {
		cpu, err := strconv.Atoi(v)
		if err != nil {
			fmt.Println("hog CPU:", err)
			os.Exit(1)
		}
		runHog(cpu)
		return
	}
	os.Exit(m.Run())
}

// runHog pins itself to cpu at a real-time priority above the probe's,
// waits for the probe to settle, spins some tens of milliseconds and
// prints how long the spin took. The spin loop calls nothing, and the
// process runs with asynchronous preemption off and one P, so nothing in
// Go takes the CPU back before the loop ends.
func runHog(cpu int) {
	runtime.LockOSThread()
	var set unix.CPUSet
	set.Set(cpu)
	if err := unix.SchedSetaffinity(0, &set); err != nil {
		fmt.Println("pin:", err)
		os.Exit(1)
	}
	if err := unix.SchedSetAttr(0, &unix.SchedAttr{Size: unix.SizeofSchedAttr, Policy: unix.SCHED_FIFO, Priority: realtimePriority + 1}, 0); err != nil {
		fmt.Println("no real-time priority here:", err)
		os.Exit(1)
	}
	// Calibrate at real-time priority, where nothing else on the CPU slows
	// the loop: how many iterations take 40 ms. A short run (a few ms,
	// well under the runtime's 10 ms preemption tick), the second of two.
	n := 1 << 20
	var begin time.Time
	for range 2 {
		begin = time.Now()
		spinLoop(n)
	}
	n = int(float64(n) * float64(40*time.Millisecond) / float64(max(time.Since(begin), time.Microsecond)))
	time.Sleep(30 * time.Millisecond) // the probe settles first
	begin = time.Now()
	spinLoop(n)
	fmt.Printf("spun %.3f ms\n", float64(time.Since(begin))/float64(time.Millisecond))
	os.Exit(0)
}

// spinSink keeps the compiler from removing spinLoop's work.
var spinSink uint64

// spinLoop burns n iterations without a call, so without a point where
// the goroutine could be preempted cooperatively.
//
//go:noinline
func spinLoop(n int) {
	x := spinSink
	for i := 0; i < n; i++ {
		x = x*6364136223846793005 + 1442695040888963407
	}
	spinSink = x
}

func TestReadStealMissingProc(t *testing.T) {
	dir := t.TempDir()
	if _, _, err := readSteal(dir, 0); err == nil {
		t.Fatal("no stat file, no error")
	}
	if err := os.WriteFile(filepath.Join(dir, "stat"), []byte(statFixture), 0o644); err != nil {
		t.Fatal(err)
	}
	if steal, _, err := readSteal(dir, 0); err != nil || steal != 10667 {
		t.Fatalf("steal %d, %v; want 10667", steal, err)
	}
}
