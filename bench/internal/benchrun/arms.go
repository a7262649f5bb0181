package benchrun

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/recmesh/recmesh/bench/pyarm"
)

// server is a started arm.
type server struct {
	addr string
	// pid is the root process the monitor watches with its descendants.
	pid  int
	stop func() error
}

// armSpec is an arm name taken apart.
type armSpec struct {
	name string
	// mesh is true for recmesh-<mode>[-lean]; mode is its --batch-mode,
	// transport its frontends' --transport.
	mesh      bool
	mode      string
	transport string
	// py is the Python arm's server.py --mode (pyarm.Modes).
	py string
}

// meshModes are the embedder's batching modes, each a recmesh-<mode> arm.
var meshModes = []string{"slo", "full", "model", "none"}

// leanSuffix marks a mesh arm whose frontends serve with the lean
// transport (frontend --transport lean) instead of grpc-go.
const leanSuffix = "-lean"

// armNames lists every arm benchrun knows, in report order.
func armNames() []string {
	var names []string
	for _, m := range meshModes {
		names = append(names, "recmesh-"+m)
	}
	for _, m := range meshModes {
		names = append(names, "recmesh-"+m+leanSuffix)
	}
	return append(names, pyarm.Modes...)
}

func parseArm(name string) (armSpec, error) {
	if mode, ok := strings.CutPrefix(name, "recmesh-"); ok {
		transport := "grpc"
		if m, lean := strings.CutSuffix(mode, leanSuffix); lean {
			mode, transport = m, "lean"
		}
		if slices.Contains(meshModes, mode) {
			return armSpec{name: name, mesh: true, mode: mode, transport: transport}, nil
		}
	}
	if slices.Contains(pyarm.Modes, name) {
		return armSpec{name: name, py: name}, nil
	}
	return armSpec{}, fmt.Errorf("unknown arm %q (want one of %s)", name, strings.Join(armNames(), ", "))
}

// batching reports whether the arm is a Python design with a dynamic
// batcher.
func (s armSpec) batching() bool { return s.py == "py-batch" || s.py == "py-mp-batch" }

// multi reports whether the arm's instance count is a number of Python
// server processes (rather than mesh frontends, or nothing for py).
func (s armSpec) multi() bool { return s.py != "" && pyarm.MultiProcess(s.py) }

// instances is how many frontends (mesh) or processes (py-mp) the arm
// runs with in the sweep.
func (c *config) instances(spec armSpec) int {
	if spec.multi() {
		return c.server.pyProcesses
	}
	return c.server.frontends
}

// detail describes the arm as started with n instances (0: as in the
// sweep).
func (c *config) detail(spec armSpec, n int) string {
	if spec.mesh {
		if n == 0 {
			n = c.server.frontends
		}
		return fmt.Sprintf("recmesh run --batch-mode %s, %s (--transport %s)", spec.mode, count(n, "frontend"), spec.transport)
	}
	threads := strconv.Itoa(c.server.pyWorkers)
	if spec.batching() {
		threads = "256"
	}
	if spec.multi() {
		if n == 0 {
			n = c.server.pyProcesses
		}
		return fmt.Sprintf("server.py --mode %s, %s × %s gRPC threads", spec.py, count(n, "frontend process"), threads)
	}
	return fmt.Sprintf("server.py --mode %s, 1 process × %s gRPC threads", spec.py, threads)
}

// count writes n things, in the plural unless n is 1.
func count(n int, thing string) string {
	switch {
	case n == 1:
		return "1 " + thing
	case strings.HasSuffix(thing, "s"):
		return fmt.Sprintf("%d %ses", n, thing)
	}
	return fmt.Sprintf("%d %ss", n, thing)
}

// pinPrefix is the command an arm runs under to be pinned to the server
// CPUs and, for the Python arms, put under the server scheduling policy
// (nil when neither applies). taskset and chrt exec their command, so
// the arm's PID is the server's own, and children inherit both. The mesh
// chooses its policy itself (startMesh sets RECMESH_SCHED_BATCH).
func (c *config) pinPrefix(python bool) ([]string, error) {
	var prefix []string
	if c.server.cpus != "" {
		path, err := exec.LookPath("taskset")
		if err != nil {
			return nil, fmt.Errorf("pinning the server to %s needs taskset (util-linux): %w", c.server.cpus, err)
		}
		prefix = append(prefix, path, "-c", c.server.cpus)
	}
	if python && c.server.sched == "batch" {
		path, err := exec.LookPath("chrt")
		if err != nil {
			return nil, fmt.Errorf("-server-sched batch needs chrt (util-linux): %w", err)
		}
		prefix = append(prefix, path, "--batch", "0")
	}
	return prefix, nil
}

// startArm starts spec with n frontends (mesh) or processes (py-mp),
// logging to logPath, and waits until it serves.
func (c *config) startArm(ctx context.Context, spec armSpec, n int, logPath string) (*server, error) {
	prefix, err := c.pinPrefix(!spec.mesh)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Dir(logPath), 0o755); err != nil {
		return nil, fmt.Errorf("arm %s: %w", spec.name, err)
	}
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("arm %s: %w", spec.name, err)
	}
	rctx, cancel := context.WithTimeout(ctx, c.server.readyTimeout)
	defer cancel()
	var s *server
	if spec.mesh {
		s, err = c.startMesh(rctx, spec, n, prefix, logf)
	} else {
		s, err = c.startPython(rctx, spec, n, prefix, logf)
	}
	if err != nil {
		logf.Close()
		return nil, err
	}
	stop := s.stop
	s.stop = func() error {
		err := stop()
		logf.Close()
		return err
	}
	return s, nil
}

func (c *config) startPython(ctx context.Context, spec armSpec, n int, prefix []string, log io.Writer) (*server, error) {
	cfg, err := readConfig(c.bundle)
	if err != nil {
		return nil, fmt.Errorf("arm %s: %w", spec.name, err)
	}
	if avail, ok := meminfo("MemAvailable"); ok {
		if err := checkFits(spec, n, cfg.TableBytes(), avail<<10); err != nil {
			return nil, fmt.Errorf("arm %s: %w", spec.name, err)
		}
	}
	o := pyarm.Options{
		Paths:   c.pyPaths(),
		Mode:    spec.py,
		Bundle:  c.bundle,
		Workers: c.server.pyWorkers,
		WarmMax: c.warmMax(),
		Prefix:  prefix,
		Log:     log,
	}
	if spec.batching() {
		// A batching arm's gRPC threads mostly wait for their batch, so
		// -py-workers would cap a batch at that many requests; and merged
		// batches reach any bucket up to 4096. The server's own defaults
		// (256 threads, every bucket compiled before READY) are the ones
		// its author chose for that.
		o.Workers, o.WarmMax = 0, 0
	}
	if spec.multi() {
		o.Processes = n
	}
	ps, err := pyarm.Start(ctx, o)
	if err != nil {
		return nil, fmt.Errorf("arm %s: %w", spec.name, err)
	}
	return &server{addr: ps.Addr, pid: ps.PID(), stop: func() error { return ps.Stop(30 * time.Second) }}, nil
}

// warmMax is the largest bucket the Python arms compile before READY: the
// largest B_req (and the parity check's 128), rounded up to a power of
// two, so no compilation lands in a measured window.
func (c *config) warmMax() int {
	m := 128
	for _, b := range append([]int{c.memory.batch}, c.load.batches...) {
		m = max(m, b)
	}
	w := 1
	for w < m {
		w *= 2
	}
	return w
}

// freePort asks the kernel for a free loopback port. The mesh's
// frontends share a port with SO_REUSEPORT and need it named up front; the
// small race until they bind is harmless on a benchmark machine.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func (c *config) startMesh(ctx context.Context, spec armSpec, n int, prefix []string, log io.Writer) (*server, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	args := []string{filepath.Join(c.bin, "recmesh"), "run", "--bundle", c.bundle, "--bin-dir", c.bin,
		"--frontends", strconv.Itoa(n), "--port", strconv.Itoa(port), "--batch-mode", spec.mode,
		// A segment of its own, so a mesh the user runs beside the
		// benchmark (default segment "recmesh") is left alone.
		"--segment", fmt.Sprintf("bench-%s-%s-%d", spec.mode, spec.transport, os.Getpid())}
	args = append(prefix, args...)
	cmd := exec.Command(args[0], args[1:]...)
	// Every child of `recmesh run` gets this environment: port 0 gives each
	// its own free metrics port, so nothing clashes with the fixed
	// defaults (127.0.0.1:9102, :9103, :9110-9125) of a mesh already running.
	cmd.Env = append(os.Environ(), "RECMESH_METRICS_ADDR=127.0.0.1:0", "RECMESH_TRANSPORT="+spec.transport,
		"RECMESH_SCHED_BATCH="+strconv.FormatBool(c.server.sched == "batch"))
	// Its own process group, so a stop that has to kill reaches the whole
	// mesh; and SIGTERM if the runner dies first.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("arm %s: %w", spec.name, err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("arm %s: start %s: %w", spec.name, args[0], err)
	}
	ready := make(chan struct{})
	done := make(chan error, 1)
	tail := &lastLines{max: 30}
	go func() {
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		signalled := false
		for sc.Scan() {
			line := sc.Text()
			fmt.Fprintln(log, line)
			tail.add(line)
			if !signalled && strings.HasPrefix(line, "mesh: ready") {
				signalled = true
				close(ready)
			}
		}
		io.Copy(io.Discard, out)
		done <- cmd.Wait()
		close(done)
	}()
	pid := cmd.Process.Pid
	var waitErr error
	exited := false
	stop := func() error {
		if exited {
			return waitErr
		}
		syscall.Kill(pid, syscall.SIGTERM)
		select {
		case waitErr = <-done:
		case <-time.After(30 * time.Second):
			syscall.Kill(-pid, syscall.SIGKILL)
			waitErr = <-done
			waitErr = errors.Join(fmt.Errorf("arm %s: mesh did not stop within 30 s; killed", spec.name), waitErr)
		}
		exited = true
		// Children that outlived the mesh's own shutdown go too.
		syscall.Kill(-pid, syscall.SIGKILL)
		var ee *exec.ExitError
		if errors.As(waitErr, &ee) && ee.Exited() && ee.ExitCode() == 0 {
			waitErr = nil
		}
		return waitErr
	}
	select {
	case <-ready:
		return &server{addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), pid: pid, stop: stop}, nil
	case waitErr = <-done:
		exited = true
		syscall.Kill(-pid, syscall.SIGKILL)
		return nil, fmt.Errorf("arm %s: mesh exited before ready (%v); its last lines:\n%s", spec.name, waitErr, tail)
	case <-ctx.Done():
		stop()
		return nil, fmt.Errorf("arm %s: mesh not ready: %w; its last lines:\n%s", spec.name, context.Cause(ctx), tail)
	}
}

// lastLines keeps the tail of a log for error messages.
type lastLines struct {
	max   int
	mu    sync.Mutex
	lines []string
}

func (l *lastLines) add(s string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, s)
	if len(l.lines) > l.max {
		l.lines = l.lines[len(l.lines)-l.max:]
	}
}

func (l *lastLines) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "\n")
}
