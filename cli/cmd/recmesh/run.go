package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/recmesh/recmesh/cli/internal/meshnats"
	"github.com/recmesh/recmesh/model"
	"github.com/recmesh/recmesh/proto/control"
)

func init() {
	register(&command{
		name:    "run",
		summary: "start the whole mesh on this machine (NATS, embedder, accelerator, frontends) until Ctrl-C",
		run:     runMesh,
	})
}

// meshReadyTimeout bounds start-up: loading tables and compiling thirteen
// buckets takes seconds on the small default model.
const meshReadyTimeout = 3 * time.Minute

// progressEvery is how often a long start-up says it is still going.
const progressEvery = 10 * time.Second

func runMesh(ctx context.Context, e *env, args []string) error {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	bundle := fs.String("bundle", model.DefaultDevBundle, "model bundle `dir`")
	frontends := fs.Int("frontends", 2, "frontend processes sharing the gRPC port")
	port := fs.Int("port", 8001, "gRPC port of the frontends")
	binDir := fs.String("bin-dir", "", "`dir` holding the embedder, accelerator and frontend binaries (default: beside recmesh)")
	segment := fs.String("segment", "recmesh", "shared-memory segment name")
	mode := fs.String("batch-mode", "slo", "embedder batching: slo, none, model or full (see embedder -h)")
	target := fs.Duration("latency-target", model.DefaultLatencyTarget, "end-to-end p99 budget: slo batching sizes batches and sheds load for it, frontends count misses of it")
	natsURL := fs.String("nats-url", "", "NATS server (env NATS_URL); empty starts an embedded one")
	jsDir := fs.String("jetstream-dir", "", "`dir` where the embedded NATS keeps its JetStream streams (fresh embeddings' row updates and dense weights), so they outlive a restart of the mesh: a bundle's tables include updates only up to its export (default <model root>/"+jetstreamDirName+"; the model root is RECMESH_MODEL_ROOT, else the directory holding --bundle; unused with --nats-url)")
	if err := parseFlags(fs, args, e); err != nil {
		return err
	}
	if *frontends < 1 || *frontends > 64 {
		return usagef("--frontends %d: want 1..64", *frontends)
	}
	if *target < time.Millisecond || *target > time.Minute {
		return usagef("--latency-target %v: want 1ms..1m", *target)
	}
	if *natsURL == "" {
		*natsURL = e.getenv("NATS_URL")
	}
	if _, err := os.Stat(filepath.Join(*bundle, "model.safetensors")); err != nil {
		return usagef("--bundle %s: %v (make run exports the default bundle; or run recmesh export)", *bundle, err)
	}
	// The processes start on a rolled-out model recorded in the model
	// root, not on --bundle: say so, since it surprises after a restart.
	if root, err := model.OpenRoot(filepath.Dir(*bundle)); err == nil {
		if dir, resumed, err := root.StartBundle(*bundle); err != nil {
			return fmt.Errorf("run: %w", err)
		} else if resumed {
			fmt.Fprintf(e.stdout, "mesh: serving %s, the model rolled out last (recorded in %s), not --bundle; delete that file to go back\n",
				dir, filepath.Join(root.Dir(), model.ServingFile))
		}
	}
	if *binDir == "" {
		exe, err := os.Executable()
		if err != nil {
			return err
		}
		*binDir = filepath.Dir(exe)
	}
	for _, b := range []string{"embedder", "accelerator", "frontend"} {
		if _, err := os.Stat(filepath.Join(*binDir, b)); err != nil {
			return usagef("--bin-dir %s: no %s binary (make build puts them in bin/)", *binDir, b)
		}
	}

	// roleEnv is the control-plane environment of a process of role:
	// with an embedded server, its own identity; with the user's server,
	// whatever NATS_* environment the user gave (inherited).
	roleEnv := func(control.Role) []string { return []string{"NATS_URL=" + *natsURL} }
	if *natsURL == "" {
		if *jsDir == "" {
			*jsDir = filepath.Join(runModelRoot(e, *bundle), jetstreamDirName)
		}
		ns, err := meshnats.StartWith(meshnats.Options{StoreDir: *jsDir})
		if err != nil {
			return fmt.Errorf("run: %w (--jetstream-dir chooses where JetStream stores)", err)
		}
		defer ns.Shutdown()
		*natsURL = ns.ClientURL()
		roleEnv = ns.Env
		fmt.Fprintf(e.stdout, "mesh: embedded NATS at %s (JetStream in %s), closed to clients without a mesh identity; as the operator:\n  export NATS_URL=%s NATS_NKEY=%s\n  (a trainer: NATS_NKEY=%s)\n",
			*natsURL, *jsDir, *natsURL, ns.Seed(control.RoleAdmin), ns.Seed(control.RoleTrainer))
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	m := &mesh{out: e.stdout, exited: make(chan string, 8+*frontends)}
	common := []string{
		"RECMESH_BUNDLE=" + *bundle,
		"RECMESH_SEGMENT=" + *segment,
		"RECMESH_LATENCY_TARGET=" + target.String(),
	}
	env := func(role control.Role) []string { return append(roleEnv(role), common...) }
	bin := func(name string) string { return filepath.Join(*binDir, name) }
	// The accelerator's key, which the embedder makes and the accelerator
	// presents, is given to those two alone: no frontend can ask for the
	// accelerator's place (docs/security.md says what the key does and
	// does not keep out where every process is the same user).
	keyDir, err := os.MkdirTemp("", "recmesh-run-")
	if err != nil {
		return fmt.Errorf("run: %w", err)
	}
	defer os.RemoveAll(keyDir)
	keyEnv := "RECMESH_ACCELERATOR_KEY_FILE=" + filepath.Join(keyDir, "accelerator.key")
	if err := m.start("embedder", append(env(control.RoleEmbedder), keyEnv), bin("embedder"), "--batch-mode", *mode); err != nil {
		return err
	}
	if err := m.start("accelerator", append(env(control.RoleAccelerator), keyEnv), bin("accelerator"), "serve"); err != nil {
		m.stop()
		return err
	}
	for i := 0; i < *frontends; i++ {
		if err := m.start(fmt.Sprintf("frontend-%d", i), env(control.RoleFrontend), bin("frontend"), "--port", strconv.Itoa(*port)); err != nil {
			m.stop()
			return err
		}
	}
	defer m.stop()

	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(*port))
	if err := waitServing(ctx, addr, m.exited, e.stdout); err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, `
mesh: ready — %d frontends on %s (Open Inference Protocol v2, model "dlrm")
  try:  bin/recmesh predict --addr %s
        grpcurl -plaintext -d '{"name":"dlrm"}' %s inference.GRPCInferenceService/ModelMetadata
  Ctrl-C stops everything.
`, *frontends, addr, addr, addr)

	select {
	case <-ctx.Done():
		fmt.Fprintln(e.stdout, "mesh: stopping")
		return nil
	case name := <-m.exited:
		return fmt.Errorf("run: %s exited; stopping the mesh", name)
	}
}

// jetstreamDirName is the directory under the model root where recmesh
// run's embedded NATS keeps its streams by default. A dot-name, so it is
// not mistaken for a bundle.
const jetstreamDirName = ".jetstream"

// runModelRoot is the model root the processes of recmesh run use: the
// embedder's and the accelerator's --model-root default, or the
// RECMESH_MODEL_ROOT they inherit.
func runModelRoot(e *env, bundle string) string {
	if root := e.getenv("RECMESH_MODEL_ROOT"); root != "" {
		return root
	}
	return filepath.Dir(bundle)
}

// stopGrace is how long a child may take to stop after SIGTERM (a
// frontend drains its calls) before it is killed.
const stopGrace = 10 * time.Second

// mesh supervises the child processes.
type mesh struct {
	out      io.Writer
	grace    time.Duration // SIGTERM to SIGKILL; 0 means stopGrace
	outMu    sync.Mutex
	mu       sync.Mutex
	children []*child
	exited   chan string
}

// child is one supervised process. Its command runs under its own
// context: cancelling it sends SIGTERM, and Wait kills the process when it
// has not exited stopGrace later (exec.Cmd's Cancel and WaitDelay), so
// stopping never races the goroutine that waits for it.
type child struct {
	name   string
	cmd    *exec.Cmd
	cancel context.CancelFunc
	done   chan struct{} // closed once the process exited and its output is flushed
}

func (m *mesh) start(name string, env []string, path string, args ...string) error {
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, path, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = m.grace
	if cmd.WaitDelay <= 0 {
		cmd.WaitDelay = stopGrace
	}
	dieWithParent(cmd)
	out := &prefixWriter{m: m, prefix: fmt.Sprintf("%-12s| ", name)}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		cancel()
		return fmt.Errorf("run: start %s: %w", name, err)
	}
	c := &child{name: name, cmd: cmd, cancel: cancel, done: make(chan struct{})}
	m.mu.Lock()
	m.children = append(m.children, c)
	m.mu.Unlock()
	go func() {
		_ = cmd.Wait()
		out.flush()
		close(c.done)
		select {
		case m.exited <- name:
		default:
		}
	}()
	return nil
}

// stop stops the children in the reverse of their start order: the
// frontends first (they drain), then the accelerator, then the embedder,
// each gone before the next is asked.
func (m *mesh) stop() {
	m.mu.Lock()
	children := m.children
	m.children = nil
	m.mu.Unlock()
	for i := len(children) - 1; i >= 0; i-- {
		c := children[i]
		c.cancel()
		select {
		case <-c.done:
		case <-time.After(max(m.grace, stopGrace) + 5*time.Second):
			fmt.Fprintf(m.out, "mesh: %s did not stop after SIGKILL\n", c.name)
		}
	}
}

// prefixWriter writes a child's output to the mesh's, line by line, each
// line prefixed with the child's name.
type prefixWriter struct {
	m      *mesh
	prefix string
	buf    []byte
}

func (w *prefixWriter) Write(p []byte) (int, error) {
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			break
		}
		w.line(w.buf[:i])
		w.buf = w.buf[i+1:]
	}
	if len(w.buf) > 1<<20 { // a line that never ends: show it anyway
		w.line(w.buf)
		w.buf = w.buf[:0]
	}
	return len(p), nil
}

func (w *prefixWriter) flush() {
	if len(w.buf) > 0 {
		w.line(w.buf)
		w.buf = w.buf[:0]
	}
}

func (w *prefixWriter) line(b []byte) {
	w.m.outMu.Lock()
	defer w.m.outMu.Unlock()
	fmt.Fprintf(w.m.out, "%s%s\n", w.prefix, b)
}

// waitServing polls the frontends' gRPC health until SERVING. Frontends
// listen only once ready (so no call reaches one that is not), so each
// poll dials anew: a client refused before that would back off for
// seconds.
// It says every progressEvery that it is still waiting, since loading
// large tables and compiling every bucket can take minutes.
func waitServing(ctx context.Context, addr string, exited <-chan string, out io.Writer) error {
	start := time.Now()
	deadline := start.Add(meshReadyTimeout)
	next := start.Add(progressEvery)
	for time.Now().Before(deadline) {
		if now := time.Now(); now.After(next) {
			fmt.Fprintf(out, "mesh: still starting after %s (the embedder loads the tables, the accelerator compiles every batch bucket)\n", now.Sub(start).Round(time.Second))
			next = now.Add(progressEvery)
		}
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return err
		}
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		resp, err := healthpb.NewHealthClient(conn).Check(cctx, &healthpb.HealthCheckRequest{})
		cancel()
		conn.Close()
		if err == nil && resp.Status == healthpb.HealthCheckResponse_SERVING {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case name := <-exited:
			return fmt.Errorf("run: %s exited during start-up", name)
		case <-time.After(200 * time.Millisecond):
		}
	}
	return fmt.Errorf("run: the mesh was not ready after %v", meshReadyTimeout)
}
