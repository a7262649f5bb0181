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

// killUnderLoad runs a mesh under load, kills victim with SIGKILL and
// restarts it. Calls in flight must fail with UNAVAILABLE at once (never
// hang to their deadline), and afterwards the mesh must serve again
// without any other process being restarted.
func killUnderLoad(t *testing.T, mode string, frontends int, victim string) {
	w := loadWorkload(t)
	c := newCluster(t, mode)
	c.startMesh(frontends)
	pids := map[string]int{}
	for name, p := range c.procs {
		if name != victim {
			pids[name] = p.cmd.Process.Pid
		}
	}

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
	count := func(code codes.Code) func() bool {
		return func() bool {
			l.mu.Lock()
			defer l.mu.Unlock()
			return l.codes[code] >= 1
		}
	}
	waitFor(t, 60*time.Second, "traffic before the kill", func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.codes[codes.OK] >= 10
	})

	c.kill(victim, syscall.SIGKILL)
	killedAt := time.Now()
	waitFor(t, 10*time.Second, "UNAVAILABLE after the kill", count(codes.Unavailable))
	t.Logf("first UNAVAILABLE %v after the kill", time.Since(killedAt).Round(time.Millisecond))

	c.start(victim)
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
	for name, pid := range pids {
		if p := c.procs[name]; p == nil || p.cmd.Process.Pid != pid {
			t.Errorf("%s was restarted", name)
		}
	}
}

// TestE2EEmbedderKilled: a restarted embedder creates the next generation
// and the same frontends and accelerator re-attach to it.
func TestE2EEmbedderKilled(t *testing.T) { killUnderLoad(t, "full", 2, "embedder") }

// TestE2EAcceleratorKilled: the embedder starts a new generation (the dead
// accelerator's batches are lost with the old rings) and a restarted
// accelerator serves it with the same embedder and frontends.
func TestE2EAcceleratorKilled(t *testing.T) { killUnderLoad(t, "model", 1, "accelerator") }

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
