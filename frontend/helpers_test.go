package frontend

import (
	"context"
	"encoding/binary"
	"io"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/recmesh/recmesh/model"
	"github.com/recmesh/recmesh/proto/inference"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// testMaxBatch keeps the batch bound small so the over-the-limit case is
// cheap to build.
const testMaxBatch = 8

func testConfig() model.Config { return model.DLRMv2(model.DevVocabCap) }

// fakeBackend is a Backend driven by the test: it counts calls, records what
// the frontend wrote into each slot, can fail at either step, can block in
// Submit, and scores each example with a checksum of its inputs, so a test
// can tell that the right bytes reached the right row.
type fakeBackend struct {
	width int
	// capacity is the largest slot, and the service's MaxBatch.
	capacity int

	notReady   atomic.Bool
	acquires   atomic.Int64
	submits    atomic.Int64
	releases   atomic.Int64
	closes     atomic.Int64
	acquireErr error
	submitErr  error
	// shortScores and shortSlot make the backend break its contract.
	shortScores bool
	shortSlot   bool
	// block, when set, makes Submit wait for it to close (or ctx to end).
	block chan struct{}
	// entered, when set, receives one value per Submit that has started.
	entered chan struct{}
	// record keeps a copy of the last slot's inputs (off in benchmarks).
	record bool

	mu          sync.Mutex
	lastDense   []float32
	lastSparse  []int32
	lastTC      TraceContext
	lastArrival time.Time

	// free recycles slots; unlike a sync.Pool it survives GC, so a
	// benchmark measures the frontend's allocations, not the fake's.
	free chan *fakeSlot
}

func newFakeBackend() *fakeBackend {
	return &fakeBackend{width: testConfig().SparseWidth(), capacity: testMaxBatch, record: true, free: make(chan *fakeSlot, 16)}
}

func (f *fakeBackend) Ready() bool { return !f.notReady.Load() }

func (f *fakeBackend) Close() error { f.closes.Add(1); return nil }

func (f *fakeBackend) Acquire(_ context.Context, n int) (Slot, error) {
	f.acquires.Add(1)
	if f.acquireErr != nil {
		return nil, f.acquireErr
	}
	var s *fakeSlot
	select {
	case s = <-f.free:
	default:
		s = &fakeSlot{
			f:      f,
			dense:  make([]float32, f.capacity*model.NumDense),
			sparse: make([]int32, f.capacity*f.width),
			scores: make([]float32, f.capacity),
		}
	}
	s.n = n
	return s, nil
}

type fakeSlot struct {
	f      *fakeBackend
	n      int
	dense  []float32
	sparse []int32
	scores []float32
}

func (s *fakeSlot) Dense() []float32 {
	if s.f.shortSlot {
		return s.dense[:s.n*model.NumDense-1]
	}
	return s.dense[:s.n*model.NumDense]
}

func (s *fakeSlot) Sparse() []int32 { return s.sparse[:s.n*s.f.width] }

func (s *fakeSlot) Submit(ctx context.Context, call Call) ([]float32, error) {
	f := s.f
	f.submits.Add(1)
	if f.entered != nil {
		f.entered <- struct{}{}
	}
	if f.block != nil {
		select {
		case <-f.block:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	if f.submitErr != nil {
		return nil, f.submitErr
	}
	dense, sparse := s.dense[:s.n*model.NumDense], s.sparse[:s.n*f.width]
	if f.record {
		f.mu.Lock()
		f.lastDense = append([]float32(nil), dense...)
		f.lastSparse = append([]int32(nil), sparse...)
		f.lastTC, f.lastArrival = call.Trace, call.Arrival
		f.mu.Unlock()
	}
	scores := s.scores[:s.n]
	for i := range scores {
		if !f.record { // benchmarks: keep the fake's own work negligible
			scores[i] = dense[i*model.NumDense]
			continue
		}
		scores[i] = checksum(dense[i*model.NumDense:(i+1)*model.NumDense], sparse[i*f.width:(i+1)*f.width])
	}
	if f.shortScores {
		scores = scores[:s.n-1]
	}
	return scores, nil
}

func (s *fakeSlot) Release() {
	s.f.releases.Add(1)
	select {
	case s.f.free <- s:
	default:
	}
}

// checksum is the fake model: a score that depends on every input of a row.
func checksum(dense []float32, sparse []int32) float32 {
	var sum float64
	for i, v := range dense {
		sum += float64(v) * float64(i+1)
	}
	for i, id := range sparse {
		sum += float64(id) * float64(i+1) * 1e-6
	}
	return float32(sum)
}

func expectedScores(dense []float32, sparse []int32, n, width int) []float32 {
	out := make([]float32, n)
	for i := range out {
		out[i] = checksum(dense[i*model.NumDense:(i+1)*model.NumDense], sparse[i*width:(i+1)*width])
	}
	return out
}

// newTestService returns a service over f with the test schema.
func newTestService(t testing.TB, f *fakeBackend) *service {
	t.Helper()
	opts, err := Options{Model: testConfig(), Backend: f, MaxBatch: f.capacity, MetricsAddr: MetricsOff}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	m, err := newMetrics(opts.Registerer, opts.LatencyTarget)
	if err != nil {
		t.Fatal(err)
	}
	return &service{schema: newSchema(opts), backend: f, metrics: m, version: "test", draining: new(atomic.Bool)}
}

func discardLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// inputs returns n valid examples.
func inputs(n int) ([]float32, []int32) { return model.RandomInputs(testConfig(), 42, n) }

func f32Bytes(v []float32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return b
}

func i32Bytes(v []int32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], uint32(x))
	}
	return b
}

func i64Bytes(v []int64) []byte {
	b := make([]byte, 8*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint64(b[8*i:], uint64(x))
	}
	return b
}

func widen(v []int32) []int64 {
	out := make([]int64, len(v))
	for i, x := range v {
		out[i] = int64(x)
	}
	return out
}

type tensor = inference.ModelInferRequest_InferInputTensor

// rawRequest is a valid request of n examples with raw contents; int64 picks
// the sparse datatype.
func rawRequest(dense []float32, sparse []int32, n int, int64ids bool) *inference.ModelInferRequest {
	width := testConfig().SparseWidth()
	st, sb := typeINT32, i32Bytes(sparse)
	if int64ids {
		st, sb = typeINT64, i64Bytes(widen(sparse))
	}
	return &inference.ModelInferRequest{
		ModelName: DefaultModelName,
		Id:        "req-1",
		Inputs: []*tensor{
			{Name: "dense", Datatype: "FP32", Shape: []int64{int64(n), model.NumDense}},
			{Name: "sparse", Datatype: st, Shape: []int64{int64(n), int64(width)}},
		},
		RawInputContents: [][]byte{f32Bytes(dense), sb},
	}
}

// typedRequest is rawRequest with typed contents.
func typedRequest(dense []float32, sparse []int32, n int, int64ids bool) *inference.ModelInferRequest {
	width := testConfig().SparseWidth()
	sc := &inference.InferTensorContents{IntContents: append([]int32(nil), sparse...)}
	st := typeINT32
	if int64ids {
		st = typeINT64
		sc = &inference.InferTensorContents{Int64Contents: widen(sparse)}
	}
	return &inference.ModelInferRequest{
		ModelName: DefaultModelName,
		Id:        "req-1",
		Inputs: []*tensor{
			{Name: "dense", Datatype: "FP32", Shape: []int64{int64(n), model.NumDense},
				Contents: &inference.InferTensorContents{Fp32Contents: append([]float32(nil), dense...)}},
			{Name: "sparse", Datatype: st, Shape: []int64{int64(n), int64(width)}, Contents: sc},
		},
	}
}

// responseScores reads the scores of a response, raw or typed, and says
// which it was.
func responseScores(t testing.TB, resp *inference.ModelInferResponse) (scores []float32, raw bool) {
	t.Helper()
	if len(resp.Outputs) != 1 {
		t.Fatalf("response has %d outputs, want 1", len(resp.Outputs))
	}
	o := resp.Outputs[0]
	if o.Name != "score" || o.Datatype != "FP32" || len(o.Shape) != 2 || o.Shape[1] != 1 {
		t.Fatalf("output is %s %s %v, want score FP32 [B, 1]", o.Name, o.Datatype, o.Shape)
	}
	if len(resp.RawOutputContents) > 0 {
		if o.Contents != nil {
			t.Fatal("response sets both raw_output_contents and contents")
		}
		b := resp.RawOutputContents[0]
		scores = make([]float32, len(b)/4)
		for i := range scores {
			scores[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
		}
		raw = true
	} else {
		scores = o.GetContents().GetFp32Contents()
	}
	if int64(len(scores)) != o.Shape[0] {
		t.Fatalf("%d scores for shape %v", len(scores), o.Shape)
	}
	return scores, raw
}

// waitFor polls cond every few milliseconds until it holds or timeout
// passes: tests synchronise on observable state, never on sleeps.
func waitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
