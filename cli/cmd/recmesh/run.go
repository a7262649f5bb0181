package main

import (
	"bufio"
	"context"
	"errors"
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

	natsserver "github.com/nats-io/nats-server/v2/server"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
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

func runMesh(ctx context.Context, e *env, args []string) error {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	bundle := fs.String("bundle", "data/dlrm-cap1000", "model bundle `dir`")
	frontends := fs.Int("frontends", 2, "frontend processes sharing the gRPC port")
	port := fs.Int("port", 8001, "gRPC port of the frontends")
	binDir := fs.String("bin-dir", "", "`dir` holding the embedder, accelerator and frontend binaries (default: beside recmesh)")
	segment := fs.String("segment", "recmesh", "shared-memory segment name")
	mode := fs.String("batch-mode", "slo", "embedder batching: slo, none, model or full (see embedder -h)")
	target := fs.Duration("latency-target", 20*time.Millisecond, "end-to-end p99 budget: slo batching sizes batches and sheds load for it, frontends count misses of it")
	natsURL := fs.String("nats-url", "", "NATS server (env NATS_URL); empty starts an embedded one")
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

	if *natsURL == "" {
		ns, err := startNATS()
		if err != nil {
			return err
		}
		defer ns.Shutdown()
		*natsURL = ns.ClientURL()
		fmt.Fprintf(e.stdout, "mesh: embedded NATS at %s\n", *natsURL)
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	m := &mesh{out: e.stdout, exited: make(chan string, 8+*frontends)}
	common := []string{
		"NATS_URL=" + *natsURL,
		"RECMESH_BUNDLE=" + *bundle,
		"RECMESH_SEGMENT=" + *segment,
		"RECMESH_LATENCY_TARGET=" + target.String(),
	}
	bin := func(name string) string { return filepath.Join(*binDir, name) }
	if err := m.start("embedder", common, bin("embedder"), "--batch-mode", *mode); err != nil {
		return err
	}
	if err := m.start("accelerator", common, bin("accelerator"), "serve"); err != nil {
		m.stop()
		return err
	}
	for i := 0; i < *frontends; i++ {
		if err := m.start(fmt.Sprintf("frontend-%d", i), common, bin("frontend"), "--port", strconv.Itoa(*port)); err != nil {
			m.stop()
			return err
		}
	}
	defer m.stop()

	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(*port))
	if err := waitServing(ctx, addr, m.exited); err != nil {
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

func startNATS() (*natsserver.Server, error) {
	opts := &natsserver.Options{Host: "127.0.0.1", Port: natsserver.RANDOM_PORT, NoSigs: true, NoLog: true}
	ns, err := natsserver.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("run: embedded NATS: %w", err)
	}
	ns.Start()
	if !ns.ReadyForConnections(5 * time.Second) {
		ns.Shutdown()
		return nil, errors.New("run: embedded NATS did not start")
	}
	return ns, nil
}

// mesh supervises the child processes.
type mesh struct {
	out    io.Writer
	mu     sync.Mutex
	procs  []*exec.Cmd
	names  []string
	exited chan string
	wg     sync.WaitGroup
	outMu  sync.Mutex
}

func (m *mesh) start(name string, env []string, path string, args ...string) error {
	cmd := exec.Command(path, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("run: start %s: %w", name, err)
	}
	m.mu.Lock()
	m.procs = append(m.procs, cmd)
	m.names = append(m.names, name)
	m.mu.Unlock()
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			m.outMu.Lock()
			fmt.Fprintf(m.out, "%-12s| %s\n", name, sc.Text())
			m.outMu.Unlock()
		}
		_ = cmd.Wait()
		select {
		case m.exited <- name:
		default:
		}
	}()
	return nil
}

// stop sends SIGTERM to frontends first (they drain), then the
// accelerator, then the embedder, waiting for each group.
func (m *mesh) stop() {
	m.mu.Lock()
	procs, names := m.procs, m.names
	m.procs, m.names = nil, nil
	m.mu.Unlock()
	for i := len(procs) - 1; i >= 0; i-- {
		p := procs[i]
		if p.Process == nil || p.ProcessState != nil {
			continue
		}
		_ = p.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() {
			for p.ProcessState == nil {
				time.Sleep(10 * time.Millisecond)
			}
			close(done)
		}()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			fmt.Fprintf(m.out, "mesh: %s did not stop; killing it\n", names[i])
			_ = p.Process.Kill()
		}
	}
	m.wg.Wait()
}

// waitServing polls the frontends' gRPC health until SERVING. Frontends
// listen only once ready (so no call reaches one that is not), so each
// poll dials anew: a client refused before that would back off for
// seconds.
func waitServing(ctx context.Context, addr string, exited <-chan string) error {
	deadline := time.Now().Add(meshReadyTimeout)
	for time.Now().Before(deadline) {
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
