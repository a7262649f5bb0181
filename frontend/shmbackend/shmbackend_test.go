package shmbackend

import (
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
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
	paused atomic.Bool // stop answering while set
	// echo answers each example with its first dense value plus value,
	// so a call handed another call's slot gets scores that are not its
	// own; jitter waits up to that long before each answer, so answers
	// race the callers' cancellations.
	echo   bool
	jitter time.Duration
	// spin yields instead of sleeping when idle, so a benchmark measures
	// the backend, not the mesh's 200 µs idle sleep.
	spin   atomic.Bool
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func testModel() model.Config { return model.DLRMv2(model.DevVocabCap) }

func startFakeMesh(t testing.TB, dir string, value float32) *fakeMesh {
	t.Helper()
	return startEchoMesh(t, dir, value, false, 0)
}

// startEchoMesh is startFakeMesh with fakeMesh's echo and jitter set.
func startEchoMesh(t testing.TB, dir string, value float32, echo bool, jitter time.Duration) *fakeMesh {
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
	m := &fakeMesh{seg: seg, value: value, cancel: cancel, echo: echo, jitter: jitter}
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
		if m.paused.Load() {
			time.Sleep(time.Millisecond)
			continue
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
			if m.jitter > 0 {
				spin(time.Duration(rand.Int64N(int64(m.jitter))))
			}
			scores := unsafe.Slice((*float32)(unsafe.Pointer(&raw[0])), req.Examples)
			for k := range scores {
				scores[k] = m.value
			}
			st := shm.StatusOK
			if m.echo {
				views, err := testModel().Request(req.Examples).Payload(req.Payload)
				if err != nil {
					st = shm.StatusInternal
				} else {
					for k := range scores {
						scores[k] = views.Dense[k*testModel().NumDense] + m.value
					}
				}
				if r.Canceled(req.Slot) {
					st = shm.StatusCanceled
				}
			}
			_ = writers[i].Complete(shm.Completion{Slot: req.Slot, Epoch: req.Epoch, Status: st, Examples: req.Examples})
		}
		if idle && m.spin.Load() {
			runtime.Gosched()
		} else if idle {
			time.Sleep(200 * time.Microsecond)
		}
	}
}

// spin waits d without sleeping: a sleep is at least the timer slack,
// far longer than the races the jitter is for.
func spin(d time.Duration) {
	for end := time.Now().Add(d); time.Now().Before(end); {
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

func newBackend(t testing.TB, dir string) *Backend {
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

// waitFor waits, up to a bound far beyond any healthy run, for cond.
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

// waitPhase waits for a to enter p.
func waitPhase(t *testing.T, a *attachment, p phase) {
	t.Helper()
	select {
	case <-a.life.entered(p).Done():
	case <-time.After(20 * time.Second):
		t.Fatalf("generation %d's attachment is %v, not %v", a.seg.Generation(), a.life.phase(), p)
	}
}

// queued is how many requests wait unread in m's request rings.
func (m *fakeMesh) queued() int {
	n := 0
	for _, l := range m.seg.Lanes() {
		n += l.Queued
	}
	return n
}

// callAsync runs call in a goroutine; the result arrives on the channel.
func callAsync(ctx context.Context, b *Backend, n int) <-chan callResult {
	res := make(chan callResult, 1)
	go func() {
		scores, err := call(ctx, b, n)
		res <- callResult{scores, err}
	}()
	return res
}

type callResult struct {
	scores []float32
	err    error
}

// TestCallMovesOffALostGeneration: a call waiting on a generation that
// dies (its owner closes it) is resubmitted to the generation that
// replaces it and answered there, not failed; the lost generation's
// attachment goes all the way to closed.
func TestCallMovesOffALostGeneration(t *testing.T) {
	dir := t.TempDir()
	old := startFakeMesh(t, dir, 0.25)
	b := newBackend(t, dir)
	a1 := b.cur.Load()
	old.paused.Store(true) // the old generation stops answering

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res := callAsync(ctx, b, 4)
	waitFor(t, "the call to wait in the old generation", func() bool { return old.queued() > 0 })
	startFakeMesh(t, dir, 0.75) // its successor
	old.stop()                  // the old one is gone
	r := <-res
	if r.err != nil {
		t.Fatalf("call across a lost generation: %v", r.err)
	}
	if len(r.scores) != 4 || r.scores[0] != 0.75 {
		t.Fatalf("scores %v, want the new generation's 0.75", r.scores)
	}
	waitPhase(t, a1, phaseClosed)
	if b.cur.Load() == a1 || b.Generation() != 2 {
		t.Fatalf("new calls go to generation %d, want 2", b.Generation())
	}
}

// TestRolloutDrainsOldLane: when a newer generation serves, new calls go
// to it while the old attachment drains: a call in flight there is
// answered there, and only then is the old lane retired, given back and
// closed.
func TestRolloutDrainsOldLane(t *testing.T) {
	dir := t.TempDir()
	old := startFakeMesh(t, dir, 0.25)
	b := newBackend(t, dir)
	a1 := b.cur.Load()
	lane := a1.lane.Index()
	old.paused.Store(true)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	inFlight := callAsync(ctx, b, 3)
	waitFor(t, "the call to wait in the old generation", func() bool { return old.queued() > 0 })
	startFakeMesh(t, dir, 0.75)
	waitFor(t, "the switch to generation 2", func() bool { return b.Generation() == 2 && b.Ready() })

	// Draining: the call in flight keeps it from retiring.
	waitPhase(t, a1, phaseDraining)
	if p := a1.life.phase(); p != phaseDraining {
		t.Fatalf("the old attachment is %v with a call in flight, want draining", p)
	}
	got, err := call(ctx, b, 2)
	if err != nil || got[0] != 0.75 {
		t.Fatalf("a new call during the drain: %v, %v; want the new generation's 0.75", got, err)
	}
	if p := a1.life.phase(); p != phaseDraining {
		t.Fatalf("the old attachment is %v with a call in flight, want draining", p)
	}

	old.paused.Store(false)
	r := <-inFlight
	if r.err != nil || len(r.scores) != 3 || r.scores[0] != 0.25 {
		t.Fatalf("the call in flight during the rollout: %v, %v; want the old generation's 0.25", r.scores, r.err)
	}
	waitPhase(t, a1, phaseClosed)
	if a1.lost.HasFired() {
		t.Fatalf("a drained attachment counts as lost: %v", *a1.lostErr.Load())
	}
	if l := old.seg.Lanes()[lane]; l.Owner != 0 {
		t.Fatalf("the drained lane %d is still held: %+v", lane, l)
	}
}

// TestCloseGivesEverythingBack: Close returns only once every attachment
// is closed and its lane given back.
func TestCloseGivesEverythingBack(t *testing.T) {
	dir := t.TempDir()
	m := startFakeMesh(t, dir, 0.5)
	b := newBackend(t, dir)
	a1 := b.cur.Load()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := call(ctx, b, 1); err != nil {
		t.Fatal(err)
	}
	b.Close()
	if !a1.life.entered(phaseClosed).HasFired() {
		t.Fatalf("Close returned with the attachment %v", a1.life.phase())
	}
	for _, l := range m.seg.Lanes() {
		if l.Owner != 0 {
			t.Fatalf("lane %d still held after Close: %+v", l.Index, l)
		}
	}
	if b.Ready() {
		t.Fatal("ready after Close")
	}
	if _, err := b.Acquire(ctx, 1); !errors.Is(err, frontend.ErrUnavailable) {
		t.Fatalf("Acquire after Close: %v", err)
	}
}

// TestCloseWithAbandonedCall: a call that gave up leaves its slot to the
// completion reader; Close must not wait for a completion that never
// comes.
func TestCloseWithAbandonedCall(t *testing.T) {
	dir := t.TempDir()
	m := startFakeMesh(t, dir, 0.5)
	b := newBackend(t, dir)
	a1 := b.cur.Load()
	m.paused.Store(true)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := call(ctx, b, 1); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a call nobody answers: %v, want its deadline", err)
	}
	closed := make(chan struct{})
	go func() { b.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(20 * time.Second):
		t.Fatalf("Close hangs on an abandoned call (attachment %v, %d references)", a1.life.phase(), a1.refs.Load())
	}
	if !a1.life.entered(phaseClosed).HasFired() {
		t.Fatalf("Close returned with the attachment %v", a1.life.phase())
	}
}

// TestCorruptCompletionRingGivenUp: a completion ring that yields more
// than maxBadCompletions bad entries in a row is given up; the backend
// retires that attachment and serves from a new one.
func TestCorruptCompletionRingGivenUp(t *testing.T) {
	dir := t.TempDir()
	m := startFakeMesh(t, dir, 0.5)
	b := newBackend(t, dir)
	a1 := b.cur.Load()
	w, err := m.seg.CompletionWriter(a1.lane.Index())
	if err != nil {
		t.Fatal(err)
	}
	// Completions for a slot that holds no request: each is corrupt. No
	// call is in flight, so the mesh's own writer for the lane is idle.
	for i := 0; i <= maxBadCompletions; i++ {
		waitFor(t, "room in the completion ring", func() bool {
			return w.Complete(shm.Completion{Slot: 0, Epoch: a1.lane.Epoch(), Status: shm.StatusOK, Examples: 1}) == nil
		})
	}
	waitPhase(t, a1, phaseClosed)
	if !a1.lost.HasFired() {
		t.Fatal("the attachment closed without being lost")
	}
	waitFor(t, "a new attachment", func() bool { a := b.cur.Load(); return a != nil && a != a1 && b.Ready() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if got, err := call(ctx, b, 2); err != nil || got[0] != 0.5 {
		t.Fatalf("a call after the ring was given up: %v, %v", got, err)
	}
}

// TestCallAllocations: a call through the backend allocates nothing.
func TestCallAllocations(t *testing.T) {
	if raceEnabled {
		// Under the race detector a call that waits for its completion
		// (one whose process lost the core meanwhile: a loaded machine)
		// counts an allocation per park, the detector's own.
		t.Skip("allocation counts under the race detector are its own")
	}
	dir := t.TempDir()
	startFakeMesh(t, dir, 0.5)
	b := newBackend(t, dir)
	one := func() { plainCall(t, b) }
	for range 50 {
		one()
	}
	if a := testing.AllocsPerRun(200, one); a > 0.5 {
		t.Fatalf("%.2f allocations per call, want 0", a)
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
