package dense

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/recmesh/recmesh/accelerator/executor"
	"github.com/recmesh/recmesh/model"
	"github.com/recmesh/recmesh/proto/updates"
)

func startJetStream(t *testing.T) *server.Server {
	t.Helper()
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, NoLog: true, NoSigs: true,
		JetStream: true, StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server did not start")
	}
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	return ns
}

func connect(t *testing.T, ns *server.Server) jetstream.JetStream {
	t.Helper()
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// smallConfig is a small network of the dev tables.
func smallConfig() model.Config {
	cfg := model.DLRMv2(model.DevVocabCap)
	cfg.Name, cfg.CrossLayers, cfg.CrossRank = "dense-test", 1, 3
	cfg.BottomMLP, cfg.TopMLP = []int{32, 128}, []int{64, 1}
	return cfg
}

// draw is Export's float32 draw of cfg's dense parameters from seed.
func draw(t *testing.T, cfg model.Config, seed uint64) map[string][]float32 {
	t.Helper()
	out, err := model.GenerateDenseWeights(cfg, seed)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// exportBundle exports cfg with seed into a temporary directory and opens
// it until the test ends.
func exportBundle(t *testing.T, cfg model.Config, seed uint64) *model.Bundle {
	t.Helper()
	dir := t.TempDir()
	if err := model.Export(context.Background(), dir, cfg, seed, nil); err != nil {
		t.Fatal(err)
	}
	b, err := model.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

func encode(t *testing.T, cfg model.Config, params map[string][]float32) []byte {
	t.Helper()
	var b bytes.Buffer
	if _, err := model.WriteDenseWeights(&b, cfg, params); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// fake is an executor: it keeps the last weights it was given.
type fake struct {
	cfg    model.Config
	mu     sync.Mutex
	params map[string][]float32
	swaps  int
	closed bool
}

func (f *fake) Config() model.Config { return f.cfg }

func (f *fake) SwapWeights(p map[string][]float32) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return executor.ErrClosed
	}
	f.params = map[string][]float32{}
	for k, v := range p {
		f.params[k] = append([]float32(nil), v...)
	}
	f.swaps++
	return nil
}

// first is the first value of tensor name the fake serves (0 before any
// swap).
func (f *fake) first(name string) (float32, int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.params == nil {
		return 0, f.swaps
	}
	return f.params[name][0], f.swaps
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func counter(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

// running starts w.Run and stops it at the end of the test.
func running(t *testing.T, w *Watcher) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run = %v", err)
		}
	})
}

// TestWatch: a bucket that appears late is found, a new object swaps, a
// wrong-shaped one is refused once and the weights before keep serving,
// another model's object waits until that model is added (and is then
// applied before Add returns), a deleted object brings the bundle's
// weights back, and a closed executor is let go.
func TestWatch(t *testing.T) {
	ns := startJetStream(t)
	js := connect(t, ns)
	ctx := context.Background()
	bundle := exportBundle(t, smallConfig(), 3)
	cfg, dir := bundle.Config, bundle.Dir
	id := cfg.ID()
	reg := prometheus.NewRegistry()
	var releases atomic.Int64
	w := New(Options{JS: js, Registry: reg, Retry: 20 * time.Millisecond,
		Bundle:  func(m string) (string, bool) { return dir, m == id },
		Release: func() { releases.Add(1) }})
	a := &fake{cfg: cfg}
	w.Add(ctx, a) // no bucket yet: serves the bundle's weights
	running(t, w)
	waitFor(t, "a second look for the bucket", func() bool { return w.attempts.Load() >= 2 })
	if st := w.Status(id); st.Source != SourceBundle || st.Swaps != 0 || st.Error != "" {
		t.Fatalf("status %+v before any object", st)
	}

	obs, err := js.CreateObjectStore(ctx, jetstream.ObjectStoreConfig{Bucket: updates.DenseBucket})
	if err != nil {
		t.Fatal(err)
	}
	seven := draw(t, cfg, 7)
	info, err := obs.PutBytes(ctx, id, encode(t, cfg, seven))
	if err != nil {
		t.Fatal(err)
	}
	source := fmt.Sprintf("recmesh-dense/%s@%s", id, info.NUID)
	waitFor(t, "the swap", func() bool { return w.Status(id).Source == source })
	waitFor(t, "the swap's garbage released", func() bool { return releases.Load() == 1 })
	if v, n := a.first("top_mlp.0.kernel"); v != seven["top_mlp.0.kernel"][0] || n != 1 {
		t.Fatalf("after the swap the fake serves %v (%d swaps), want %v (1)", v, n, seven["top_mlp.0.kernel"][0])
	}
	if st := w.Status(id); st.Swaps != 1 || st.Refused != 0 || st.Error != "" {
		t.Errorf("status %+v after a swap", st)
	}
	if got := counter(t, reg, "recmesh_accelerator_dense_swaps_total"); got != 1 {
		t.Errorf("swaps_total %v, want 1", got)
	}

	// A network of another shape: refused with the reason.
	other := cfg
	other.BottomMLP = []int{64, 128}
	bad, err := obs.PutBytes(ctx, id, encode(t, other, draw(t, other, 1)))
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the refusal", func() bool { return w.Status(id).Refused == 1 })
	st := w.Status(id)
	if want := "tensor bottom_mlp.0.kernel has shape [13 64], the serving model's is [13 32]"; !strings.Contains(st.Error, want) || !strings.Contains(st.Error, bad.NUID) {
		t.Errorf("status error %q, want the revision %s and %q", st.Error, bad.NUID, want)
	}
	if st.Source != source || st.Swaps != 1 {
		t.Errorf("status %+v after a refusal, want still %s", st, source)
	}
	if v, n := a.first("top_mlp.0.kernel"); v != seven["top_mlp.0.kernel"][0] || n != 1 {
		t.Fatalf("after the refusal the fake serves %v (%d swaps)", v, n)
	}
	if got := counter(t, reg, "recmesh_accelerator_dense_refused_total"); got != 1 {
		t.Errorf("refused_total %v, want 1", got)
	}

	// Another model's object waits for that model.
	cfgB := cfg
	cfgB.Seed = 4
	eight := draw(t, cfgB, 8)
	infoB, err := obs.PutBytes(ctx, cfgB.ID(), encode(t, cfgB, eight))
	if err != nil {
		t.Fatal(err)
	}
	b := &fake{cfg: cfgB}
	w.Add(ctx, b)
	if v, n := b.first("cross.0.v"); v != eight["cross.0.v"][0] || n != 1 {
		t.Fatalf("Add gave the new model %v (%d swaps), want its stored object's %v", v, n, eight["cross.0.v"][0])
	}
	if got := w.Status(cfgB.ID()).Source; got != fmt.Sprintf("recmesh-dense/%s@%s", cfgB.ID(), infoB.NUID) {
		t.Errorf("the new model's source %q", got)
	}

	// Deleting the object brings the bundle's weights back. (Add applied
	// under the lock Run's applies take, so the count is settled.)
	beforeDelete := releases.Load()
	if err := obs.Delete(ctx, id); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the bundle's weights back", func() bool { return w.Status(id).Source == SourceBundle })
	waitFor(t, "the bundle reading's garbage released", func() bool { return releases.Load() > beforeDelete })
	if v, n := a.first("top_mlp.0.kernel"); v != bundle.Param("top_mlp.0.kernel")[0] || n != 2 {
		t.Fatalf("after the deletion the fake serves %v (%d swaps), want the bundle's %v", v, n, bundle.Param("top_mlp.0.kernel")[0])
	}

	// A closed executor is let go; the refused revision is not tried
	// again, and the watch goes on.
	a.mu.Lock()
	a.closed = true
	a.mu.Unlock()
	if _, err := obs.PutBytes(ctx, id, encode(t, cfg, seven)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the closed executor let go", func() bool {
		w.mu.Lock()
		defer w.mu.Unlock()
		_, ok := w.targets[a]
		return !ok
	})
	if st := w.Status(id); st.Refused != 1 || st.Swaps != 3 {
		t.Errorf("status %+v at the end, want 3 swaps and 1 refusal", st)
	}
}
