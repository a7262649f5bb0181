package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// hogEnv makes the test binary, run as TestAbuseHogHelper, a busy loop
// for the given seconds: one of make e2e-abuse's CPU hogs.
const hogEnv = "RECMESH_ABUSE_HOG"

// livenessSigns are the log lines by which a mesh process shows that it
// declared a peer dead or lost its place: each counts as a restart.
// (Messages as embedder/embedder.go, frontend/shmbackend and
// accelerator/server log them.)
var livenessSigns = map[string][]string{
	"embedder":    {"segment ready", "accelerator died", "generation failed", "evicting lane"},
	"accelerator": {"generation ended"},
	"frontend":    {"lane failed", "switched generation"},
}

// restartSigns are those of livenessSigns that make false_restarts: a new
// generation, the accelerator declared dead, a frontend's lane lost. (The
// others follow from them and are logged beside.)
var restartSigns = map[string]bool{"segment ready": true, "accelerator died": true, "lane failed": true}

// cpuHog runs 6 × the CPU count busy-looping processes
// (RECMESH_ABUSE_HOG_PROCS) beside the healthy mesh for
// RECMESH_ABUSE_HOG_SECONDS (180) while the honest clients keep calling. A
// starved process is slow, not dead: no mesh process may be declared dead
// (no new generation, no lane taken from a live frontend, no process
// exit: false_restarts) and no honest call may fail with UNAVAILABLE.
func (a *abuseRun) cpuHog(t *testing.T, _ *abuseFrontend) (string, error) {
	secs := envInt("RECMESH_ABUSE_HOG_SECONDS", 180)
	n := envInt("RECMESH_ABUSE_HOG_PROCS", 6*runtime.NumCPU())
	mesh := map[string]*proc{}
	for name, p := range a.c.procs {
		mesh[name] = p
	}
	before := livenessCounts(mesh)
	honest0 := a.honest.snapshot()
	var hogs []*exec.Cmd
	defer func() {
		for _, h := range hogs {
			_ = h.Process.Kill()
			_ = h.Wait()
		}
	}()
	for i := 0; i < n; i++ {
		// The hog stops by itself a little after the phase, should this
		// test die before it kills it (Pdeathsig covers the rest).
		h := exec.Command(os.Args[0], "-test.run=^TestAbuseHogHelper$", "-test.count=1")
		h.Env = append(os.Environ(), fmt.Sprintf("%s=%d", hogEnv, secs+30), "GOMAXPROCS=1")
		h.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := h.Start(); err != nil {
			return "", fmt.Errorf("start CPU hog %d: %w", i, err)
		}
		hogs = append(hogs, h)
	}
	// The phase lasts its configured time; a mesh process that exits
	// meanwhile is noted as it happens.
	exited := map[string]bool{}
	end := time.Now().Add(time.Duration(secs) * time.Second)
	for time.Now().Before(end) {
		for name, p := range mesh {
			select {
			case <-p.done:
				if !exited[name] {
					exited[name] = true
					t.Errorf("cpu hog: %s exited:\n%s", name, tail(p.out.String()))
				}
			default:
			}
		}
		time.Sleep(min(time.Second, time.Until(end)))
	}
	for _, h := range hogs {
		_ = h.Process.Kill()
		_ = h.Wait()
	}
	hogs = nil
	after := livenessCounts(mesh)
	unavailable := int64(0)
	for _, v := range a.honest.snapshot().minus(honest0) {
		unavailable += v.unavailable
	}
	restarts := len(exited)
	var signs []string
	for key, v := range after {
		if d := v - before[key]; d != 0 {
			signs = append(signs, fmt.Sprintf("%s=%d", key, d))
			if restartSigns[key[strings.Index(key, ":")+1:]] {
				restarts += d
			}
		}
	}
	sort.Strings(signs)
	a.mu.Lock()
	a.hogRan = true
	a.falseRestarts += restarts
	a.hogUnavail += unavailable
	a.mu.Unlock()
	if restarts > 0 {
		t.Errorf("cpu hog: %d false restarts (%s; exited: %d)", restarts, strings.Join(signs, " "), len(exited))
	}
	if unavailable > 0 {
		t.Errorf("cpu hog: %d honest calls failed with UNAVAILABLE", unavailable)
	}
	return fmt.Sprintf("hogs=%d seconds=%d false_restarts=%d honest_unavailable=%d signs=[%s]",
		n, secs, restarts, unavailable, strings.Join(signs, " ")), nil
}

// livenessCounts counts each process's livenessSigns in its output so
// far, keyed "<process>:<sign>".
func livenessCounts(mesh map[string]*proc) map[string]int {
	out := map[string]int{}
	for name, p := range mesh {
		role := name
		if strings.HasPrefix(name, "frontend") {
			role = "frontend"
		}
		text := p.out.String()
		for _, s := range livenessSigns[role] {
			out[name+":"+s] = strings.Count(text, s)
		}
	}
	return out
}

// hogSink keeps the busy loop's work observable, so it is not optimised
// away.
var hogSink uint64

// TestAbuseHogHelper is one CPU hog's process (see hogEnv); it does
// nothing in a normal test run.
func TestAbuseHogHelper(t *testing.T) {
	v := os.Getenv(hogEnv)
	if v == "" {
		t.Skip("a CPU hog of TestE2EAbuse: runs only as that test's child process")
	}
	secs, err := strconv.Atoi(v)
	if err != nil {
		t.Fatalf("%s=%q: %v", hogEnv, v, err)
	}
	x := uint64(1)
	for end := time.Now().Add(time.Duration(secs) * time.Second); time.Now().Before(end); {
		for i := 0; i < 1<<20; i++ {
			x = x*6364136223846793005 + 1442695040888963407
		}
	}
	hogSink = x
}
