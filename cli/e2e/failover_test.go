package e2e

import (
	"context"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	pb "github.com/recmesh/recmesh/proto/inference"
	"github.com/recmesh/recmesh/proto/oip"
)

// load sends requests from clients goroutines until stop is closed and
// counts outcomes by code. Each call has a deadline: a call that runs into
// it means the mesh hung instead of failing fast.
type load struct {
	mu       sync.Mutex
	codes    map[codes.Code]int
	okAfter  atomic.Int64 // successes since the mark
	marked   atomic.Bool
	slowFail time.Duration // the slowest failed call
}

func runLoad(t *testing.T, addr string, w *workload, clients int, deadline time.Duration, stop <-chan struct{}) (*load, *sync.WaitGroup) {
	l := &load{codes: map[codes.Code]int{}}
	var wg sync.WaitGroup
	for c := 0; c < clients; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Error(err)
				return
			}
			defer conn.Close()
			client := pb.NewGRPCInferenceServiceClient(conn)
			for i := c; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				k := i % len(w.reqs)
				if w.n[k] > 16 {
					continue // keep calls short so the kill lands mid-flight often
				}
				ctx, cancel := context.WithTimeout(context.Background(), deadline)
				start := time.Now()
				resp, err := client.ModelInfer(ctx, w.reqs[k])
				took := time.Since(start)
				cancel()
				code := status.Code(err)
				if err == nil {
					if got, err := oip.Scores(resp, w.n[k]); err != nil || maxAbsDiff(got, w.want[k]) > 1e-4 {
						code = codes.DataLoss // a wrong answer: never acceptable
					}
				}
				l.mu.Lock()
				l.codes[code]++
				if code != codes.OK && took > l.slowFail {
					l.slowFail = took
				}
				l.mu.Unlock()
				if code == codes.OK && l.marked.Load() {
					l.okAfter.Add(1)
				}
				if code != codes.OK {
					time.Sleep(5 * time.Millisecond) // do not spin on a dead mesh
				}
			}
		}()
	}
	return l, &wg
}

// TestE2EEmbedderKilled kills the embedder with SIGKILL under load: calls
// in flight must fail with UNAVAILABLE at once (never hang to their
// deadline), and once a new embedder starts the same frontends and
// accelerator re-attach and serve again without a restart.
func TestE2EEmbedderKilled(t *testing.T) {
	w := loadWorkload(t)
	c := newCluster(t, "full")
	c.startMesh(2)
	frontendPIDs := []int{c.procs["frontend-0"].cmd.Process.Pid, c.procs["frontend-1"].cmd.Process.Pid}
	accelPID := c.procs["accelerator"].cmd.Process.Pid

	stop := make(chan struct{})
	const deadline = 5 * time.Second
	l, wg := runLoad(t, c.addr(), w, 4, deadline, stop)
	defer func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		wg.Wait()
	}()
	waitFor(t, 60*time.Second, "traffic before the kill", func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.codes[codes.OK] >= 10
	})

	c.kill("embedder", syscall.SIGKILL)
	killedAt := time.Now()
	// Let the frontends see the death and fail what was in flight.
	waitFor(t, 10*time.Second, "UNAVAILABLE after the kill", func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.codes[codes.Unavailable] > 0
	})
	t.Logf("first UNAVAILABLE %v after the kill", time.Since(killedAt).Round(time.Millisecond))

	c.start("embedder")
	l.marked.Store(true)
	waitFor(t, 90*time.Second, "successes after the restart", func() bool { return l.okAfter.Load() >= 10 })
	close(stop)
	wg.Wait()

	l.mu.Lock()
	defer l.mu.Unlock()
	t.Logf("outcomes: %v; slowest failed call %v", l.codes, l.slowFail)
	for code, n := range l.codes {
		switch code {
		case codes.OK, codes.Unavailable:
		default:
			t.Errorf("%d calls ended %v; only OK and UNAVAILABLE are acceptable", n, code)
		}
	}
	if l.slowFail >= deadline {
		t.Errorf("a failed call took %v: it hung to its deadline", l.slowFail)
	}
	for i, pid := range frontendPIDs {
		if p := c.procs[namef("frontend-%d", i)]; p == nil || p.cmd.Process.Pid != pid {
			t.Errorf("frontend-%d was restarted", i)
		}
	}
	if c.procs["accelerator"].cmd.Process.Pid != accelPID {
		t.Error("the accelerator was restarted")
	}
}

func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestE2EAcceleratorKilled kills the accelerator with SIGKILL under load:
// calls fail with UNAVAILABLE at once, the embedder starts a new
// generation (the dead accelerator's batches are lost with the old rings),
// and a restarted accelerator serves again with the same embedder and
// frontends.
func TestE2EAcceleratorKilled(t *testing.T) {
	w := loadWorkload(t)
	c := newCluster(t, "model")
	c.startMesh(1)
	embedderPID := c.procs["embedder"].cmd.Process.Pid
	frontendPID := c.procs["frontend-0"].cmd.Process.Pid

	stop := make(chan struct{})
	const deadline = 5 * time.Second
	l, wg := runLoad(t, c.addr(), w, 3, deadline, stop)
	defer func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		wg.Wait()
	}()
	waitFor(t, 60*time.Second, "traffic before the kill", func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.codes[codes.OK] >= 10
	})
	c.kill("accelerator", syscall.SIGKILL)
	waitFor(t, 10*time.Second, "UNAVAILABLE after the kill", func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.codes[codes.Unavailable] > 0
	})
	c.start("accelerator")
	l.marked.Store(true)
	waitFor(t, 90*time.Second, "successes after the restart", func() bool { return l.okAfter.Load() >= 10 })
	close(stop)
	wg.Wait()

	l.mu.Lock()
	defer l.mu.Unlock()
	t.Logf("outcomes: %v; slowest failed call %v", l.codes, l.slowFail)
	for code, n := range l.codes {
		if code != codes.OK && code != codes.Unavailable {
			t.Errorf("%d calls ended %v; only OK and UNAVAILABLE are acceptable", n, code)
		}
	}
	if l.slowFail >= deadline {
		t.Errorf("a failed call took %v: it hung to its deadline", l.slowFail)
	}
	if c.procs["embedder"].cmd.Process.Pid != embedderPID || c.procs["frontend-0"].cmd.Process.Pid != frontendPID {
		t.Error("the embedder or the frontend was restarted")
	}
}
