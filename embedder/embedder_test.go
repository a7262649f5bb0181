package embedder

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/recmesh/recmesh/embedder/batch"
	"github.com/recmesh/recmesh/model"
	"github.com/recmesh/recmesh/shm"
)

// rig is an embedder serving a small bundle, with this test playing both
// a frontend (a claimed lane) and the accelerator (the batch ring).
type rig struct {
	cfg    model.Config
	ref    *model.Reference
	lane   *shm.Lane
	seg    *shm.Segment // the accelerator's attachment
	reader *shm.BatchReader
	cw     []*shm.CompletionWriter
}

func newRig(t *testing.T, mode batch.Mode, window time.Duration) *rig {
	t.Helper()
	dir := t.TempDir()
	if err := model.Export(context.Background(), dir, model.DLRMv2(model.DevVocabCap), 5, nil); err != nil {
		t.Fatal(err)
	}
	b, ref := openReference(t, dir)
	name := fmt.Sprintf("recmesh-embedder-test-%d-%s", os.Getpid(), mode)
	e, err := New(Options{Bundle: dir, Segment: name, Lanes: 2, Mode: mode, MaxBatch: 64, Window: window, Workers: 2})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _ = e.Run(ctx) }()
	path := filepath.Join(shm.DefaultDir, name)
	var seg *shm.Segment
	deadline := time.Now().Add(30 * time.Second)
	for {
		seg, err = shm.Attach(path, shm.AttachOptions{})
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := seg.SetAccelerator(os.Getpid()); err != nil {
		t.Fatal(err)
	}
	lane, err := seg.ClaimLane(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	r := &rig{cfg: b.Config, ref: ref, lane: lane, seg: seg, reader: seg.BatchReader()}
	for i := 0; i < 2; i++ {
		w, err := seg.CompletionWriter(i)
		if err != nil {
			t.Fatal(err)
		}
		r.cw = append(r.cw, w)
	}
	t.Cleanup(func() {
		cancel()
		wg.Wait()
		seg.Close()
	})
	return r
}

// submit writes a request of n examples into the lane and publishes it.
func (r *rig) submit(t *testing.T, dense []float32, sparse []int32, n int) int {
	t.Helper()
	lay := r.cfg.Request(n)
	slot, payload, err := r.lane.Claim(n, lay.Size)
	if err != nil {
		t.Fatal(err)
	}
	copy(unsafe.Slice((*float32)(unsafe.Pointer(&payload[0])), len(dense)), dense)
	copy(unsafe.Slice((*int32)(unsafe.Pointer(&payload[lay.SparseOffset])), len(sparse)), sparse)
	if err := r.lane.Commit(slot, shm.RequestMeta{ID: uint64(slot + 1), Deadline: time.Now().Add(time.Minute).UnixNano()}); err != nil {
		t.Fatal(err)
	}
	return slot
}

// TestBadIDFailsAlone batches a request holding an id outside its table
// between two good ones: it alone is completed as invalid, and the good
// ones' pooled rows in the staging buffer equal the reference pooling.
func TestBadIDFailsAlone(t *testing.T) {
	r := newRig(t, batch.Full, 50*time.Millisecond)
	d1, s1 := model.RandomInputs(r.cfg, 1, 2)
	d2, s2 := model.RandomInputs(r.cfg, 2, 1)
	s2[r.cfg.HotnessOffsets()[3]] = int32(r.cfg.VocabSizes[3]) // one past the end of table 3
	d3, s3 := model.RandomInputs(r.cfg, 3, 3)
	slots := []int{r.submit(t, d1, s1, 2), r.submit(t, d2, s2, 1), r.submit(t, d3, s3, 3)}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := r.reader.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if b.Entries != 3 {
		t.Fatalf("batch carries %d requests, want all 3 (one window)", b.Entries)
	}
	lay := r.cfg.Staging(64)
	per := len(r.cfg.VocabSizes) * r.cfg.EmbeddingDim
	pooled := unsafe.Slice((*float32)(unsafe.Pointer(&b.Data[lay.PooledOffset])), 64*per)
	dense := unsafe.Slice((*float32)(unsafe.Pointer(&b.Data[lay.DenseOffset])), 64*r.cfg.NumDense)
	inputs := map[int]struct {
		d []float32
		s []int32
		n int
	}{slots[0]: {d1, s1, 2}, slots[2]: {d3, s3, 3}}
	for i := 0; i < b.Entries; i++ {
		e, err := r.reader.Entry(b, i)
		if err != nil {
			t.Fatal(err)
		}
		if e.Slot == slots[1] {
			if e.Status != shm.StatusInvalid || e.Rows != 0 {
				t.Errorf("bad request: status %d rows %d, want invalid with no rows", e.Status, e.Rows)
			}
			continue
		}
		in := inputs[e.Slot]
		if e.Status != shm.StatusOK || e.Rows != in.n {
			t.Fatalf("good request in slot %d: status %d rows %d", e.Slot, e.Status, e.Rows)
		}
		want := make([]float32, in.n*per)
		if err := r.ref.Pool(in.s, in.n, want); err != nil {
			t.Fatal(err)
		}
		got := pooled[e.FirstRow*per : (e.FirstRow+in.n)*per]
		for k := range want {
			if d := got[k] - want[k]; d > 1e-5 || d < -1e-5 {
				t.Fatalf("slot %d: pooled[%d] = %v, reference %v", e.Slot, k, got[k], want[k])
			}
		}
		gotDense := dense[e.FirstRow*r.cfg.NumDense : (e.FirstRow+in.n)*r.cfg.NumDense]
		for k := range in.d {
			if gotDense[k] != in.d[k] {
				t.Fatalf("slot %d: dense[%d] = %v, sent %v", e.Slot, k, gotDense[k], in.d[k])
			}
		}
	}
	if err := r.reader.Done(b); err != nil {
		t.Fatal(err)
	}
}

// TestNoneModeOneRequestPerBatch checks the none mode: every request is a
// batch of its own.
func TestNoneModeOneRequestPerBatch(t *testing.T) {
	r := newRig(t, batch.None, 0)
	for i := 0; i < 3; i++ {
		d, s := model.RandomInputs(r.cfg, uint64(i), 2)
		r.submit(t, d, s, 2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := 0; i < 3; i++ {
		b, err := r.reader.Wait(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if b.Entries != 1 || b.Examples != 2 {
			t.Fatalf("batch %d: %d requests, %d examples; want 1 and 2", i, b.Entries, b.Examples)
		}
		if err := r.reader.Done(b); err != nil {
			t.Fatal(err)
		}
	}
}

// TestExpiredDroppedBeforeLookup publishes a request whose deadline has
// passed: it is carried with StatusExpired and no rows.
func TestExpiredDroppedBeforeLookup(t *testing.T) {
	r := newRig(t, batch.None, 0)
	d, s := model.RandomInputs(r.cfg, 9, 1)
	lay := r.cfg.Request(1)
	slot, payload, err := r.lane.Claim(1, lay.Size)
	if err != nil {
		t.Fatal(err)
	}
	copy(unsafe.Slice((*float32)(unsafe.Pointer(&payload[0])), len(d)), d)
	copy(unsafe.Slice((*int32)(unsafe.Pointer(&payload[lay.SparseOffset])), len(s)), s)
	if err := r.lane.Commit(slot, shm.RequestMeta{ID: 1, Deadline: time.Now().Add(-time.Second).UnixNano()}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b, err := r.reader.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	e, err := r.reader.Entry(b, 0)
	if err != nil {
		t.Fatal(err)
	}
	if e.Status != shm.StatusExpired || e.Rows != 0 || b.Examples != 0 {
		t.Fatalf("expired request: status %d rows %d batch examples %d", e.Status, e.Rows, b.Examples)
	}
}

// TestHotPathAllocations pushes requests through the dispatcher, the
// workers and the staging buffers while this test plays frontend and
// accelerator with the allocation-free shm API: the process as a whole,
// embedder included, must not allocate per request.
func TestHotPathAllocations(t *testing.T) {
	r := newRig(t, batch.None, 0)
	d, s := model.RandomInputs(r.cfg, 4, 16)
	lay := r.cfg.Request(16)
	ctx := context.Background()
	deadline := time.Now().Add(time.Hour).UnixNano()
	one := func() {
		slot, payload, err := r.lane.Claim(16, lay.Size)
		if err != nil {
			t.Fatal(err)
		}
		copy(unsafe.Slice((*float32)(unsafe.Pointer(&payload[0])), len(d)), d)
		copy(unsafe.Slice((*int32)(unsafe.Pointer(&payload[lay.SparseOffset])), len(s)), s)
		if err := r.lane.Commit(slot, shm.RequestMeta{ID: 1, Deadline: deadline}); err != nil {
			t.Fatal(err)
		}
		b, err := r.reader.Wait(ctx)
		if err != nil {
			t.Fatal(err)
		}
		e, err := r.reader.Entry(b, 0)
		if err != nil || e.Status != shm.StatusOK {
			t.Fatalf("entry %+v, %v", e, err)
		}
		if err := r.cw[e.Lane].Complete(shm.Completion{Slot: e.Slot, Epoch: e.Epoch, Examples: e.Rows}); err != nil {
			t.Fatal(err)
		}
		if err := r.reader.Done(b); err != nil {
			t.Fatal(err)
		}
		c, err := r.lane.WaitCompletion(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := r.lane.Free(c.Slot); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < 50; i++ { // warm up: first batches size the metric children, pools and stacks
		one()
	}
	if a := testing.AllocsPerRun(200, one); a > 0.5 {
		t.Fatalf("%.2f allocations per request through the embedder, want 0", a)
	}
}
