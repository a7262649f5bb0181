package frontend

import (
	"context"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/recmesh/recmesh/model"
	"github.com/recmesh/recmesh/proto/inference"
)

// Triton's extensions that its tools call before their first inference:
// perf_analyzer reads ModelConfig to shape its requests, model analyzers
// and dashboards read ModelStatistics, and clients list models with
// RepositoryIndex. They report this frontend's model as a Triton model.

// extensions are the protocol extensions ServerMetadata lists.
func extensions() []string { return []string{"statistics", "model_repository"} }

// PlatformBackend is what ModelConfig names as the model's backend.
const PlatformBackend = "recmesh"

// ModelConfig describes the model in Triton's configuration schema: inputs
// and output without the batch dimension, max_batch_size the largest
// request, the mesh's batching as a dynamic batcher that never waits for a
// window (it merges requests while the device is busy, bounded by the
// latency target), and the model's shape as parameters.
func (s *service) ModelConfig(_ context.Context, req *inference.ModelConfigRequest) (*inference.ModelConfigResponse, error) {
	if err := s.schema.checkModel(req.Name, req.Version); err != nil {
		return nil, err
	}
	cfg := s.model
	vocab := make([]string, len(cfg.VocabSizes))
	for i, v := range cfg.VocabSizes {
		vocab[i] = strconv.FormatInt(int64(v), 10)
	}
	hot := make([]string, len(cfg.Hotness))
	for i, h := range cfg.Hotness {
		hot[i] = strconv.Itoa(h)
	}
	param := func(v string) *inference.ModelParameter { return &inference.ModelParameter{StringValue: v} }
	return &inference.ModelConfigResponse{Config: &inference.ModelConfig{
		Name:         s.schema.name,
		Platform:     Platform,
		Backend:      PlatformBackend,
		MaxBatchSize: int32(s.schema.maxBatch),
		Input: []*inference.ModelInput{
			{Name: inputDense, DataType: inference.DataType_TYPE_FP32, Dims: []int64{model.NumDense}},
			{Name: inputSparse, DataType: inference.DataType_TYPE_INT32, Dims: []int64{int64(s.schema.width)}},
		},
		Output: []*inference.ModelOutput{
			{Name: outputScore, DataType: inference.DataType_TYPE_FP32, Dims: []int64{1}},
		},
		InstanceGroup: []*inference.ModelInstanceGroup{{Name: "accelerator", Count: 1, Kind: inference.ModelInstanceGroup_KIND_MODEL}},
		SchedulingChoice: &inference.ModelConfig_DynamicBatching{DynamicBatching: &inference.ModelDynamicBatching{
			MaxQueueDelayMicroseconds: 0,
		}},
		Parameters: map[string]*inference.ModelParameter{
			"model_id":          param(cfg.ID()),
			"vocab_sizes":       param(strings.Join(vocab, ",")),
			"multi_hot_sizes":   param(strings.Join(hot, ",")),
			"embedding_dim":     param(strconv.Itoa(cfg.EmbeddingDim)),
			"latency_target_us": param(strconv.FormatInt(s.metrics.target.Microseconds(), 10)),
			"batching":          param("merged by the embedder while the device is busy; sized and shed to keep the latency target (batch mode slo)"),
		},
	}}, nil
}

// RepositoryIndex lists the one model, READY or UNAVAILABLE.
func (s *service) RepositoryIndex(_ context.Context, req *inference.RepositoryIndexRequest) (*inference.RepositoryIndexResponse, error) {
	m := &inference.RepositoryIndexResponse_ModelIndex{Name: s.schema.name, Version: s.schema.version, State: "READY"}
	if !s.ready() {
		if req.Ready {
			return &inference.RepositoryIndexResponse{}, nil
		}
		m.State, m.Reason = "UNAVAILABLE", "the mesh behind this frontend is not ready"
	}
	return &inference.RepositoryIndexResponse{Models: []*inference.RepositoryIndexResponse_ModelIndex{m}}, nil
}

// ModelStatistics reports this frontend's cumulative statistics of the
// model (each frontend process counts the calls it answered; sum them over
// the frontends for the mesh's). Durations follow Triton's split: queue is
// the wait for a shared-memory slot, compute_input the decoding into it,
// compute_infer the mesh's lookup, batching and execution, compute_output
// the reply's encoding.
func (s *service) ModelStatistics(_ context.Context, req *inference.ModelStatisticsRequest) (*inference.ModelStatisticsResponse, error) {
	if req.Name != "" {
		if err := s.schema.checkModel(req.Name, req.Version); err != nil {
			return nil, err
		}
	}
	st := &s.stats
	dur := func(c, ns *atomic.Uint64) *inference.StatisticDuration {
		return &inference.StatisticDuration{Count: c.Load(), Ns: ns.Load()}
	}
	ok := st.success.Load()
	return &inference.ModelStatisticsResponse{ModelStats: []*inference.ModelStatistics{{
		Name:           s.schema.name,
		Version:        s.schema.version,
		LastInference:  st.lastMs.Load(),
		InferenceCount: st.examples.Load(),
		ExecutionCount: ok,
		InferenceStats: &inference.InferStatistics{
			Success:       dur(&st.success, &st.successNs),
			Fail:          dur(&st.fail, &st.failNs),
			Queue:         &inference.StatisticDuration{Count: ok, Ns: st.queueNs.Load()},
			ComputeInput:  &inference.StatisticDuration{Count: ok, Ns: st.inputNs.Load()},
			ComputeInfer:  &inference.StatisticDuration{Count: ok, Ns: st.inferNs.Load()},
			ComputeOutput: &inference.StatisticDuration{Count: ok, Ns: st.outputNs.Load()},
		},
	}}}, nil
}

// stats are the cumulative counters ModelStatistics reports. The split
// durations are those of successful calls, as Triton counts them.
type stats struct {
	success, successNs atomic.Uint64
	fail, failNs       atomic.Uint64
	examples           atomic.Uint64
	lastMs             atomic.Uint64
	queueNs, inputNs   atomic.Uint64
	inferNs, outputNs  atomic.Uint64
}

// callTimes are the instants that split one successful call: arrival,
// asking for a slot, holding it, submitting it, its scores back, and the
// reply built.
type callTimes struct {
	start, acquiring, acquired, submitted, scored, replied time.Time
}

// record adds one answered call.
func (st *stats) record(t *callTimes, n int, ok bool, end time.Time) {
	took := uint64(end.Sub(t.start))
	st.lastMs.Store(uint64(end.UnixMilli()))
	if !ok {
		st.fail.Add(1)
		st.failNs.Add(took)
		return
	}
	st.success.Add(1)
	st.successNs.Add(took)
	st.examples.Add(uint64(n))
	st.queueNs.Add(uint64(t.acquired.Sub(t.acquiring)))
	st.inputNs.Add(uint64(t.acquiring.Sub(t.start) + t.submitted.Sub(t.acquired)))
	st.inferNs.Add(uint64(t.scored.Sub(t.submitted)))
	st.outputNs.Add(uint64(t.replied.Sub(t.scored)))
}

// tritonMetrics exports the statistics under the names Triton's own
// /metrics uses (nv_inference_*, labelled model and version), so Triton's
// Grafana dashboards and queue-time autoscalers read a recmesh frontend
// as they read a Triton server. Durations are cumulative microseconds, as
// Triton's are.
type tritonMetrics struct {
	s     *service
	descs [7]*prometheus.Desc
}

func newTritonMetrics(s *service) *tritonMetrics {
	m := &tritonMetrics{s: s}
	labels := []string{"model", "version"}
	for i, d := range [...][2]string{
		{"nv_inference_request_success", "Successful inference requests (Triton's name; recmesh counts this frontend's)."},
		{"nv_inference_request_failure", "Failed inference requests (Triton's name)."},
		{"nv_inference_count", "Examples inferred (Triton's name; a request of batch size B counts B)."},
		{"nv_inference_exec_count", "Model executions (Triton's name; recmesh counts successful requests)."},
		{"nv_inference_request_duration_us", "Cumulative end-to-end duration of inference requests, µs (Triton's name)."},
		{"nv_inference_queue_duration_us", "Cumulative time requests waited for a slot, µs (Triton's name)."},
		{"nv_inference_compute_infer_duration_us", "Cumulative time of lookup, batching and execution, µs (Triton's name)."},
	} {
		m.descs[i] = prometheus.NewDesc(d[0], d[1], labels, nil)
	}
	return m
}

func (m *tritonMetrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range m.descs {
		ch <- d
	}
}

func (m *tritonMetrics) Collect(ch chan<- prometheus.Metric) {
	st := &m.s.stats
	ok, fail := st.success.Load(), st.fail.Load()
	us := func(ns uint64) float64 { return float64(ns) / 1e3 }
	for i, v := range [...]float64{
		float64(ok), float64(fail), float64(st.examples.Load()), float64(ok),
		us(st.successNs.Load() + st.failNs.Load()), us(st.queueNs.Load()), us(st.inferNs.Load()),
	} {
		ch <- prometheus.MustNewConstMetric(m.descs[i], prometheus.CounterValue, v, m.s.schema.name, m.s.schema.version)
	}
}
