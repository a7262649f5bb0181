//go:build linux

package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/recmesh/recmesh/model"
	pb "github.com/recmesh/recmesh/proto/inference"
	"github.com/recmesh/recmesh/proto/oip"
)

// TestCompose runs compose.yaml for real with docker compose (make
// compose-test builds the images and starts an engine first; see
// docs/deployment.md): three frontends serving Triton's client through the
// published port; a scale to five and back to two under load with no
// failed call; a frontend and then the embedder SIGKILLed and brought back
// by the restart policy, with the others re-attaching by themselves; one
// request's trace read back from Jaeger's query API; and `down` leaving
// nothing behind. It ends with the `compose ok:` line.
//
// Environment: RECMESH_COMPOSE_TEST=1 turns it on; RECMESH_COMPOSE is the
// compose command ("docker compose"); RECMESH_COMPOSE_FILES the files,
// colon-separated (compose.yaml); RECMESH_COMPOSE_STEERING is the
// frontends' steering mode the test expects (ebpf or kernel-hash).
func TestCompose(t *testing.T) {
	if os.Getenv("RECMESH_COMPOSE_TEST") == "" {
		t.Skip("set RECMESH_COMPOSE_TEST=1 (make compose-test) to run the mesh under docker compose")
	}
	py, root := clientPython(t)
	dc := newComposeProject(t, root)
	shmBefore := hostSegments(t)
	dc.down() // what an earlier, interrupted run left
	downed := false
	t.Cleanup(func() {
		if !downed {
			dc.dumpLogs()
			dc.down()
		}
	})

	// 1. Up with three frontends; every health check passes.
	dc.up(3)
	dc.waitHealthy(3, 10*time.Minute)
	engine := strings.TrimSpace(dc.docker("version", "--format", "{{.Server.Version}}"))
	composeVersion := strings.TrimSpace(dc.compose("version", "--short"))
	steering := dc.steeringModes()
	t.Logf("up: engine %s, compose %s, frontends' steering %v", engine, composeVersion, steering)
	if want := os.Getenv("RECMESH_COMPOSE_STEERING"); want != "" {
		for _, m := range steering {
			if m != want {
				t.Errorf("a frontend steers with %q; want %q (every replica: %v)", m, want, steering)
			}
		}
	}

	// The scores are checked against the reference of the very bundle the
	// mesh serves: copied out of its volume.
	bundle := filepath.Join(t.TempDir(), "bundle")
	dc.compose("cp", "embedder:/data/dlrm-cap1000", bundle)
	w, err := buildWorkload(bundle)
	if err != nil {
		t.Fatal(err)
	}
	tritonCheck(t, py, root, bundle, w.cfg, dc.addr())

	// 2. Scale to five and back to two under load: no call may fail.
	load := startComposeLoad(t, dc, w, 4)
	dc.scale(5)
	dc.waitHealthy(5, 5*time.Minute)
	load.waitCalls(t, 200, 2*time.Minute)
	dc.scale(2)
	dc.waitRunning("frontend", 2, 2*time.Minute)
	load.waitCalls(t, 200, 2*time.Minute)
	load.stop()
	requests, failed := load.calls.Load(), load.failed.Load()
	t.Logf("scale 3 → 5 → 2: %d calls, %d failed, %d wrong; failures %v", requests, failed, load.wrong.Load(), load.errs())
	if failed != 0 || load.wrong.Load() != 0 {
		t.Errorf("scaling failed %d calls and answered %d wrongly; want none: %v", failed, load.wrong.Load(), load.errs())
	}

	// 3. SIGKILL a frontend, then the embedder: the others keep (or go
	// back to) serving, and the restart policy brings each back.
	recovered := 0
	victim := dc.containers("frontend")[0]
	dc.crash(victim)
	serveAgain(t, dc, w, "after a frontend was killed", 2*time.Minute)
	if dc.recovered(victim, 3*time.Minute) {
		recovered++
	}
	dc.waitHealthy(2, 5*time.Minute)
	embedder := dc.containers("embedder")[0]
	dc.crash(embedder)
	if dc.recovered(embedder, 5*time.Minute) {
		recovered++
	}
	serveAgain(t, dc, w, "after the embedder was killed", 3*time.Minute)
	dc.waitHealthy(2, 5*time.Minute)

	// 4. One request, traced end to end, read back from Jaeger.
	spans := traceInJaeger(t, dc, w)

	// 5. Down: nothing of the project is left, and no segment on the host.
	dc.down()
	downed = true
	dc.checkNothingLeft(shmBefore)

	line := fmt.Sprintf("compose ok: engine=%s compose=%s frontends_max=5 requests=%d failed_calls=%d restarts_recovered=%d trace_spans=%d services=frontend,embedder,accelerator,nats,jaeger",
		engine, composeVersion, requests, failed, recovered, spans)
	if t.Failed() || recovered != 2 {
		t.Errorf("not ok: %s", strings.TrimPrefix(line, "compose ok: "))
		return
	}
	fmt.Printf("compose: steering=%s\n", strings.Join(slices.Compact(slices.Sorted(slices.Values(steering))), ","))
	fmt.Println(line)
}

// composeServices are the services the test runs: the mesh and what it
// needs. Prometheus and Grafana cannot be built without a registry, so
// they are checked by parsing (deploy/compose_test.go) and not started.
var composeTestServices = []string{"nats-identities", "nats", "bundle", "mesh", "embedder", "accelerator", "frontend", "jaeger"}

// composeProject runs one compose project of the test.
type composeProject struct {
	t       *testing.T
	root    string
	command []string // the compose command, e.g. docker compose
	files   []string
	name    string
	port    int // the published gRPC port
	jaeger  int // the published Jaeger UI and query port
}

func newComposeProject(t *testing.T, root string) *composeProject {
	command := strings.Fields(os.Getenv("RECMESH_COMPOSE"))
	if len(command) == 0 {
		command = []string{"docker", "compose"}
	}
	files := []string{"compose.yaml"}
	if v := os.Getenv("RECMESH_COMPOSE_FILES"); v != "" {
		files = strings.Split(v, ":")
	}
	return &composeProject{t: t, root: root, command: command, files: files,
		name: "recmesh-test", port: freePort(t), jaeger: freePort(t)}
}

func (dc *composeProject) addr() string { return "127.0.0.1:" + strconv.Itoa(dc.port) }

// run runs a command in the repository root with the project's settings
// in its environment and returns its standard output; a failure fails the
// test with the command's output.
func (dc *composeProject) run(timeout time.Duration, name string, args ...string) string {
	dc.t.Helper()
	out, err := dc.try(timeout, name, args...)
	if err != nil {
		dc.t.Fatalf("%s %s: %v", name, strings.Join(args, " "), err)
	}
	return out
}

func (dc *composeProject) try(timeout time.Duration, name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dc.root
	cmd.Env = append(os.Environ(),
		"COMPOSE_PROJECT_NAME="+dc.name,
		"RECMESH_PORT="+strconv.Itoa(dc.port),
		"JAEGER_UI_PORT="+strconv.Itoa(dc.jaeger),
		// Every request of the test is sampled when the client asks
		// (parent-based), none otherwise: the trace check sends one.
		"RECMESH_TRACE_RATIO=0",
		// This checks availability, not latency, on a machine that runs
		// the engine, Jaeger and the load too: slo batching would shed
		// calls that cannot make 20 ms there (make bench measures that).
		"RECMESH_LATENCY_TARGET=1s")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("%w\n%s%s", err, tail(stdout.String()), tail(stderr.String()))
	}
	return stdout.String(), nil
}

func (dc *composeProject) compose(args ...string) string {
	dc.t.Helper()
	full := append(append(slices.Clone(dc.command[1:]), dc.fileArgs()...), args...)
	return dc.run(10*time.Minute, dc.command[0], full...)
}

func (dc *composeProject) docker(args ...string) string {
	dc.t.Helper()
	return dc.run(2*time.Minute, "docker", args...)
}

func (dc *composeProject) fileArgs() []string {
	var a []string
	for _, f := range dc.files {
		a = append(a, "-f", f)
	}
	return a
}

// up starts the test's services with frontends replicas, from the images
// make images built: nothing is pulled or built here.
func (dc *composeProject) up(frontends int) {
	dc.t.Helper()
	args := append([]string{"up", "-d", "--no-build", "--pull", "never", "--scale", "frontend=" + strconv.Itoa(frontends)}, composeTestServices...)
	dc.compose(args...)
}

// scale changes the frontends' replica count and nothing else.
func (dc *composeProject) scale(frontends int) {
	dc.t.Helper()
	dc.compose("up", "-d", "--no-build", "--pull", "never", "--no-recreate", "--no-deps", "--scale", "frontend="+strconv.Itoa(frontends), "frontend")
}

func (dc *composeProject) down() {
	dc.t.Helper()
	dc.compose("down", "--volumes", "--remove-orphans", "--timeout", "30")
}

// containerState is what the test reads of one container.
type containerState struct {
	ID      string
	Service string
	Running bool
	Health  string // healthy, starting, unhealthy or "" (no health check)
	Pid     int
	Restart int
}

// states inspects the project's containers, all of them or one service's.
func (dc *composeProject) states(service string) []containerState {
	dc.t.Helper()
	filter := []string{"--filter", "label=com.docker.compose.project=" + dc.name}
	if service != "" {
		filter = append(filter, "--filter", "label=com.docker.compose.service="+service)
	}
	ids := strings.Fields(dc.docker(append([]string{"ps", "-aq"}, filter...)...))
	if len(ids) == 0 {
		return nil
	}
	format := `{{.Id}} {{index .Config.Labels "com.docker.compose.service"}} {{.State.Running}} {{if .State.Health}}{{.State.Health.Status}}{{else}}-{{end}} {{.State.Pid}} {{.RestartCount}}`
	out, err := dc.try(time.Minute, "docker", append([]string{"inspect", "--format", format}, ids...)...)
	if err != nil {
		// A container went between ps and inspect (one replaced or
		// removed): what is left is inspected one by one.
		out = ""
		for _, id := range ids {
			if o, err := dc.try(time.Minute, "docker", "inspect", "--format", format, id); err == nil {
				out += o
			}
		}
	}
	var states []containerState
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Fields(line)
		if len(f) != 6 {
			continue // a container removed between ps and inspect
		}
		pid, _ := strconv.Atoi(f[4])
		restarts, _ := strconv.Atoi(f[5])
		health := f[3]
		if health == "-" {
			health = ""
		}
		states = append(states, containerState{ID: f[0], Service: f[1], Running: f[2] == "true", Health: health, Pid: pid, Restart: restarts})
	}
	return states
}

func (dc *composeProject) containers(service string) []string {
	var ids []string
	for _, s := range dc.states(service) {
		if s.Running {
			ids = append(ids, s.ID)
		}
	}
	sort.Strings(ids)
	return ids
}

// waitHealthy waits until nats, jaeger, the embedder, the accelerator and
// exactly frontends frontends run and pass their health checks.
func (dc *composeProject) waitHealthy(frontends int, timeout time.Duration) {
	dc.t.Helper()
	want := map[string]int{"nats": 1, "jaeger": 1, "embedder": 1, "accelerator": 1, "frontend": frontends}
	var last map[string]string
	deadline := time.Now().Add(timeout)
	for {
		healthy := map[string]int{}
		last = map[string]string{}
		for _, s := range dc.states("") {
			last[s.Service+"/"+s.ID[:12]] = fmt.Sprintf("running=%v health=%s", s.Running, s.Health)
			if s.Running && s.Health == "healthy" {
				healthy[s.Service]++
			}
		}
		ok := true
		for svc, n := range want {
			ok = ok && healthy[svc] == n
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			dc.dumpLogs()
			dc.t.Fatalf("services not healthy after %v (want %v): %v", timeout, want, last)
		}
		time.Sleep(time.Second)
	}
}

// waitRunning waits until exactly n containers of service run.
func (dc *composeProject) waitRunning(service string, n int, timeout time.Duration) {
	dc.t.Helper()
	deadline := time.Now().Add(timeout)
	for len(dc.containers(service)) != n {
		if time.Now().After(deadline) {
			dc.t.Fatalf("%s: %d containers running after %v, want %d", service, len(dc.containers(service)), timeout, n)
		}
		time.Sleep(time.Second)
	}
}

// crash SIGKILLs a container's main process from the host, as a crash
// would: unlike `docker kill`, the engine does not record it as stopped by
// the user, so the restart policy applies.
func (dc *composeProject) crash(id string) {
	dc.t.Helper()
	for _, s := range dc.states("") {
		if s.ID == id {
			if err := syscall.Kill(s.Pid, syscall.SIGKILL); err != nil {
				dc.t.Fatalf("SIGKILL %s (%s, pid %d): %v", s.Service, id[:12], s.Pid, err)
			}
			dc.t.Logf("SIGKILLed %s %s (pid %d)", s.Service, id[:12], s.Pid)
			return
		}
	}
	dc.t.Fatalf("no container %s to kill", id)
}

// recovered waits until the restart policy has restarted container id and
// it is running again (and healthy, where it has a health check).
func (dc *composeProject) recovered(id string, timeout time.Duration) bool {
	dc.t.Helper()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		for _, s := range dc.states("") {
			if s.ID == id && s.Restart > 0 && s.Running && s.Health == "healthy" {
				dc.t.Logf("%s %s restarted (%d restarts) and healthy", s.Service, id[:12], s.Restart)
				return true
			}
		}
		time.Sleep(time.Second)
	}
	dc.dumpLogs()
	dc.t.Errorf("container %s not restarted and healthy within %v", id[:12], timeout)
	return false
}

// steeringModes asks the control plane (recmesh status, with the
// operator's identity) how each frontend steers.
func (dc *composeProject) steeringModes() []string {
	dc.t.Helper()
	var modes []string
	deadline := time.Now().Add(time.Minute)
	for {
		out := dc.compose("exec", "-T", "-e", "NATS_NKEY=/nats/admin/admin.nk", "embedder", "recmesh", "status")
		modes = modes[:0]
		for _, line := range strings.Split(out, "\n") {
			if !strings.HasPrefix(line, "recmesh-frontend") {
				continue
			}
			if i := strings.Index(line, "steering "); i >= 0 {
				modes = append(modes, strings.Fields(line[i+len("steering "):])[0])
			}
		}
		if len(modes) == len(dc.containers("frontend")) || time.Now().After(deadline) {
			return modes
		}
		time.Sleep(time.Second)
	}
}

// dumpLogs puts the last lines of every service's log in the test log.
func (dc *composeProject) dumpLogs() {
	out, _ := dc.try(time.Minute, dc.command[0], append(append(slices.Clone(dc.command[1:]), dc.fileArgs()...), "logs", "--no-color", "--tail", "30")...)
	dc.t.Logf("compose logs:\n%s", out)
}

// checkNothingLeft fails the test if any container, volume or network of
// the project, or a segment in the host's /dev/shm that was not there
// before, remains.
func (dc *composeProject) checkNothingLeft(shmBefore []string) {
	dc.t.Helper()
	label := "label=com.docker.compose.project=" + dc.name
	for what, args := range map[string][]string{
		"containers": {"ps", "-aq", "--filter", label},
		"volumes":    {"volume", "ls", "-q", "--filter", label},
		"networks":   {"network", "ls", "-q", "--filter", label},
	} {
		if left := strings.Fields(dc.docker(args...)); len(left) != 0 {
			dc.t.Errorf("down left %d %s: %v", len(left), what, left)
		}
	}
	for _, f := range hostSegments(dc.t) {
		if !slices.Contains(shmBefore, f) {
			dc.t.Errorf("down left %s in the host's /dev/shm", f)
		}
	}
}

func hostSegments(t *testing.T) []string {
	m, err := filepath.Glob("/dev/shm/recmesh*")
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// composeLoad is closed-loop load on the published port, every answer
// checked against the reference.
type composeLoad struct {
	calls, failed, wrong atomic.Int64
	mu                   sync.Mutex
	failures             map[string]int
	done                 chan struct{}
	wg                   sync.WaitGroup
	once                 sync.Once
}

func startComposeLoad(t *testing.T, dc *composeProject, w *workload, clients int) *composeLoad {
	l := &composeLoad{failures: map[string]int{}, done: make(chan struct{})}
	c := &cluster{t: t, port: dc.port}
	callLoop(t, c, w, clients, 10*time.Second, &windows{}, l.done, &l.wg, func(i int, resp *pb.ModelInferResponse, err error, _ callInfo) {
		l.calls.Add(1)
		if err != nil {
			l.failed.Add(1)
			l.mu.Lock()
			l.failures[err.Error()]++
			l.mu.Unlock()
			return
		}
		if got, err := oip.Scores(resp, w.n[i]); err != nil || maxAbsDiff(got, w.want[i]) > 1e-4 {
			l.wrong.Add(1)
		}
	})
	t.Cleanup(l.stop)
	return l
}

func (l *composeLoad) stop() { l.once.Do(func() { close(l.done); l.wg.Wait() }) }

func (l *composeLoad) errs() map[string]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return maps.Clone(l.failures)
}

// waitCalls waits for n more calls to finish.
func (l *composeLoad) waitCalls(t *testing.T, n int64, timeout time.Duration) {
	t.Helper()
	target := l.calls.Load() + n
	deadline := time.Now().Add(timeout)
	for l.calls.Load() < target {
		if time.Now().After(deadline) {
			t.Fatalf("load: %d calls in %v, want %d more", l.calls.Load()-target+n, timeout, n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// serveAgain waits until 50 calls in a row succeed with correct scores
// through the published port.
func serveAgain(t *testing.T, dc *composeProject, w *workload, what string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	streak, failures := 0, 0
	var last error
	for streak < 50 {
		if time.Now().After(deadline) {
			dc.dumpLogs()
			t.Fatalf("%s: no 50 correct calls in a row within %v (%d failures, last %v)", what, timeout, failures, last)
		}
		i := (streak + failures) % len(w.reqs)
		if err := callOnce(dc.addr(), w, i, nil); err != nil {
			streak, last = 0, err
			failures++
			time.Sleep(100 * time.Millisecond)
			continue
		}
		streak++
	}
	t.Logf("%s: serving again (%d calls failed meanwhile, last %v)", what, failures, last)
}

// callOnce makes one call on a new connection and checks its scores; md is
// sent as the call's metadata.
func callOnce(addr string, w *workload, i int, md metadata.MD) error {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if md != nil {
		ctx = metadata.NewOutgoingContext(ctx, md)
	}
	resp, err := pb.NewGRPCInferenceServiceClient(conn).ModelInfer(ctx, w.reqs[i])
	if err != nil {
		return err
	}
	got, err := oip.Scores(resp, w.n[i])
	if err != nil {
		return err
	}
	if d := maxAbsDiff(got, w.want[i]); d > 1e-4 {
		return fmt.Errorf("request %d: scores differ from the reference by %g", i, d)
	}
	return nil
}

// tritonCheck runs Triton's own Python client through the published port
// and compares its scores with the reference of the served bundle.
func tritonCheck(t *testing.T, py, root, bundle string, cfg model.Config, addr string) {
	t.Helper()
	got, want := runTritonClient(t, py, root, bundle, cfg, addr)
	if !got.ServerLive || !got.ModelReady {
		t.Errorf("tritonclient: live %v, model ready %v", got.ServerLive, got.ModelReady)
	}
	for name, s := range map[string][]float32{"raw INT32": got.RawINT32.Scores, "raw INT64": got.RawINT64.Scores, "typed INT32": got.TypedINT32.Scores} {
		if len(s) != len(want) || maxAbsDiff(s, want) > 1e-4 {
			t.Errorf("tritonclient %s: scores %v, reference %v", name, s, want)
		}
	}
	t.Logf("tritonclient through %s: %d scores match the reference", addr, len(want))
}

// jaegerTrace is the part of Jaeger's query API (/api/traces) the test reads.
type jaegerTrace struct {
	TraceID string `json:"traceID"`
	Spans   []struct {
		SpanID        string `json:"spanID"`
		OperationName string `json:"operationName"`
		ProcessID     string `json:"processID"`
		References    []struct {
			RefType string `json:"refType"`
			TraceID string `json:"traceID"`
			SpanID  string `json:"spanID"`
		} `json:"references"`
	} `json:"spans"`
	Processes map[string]struct {
		ServiceName string `json:"serviceName"`
	} `json:"processes"`
}

// traceInJaeger sends sampled requests, a new trace every 5 s, until
// Jaeger holds one of them with spans of the frontend, the embedder and the
// accelerator, linked by the embedder's and the accelerator's batch spans.
// It returns the number of spans in that request's trace. (More than one
// request because an exporter may drop a batch of spans, on a timeout for
// example: tracing is best effort, and the check is that traces are whole,
// not that none is lost.)
func traceInJaeger(t *testing.T, dc *composeProject, w *workload) int {
	t.Helper()
	api := "http://127.0.0.1:" + strconv.Itoa(dc.jaeger) + "/api/traces"
	deadline := time.Now().Add(2 * time.Minute)
	var sent []string
	var lastSend time.Time
	var services map[string]bool
	for {
		if time.Since(lastSend) >= 5*time.Second {
			var id [16]byte
			var parent [8]byte
			rand.Read(id[:])
			rand.Read(parent[:])
			traceID := hex.EncodeToString(id[:])
			md := metadata.Pairs("traceparent", "00-"+traceID+"-"+hex.EncodeToString(parent[:])+"-01")
			if err := callOnce(dc.addr(), w, 0, md); err != nil {
				t.Fatalf("traced call: %v", err)
			}
			sent, lastSend = append(sent, traceID), time.Now()
		}
		for _, traceID := range sent {
			var got struct{ Data []jaegerTrace }
			if err := getJSON(api+"/"+traceID, &got); err != nil || len(got.Data) != 1 {
				continue
			}
			tr := got.Data[0]
			services = map[string]bool{}
			server := ""
			for _, s := range tr.Spans {
				services[tr.Processes[s.ProcessID].ServiceName] = true
				if strings.HasSuffix(s.OperationName, "/ModelInfer") {
					server = s.SpanID
				}
			}
			if server == "" || !services["recmesh-frontend"] || !services["recmesh-embedder"] || !services["recmesh-accelerator"] {
				continue
			}
			links := batchLinks(t, api, traceID, server)
			if links["embedder.lookup_batch"] && links["accelerator.execute"] {
				t.Logf("trace %s (traced request %d of %d): %d spans from %v; linked by the embedder's and the accelerator's batch spans",
					traceID, slices.Index(sent, traceID)+1, len(sent), len(tr.Spans), services)
				return len(tr.Spans)
			}
		}
		if time.Now().After(deadline) {
			dc.dumpLogs()
			t.Fatalf("none of %d traced requests whole in Jaeger after 2 min (last seen services %v): want spans of the frontend, the embedder and the accelerator, and both batch links", len(sent), services)
		}
		time.Sleep(time.Second)
	}
}

// batchLinks finds the batch spans (the embedder's lookup, the
// accelerator's execute) whose links name the request's server span.
func batchLinks(t *testing.T, api, traceID, spanID string) map[string]bool {
	found := map[string]bool{}
	for _, q := range []struct{ service, op string }{{"recmesh-embedder", "embedder.lookup_batch"}, {"recmesh-accelerator", "accelerator.execute"}} {
		var got struct{ Data []jaegerTrace }
		if err := getJSON(api+"?service="+q.service+"&operation="+q.op+"&lookback=1h&limit=200", &got); err != nil {
			continue
		}
		for _, tr := range got.Data {
			for _, s := range tr.Spans {
				for _, r := range s.References {
					if s.OperationName == q.op && r.TraceID == traceID && r.SpanID == spanID {
						found[q.op] = true
					}
				}
			}
		}
	}
	return found
}

func getJSON(url string, v any) error {
	resp, err := http.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", url, resp.Status)
	}
	return json.Unmarshal(b, v)
}
