package e2e

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/recmesh/recmesh/proto/inference"
	"github.com/recmesh/recmesh/proto/oip"
)

// chaosCallBound is each honest call's deadline; a call must end, one way
// or the other, within it.
const chaosCallBound = 5 * time.Second

// TestE2EChaos is make chaos: honest clients keep calling a real mesh
// while a hostile frontend scribbles over its lane, commits garbage, tries
// every way out of its lane (all must be refused, and it may cause no new
// generation) and is SIGKILLed and restarted; meanwhile the
// accelerator and then the embedder are stopped (SIGSTOP) for a while, and
// NATS is taken away and brought back. Every honest call must succeed with
// the reference's scores or fail with a defined code within its bound, and
// fail at all only inside a hang or kill window; no mesh process may die.
// It ends with the `chaos ok:` line.
func TestE2EChaos(t *testing.T) {
	if os.Getenv("RECMESH_E2E_CHAOS") == "" {
		t.Skip("make chaos runs this (RECMESH_E2E_CHAOS=1, RECMESH_CHAOS_SECONDS)")
	}
	secs := 30
	if v, err := strconv.Atoi(os.Getenv("RECMESH_CHAOS_SECONDS")); err == nil && v >= 10 {
		secs = v
	}
	total := time.Duration(secs) * time.Second
	w := loadWorkload(t)

	natsPort := freePort(t)
	nats := startNATSAt(t, natsPort)
	c := newCluster(t, "model")
	c.natsURL = fmt.Sprintf("nats://127.0.0.1:%d", natsPort)
	c.startMesh(2)
	mesh := map[string]*proc{}
	for name, p := range c.procs {
		mesh[name] = p
	}
	segPath := filepath.Join("/dev/shm", c.segment)
	pause := filepath.Join(t.TempDir(), "pause-file-actions")

	l := startChaosLoad(t, c, w, 3)
	defer l.stop()
	waitFor(t, time.Minute, "honest traffic", func() bool { return l.ok.Load() >= 20 })
	start := time.Now()

	// The hostile frontend, killed and restarted every few seconds.
	var hostileActions, hostileRefused atomic.Int64
	hostileDone := make(chan struct{})
	go func() {
		defer close(hostileDone)
		for i := 0; time.Since(start) < total; i++ {
			life := time.Duration(3+i%4) * time.Second
			runHostileProcess(t, segPath, pause, life+time.Second, uint64(i+1), life, &hostileActions, &hostileRefused)
		}
	}()

	// Hangs and the control plane's outage.
	at := func(frac float64) { time.Sleep(time.Until(start.Add(time.Duration(frac * float64(total))))) }
	// Generations the embedder started: the hostile alone must cause
	// none (only the accelerator's hang may), so honest lanes never have
	// to move.
	generations := func() int { return strings.Count(mesh["embedder"].out.String(), "segment ready") }
	gens0 := generations()
	var hangDetect time.Duration
	at(0.3)
	if g := generations(); g != gens0 {
		t.Errorf("%d new generations while only the hostile frontend acted", g-gens0)
	}
	hangDetect = hang(t, l, pause, mesh["accelerator"], mesh["embedder"], "accelerator died", 3*time.Second)
	at(0.55)
	hang(t, l, pause, mesh["embedder"], nil, "", 3*time.Second)
	gens1 := generations()
	at(0.8)
	l.window(true)
	nats.Shutdown()
	time.Sleep(2 * time.Second)
	nats = startNATSAt(t, natsPort)
	l.window(false) // the data plane never waits on NATS: no recovery wait
	<-hostileDone
	l.stop()
	nats.Shutdown()
	if g := generations(); g != gens1 {
		t.Errorf("%d new generations after the hangs, while only the hostile frontend and the NATS outage acted", g-gens1)
	}

	crashes := 0
	for name, p := range mesh {
		select {
		case <-p.done:
			crashes++
			t.Errorf("%s exited during the chaos:\n%s", name, tail(p.out.String()))
		default:
		}
	}
	outside, failures := l.failuresOutside()
	line := fmt.Sprintf("chaos ok: honest_calls=%d honest_failed=%d wrong_scores=%d hostile_actions=%d peer_crashes=%d hang_detect_ms=%d max_call_ms=%d",
		l.calls.Load(), l.failed.Load(), l.wrong.Load(), hostileActions.Load(), crashes, hangDetect.Milliseconds(), l.maxCall().Milliseconds())
	t.Logf("failures by code (inside windows too): %v; outside the hang and kill windows: %d; the hostile's escape attempts refused: %d", failures, outside, hostileRefused.Load())
	switch {
	case l.wrong.Load() != 0:
		t.Errorf("%d honest calls got wrong scores", l.wrong.Load())
	case outside != 0:
		t.Errorf("%d honest calls failed outside the hang and kill windows", outside)
	case l.undefined.Load() != 0:
		t.Errorf("%d honest calls failed with a code outside UNAVAILABLE, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED", l.undefined.Load())
	case l.maxCall() > chaosCallBound+time.Second:
		t.Errorf("an honest call took %v, past its %v bound", l.maxCall(), chaosCallBound)
	case hostileActions.Load() == 0:
		t.Error("the hostile frontend did nothing")
	case hostileRefused.Load() == 0:
		t.Error("the hostile frontend never tried to leave its lane")
	}
	if t.Failed() || crashes != 0 {
		t.Logf("chaos FAILED: %s", strings.TrimPrefix(line, "chaos ok: "))
		return
	}
	fmt.Println(line)
}

// startNATSAt starts an embedded NATS server on port, so it can be stopped
// and started again at the same URL.
func startNATSAt(t *testing.T, port int) *natsserver.Server {
	t.Helper()
	ns, err := natsserver.NewServer(&natsserver.Options{Host: "127.0.0.1", Port: port, NoSigs: true, NoLog: true})
	if err != nil {
		t.Fatal(err)
	}
	ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("embedded NATS did not start")
	}
	t.Cleanup(ns.Shutdown)
	return ns
}

// hang stops p for d, inside a window, then lets it go and waits until the
// honest load succeeds again. With watch and logLine, it returns how long
// after the stop watch logged logLine (the hang detected).
func hang(t *testing.T, l *chaosLoad, pause string, p, watch *proc, logLine string, d time.Duration) time.Duration {
	t.Helper()
	// No file resizing meanwhile (a new generation would have no
	// accelerator to lose), and a mesh that serves when the hang begins.
	if err := os.WriteFile(pause, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(pause)
	time.Sleep(fileResizeSettle)
	base0 := l.ok.Load()
	waitFor(t, time.Minute, "honest calls succeeding before stopping "+p.name, func() bool { return l.ok.Load() >= base0+10 })
	l.window(true)
	before := 0
	if watch != nil {
		before = strings.Count(watch.out.String(), logLine)
	}
	stopped := time.Now()
	_ = p.cmd.Process.Signal(syscall.SIGSTOP)
	var detect time.Duration
	for time.Since(stopped) < d {
		if watch != nil && detect == 0 && strings.Count(watch.out.String(), logLine) > before {
			detect = time.Since(stopped)
		}
		time.Sleep(5 * time.Millisecond)
	}
	_ = p.cmd.Process.Signal(syscall.SIGCONT)
	base := l.ok.Load()
	waitFor(t, time.Minute, "honest calls succeeding after "+p.name+" resumed", func() bool { return l.ok.Load() >= base+20 })
	l.window(false)
	if watch != nil && detect == 0 {
		t.Errorf("%s never logged %q while %s was stopped for %v", watch.name, logLine, p.name, d)
	}
	return detect
}

// fileResizeSettle is how long a resize the hostile made just before a
// pause takes to be replaced by a new generation that serves.
const fileResizeSettle = time.Second

// runHostileProcess runs one life of the hostile frontend and SIGKILLs it
// after life, adding its reported actions to actions and its refused
// escape attempts to refusals; a breach it reports fails the test.
func runHostileProcess(t *testing.T, path, pause string, run time.Duration, seed uint64, life time.Duration, actions, refusals *atomic.Int64) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s,%d,%d,%s", hostileEnv, path, int(run.Seconds()), seed, pause))
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Error(err)
		return
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Error(err)
		return
	}
	var last int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if b, ok := strings.CutPrefix(sc.Text(), "breach "); ok {
				t.Errorf("the hostile frontend was not refused: %s", b)
				continue
			}
			if n, err := strconv.ParseInt(strings.TrimPrefix(sc.Text(), "refused "), 10, 64); err == nil {
				refusals.Add(n)
				continue
			}
			if n, err := strconv.ParseInt(strings.TrimPrefix(sc.Text(), "actions "), 10, 64); err == nil {
				actions.Add(n - last)
				last = n
			}
		}
	}()
	time.Sleep(life)
	_ = cmd.Process.Kill()
	<-done
	_ = cmd.Wait()
}

// chaosLoad is the honest clients: every call's outcome, sorted by whether
// it overlapped a hang or kill window.
type chaosLoad struct {
	windows
	calls, ok, failed, wrong, undefined atomic.Int64
	mu                                  sync.Mutex
	codes                               map[codes.Code]int
	outside                             int
	longest                             time.Duration
	done                                chan struct{}
	wg                                  sync.WaitGroup
	once                                sync.Once
}

func (l *chaosLoad) window(open bool) { l.set(open) }

func (l *chaosLoad) stop() { l.once.Do(func() { close(l.done); l.wg.Wait() }) }

func (l *chaosLoad) maxCall() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.longest
}

func (l *chaosLoad) failuresOutside() (int, map[codes.Code]int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.outside, l.codes
}

func startChaosLoad(t *testing.T, c *cluster, w *workload, clients int) *chaosLoad {
	l := &chaosLoad{codes: map[codes.Code]int{}, done: make(chan struct{})}
	callLoop(t, c, w, clients, chaosCallBound, &l.windows, l.done, &l.wg, func(i int, resp *pb.ModelInferResponse, err error, ci callInfo) {
		l.calls.Add(1)
		l.mu.Lock()
		l.longest = max(l.longest, ci.took)
		l.mu.Unlock()
		if err != nil {
			code := status.Code(err)
			l.failed.Add(1)
			switch code {
			case codes.Unavailable, codes.DeadlineExceeded, codes.ResourceExhausted:
			default:
				l.undefined.Add(1)
				t.Logf("honest call failed %v: %v", code, err)
			}
			l.mu.Lock()
			l.codes[code]++
			if !ci.inWindow {
				l.outside++
				t.Logf("honest call failed outside a window after %v: %v", ci.took, err)
			}
			l.mu.Unlock()
			return
		}
		if got, err := oip.Scores(resp, w.n[i]); err != nil || maxAbsDiff(got, w.want[i]) > 1e-4 {
			l.wrong.Add(1)
			return
		}
		l.ok.Add(1)
	})
	return l
}
