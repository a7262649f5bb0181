// Package pyarm starts and stops the Python baseline servers of
// bench/python/server.py (the arms in Modes), so the load generator, the
// parity check and the tests can drive them like any other OIP v2 server.
package pyarm

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Modes are server.py's arms: py (one process, no batching), py-batch (one
// process, dynamic batching), py-mp (SO_REUSEPORT frontends feeding one
// device-owner process over shared memory, one call per request),
// py-mp-batch (the same with a dynamic batcher per frontend and a zero-wait
// merger in the device owner) and py-mp-local (SO_REUSEPORT copies of py).
var Modes = []string{"py", "py-batch", "py-mp", "py-mp-batch", "py-mp-local"}

// MultiProcess reports whether mode runs several processes, the count set
// by Options.Processes.
func MultiProcess(mode string) bool {
	return strings.HasPrefix(mode, "py-mp")
}

// Paths locate the Python side.
type Paths struct {
	// Python is the interpreter of the bench venv, which has the pinned
	// requirements of bench/python/requirements.txt.
	Python string
	// Script is bench/python/server.py.
	Script string
	// Stubs is the directory of the generated grpc_service_pb2*.py.
	Stubs string
}

// DefaultPaths returns where `make bench-py-deps` installs everything,
// below the repository root.
func DefaultPaths(root string) Paths {
	return Paths{
		Python: filepath.Join(root, ".deps", "bench-venv", "bin", "python"),
		Script: filepath.Join(root, "bench", "python", "server.py"),
		Stubs:  filepath.Join(root, ".deps", "bench-pygen"),
	}
}

// Check reports what is missing, naming the make target that installs it.
func (p Paths) Check() error {
	for _, f := range []string{p.Python, p.Script, filepath.Join(p.Stubs, "grpc_service_pb2.py"), filepath.Join(p.Stubs, "grpc_service_pb2_grpc.py")} {
		if _, err := os.Stat(f); err != nil {
			return fmt.Errorf("pyarm: %w (run `make bench-py-deps`)", err)
		}
	}
	return nil
}

// Options describe one server.
type Options struct {
	Paths
	// Mode is one of Modes.
	Mode string
	// Host and Port to listen on (default 127.0.0.1, and 0 = pick a free
	// port; the chosen one is in Server.Addr).
	Host string
	Port int
	// Bundle is the bundle directory.
	Bundle string
	// Workers is gRPC threads per process; Processes the process (py-mp*:
	// frontend) count of a MultiProcess mode, ignored by the others;
	// WarmMax the largest bucket compiled before ready. Zero takes
	// server.py's defaults.
	Workers, Processes, WarmMax int
	// Args are further server.py flags.
	Args []string
	// Env is added to this process's environment.
	Env []string
	// Prefix, when set, is a command the interpreter runs under, for
	// example {"taskset", "-c", "0-7"} to pin the arm; it must exec the
	// interpreter (as taskset does), so the PID stays the server's.
	Prefix []string
	// Log receives the server's stderr (discarded if nil); the last lines
	// are also kept for error messages.
	Log io.Writer
}

// Server is a running Python arm.
type Server struct {
	// Addr is host:port, once ready.
	Addr string

	cmd  *exec.Cmd
	done chan struct{} // closed when the process has been waited for
	err  error         // the wait's result, valid once done is closed
	tail *tailBuffer
}

// Start launches the server and waits until it says READY (bundle loaded,
// warm-up compiled, every process ready), the process exits, or ctx ends.
// The process leads its own process group, so Stop reaches the children of
// the multi-process modes too.
func Start(ctx context.Context, o Options) (*Server, error) {
	if !slices.Contains(Modes, o.Mode) {
		return nil, fmt.Errorf("pyarm: unknown mode %q (want one of %s)", o.Mode, strings.Join(Modes, ", "))
	}
	if err := o.Paths.Check(); err != nil {
		return nil, err
	}
	if o.Host == "" {
		o.Host = "127.0.0.1"
	}
	if !MultiProcess(o.Mode) {
		o.Processes = 0
	}
	args := []string{o.Script, "--mode", o.Mode, "--host", o.Host, "--port", strconv.Itoa(o.Port),
		"--bundle", o.Bundle, "--stubs", o.Stubs}
	for flag, v := range map[string]int{"--workers": o.Workers, "--processes": o.Processes, "--warm-max": o.WarmMax} {
		if v > 0 {
			args = append(args, flag, strconv.Itoa(v))
		}
	}
	args = append(args, o.Args...)
	cmd := exec.Command(o.Python, args...)
	if len(o.Prefix) > 0 {
		cmd = exec.Command(o.Prefix[0], append(append(o.Prefix[1:len(o.Prefix):len(o.Prefix)], o.Python), args...)...)
	}
	cmd.Env = append(os.Environ(), o.Env...)
	// Its own process group, so a stop reaches every process of the arm;
	// and a SIGTERM if we die first, so no server outlives its test. (The
	// kernel sends Pdeathsig when the forking *thread* exits; the Go
	// runtime ends a thread only when a goroutine exits while locked to
	// it, which nothing that calls Start does.)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	s := &Server{cmd: cmd, done: make(chan struct{}), tail: &tailBuffer{max: 40}}
	logw := io.Writer(s.tail)
	if o.Log != nil {
		logw = io.MultiWriter(s.tail, o.Log)
	}
	cmd.Stderr = logw
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("pyarm: %w", err)
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("pyarm: start %s: %w", o.Script, err)
	}
	ready := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if addr, ok := strings.CutPrefix(sc.Text(), "READY "); ok {
				select {
				case ready <- addr:
				default:
				}
			}
		}
		// Drain to EOF: the pipe must be read until the process exits.
		io.Copy(io.Discard, stdout)
	}()
	go func() {
		s.err = cmd.Wait()
		close(s.done)
	}()
	select {
	case s.Addr = <-ready:
		return s, nil
	case <-s.done:
		return nil, fmt.Errorf("pyarm: %s %s exited before ready (%v); its last lines:\n%s", o.Mode, o.Script, s.err, s.tail)
	case <-ctx.Done():
		s.Stop(5 * time.Second)
		return nil, fmt.Errorf("pyarm: %s not ready: %w; its last lines:\n%s", o.Mode, context.Cause(ctx), s.tail)
	}
}

// PID is the server's (multi-process modes: the supervisor's) process id;
// it is also the process group of every process of the arm.
func (s *Server) PID() int { return s.cmd.Process.Pid }

// Exited reports whether the server process has ended.
func (s *Server) Exited() bool {
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}

// Stop sends SIGTERM to the server's process group and waits up to grace
// for it to exit, then sends SIGKILL. It returns nil after a clean exit.
func (s *Server) Stop(grace time.Duration) error {
	pgid := s.cmd.Process.Pid
	syscall.Kill(-pgid, syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(grace):
		syscall.Kill(-pgid, syscall.SIGKILL)
		<-s.done
		return fmt.Errorf("pyarm: server %d did not stop within %v; killed", pgid, grace)
	}
	// Children that ignored the group signal are killed too.
	syscall.Kill(-pgid, syscall.SIGKILL)
	var ee *exec.ExitError
	if s.err != nil && !(errors.As(s.err, &ee) && ee.Exited() && ee.ExitCode() == 0) {
		return fmt.Errorf("pyarm: server %d: %w; its last lines:\n%s", pgid, s.err, s.tail)
	}
	return nil
}

// tailBuffer keeps the last max lines written to it.
type tailBuffer struct {
	mu    sync.Mutex
	max   int
	lines []string
	part  string
}

func (b *tailBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	text := b.part + string(p)
	lines := strings.Split(text, "\n")
	b.part = lines[len(lines)-1]
	b.lines = append(b.lines, lines[:len(lines)-1]...)
	if over := len(b.lines) - b.max; over > 0 {
		b.lines = b.lines[over:]
	}
	return len(p), nil
}

func (b *tailBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return strings.Join(append(b.lines, b.part), "\n")
}
