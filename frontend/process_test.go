//go:build linux

package frontend_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/recmesh/recmesh/model"
	"github.com/recmesh/recmesh/proto/inference"
)

// TestFrontendProcess runs the frontend binary as real processes with the
// reference backend: a SIGTERM drain, and three processes sharing one port.
func TestFrontendProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the frontend binary")
	}
	bin := filepath.Join(t.TempDir(), "frontend")
	build := exec.Command("go", "build", "-o", bin, "./cmd/frontend")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/frontend: %v\n%s", err, out)
	}
	bd := exportBundle(t)
	t.Run("drain", func(t *testing.T) { testDrainProcess(t, bin, bd) })
	t.Run("reuseport", func(t *testing.T) { testReusePortProcesses(t, bin, bd) })
}

// proc is one frontend process.
type proc struct {
	cmd     *exec.Cmd
	log     *procLog
	addr    string // gRPC
	metrics string // host:port of /metrics
	exited  chan struct{}
	waitErr error
}

// procLog collects a process's stderr and spots the start-up line.
type procLog struct {
	mu      sync.Mutex
	buf     bytes.Buffer
	partial []byte
	serving chan [2]string // addr, metrics_addr; sent once
}

var (
	addrRE    = regexp.MustCompile(`\baddr=(\S+)`)
	metricsRE = regexp.MustCompile(`\bmetrics_addr=(\S+)`)
)

func (l *procLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf.Write(p)
	l.partial = append(l.partial, p...)
	for {
		i := bytes.IndexByte(l.partial, '\n')
		if i < 0 {
			break
		}
		line := string(l.partial[:i])
		l.partial = l.partial[i+1:]
		if strings.Contains(line, `msg="frontend serving"`) {
			a, m := addrRE.FindStringSubmatch(line), metricsRE.FindStringSubmatch(line)
			if a != nil && m != nil {
				select {
				case l.serving <- [2]string{a[1], m[1]}:
				default:
				}
			}
		}
	}
	return len(p), nil
}

func (l *procLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// startFrontend starts the binary and waits until it listens.
func startFrontend(t *testing.T, bin string, args ...string) *proc {
	t.Helper()
	p := &proc{log: &procLog{serving: make(chan [2]string, 1)}, exited: make(chan struct{})}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Stdout = io.Discard
	p.cmd.Stderr = p.log
	// Environment twins of the flags must not leak in from the caller.
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "RECMESH_") {
			p.cmd.Env = append(p.cmd.Env, kv)
		}
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		p.waitErr = p.cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-p.exited:
		default:
			p.cmd.Process.Kill()
			<-p.exited
		}
		if t.Failed() {
			t.Logf("frontend pid %d log:\n%s", p.cmd.Process.Pid, p.log)
		}
	})
	select {
	case a := <-p.log.serving:
		p.addr, p.metrics = a[0], a[1]
	case <-p.exited:
		t.Fatalf("frontend exited at start-up: %v\n%s", p.waitErr, p.log)
	case <-time.After(60 * time.Second):
		t.Fatalf("frontend did not start in 60s\n%s", p.log)
	}
	return p
}

func (p *proc) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
}

// waitExit waits for the process and returns its exit error.
func (p *proc) waitExit(t *testing.T, timeout time.Duration) error {
	t.Helper()
	select {
	case <-p.exited:
		return p.waitErr
	case <-time.After(timeout):
		t.Fatalf("frontend pid %d did not exit in %v", p.cmd.Process.Pid, timeout)
		return nil
	}
}

// metric reads one unlabelled sample from the process's /metrics.
func (p *proc) metric(name string) (float64, error) {
	c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + p.metrics + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 1<<16), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			return strconv.ParseFloat(v, 64)
		}
	}
	return 0, fmt.Errorf("no sample %s", name)
}

func (p *proc) ready() bool {
	c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 2 * time.Second}
	resp, err := c.Get("http://" + p.metrics + "/readyz")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// testDrainProcess: after SIGTERM readiness turns false first, then new
// connections are refused while slow calls in flight complete, then the
// process exits 0.
func testDrainProcess(t *testing.T, bin string, bd *bundle) {
	const (
		slow       = 4 * time.Second // every call's artificial delay
		drainDelay = 1 * time.Second
		inflight   = 3
	)
	p := startFrontend(t, bin, "--listen=127.0.0.1:0", "--metrics-addr=127.0.0.1:0", "--bundle="+bd.dir,
		"--backend=reference", "--reference-delay="+slow.String(), "--drain-delay="+drainDelay.String(), "--drain-timeout=30s")
	conn := dialT(t, p.addr)
	health := healthpb.NewHealthClient(conn)
	api := inference.NewGRPCInferenceServiceClient(conn)
	serving := func() healthpb.HealthCheckResponse_ServingStatus {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		r, err := health.Check(ctx, &healthpb.HealthCheckRequest{})
		if err != nil {
			return healthpb.HealthCheckResponse_UNKNOWN
		}
		return r.Status
	}
	waitUntil(t, 30*time.Second, "health SERVING", func() bool { return serving() == healthpb.HealthCheckResponse_SERVING })

	dense, sparse := model.RandomInputs(bd.cfg, 3, 1)
	want, err := bd.ref.Predict(dense, sparse, 1)
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		scores []float32
		err    error
		at     time.Time
	}
	results := make(chan result, inflight)
	for range inflight {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			resp, err := api.ModelInfer(ctx, inferRequest(bd.cfg, dense, sparse, 1))
			r := result{err: err, at: time.Now()}
			if err == nil {
				r.scores = rawScores(resp)
			}
			results <- r
		}()
	}
	waitUntil(t, 30*time.Second, "3 calls in flight", func() bool {
		v, err := p.metric("recmesh_frontend_inflight_requests")
		return err == nil && v == inflight
	})

	p.signal(t, syscall.SIGTERM)
	waitUntil(t, 10*time.Second, "health NOT_SERVING", func() bool {
		return serving() == healthpb.HealthCheckResponse_NOT_SERVING
	})
	notServingAt := time.Now()
	if r, err := api.ServerReady(context.Background(), &inference.ServerReadyRequest{}); err != nil || r.Ready {
		t.Errorf("ServerReady while draining = %v, %v", r, err)
	}

	// New calls are refused once the listener has closed; each try is a
	// fresh connection with a short deadline.
	var refusedAt time.Time
	waitUntil(t, 20*time.Second, "new calls refused", func() bool {
		fresh := dialT(t, p.addr)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err := inference.NewGRPCInferenceServiceClient(fresh).ServerLive(ctx, &inference.ServerLiveRequest{})
		fresh.Close()
		if status.Code(err) == codes.Unavailable {
			refusedAt = time.Now()
			return true
		}
		return false
	})

	for range inflight {
		r := <-results
		if r.err != nil {
			t.Errorf("call in flight at SIGTERM failed: %v", r.err)
			continue
		}
		if d := maxAbsDiff(r.scores, want); d > 1e-4 {
			t.Errorf("call in flight scored %v, reference %v", r.scores, want)
		}
		if !r.at.After(refusedAt) {
			t.Errorf("call in flight completed at %v, before new calls were refused at %v", r.at, refusedAt)
		}
	}
	if !notServingAt.Before(refusedAt) {
		t.Errorf("readiness turned false at %v, not before new calls were refused at %v", notServingAt, refusedAt)
	}
	if err := p.waitExit(t, 30*time.Second); err != nil {
		t.Errorf("frontend exited with %v after SIGTERM, want 0\n%s", err, p.log)
	}
	if logs := p.log.String(); !strings.Contains(logs, "frontend draining") || !strings.Contains(logs, "frontend drained") {
		t.Errorf("log lacks the drain:\n%s", logs)
	}
}

// reservePort binds 127.0.0.1:0 with SO_REUSEPORT, so that the frontends can
// join the port while the test still holds it (no other process can take
// it meanwhile).
func reservePort(t *testing.T) net.Listener {
	t.Helper()
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1)
		})
		if err != nil {
			return err
		}
		return serr
	}}
	lc.SetMultipathTCP(false)
	l, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// testReusePortProcesses: three frontends share one port; one is killed
// (SIGKILL) under load; the others keep serving, and every call either
// succeeds or fails with UNAVAILABLE within its deadline.
func testReusePortProcesses(t *testing.T, bin string, bd *bundle) {
	const (
		procs       = 3
		workers     = 6
		callTimeout = 5 * time.Second
		phaseMin    = time.Second
		phaseMax    = 20 * time.Second
		wantOK      = 20 // successful calls wanted per phase
		maxCalls    = 2000
	)
	reserved := reservePort(t)
	addr := reserved.Addr().String()
	ps := make([]*proc, procs)
	for i := range ps {
		ps[i] = startFrontend(t, bin, "--listen="+addr, "--metrics-addr=127.0.0.1:0", "--bundle="+bd.dir, "--backend=reference")
		if ps[i].addr != addr {
			t.Fatalf("frontend %d listens on %s, want %s", i, ps[i].addr, addr)
		}
	}
	for i, p := range ps {
		waitUntil(t, 30*time.Second, fmt.Sprintf("frontend %d ready", i), p.ready)
	}
	reserved.Close() // from here on, only the frontends hold the port

	dense, sparse := model.RandomInputs(bd.cfg, 5, 1)
	want, err := bd.ref.Predict(dense, sparse, 1)
	if err != nil {
		t.Fatal(err)
	}

	type outcome struct {
		code  codes.Code
		took  time.Duration
		after bool // started after the kill
		msg   string
	}
	var (
		mu       sync.Mutex
		outcomes []outcome
		killed   bool
		okBefore int
		okAfter  int
	)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range workers {
		conn := dialT(t, addr) // one TCP connection each, spread by the kernel
		api := inference.NewGRPCInferenceServiceClient(conn)
		wg.Go(func() {
			for i := 0; i < maxCalls; i++ {
				select {
				case <-stop:
					return
				default:
				}
				mu.Lock()
				after := killed
				mu.Unlock()
				ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
				start := time.Now()
				resp, err := api.ModelInfer(ctx, inferRequest(bd.cfg, dense, sparse, 1))
				took := time.Since(start)
				cancel()
				o := outcome{code: status.Code(err), took: took, after: after}
				if err != nil {
					o.msg = fmt.Sprintf("worker %d: %v", w, err)
				} else if d := maxAbsDiff(rawScores(resp), want); d > 1e-4 {
					o.code, o.msg = codes.DataLoss, fmt.Sprintf("worker %d: wrong scores %v", w, rawScores(resp))
				}
				mu.Lock()
				outcomes = append(outcomes, o)
				if o.code == codes.OK {
					if after {
						okAfter++
					} else {
						okBefore++
					}
				}
				mu.Unlock()
				if o.code == codes.Unavailable {
					time.Sleep(20 * time.Millisecond) // a client's back-off
				}
			}
		})
	}
	phase := func(what string, enough func() bool) {
		start := time.Now()
		waitUntil(t, phaseMax, what, func() bool {
			mu.Lock()
			defer mu.Unlock()
			return time.Since(start) >= phaseMin && enough()
		})
	}
	phase("load before the kill", func() bool { return okBefore >= wantOK })

	// Kill the busiest process: the one most clients are talking to.
	victim, best := 0, -1.0
	before := make([]float64, procs)
	for i, p := range ps {
		v, err := p.metric("recmesh_frontend_examples_total")
		if err != nil {
			t.Fatal(err)
		}
		before[i] = v
		if v > best {
			victim, best = i, v
		}
	}
	ps[victim].signal(t, syscall.SIGKILL)
	mu.Lock()
	killed = true
	mu.Unlock()
	t.Logf("examples per frontend before the kill: %v; killed frontend %d", before, victim)
	phase("load after the kill", func() bool { return okAfter >= wantOK })
	close(stop)
	wg.Wait()

	if err := ps[victim].waitExit(t, 10*time.Second); err == nil {
		t.Errorf("killed frontend exited cleanly")
	}
	var served float64
	for i, p := range ps {
		if i == victim {
			continue
		}
		v, err := p.metric("recmesh_frontend_examples_total")
		if err != nil {
			t.Fatalf("surviving frontend %d: %v", i, err)
		}
		served += v - before[i]
	}
	if served < wantOK {
		t.Errorf("surviving frontends served %v examples after the kill, want ≥ %d", served, wantOK)
	}
	counts := map[codes.Code]int{}
	for _, o := range outcomes {
		counts[o.code]++
		if o.code != codes.OK && o.code != codes.Unavailable {
			t.Errorf("call got %v, want OK or Unavailable: %s", o.code, o.msg)
		}
		if o.took > callTimeout+2*time.Second {
			t.Errorf("call took %v, past its %v deadline: %s", o.took, callTimeout, o.msg)
		}
	}
	t.Logf("%d calls: %v (OK before the kill %d, after %d)", len(outcomes), counts, okBefore, okAfter)

	for i, p := range ps {
		if i == victim {
			continue
		}
		p.signal(t, syscall.SIGTERM)
		if err := p.waitExit(t, 30*time.Second); err != nil {
			t.Errorf("frontend %d exited with %v after SIGTERM", i, err)
		}
	}
}
