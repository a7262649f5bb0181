package shmbackend

import (
	"context"
	"errors"
	"os"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/recmesh/recmesh/frontend"
	"github.com/recmesh/recmesh/model"
	"github.com/recmesh/recmesh/shm"
)

// fakeMesh is one segment generation with this test as its embedder and
// accelerator: it answers every request on every lane with scores of
// value, unless answering is paused.
type fakeMesh struct {
	seg    *shm.Segment
	value  float32
	paused chan struct{} // closed: stop answering
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func testModel() model.Config { return model.DLRMv2(model.DevVocabCap) }

func startFakeMesh(t *testing.T, dir string, value float32) *fakeMesh {
	t.Helper()
	cfg := testModel()
	seg, err := shm.Create(shm.Options{Name: "seg", Dir: dir, ModelID: cfg.ID(), Geometry: shm.Geometry{
		Lanes: 2, MaxExamples: 16, ExampleBytes: (cfg.NumDense + cfg.SparseWidth()) * 4,
		StagingCount: 1, StagingBytes: shm.PageSize, MaxBatchEntries: 16,
	}})
	if err != nil {
		t.Fatal(err)
	}
	if err := seg.SetAccelerator(os.Getpid()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	m := &fakeMesh{seg: seg, value: value, paused: make(chan struct{}), cancel: cancel}
	m.wg.Add(3)
	go func() { defer m.wg.Done(); _ = seg.Heartbeat(ctx, 0, nil) }()
	go func() { defer m.wg.Done(); _ = seg.AcceleratorHeartbeat(ctx, 0, nil) }()
	go func() { defer m.wg.Done(); m.answer(ctx) }()
	t.Cleanup(m.stop)
	return m
}

func (m *fakeMesh) answer(ctx context.Context) {
	g := m.seg.Geometry()
	var readers []*shm.RequestReader
	var writers []*shm.CompletionWriter
	for i := 0; i < g.Lanes; i++ {
		r, _ := m.seg.RequestReader(i)
		w, _ := m.seg.CompletionWriter(i)
		readers, writers = append(readers, r), append(writers, w)
	}
	for ctx.Err() == nil {
		select {
		case <-m.paused:
			time.Sleep(time.Millisecond)
			continue
		default:
		}
		idle := true
		for i, r := range readers {
			req, ok, err := r.Next()
			if err != nil || !ok {
				continue
			}
			idle = false
			raw, err := writers[i].Scores(req.Slot, req.Epoch)
			if err != nil {
				continue
			}
			scores := unsafe.Slice((*float32)(unsafe.Pointer(&raw[0])), req.Examples)
			for k := range scores {
				scores[k] = m.value
			}
			_ = writers[i].Complete(shm.Completion{Slot: req.Slot, Epoch: req.Epoch, Status: shm.StatusOK, Examples: req.Examples})
		}
		if idle {
			time.Sleep(200 * time.Microsecond)
		}
	}
}

func (m *fakeMesh) stop() {
	m.cancel()
	m.wg.Wait()
	if m.seg != nil {
		_ = m.seg.Close()
		m.seg = nil
	}
}

func newBackend(t *testing.T, dir string) *Backend {
	t.Helper()
	b, err := New(Options{ShmDir: dir, Segment: "seg", Model: testModel()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	deadline := time.Now().Add(10 * time.Second)
	for !b.Ready() {
		if time.Now().After(deadline) {
			t.Fatal("backend not ready")
		}
		time.Sleep(5 * time.Millisecond)
	}
	return b
}

func call(ctx context.Context, b *Backend, n int) ([]float32, error) {
	slot, err := b.Acquire(ctx, n)
	if err != nil {
		return nil, err
	}
	defer slot.Release()
	dense, sparse := model.RandomInputs(testModel(), 3, n)
	copy(slot.Dense(), dense)
	copy(slot.Sparse(), sparse)
	scores, err := slot.Submit(ctx, frontend.Call{Arrival: time.Now()})
	if err != nil {
		return nil, err
	}
	return append([]float32(nil), scores...), nil
}

func TestRoundTrip(t *testing.T) {
	dir := t.TempDir()
	startFakeMesh(t, dir, 0.25)
	b := newBackend(t, dir)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, n := range []int{1, 7, 16} {
		got, err := call(ctx, b, n)
		if err != nil {
			t.Fatalf("%d examples: %v", n, err)
		}
		if len(got) != n || got[0] != 0.25 || got[n-1] != 0.25 {
			t.Fatalf("%d examples: scores %v", n, got)
		}
	}
	if b.Generation() != 1 {
		t.Errorf("generation %d, want 1", b.Generation())
	}
}

// TestCallMovesOffALostGeneration: a call waiting on a generation that
// dies (its owner closes it) is resubmitted to the generation that
// replaces it and answered there, not failed.
func TestCallMovesOffALostGeneration(t *testing.T) {
	dir := t.TempDir()
	old := startFakeMesh(t, dir, 0.25)
	b := newBackend(t, dir)
	close(old.paused) // the old generation stops answering

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res := make(chan error, 1)
	var got []float32
	go func() {
		var err error
		got, err = call(ctx, b, 4)
		res <- err
	}()
	time.Sleep(50 * time.Millisecond) // the call waits on the old generation
	startFakeMesh(t, dir, 0.75)       // its successor
	old.stop()                        // the old one is gone
	if err := <-res; err != nil {
		t.Fatalf("call across a lost generation: %v", err)
	}
	if len(got) != 4 || got[0] != 0.75 {
		t.Fatalf("scores %v, want the new generation's 0.75", got)
	}
}

// TestNoGenerationUnavailable: with no segment there is nothing to serve,
// and Acquire says so at once.
func TestNoGenerationUnavailable(t *testing.T) {
	b, err := New(Options{ShmDir: t.TempDir(), Segment: "seg", Model: testModel()})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if b.Ready() {
		t.Fatal("ready without a segment")
	}
	if _, err := b.Acquire(context.Background(), 1); !errors.Is(err, frontend.ErrUnavailable) {
		t.Fatalf("Acquire without a segment: %v", err)
	}
}
