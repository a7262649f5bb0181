package frontend

import (
	"context"
	"encoding/binary"
	"errors"
	"math"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"

	"github.com/recmesh/recmesh/model"
	"github.com/recmesh/recmesh/proto/inference"
)

// service implements inference.GRPCInferenceServiceServer for one model.
type service struct {
	inference.UnimplementedGRPCInferenceServiceServer

	schema   *schema
	backend  Backend
	metrics  *metrics
	version  string
	draining *atomic.Bool
	// load receives the in-flight count when steering weighs frontends by
	// it; nil otherwise.
	load interface{ addInflight(int32) }
	// model is the served model's configuration (ModelConfig reports it).
	model model.Config
	// stats are what ModelStatistics reports.
	stats stats
	// maxTime bounds every ModelInfer call (Options.MaxRequestTime; 0:
	// only the client's deadline).
	maxTime time.Duration
	// calls counts the ModelInfer calls in flight, against maxCalls
	// (Options.MaxInflight; 0: no cap).
	calls    atomic.Int64
	maxCalls int64
}

// ready is the readiness every probe reports: the backend can serve and the
// server is not draining.
func (s *service) ready() bool { return !s.draining.Load() && s.backend.Ready() }

// ServerLive is true while the process answers at all.
func (s *service) ServerLive(context.Context, *inference.ServerLiveRequest) (*inference.ServerLiveResponse, error) {
	return &inference.ServerLiveResponse{Live: true}, nil
}

// ServerReady is true when the one model is ready.
func (s *service) ServerReady(context.Context, *inference.ServerReadyRequest) (*inference.ServerReadyResponse, error) {
	return &inference.ServerReadyResponse{Ready: s.ready()}, nil
}

// ModelReady answers NOT_FOUND for a model or version this server lacks.
func (s *service) ModelReady(_ context.Context, req *inference.ModelReadyRequest) (*inference.ModelReadyResponse, error) {
	if err := s.schema.checkModel(req.Name, req.Version); err != nil {
		return nil, err
	}
	return &inference.ModelReadyResponse{Ready: s.ready()}, nil
}

// ServerMetadata lists the Triton extensions recmesh serves: statistics
// and the model repository's index (triton.go).
func (s *service) ServerMetadata(context.Context, *inference.ServerMetadataRequest) (*inference.ServerMetadataResponse, error) {
	return &inference.ServerMetadataResponse{Name: ServerName, Version: s.version, Extensions: extensions()}, nil
}

// ModelMetadata describes the tensors of decode.go. The sparse input is
// declared INT32, the type the backend consumes and half the bytes on the
// wire; INT64 is accepted as well (ids must fit their table either way).
func (s *service) ModelMetadata(_ context.Context, req *inference.ModelMetadataRequest) (*inference.ModelMetadataResponse, error) {
	if err := s.schema.checkModel(req.Name, req.Version); err != nil {
		return nil, err
	}
	type tm = inference.ModelMetadataResponse_TensorMetadata
	return &inference.ModelMetadataResponse{
		Name:     s.schema.name,
		Versions: []string{s.schema.version},
		Platform: Platform,
		Inputs: []*tm{
			{Name: inputDense, Datatype: typeFP32, Shape: []int64{-1, model.NumDense}},
			{Name: inputSparse, Datatype: typeINT32, Shape: []int64{-1, int64(s.schema.width)}},
		},
		Outputs: []*tm{
			{Name: outputScore, Datatype: typeFP32, Shape: []int64{-1, 1}},
		},
	}, nil
}

// ModelInfer validates the request from its bytes, then acquires a backend
// slot, decodes the inputs straight into it, submits it and answers with
// the scores. A request that fails validation never reaches the backend.
func (s *service) ModelInfer(ctx context.Context, req *inference.ModelInferRequest) (*inference.ModelInferResponse, error) {
	start := time.Now()
	if n := s.calls.Add(1); s.maxCalls > 0 && n > s.maxCalls {
		s.calls.Add(-1)
		err := errOverloaded(n - 1)
		s.metrics.done(start, 0, status.Code(err))
		return nil, err
	}
	defer s.calls.Add(-1)
	// The server's own bound, whatever the client asked for: a hung
	// backend costs a call maxTime at most.
	if dl, ok := ctx.Deadline(); s.maxTime > 0 && (!ok || time.Until(dl) > s.maxTime) {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, s.maxTime)
		defer cancel()
	}
	s.metrics.inflight.Inc()
	if s.load != nil {
		s.load.addInflight(1)
	}
	times := callTimes{start: start}
	resp, n, err := s.guardedInfer(ctx, req, &times)
	// Scoring is idempotent and the request is still ours: while the
	// backend replaces the memory that was pulled away (a new generation),
	// try again, for up to faultRetryWait.
	for retryEnd := time.Now().Add(faultRetryWait); errors.Is(err, ErrMemoryLost) && time.Now().Before(retryEnd); {
		time.Sleep(faultRetryPause)
		if !s.waitReady(ctx, time.Until(retryEnd)) {
			break
		}
		resp, n, err = s.guardedInfer(ctx, req, &times)
	}
	if errors.Is(err, ErrMemoryLost) {
		err = status.Errorf(codes.Unavailable, "the model backend's shared memory was lost mid-call; retry: %v", err)
	}
	if s.load != nil {
		s.load.addInflight(-1)
	}
	s.metrics.inflight.Dec()
	code := status.Code(err)
	s.metrics.done(start, n, code)
	s.stats.record(&times, n, err == nil, time.Now())
	return resp, err
}

// faultRetryWait bounds how long a call whose backend memory was pulled
// away waits for the backend to serve again before its one retry.
const faultRetryWait = 2 * time.Second

// faultRetryPause lets the backend notice the loss before the next try.
const faultRetryPause = 50 * time.Millisecond

// guardedInfer is infer under the backend's MemoryGuard, if it has one:
// the call writes its inputs into, and reads its scores from, memory the
// backend may share with other processes.
func (s *service) guardedInfer(ctx context.Context, req *inference.ModelInferRequest, t *callTimes) (resp *inference.ModelInferResponse, n int, err error) {
	g, ok := s.backend.(MemoryGuard)
	if !ok {
		return s.infer(ctx, req, t)
	}
	if ferr := g.Guard(func() error { resp, n, err = s.infer(ctx, req, t); return nil }); ferr != nil {
		return nil, n, ferr
	}
	return resp, n, err
}

// waitReady waits up to d (and ctx) for the backend to be ready.
func (s *service) waitReady(ctx context.Context, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for !s.backend.Ready() {
		if time.Now().After(deadline) || ctx.Err() != nil {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
	return true
}

// infer is ModelInfer without the bookkeeping; n is the batch size. t
// holds when the call arrived, and infer stamps the steps of a successful
// one into it.
func (s *service) infer(ctx context.Context, req *inference.ModelInferRequest, t *callTimes) (*inference.ModelInferResponse, int, error) {
	var in inferInput
	if err := s.schema.parse(req, &in); err != nil {
		return nil, 0, err
	}
	n := in.n
	t.acquiring = time.Now()
	slot, err := s.backend.Acquire(ctx, n)
	if err != nil {
		return nil, n, backendStatus(err)
	}
	t.acquired = time.Now()
	defer slot.Release()
	dense, sparse := slot.Dense(), slot.Sparse()
	if len(dense) != n*model.NumDense || len(sparse) != n*s.schema.width {
		return nil, n, contractError("slot for %d examples has %d dense and %d sparse values", n, len(dense), len(sparse))
	}
	in.dense.copyDense(dense)
	in.sparse.copySparse(sparse)
	t.submitted = time.Now()
	scores, err := slot.Submit(ctx, Call{Arrival: t.start, Trace: traceContext(ctx)})
	if err != nil {
		return nil, n, backendStatus(err)
	}
	t.scored = time.Now()
	if len(scores) != n {
		return nil, n, contractError("%d scores for %d examples", len(scores), n)
	}
	resp := s.reply(req, scores, in.rawOutput)
	t.replied = time.Now()
	return resp, n, nil
}

// traceContext is the current span's context, as handed to the backend.
func traceContext(ctx context.Context) TraceContext {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() {
		return TraceContext{}
	}
	return TraceContext{TraceID: sc.TraceID(), SpanID: sc.SpanID(), Flags: byte(sc.TraceFlags())}
}

// inlineScores is how many scores a reply holds without a second
// allocation: most recommendation calls rank a few dozen candidates.
const inlineScores = 64

// reply is a ModelInferResponse with everything it points to laid out in one
// allocation. It is not pooled: grpc-go keeps using the response after the
// handler returns (encoding, stats handlers' OutPayload, binary logging) and
// gives no signal when it is done, so recycling it could race; one
// allocation per call (two above inlineScores) is the floor.
type reply struct {
	resp     inference.ModelInferResponse
	out      inference.ModelInferResponse_InferOutputTensor
	contents inference.InferTensorContents
	outs     [1]*inference.ModelInferResponse_InferOutputTensor
	raw      [1][]byte
	shape    [2]int64
	inline   [4 * inlineScores]byte
}

// reply builds the response for scores (copied: they are only valid until
// the slot is released), raw or typed as decode.go's rule says.
func (s *service) reply(req *inference.ModelInferRequest, scores []float32, raw bool) *inference.ModelInferResponse {
	r := new(reply)
	r.shape = [2]int64{int64(len(scores)), 1}
	r.out.Name = outputScore
	r.out.Datatype = typeFP32
	r.out.Shape = r.shape[:]
	r.outs[0] = &r.out
	r.resp.ModelName = s.schema.name
	r.resp.ModelVersion = s.schema.version
	r.resp.Id = req.Id
	r.resp.Outputs = r.outs[:]
	if !raw {
		r.contents.Fp32Contents = append([]float32(nil), scores...)
		r.out.Contents = &r.contents
		return &r.resp
	}
	var b []byte
	if len(scores) <= inlineScores {
		b = r.inline[:4*len(scores)]
	} else {
		b = make([]byte, 4*len(scores))
	}
	for i, v := range scores {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
	}
	r.raw[0] = b
	r.resp.RawOutputContents = r.raw[:]
	return &r.resp
}

// errOverloaded refuses a call beyond Options.MaxInflight.
func errOverloaded(inflight int64) error {
	return status.Errorf(codes.ResourceExhausted, "server is at capacity (%d calls in flight, --max-inflight), retry later", inflight)
}

// admit is the gRPC tap in front of every call: beyond the in-flight cap a
// ModelInfer is refused before its request is read and decoded.
func (s *service) admit(ctx context.Context, info *tap.Info) (context.Context, error) {
	return ctx, s.admitMethod(info.FullMethodName)
}

// admitMethod is admit for a transport that names only the method.
func (s *service) admitMethod(fullMethod string) error {
	if s.maxCalls > 0 && fullMethod == inference.GRPCInferenceService_ModelInfer_FullMethodName && s.calls.Load() >= s.maxCalls {
		return errOverloaded(s.calls.Load())
	}
	return nil
}
