package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	"github.com/recmesh/recmesh/cli/internal/meshnats"
	"github.com/recmesh/recmesh/model"
	"github.com/recmesh/recmesh/proto/control"
	pb "github.com/recmesh/recmesh/proto/inference"
	"github.com/recmesh/recmesh/proto/oip"
)

// TestE2ESecurity is the security acceptance run (make e2e-security): TLS
// and mTLS with Triton's client and certificates rotated under load; the
// control plane closed to strangers and to a frontend's model load; a
// rollout refused outside the model root; and a rollout that survives
// SIGKILLed restarts of the accelerator, the embedder and everything. It
// ends with the `security ok:` line.
func TestE2ESecurity(t *testing.T) {
	if os.Getenv("RECMESH_E2E_SECURITY") == "" {
		t.Skip("make e2e-security runs this (set RECMESH_E2E_SECURITY=1); make test runs its halves, TestE2ETLS and TestE2EControlPlaneSecurity")
	}
	tlsRes := checkTLS(t)
	if tlsRes.TLS != "pass" || tlsRes.MTLS != "pass" || tlsRes.RotationFailedCalls != 0 || tlsRes.Calls == 0 {
		t.Errorf("TLS: %+v", tlsRes)
	}
	ctl := checkControlPlane(t)
	line := fmt.Sprintf("security ok: tls=%s mtls=%s cert_rotation_failed_calls=%d nats_unauth=%s frontend_model_load=%s path_escape=%s restart_after_rollout_failed_calls=%d",
		tlsRes.TLS, tlsRes.MTLS, tlsRes.RotationFailedCalls, ctl.natsUnauth, ctl.frontendLoad, ctl.pathEscape, ctl.restartFailed)
	if t.Failed() {
		t.Logf("not ok: %s", strings.TrimPrefix(line, "security ok: "))
		return
	}
	fmt.Println(line)
}

// TestE2EControlPlaneSecurity is the control-plane half alone.
func TestE2EControlPlaneSecurity(t *testing.T) {
	ctl := checkControlPlane(t)
	t.Logf("%+v", ctl)
}

type controlResult struct {
	natsUnauth, frontendLoad, pathEscape string
	restartFailed                        int
}

// checkControlPlane runs a mesh on a closed NATS server (meshnats, as
// recmesh run does), and checks who may roll out what, and that a rollout
// is durable.
func checkControlPlane(t *testing.T) controlResult {
	res := controlResult{natsUnauth: "open", frontendLoad: "allowed", pathEscape: "allowed", restartFailed: -1}
	w := loadWorkload(t)
	ns, err := meshnats.Start(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ns.Shutdown)

	// A stranger cannot connect at all.
	if nc, err := nats.Connect(ns.ClientURL(), nats.MaxReconnects(0)); err == nil {
		nc.Close()
		t.Error("a NATS client without credentials connected")
	} else if strings.Contains(strings.ToLower(err.Error()), "authorization") {
		res.natsUnauth = "refused"
	} else {
		t.Errorf("unauthenticated NATS client: %v; want an authorization error", err)
	}

	c := newCluster(t, "model")
	c.natsURL = ns.ClientURL()
	c.natsEnv = func(name string) []string {
		role := control.RoleFrontend
		switch name {
		case "embedder":
			role = control.RoleEmbedder
		case "accelerator":
			role = control.RoleAccelerator
		}
		return ns.Env(role)
	}
	c.startMesh(2)

	// The rollout's bundle, inside the model root, and its answers.
	if err := model.Export(context.Background(), filepath.Join(c.modelRoot, "v2"), model.DLRMv2(model.DevVocabCap), 12, nil); err != nil {
		t.Fatal(err)
	}
	wantNew := newModelAnswers(t, filepath.Join(c.modelRoot, "v2"), w)

	connect := func(role control.Role) *nats.Conn {
		opt, err := nats.NkeyOptionFromSeed(ns.Seed(role))
		if err != nil {
			t.Fatal(err)
		}
		nc, err := nats.Connect(ns.ClientURL(), opt)
		if err != nil {
			t.Fatalf("connect as %s: %v", role, err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	// A frontend's identity cannot roll out a model: the publish is
	// refused by the server, so nothing answers.
	fe := connect(control.RoleFrontend)
	short, cancelShort := context.WithTimeout(ctx, 3*time.Second)
	_, err = control.Call(short, fe, control.SubjectModelLoad, control.LoadRequest{Bundle: "v2"})
	cancelShort()
	if err == nil {
		t.Error("a frontend's model load was answered")
	} else {
		res.frontendLoad = "refused"
	}

	// The operator cannot load from outside the model root: by "..", by
	// an absolute path, or by a symbolic link in the root.
	admin := connect(control.RoleAdmin)
	if err := os.Symlink(c.bundle, filepath.Join(c.modelRoot, "link-out")); err != nil {
		t.Fatal(err)
	}
	// recmesh model load, the operator's tool, run as the admin: the
	// escape is refused and it exits non-zero with the reason.
	cli := func(args ...string) (string, error) {
		cmd := exec.CommandContext(ctx, filepath.Join(c.bin, "recmesh"), args...)
		cmd.Env = append(os.Environ(), ns.Env(control.RoleAdmin)...)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	refused := 0
	if out, err := cli("model", "load", filepath.Join(c.modelRoot, "..")); err != nil && strings.Contains(out, "outside the model root") {
		refused++
	} else {
		t.Errorf("recmesh model load of the root's parent: %v\n%s", err, out)
	}
	for _, name := range []string{"../" + filepath.Base(c.bundle), c.bundle, "link-out"} {
		_, err := control.Call(ctx, admin, control.SubjectModelLoad, control.LoadRequest{Bundle: name})
		if err != nil && strings.Contains(err.Error(), "outside the model root") {
			refused++
		} else {
			t.Errorf("rollout of %q: %v; want a refusal naming the model root", name, err)
		}
	}
	if refused == 4 {
		res.pathEscape = "refused"
	}
	// Still the old model, and nothing recorded.
	if _, ok, _ := mustRoot(t, c.modelRoot).Serving(); ok {
		t.Error("a refused rollout was recorded")
	}
	expectModel(t, c, w, w.want, "the old model after refused rollouts")

	// The rollout, then restarts: every answer from the new model, no
	// failed call once the mesh serves again.
	l := startVersionedLoad(t, c, w, wantNew)
	defer l.stop()
	waitFor(t, time.Minute, "traffic before the rollout", func() bool { return l.ok.Load() >= 10 })
	out, err := cli("model", "load", filepath.Join(c.modelRoot, "v2"))
	if err != nil {
		t.Fatalf("recmesh model load: %v\n%s", err, out)
	}
	t.Logf("%s", strings.TrimSpace(out))
	waitFor(t, time.Minute, "answers from the new model", func() bool { return l.newOK.Load() >= 10 })

	restart := func(what string, names ...string) {
		l.window(true)
		for _, n := range names {
			c.kill(n, syscall.SIGKILL)
		}
		for _, n := range names {
			c.start(n)
		}
		c.waitServing(3 * time.Minute)
		// The window closes once the mesh answers again, from the new
		// model, several times in a row.
		base := l.newOK.Load()
		waitFor(t, time.Minute, "answers after restarting "+what, func() bool { return l.newOK.Load() >= base+20 })
		l.window(false)
		base = l.newOK.Load()
		waitFor(t, time.Minute, "answers outside the window after restarting "+what, func() bool { return l.newOK.Load() >= base+40 })
	}
	l.strictSince.Store(time.Now().UnixNano()) // from here on, an old-model answer is wrong
	restart("the accelerator", "accelerator")
	restart("the embedder", "embedder")
	all := []string{"embedder", "accelerator"}
	for name := range c.procs {
		if strings.HasPrefix(name, "frontend") {
			all = append(all, name)
		}
	}
	restart("everything", all...)
	l.stop()

	t.Logf("calls: %d ok (%d new model), failed outside restart windows %d %v, in windows %d, old-model answers after the restarts began %d, wrong %d",
		l.ok.Load(), l.newOK.Load(), l.failedOutside.Load(), l.failures(), l.failedInside.Load(), l.oldStrict.Load(), l.wrong.Load())
	res.restartFailed = int(l.failedOutside.Load() + l.oldStrict.Load() + l.wrong.Load())
	if res.restartFailed != 0 {
		t.Errorf("%d calls failed or answered from the old model outside the restart windows", res.restartFailed)
	}
	return res
}

func mustRoot(t *testing.T, dir string) model.Root {
	t.Helper()
	r, err := model.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// newModelAnswers is the reference's answers of the bundle at dir for
// every request of w.
func newModelAnswers(t *testing.T, dir string, w *workload) [][]float32 {
	t.Helper()
	b, err := model.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ref, err := model.NewReference(b)
	if err != nil {
		t.Fatal(err)
	}
	out := make([][]float32, len(w.reqs))
	for i := range w.reqs {
		if out[i], err = ref.Predict(w.dense[i], w.sparse[i], w.n[i]); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// expectModel sends every small request once and wants answers from want.
func expectModel(t *testing.T, c *cluster, w *workload, want [][]float32, what string) {
	t.Helper()
	conn, err := grpc.NewClient(c.addr(), c.dialOption())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := pb.NewGRPCInferenceServiceClient(conn)
	for i := range w.reqs {
		if w.n[i] > 16 {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		resp, err := client.ModelInfer(ctx, w.reqs[i])
		cancel()
		if err != nil {
			t.Errorf("%s: %v", what, err)
			return
		}
		got, err := oip.Scores(resp, w.n[i])
		if err != nil || maxAbsDiff(got, want[i]) > 1e-4 {
			t.Errorf("%s: request %d answered %v (%v), want %v", what, i, got, err, want[i])
			return
		}
	}
}

// versionedLoad keeps two clients calling and sorts every answer by the
// model it came from. Calls that overlap a restart window are counted
// apart.
type versionedLoad struct {
	windows
	ok, newOK, wrong            atomic.Int64
	failedInside, failedOutside atomic.Int64
	oldStrict                   atomic.Int64
	strictSince                 atomic.Int64 // unix ns; calls begun after it may not answer from the old model
	mu                          sync.Mutex
	failed                      map[string]int
	done                        chan struct{}
	wg                          sync.WaitGroup
	stopOnce                    sync.Once
}

func (l *versionedLoad) window(open bool) { l.set(open) }

func (l *versionedLoad) stop() {
	l.stopOnce.Do(func() { close(l.done); l.wg.Wait() })
}

func (l *versionedLoad) failures() map[string]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.failed
}

func startVersionedLoad(t *testing.T, c *cluster, w *workload, wantNew [][]float32) *versionedLoad {
	l := &versionedLoad{failed: map[string]int{}, done: make(chan struct{})}
	callLoop(t, c, w, 2, 10*time.Second, &l.windows, l.done, &l.wg, func(i int, resp *pb.ModelInferResponse, err error, ci callInfo) {
		if err != nil {
			if ci.inWindow {
				l.failedInside.Add(1)
				return
			}
			l.failedOutside.Add(1)
			l.mu.Lock()
			l.failed[status.Code(err).String()+": "+status.Convert(err).Message()]++
			l.mu.Unlock()
			return
		}
		got, err := oip.Scores(resp, w.n[i])
		switch {
		case err != nil:
			l.wrong.Add(1)
		case maxAbsDiff(got, wantNew[i]) <= 1e-4:
			l.ok.Add(1)
			l.newOK.Add(1)
		case maxAbsDiff(got, w.want[i]) <= 1e-4:
			l.ok.Add(1)
			if s := l.strictSince.Load(); s != 0 && ci.began.UnixNano() >= s {
				l.oldStrict.Add(1)
			}
		default:
			l.wrong.Add(1)
		}
	})
	return l
}
