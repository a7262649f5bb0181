package e2e

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/recmesh/recmesh/model"
)

// binaries builds (once per test binary) the mesh's commands, or uses
// RECMESH_BIN_DIR when make already built them.
var (
	binOnce sync.Once
	binDir  string
	binErr  error
)

func buildBinaries(t *testing.T) string {
	t.Helper()
	binOnce.Do(func() {
		if d := os.Getenv("RECMESH_BIN_DIR"); d != "" {
			binDir = d
			return
		}
		root, err := workspaceRoot()
		if err != nil {
			binErr = err
			return
		}
		binDir, binErr = os.MkdirTemp("", "recmesh-e2e-bin-")
		if binErr != nil {
			return
		}
		cmd := exec.Command("go", "build", "-o", binDir+"/",
			"./embedder/cmd/embedder", "./accelerator/cmd/accelerator", "./frontend/cmd/frontend", "./cli/cmd/recmesh")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			binErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binDir
}

func workspaceRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.work")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no go.work above the test's directory")
		}
		dir = parent
	}
}

// bundleOnce exports the small model once for every test.
var (
	bundleOnce sync.Once
	bundleDir  string
	bundleErr  error
)

func exportBundle(t *testing.T) string {
	t.Helper()
	bundleOnce.Do(func() {
		bundleDir, bundleErr = os.MkdirTemp("", "recmesh-e2e-bundle-")
		if bundleErr == nil {
			bundleErr = model.Export(context.Background(), bundleDir, model.DLRMv2(model.DevVocabCap), 11, nil)
		}
	})
	if bundleErr != nil {
		t.Fatal(bundleErr)
	}
	return bundleDir
}

// proc is one mesh process with its output kept for failure reports.
type proc struct {
	name string
	cmd  *exec.Cmd
	out  *syncBuffer
	done chan struct{}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// cluster is one mesh: a segment name of its own, so tests never share
// shared memory.
type cluster struct {
	t       *testing.T
	bin     string
	bundle  string
	segment string
	port    int
	// host is where the mesh answers when not on this machine's loopback
	// (TestK8s: the Service's cluster IP); empty: 127.0.0.1.
	host string
	mode string
	// latencyTarget is the embedder's --latency-target (slo mode), empty
	// for its default.
	latencyTarget string
	// frontendArgs are added to every frontend's flags.
	frontendArgs []string
	procs        map[string]*proc
	metrics      map[string]string // process name → metrics address
	natsURL      string            // empty: no control plane
	// natsEnv, when set, gives each process its control-plane identity
	// (NATS_NKEY for its role) beside NATS_URL.
	natsEnv func(name string) []string
	// modelRoot is the processes' --model-root: every cluster has its
	// own, so a rollout's serving.json never leaks into another test.
	modelRoot string
	// dialCreds are the credentials the harness dials c.addr() with (the
	// readiness check); nil: plaintext.
	dialCreds credentials.TransportCredentials
	// pin, when set, is the CPU list (taskset -c) every mesh process runs
	// on, all of its threads, for benchmarks that give the mesh one core.
	pin string
}

func newCluster(t *testing.T, mode string) *cluster {
	c := &cluster{
		t:         t,
		bin:       buildBinaries(t),
		bundle:    exportBundle(t),
		segment:   fmt.Sprintf("recmesh-e2e-%d-%s", os.Getpid(), mode),
		port:      freePort(t),
		mode:      mode,
		procs:     map[string]*proc{},
		metrics:   map[string]string{},
		modelRoot: t.TempDir(),
	}
	t.Cleanup(c.stopAll)
	return c
}

// handedOut remembers every port freePort gave: a process may not have
// bound its port yet when the next one is asked for, and the kernel would
// happily offer the same free port twice.
var (
	portsMu   sync.Mutex
	handedOut = map[int]bool{}
)

func freePort(t *testing.T) int {
	portsMu.Lock()
	defer portsMu.Unlock()
	for {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		p := ln.Addr().(*net.TCPAddr).Port
		ln.Close()
		if !handedOut[p] {
			handedOut[p] = true
			return p
		}
	}
}

func (c *cluster) addr() string {
	if c.host != "" {
		return net.JoinHostPort(c.host, strconv.Itoa(c.port))
	}
	return "127.0.0.1:" + strconv.Itoa(c.port)
}

// dialOption is how the harness reaches c.addr(): c.dialCreds, or
// plaintext when they are nil.
func (c *cluster) dialOption() grpc.DialOption {
	if c.dialCreds != nil {
		return grpc.WithTransportCredentials(c.dialCreds)
	}
	return grpc.WithTransportCredentials(insecure.NewCredentials())
}

func (c *cluster) start(name string, args ...string) *proc {
	c.t.Helper()
	var path string
	switch {
	case name == "embedder":
		path = filepath.Join(c.bin, "embedder")
		args = append([]string{"--batch-mode", c.mode, "--lanes", "8", "--workers", "2"}, args...)
		if c.latencyTarget != "" {
			args = append(args, "--latency-target", c.latencyTarget)
		}
	case name == "accelerator":
		path = filepath.Join(c.bin, "accelerator")
		args = append([]string{"serve"}, args...)
	default:
		path = filepath.Join(c.bin, "frontend")
		args = append(append([]string{"--port", strconv.Itoa(c.port)}, c.frontendArgs...), args...)
	}
	maddr := fmt.Sprintf("127.0.0.1:%d", freePort(c.t))
	c.metrics[name] = maddr
	args = append(args, "--metrics-addr", maddr)
	cmd := exec.Command(path, args...)
	if c.pin != "" {
		cmd = exec.Command("taskset", append([]string{"-c", c.pin, path}, args...)...)
	}
	cmd.Env = append(os.Environ(),
		"RECMESH_BUNDLE="+c.bundle,
		"RECMESH_SEGMENT="+c.segment,
		"NATS_URL="+c.natsURL,
		"RECMESH_MODEL_ROOT="+c.modelRoot,
	)
	if c.natsEnv != nil {
		cmd.Env = append(cmd.Env, c.natsEnv(name)...)
	}
	out := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		c.t.Fatalf("start %s: %v", name, err)
	}
	p := &proc{name: name, cmd: cmd, out: out, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(p.done) }()
	c.procs[name] = p
	return p
}

// startMesh starts the embedder, the accelerator and n frontends and
// waits until the frontends answer SERVING.
func (c *cluster) startMesh(frontends int) {
	c.start("embedder")
	c.start("accelerator")
	for i := 0; i < frontends; i++ {
		c.start(fmt.Sprintf("frontend-%d", i))
	}
	c.waitServing(3 * time.Minute)
}

func (c *cluster) waitServing(timeout time.Duration) {
	c.t.Helper()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		// A new connection each round: frontends listen only once ready,
		// and a client refused until then would back off for seconds.
		conn, err := grpc.NewClient(c.addr(), c.dialOption())
		if err != nil {
			c.t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
		cancel()
		conn.Close()
		// The health check reaches one frontend of the SO_REUSEPORT group;
		// a call may reach another that has not yet seen the accelerator.
		// So the mesh serves only once every frontend says it is ready.
		if err == nil && resp.Status == healthpb.HealthCheckResponse_SERVING && c.frontendsReady() {
			return
		}
		for _, p := range c.procs {
			select {
			case <-p.done:
				c.t.Fatalf("%s exited during start-up:\n%s", p.name, tail(p.out.String()))
			default:
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	c.dump()
	c.t.Fatalf("mesh not serving after %v", timeout)
}

// frontendsReady reports whether every running frontend answers /readyz
// with 200 on its own metrics address.
func (c *cluster) frontendsReady() bool {
	for name := range c.procs {
		if strings.HasPrefix(name, "frontend") && !c.ready(name) {
			return false
		}
	}
	return true
}

// ready reports whether the named process answers /readyz with 200.
func (c *cluster) ready(name string) bool {
	client := &http.Client{Timeout: time.Second}
	resp, err := client.Get("http://" + c.metrics[name] + "/readyz")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

func (c *cluster) kill(name string, sig syscall.Signal) {
	p := c.procs[name]
	_ = p.cmd.Process.Signal(sig)
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
	delete(c.procs, name)
}

func (c *cluster) stopAll() {
	if c.t.Failed() {
		c.dump()
	}
	order := []string{}
	for name := range c.procs {
		if name != "embedder" && name != "accelerator" {
			order = append(order, name)
		}
	}
	order = append(order, "accelerator", "embedder")
	for _, name := range order {
		if _, ok := c.procs[name]; ok {
			c.kill(name, syscall.SIGTERM)
		}
	}
	_ = os.Remove(filepath.Join("/dev/shm", c.segment))
}

func (c *cluster) dump() {
	for _, p := range c.procs {
		c.t.Logf("--- %s output:\n%s", p.name, tail(p.out.String()))
	}
}

func namef(format string, args ...any) string { return fmt.Sprintf(format, args...) }

func tail(s string) string {
	sc := bufio.NewScanner(bytes.NewBufferString(s))
	var lines []string
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	if len(lines) > 40 {
		lines = lines[len(lines)-40:]
	}
	var b bytes.Buffer
	for _, l := range lines {
		b.WriteString(l + "\n")
	}
	return b.String()
}
