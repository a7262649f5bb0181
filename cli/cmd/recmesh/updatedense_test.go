package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/recmesh/recmesh/accelerator/dense"
	"github.com/recmesh/recmesh/model"
	"github.com/recmesh/recmesh/proto/control"
	"github.com/recmesh/recmesh/proto/updates"
)

// denseExecutor stands in for the accelerator's executor: it keeps the
// weights it is given.
type denseExecutor struct {
	cfg    model.Config
	mu     sync.Mutex
	params map[string][]float32
}

func (x *denseExecutor) Config() model.Config { return x.cfg }

func (x *denseExecutor) SwapWeights(p map[string][]float32) error {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.params = map[string][]float32{}
	for k, v := range p {
		x.params[k] = append([]float32(nil), v...)
	}
	return nil
}

func (x *denseExecutor) value(name string, i int) float32 {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.params == nil {
		return 0
	}
	return x.params[name][i]
}

// fakeAccelerator answers status on nc as the accelerator does, with the
// dense weights a real watcher gives ex.
func fakeAccelerator(t *testing.T, url string, ex *denseExecutor) {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	w := dense.New(dense.Options{JS: js, Retry: 20 * time.Millisecond})
	w.Add(context.Background(), ex)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = w.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	id := ex.cfg.ID()
	svc, err := control.Register(nc, control.ServiceAccelerator, "v0.0.0", func() control.Status {
		return control.Status{State: "serving", Ready: true, ModelID: id, Dense: w.Status(id)}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = svc.Stop() })
}

// TestUpdateDense pushes a bundle's weights scaled, waits for the swap,
// pushes a dense-weights file without waiting, refuses locally weights of
// another network, and reports the accelerator's refusal of an object
// that does not fit the model it serves.
func TestUpdateDense(t *testing.T) {
	ns, err := natsserver.NewServer(&natsserver.Options{Host: "127.0.0.1", Port: natsserver.RANDOM_PORT, NoLog: true, NoSigs: true,
		JetStream: true, StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server did not start")
	}
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	vars := map[string]string{"NATS_URL": ns.ClientURL()}

	cfg := model.DLRMv2(model.DevVocabCap)
	cfg.Name, cfg.CrossLayers, cfg.CrossRank = "update-dense", 1, 3
	cfg.BottomMLP, cfg.TopMLP = []int{32, 128}, []int{64, 1}
	dir := filepath.Join(t.TempDir(), "bundle")
	if err := model.Export(context.Background(), dir, cfg, 3, nil); err != nil {
		t.Fatal(err)
	}
	bundle, err := model.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer bundle.Close()
	id := bundle.Config.ID()
	ex := &denseExecutor{cfg: bundle.Config}
	fakeAccelerator(t, ns.ClientURL(), ex)

	line := regexp.MustCompile(`^dense pushed model=` + regexp.QuoteMeta(id) + ` bytes=(\d+) revision=(\S+) swapped=yes swap_ms=\d+\n$`)
	code, stdout, stderr := runT(t, vars, "update", "dense", "--bundle", dir, "--scale", "2", "--wait", "--timeout", "20s")
	if code != exitOK || !line.MatchString(stdout) {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	w := bundle.Param("cross.0.v")[5]
	if got := ex.value("cross.0.v", 5); got != 2*w {
		t.Fatalf("the accelerator serves %v, want twice the bundle's %v", got, w)
	}

	// A dense-weights file, without waiting: the object is stored.
	params, err := model.GenerateDenseWeights(bundle.Config, 7)
	if err != nil {
		t.Fatal(err)
	}
	var file bytes.Buffer
	if _, err := model.WriteDenseWeights(&file, bundle.Config, params); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "dense.safetensors")
	if err := os.WriteFile(path, file.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr = runT(t, vars, "update", "dense", "--bundle", dir, "--from", path)
	m := regexp.MustCompile(`^dense pushed model=\S+ bytes=(\d+) revision=(\S+)\n$`).FindStringSubmatch(stdout)
	if code != exitOK || m == nil || m[1] != strconv.Itoa(file.Len()) {
		t.Fatalf("exit %d, stdout %q, stderr %q; want the file's %d bytes pushed", code, stdout, stderr, file.Len())
	}
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	obs, err := js.ObjectStore(context.Background(), updates.DenseBucket)
	if err != nil {
		t.Fatal(err)
	}
	info, err := obs.GetInfo(context.Background(), id)
	if err != nil || info.NUID != m[2] {
		t.Fatalf("stored object %+v, %v; want revision %s", info, err, m[2])
	}
	deadline := time.Now().Add(20 * time.Second)
	for ex.value("top_mlp.1.bias", 0) != params["top_mlp.1.bias"][0] {
		if time.Now().After(deadline) {
			t.Fatal("the file's weights were not swapped in")
		}
		time.Sleep(time.Millisecond)
	}

	// Weights of another network are refused before anything is pushed.
	other := cfg
	other.Name, other.TopMLP = "update-dense-other", []int{32, 1}
	otherDir := filepath.Join(t.TempDir(), "other")
	if err := model.Export(context.Background(), otherDir, other, 3, nil); err != nil {
		t.Fatal(err)
	}
	code, _, stderr = runT(t, vars, "update", "dense", "--bundle", dir, "--from", otherDir)
	if code != exitFailure || !strings.Contains(stderr, "tensor top_mlp.0.kernel has shape [3456 32], the serving model's is [3456 64]") ||
		!strings.Contains(stderr, "nothing pushed") {
		t.Errorf("another network: exit %d, stderr %q", code, stderr)
	}
	if again, err := obs.GetInfo(context.Background(), id); err != nil || again.NUID != info.NUID {
		t.Errorf("the object changed: %+v, %v", again, err)
	}

	// An accelerator serving another network refuses what fits --bundle.
	otherBundle, err := model.Open(otherDir)
	if err != nil {
		t.Fatal(err)
	}
	defer otherBundle.Close()
	fakeAccelerator(t, ns.ClientURL(), &denseExecutor{cfg: otherBundle.Config})
	code, stdout, stderr = runT(t, vars, "update", "dense", "--bundle", dir, "--model", otherBundle.Config.ID(), "--wait", "--timeout", "20s")
	if code != exitFailure || !strings.HasPrefix(stdout, "dense pushed model="+otherBundle.Config.ID()+" ") || !strings.HasSuffix(stdout, " swapped=no\n") ||
		!strings.Contains(stderr, "the accelerator refused the new weights") || !strings.Contains(stderr, "tensor top_mlp.0.kernel has shape [3456 64]") {
		t.Errorf("refused by the accelerator: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}

	for _, tc := range []struct {
		vars map[string]string
		args []string
		msg  string
	}{
		{nil, []string{"--bundle", dir}, "no NATS URL"},
		{vars, []string{"--bundle", ""}, "--bundle is empty"},
		{vars, []string{"--bundle", dir, "--timeout", "0s"}, "--timeout 0s"},
		{vars, []string{"--bundle", dir, "--scale", "0"}, "--scale 0"},
	} {
		code, _, stderr := runT(t, tc.vars, append([]string{"update", "dense"}, tc.args...)...)
		if code != exitUsage || !strings.Contains(stderr, tc.msg) {
			t.Errorf("update dense %v: exit %d, stderr %q; want a usage error mentioning %q", tc.args, code, stderr, tc.msg)
		}
	}
}
