// Package server is the accelerator's serving loop: it attaches to the
// embedder's current segment generation, reads batches from the batch ring,
// runs each through the executor straight from its staging buffer, writes
// the scores into each request's lane arena and completes it. When a
// generation ends (embedder dead, draining or replaced) it re-attaches to
// the next one.
package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/recmesh/recmesh/accelerator/executor"
	"github.com/recmesh/recmesh/model"
	"github.com/recmesh/recmesh/shm"
)

// Defaults for Options.
const (
	DefaultSegment = shm.DefaultSegment
	attachRetry    = 50 * time.Millisecond
)

// Options configure a Server.
type Options struct {
	// ShmDir and Segment name the embedder's segment file.
	ShmDir, Segment string
	// Executor runs the program; its model must be the embedder's.
	Executor *executor.Executor
	Log      *slog.Logger
	Registry prometheus.Registerer
	// Tracer records an execute span per bucket run, linked to every
	// request it carried. Nil or a no-op provider: no tracing work.
	Tracer trace.TracerProvider
	// CopyStaging copies each batch's rows, under a fault guard, into
	// private memory before the device runs it, instead of letting the
	// device read them in place from the segment's staging buffers (the
	// default). The copy guarded against a process truncating the
	// segment under an XLA thread, which no Go fault guard reaches; the
	// staging buffers are now a memfd sealed against shrinking that only
	// the embedder and the accelerator hold, so it is defence in depth
	// that costs a memcpy per batch (5 % of the serving core at hostbound
	// B_req 128).
	CopyStaging bool
	// AcceleratorKeyFile, when set, holds the segment's accelerator key
	// (the embedder's --accelerator-key-file). It is read at every attach,
	// so an embedder restarted with a new key is still reached.
	AcceleratorKeyFile string
	// Release, if set, runs after each calibration: the accelerator
	// hands the heap pages it left free back to the kernel
	// (device.ReleaseHeap). Calibrating runs every bucket, the largest
	// ones' temporaries included (tens of MiB at bucket 4096 on MLPerf's
	// network); glibc keeps what they freed resident, and serving small
	// batches never needs it again.
	Release func()
}

// Server serves batches of one embedder.
type Server struct {
	opts   Options
	log    *slog.Logger
	m      *metrics
	tracer trace.Tracer // nil when tracing is off

	gen atomic.Uint64 // attached generation, 0 when none (read by status)

	mu      sync.Mutex
	ex      program // serves new generations
	pending program // compiled for a rollout, not yet attached
	refs    map[program]int
	// times are the execution time estimates of each program, calibrated
	// once and carried across generations.
	times map[program]*execTimes

	// pulses are the serving loops' proofs of progress, one per attached
	// generation (Live).
	pulses shm.PulseSet
}

// Allowances of the serving loop's long steps (shm.Pulse.Expect): past
// them without progress, the loop counts as stuck.
const (
	// runSlack is added to a batch's expected execution time.
	runSlack = 2 * time.Second
)

// runAllowance is how long one batch may take before the loop counts as
// stuck: several times its estimate, plus slack for a busy machine.
func runAllowance(estimate time.Duration) time.Duration { return 8*estimate + runSlack }

// Live reports whether every serving loop is making progress (true with
// none attached: waiting for a generation is not being stuck).
func (s *Server) Live() bool { return s.pulses.Live(0) }

// New checks the options.
func New(opts Options) (*Server, error) {
	if opts.Executor == nil {
		return nil, errors.New("accelerator: server needs an executor")
	}
	return newServer(opts, pjrtProgram{opts.Executor}), nil
}

// newServer is New with the program to serve (the tests' seam).
func newServer(opts Options, ex program) *Server {
	if opts.ShmDir == "" {
		opts.ShmDir = shm.DefaultDir
	}
	if opts.Segment == "" {
		opts.Segment = DefaultSegment
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	if opts.Registry == nil {
		opts.Registry = prometheus.NewRegistry()
	}
	return &Server{
		opts:   opts,
		ex:     ex,
		log:    opts.Log,
		m:      newMetrics(opts.Registry, ex.Buckets()),
		refs:   map[program]int{},
		times:  map[program]*execTimes{},
		tracer: newTracer(opts.Tracer),
	}
}

// Path is the segment file the server attaches to.
func (s *Server) Path() string { return filepath.Join(s.opts.ShmDir, s.opts.Segment) }

// Generation is the attached generation (0 when detached).
func (s *Server) Generation() uint64 { return s.gen.Load() }

// ModelID is the id of the model the server serves new generations with:
// the one it started with, or the last rollout's once a generation of it
// has attached.
func (s *Server) ModelID() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ex.Config().ID()
}

// Prepare makes ex the executor for segments of its model: a rollout
// compiles the new model with it while the old one serves, and the next
// generation that announces that model is served with it.
func (s *Server) Prepare(ex *executor.Executor) {
	if ex == nil {
		return
	}
	s.prepare(pjrtProgram{ex})
}

func (s *Server) prepare(ex program) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.pending != nil && s.pending != s.ex && s.refs[s.pending] == 0 {
		s.pending.Close()
	}
	s.pending = ex
}

// Run attaches to the embedder's newest generation and serves it until ctx
// is done. A generation replaced by a newer one (a rollout) keeps being
// served until the embedder closes it, beside the new one.
func (s *Server) Run(ctx context.Context) error {
	// Calibrate before the first attach: the frontends take calls once an
	// accelerator is attached, and calls that came in while it calibrated
	// would wait for it (a second of every bucket on the MLPerf network).
	s.mu.Lock()
	ex := s.ex
	s.mu.Unlock()
	if _, err := s.execTimesFor(ex); err != nil {
		return fmt.Errorf("accelerator: calibrate: %w", err)
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	var lastIno uint64
	active := 0
	ended := make(chan struct{}, 16)
	waiting := false
	t := time.NewTicker(attachRetry)
	defer t.Stop()
	for {
		ino, statErr := shm.FileIdentity(s.Path())
		if statErr == nil && (active == 0 || ino != lastIno) {
			seg, ex, err := s.attach()
			if err == nil {
				lastIno = ino
				active++
				waiting = false
				wg.Add(1)
				go func() {
					defer wg.Done()
					s.serveGeneration(ctx, seg, ex)
					ended <- struct{}{}
				}()
			} else if !waiting {
				s.log.Info("waiting for a segment to serve", "path", s.Path(), "reason", err)
				waiting = true
			}
		} else if statErr != nil && active == 0 && !waiting {
			s.log.Info("waiting for the embedder's segment", "path", s.Path(), "reason", statErr)
			waiting = true
		}
		select {
		case <-ctx.Done():
			return nil
		case <-ended:
			active--
		case <-t.C:
		}
	}
}

// serveGeneration serves one attached segment with ex until it ends.
func (s *Server) serveGeneration(ctx context.Context, seg *shm.Segment, ex program) {
	gen := seg.Generation()
	s.gen.Store(gen)
	s.m.generation.Set(float64(gen))
	s.log.Info("attached", "path", seg.Path(), "generation", gen, "model", seg.ModelID())
	// A fault on the mapping (someone truncated the segment file) ends
	// this generation, not the process; the embedder replaces it.
	err := shm.GuardFaults(func() error { return s.serve(ctx, seg, ex) })
	s.gen.CompareAndSwap(gen, 0)
	_ = shm.GuardFaults(func() error { seg.DetachAccelerator(); return nil })
	_ = seg.Close()
	s.mu.Lock()
	s.refs[ex]--
	if s.refs[ex] == 0 && ex != s.ex && ex != s.pending {
		ex.Close()
		delete(s.refs, ex)
		delete(s.times, ex)
	}
	s.mu.Unlock()
	if ctx.Err() == nil {
		s.log.Info("generation ended", "generation", gen, "reason", err)
	}
}

// attach opens the current generation, picks the executor compiled for its
// model, and registers as its accelerator.
func (s *Server) attach() (*shm.Segment, program, error) {
	var key []byte
	if s.opts.AcceleratorKeyFile != "" {
		var err error
		if key, err = shm.AcceleratorKeyFile(s.opts.AcceleratorKeyFile, false); err != nil {
			return nil, nil, err
		}
	}
	seg, err := shm.Attach(s.Path(), shm.AttachOptions{AcceleratorKey: key})
	if err != nil {
		return nil, nil, err
	}
	s.mu.Lock()
	ex := s.ex
	if id := seg.ModelID(); id != s.ex.Config().ID() {
		if s.pending == nil || s.pending.Config().ID() != id {
			s.mu.Unlock()
			seg.Close()
			return nil, nil, fmt.Errorf("no program compiled for model %q (serving %q): roll out with recmesh model load", id, s.ex.Config().ID())
		}
		// The rollout's model: it becomes the one new generations use.
		s.ex, s.pending = s.pending, nil
		ex = s.ex
	}
	s.refs[ex]++
	s.mu.Unlock()
	fail := func(err error) (*shm.Segment, program, error) {
		s.mu.Lock()
		s.refs[ex]--
		s.mu.Unlock()
		seg.Close()
		return nil, nil, err
	}
	g := seg.Geometry()
	if model.PowerOfTwoCeil(g.MaxExamples) > ex.MaxBucket() {
		return fail(fmt.Errorf("segment max batch %d exceeds the compiled buckets (up to %d): raise the accelerator's --max-batch", g.MaxExamples, ex.MaxBucket()))
	}
	if need := ex.Config().Staging(model.PowerOfTwoCeil(g.MaxExamples)).Size; g.StagingBytes < need {
		return fail(fmt.Errorf("segment staging buffers of %d bytes, need %d", g.StagingBytes, need))
	}
	// The embedder plans its first batch with these, and the frontends
	// take calls as soon as we are attached: publish them first. A
	// rollout's program is calibrated here, at its first generation.
	times, err := s.execTimesFor(ex)
	if err != nil {
		return fail(fmt.Errorf("accelerator: calibrate: %w", err))
	}
	exec := make([]shm.ExecEstimate, 0, len(ex.Buckets()))
	for i, b := range ex.Buckets() {
		if d := times.estimate(i); d > 0 {
			exec = append(exec, shm.ExecEstimate{Bucket: b, Time: d})
			s.m.predicted[i].Set(d.Seconds())
		}
	}
	if err := seg.SetAccelerator(os.Getpid(), exec...); err != nil {
		return fail(err)
	}
	return seg, ex, nil
}

// serve runs one generation's batches.
func (s *Server) serve(ctx context.Context, seg *shm.Segment, ex program) error {
	ctx, cancel := context.WithCancel(ctx)
	// The heartbeat writes into the mapping: it must stop before the
	// caller unmaps it.
	beat := make(chan struct{})
	defer func() { cancel(); <-beat }()
	// The heartbeat stands for this loop: it beats only while the loop
	// ticks (every wake-up of the batch wait, every batch), so a loop stuck
	// in a device call stops it and the embedder declares us hung.
	pulse := shm.NewPulse()
	s.pulses.Add(pulse)
	defer s.pulses.Remove(pulse)
	go func() {
		defer close(beat)
		if err := shm.GuardFaults(func() error { return seg.AcceleratorHeartbeat(ctx, 0, pulse) }); errors.Is(err, shm.ErrSegmentLost) {
			cancel() // the loop would fault next: end the generation
		}
	}()

	times, err := s.execTimesFor(ex) // calibrated by attach
	if err != nil {
		return fmt.Errorf("accelerator: calibrate: %w", err)
	}
	l, err := s.newLoop(seg, ex, times, pulse)
	if err != nil {
		return err
	}
	defer l.close()
	return l.run(ctx)
}

// execTimesFor returns ex's execution time estimates, calibrating them on
// first use (the embedder's SLO batching needs them before the first
// batch, and a new executor's buckets have never run).
func (s *Server) execTimesFor(ex program) (*execTimes, error) {
	s.mu.Lock()
	t := s.times[ex]
	s.mu.Unlock()
	if t != nil {
		return t, nil
	}
	t = newExecTimes(ex.Buckets())
	start := time.Now()
	if err := t.calibrate(ex); err != nil {
		return nil, err
	}
	s.log.Info("calibrated execution times", "took", time.Since(start).Round(time.Millisecond))
	if s.opts.Release != nil {
		s.opts.Release()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if prev := s.times[ex]; prev != nil {
		return prev, nil // another generation calibrated it meanwhile
	}
	s.times[ex] = t
	return t, nil
}

// metrics are the accelerator's Prometheus series.
type metrics struct {
	completed  []prometheus.Counter // by shm status code
	execute    []prometheus.Observer
	predicted  []prometheus.Gauge
	runs       []prometheus.Counter
	batch      prometheus.Histogram
	padding    prometheus.Histogram
	generation prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer, buckets []int) *metrics {
	exec := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "recmesh_accelerator_execute_seconds",
		Help:    "Device time of one program run, by bucket.",
		Buckets: prometheus.ExponentialBuckets(50e-6, 2, 16),
	}, []string{"bucket"})
	predicted := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "recmesh_accelerator_predicted_execute_seconds",
		Help: "Execution time the accelerator publishes for the embedder's SLO batching, by bucket: a high quantile of recent runs.",
	}, []string{"bucket"})
	runs := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "recmesh_accelerator_runs_total",
		Help: "Program runs, by bucket.",
	}, []string{"bucket"})
	m := &metrics{
		batch: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "recmesh_accelerator_batch_examples",
			Help:    "Real (unpadded) examples per program run.",
			Buckets: prometheus.ExponentialBuckets(1, 2, 13),
		}),
		padding: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "recmesh_accelerator_padding_ratio",
			Help:    "Fraction of each run's bucket that was padding.",
			Buckets: prometheus.LinearBuckets(0, 0.1, 10),
		}),
		generation: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "recmesh_accelerator_generation",
			Help: "Segment generation attached to (0 when detached).",
		}),
	}
	requests := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "recmesh_accelerator_requests_total",
		Help: "Requests completed into their lanes, by status.",
	}, []string{"status"})
	for _, name := range []string{"ok", "canceled", "expired", "invalid", "unavailable", "internal", "shed"} {
		m.completed = append(m.completed, requests.WithLabelValues(name))
	}
	reg.MustRegister(requests)
	for _, b := range buckets {
		l := strconv.Itoa(b)
		m.execute = append(m.execute, exec.WithLabelValues(l))
		m.predicted = append(m.predicted, predicted.WithLabelValues(l))
		m.runs = append(m.runs, runs.WithLabelValues(l))
	}
	reg.MustRegister(exec, predicted, runs, m.batch, m.padding, m.generation)
	return m
}
