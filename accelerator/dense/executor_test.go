package dense

import (
	"context"
	"fmt"
	"math"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/recmesh/recmesh/accelerator/device"
	"github.com/recmesh/recmesh/accelerator/executor"
	"github.com/recmesh/recmesh/model"
	"github.com/recmesh/recmesh/proto/updates"
)

// TestWatchSwapsTheExecutor runs the compiled program through the object
// store: an executor whose model has a stored object starts on it, a new
// object's weights are what the next run scores with, a wrong-shaped one
// leaves the scores as they were, and nothing is compiled.
func TestWatchSwapsTheExecutor(t *testing.T) {
	if _, err := device.FindPlugin(""); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI needs the PJRT plugin: %v", err)
		}
		t.Skipf("no PJRT plugin (run make deps): %v", err)
	}
	ns := startJetStream(t)
	js := connect(t, ns)
	ctx := context.Background()
	bundle := exportBundle(t, smallConfig(), 3)
	cfg := bundle.Config
	id := cfg.ID()
	ref, err := model.NewReference(bundle)
	if err != nil {
		t.Fatal(err)
	}
	rt, err := device.Open("", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	ex, err := executor.New(ctx, rt, bundle, executor.Options{MaxBatch: 4, StripDot: executor.StripDotOn})
	if err != nil {
		t.Fatal(err)
	}
	defer ex.Close()
	compiles := ex.Compiles()

	const n = 4
	in, err := ex.NewHostInputs(n)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	dense, sparse := model.RandomInputs(cfg, 5, n)
	copy(in.Dense(), dense)
	if err := ref.Pool(sparse, n, in.Pooled()); err != nil {
		t.Fatal(err)
	}
	// scoresOf checks a run against the model of seed's dense weights.
	scoresOf := func(seed uint64) []float32 {
		t.Helper()
		r, err := model.NewGeneratedReference(cfg, seed, 0)
		if err != nil {
			t.Fatal(err)
		}
		want := make([]float32, n)
		if err := r.Forward(in.Dense()[:n*cfg.NumDense], in.Pooled(), n, want); err != nil {
			t.Fatal(err)
		}
		got := make([]float32, n)
		if err := ex.Run(in, n, got); err != nil {
			t.Fatal(err)
		}
		for i := range got {
			if d := math.Abs(float64(got[i] - want[i])); !(d <= 1e-4) {
				t.Fatalf("row %d scores %v, the model of seed %d's weights %v", i, got[i], seed, want[i])
			}
		}
		return got
	}

	obs, err := js.CreateObjectStore(ctx, jetstream.ObjectStoreConfig{Bucket: updates.DenseBucket})
	if err != nil {
		t.Fatal(err)
	}
	first, err := obs.PutBytes(ctx, id, encode(t, cfg, draw(t, cfg, 7)))
	if err != nil {
		t.Fatal(err)
	}
	w := New(Options{JS: js, Retry: 20 * time.Millisecond})
	w.Add(ctx, ex) // as the accelerator starts: the stored object first
	if got, want := w.Status(id).Source, fmt.Sprintf("recmesh-dense/%s@%s", id, first.NUID); got != want {
		t.Fatalf("source %q after Add, want %q", got, want)
	}
	scoresOf(7)
	running(t, w)

	next, err := obs.PutBytes(ctx, id, encode(t, cfg, draw(t, cfg, 11)))
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the swap", func() bool { return strings.HasSuffix(w.Status(id).Source, "@"+next.NUID) })
	before := scoresOf(11)

	other := cfg
	other.TopMLP = []int{32, 1}
	if _, err := obs.PutBytes(ctx, id, encode(t, other, draw(t, other, 1))); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the refusal", func() bool { return w.Status(id).Refused == 1 })
	if e := w.Status(id).Error; !strings.Contains(e, "tensor top_mlp.0.kernel has shape [3456 32], the serving model's is [3456 64]") {
		t.Errorf("status error %q", e)
	}
	after := scoresOf(11)
	for i := range after {
		if after[i] != before[i] {
			t.Fatalf("row %d: %v after the refusal, %v before", i, after[i], before[i])
		}
	}
	if st := w.Status(id); st.Swaps != 2 {
		t.Errorf("status %+v, want 2 swaps", st)
	}
	if got := ex.Compiles(); got != compiles {
		t.Errorf("Compiles went from %d to %d", compiles, got)
	}
}
