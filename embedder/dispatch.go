package embedder

import (
	"context"
	"errors"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/recmesh/recmesh/embedder/batch"
	"github.com/recmesh/recmesh/model"
	"github.com/recmesh/recmesh/shm"
)

// dispatcher is the one goroutine that consumes every lane's request ring,
// owns the Batcher and the batch ring's producer side, and reclaims dead
// lanes (reclaim must not race the ring consumer, so it runs here too).
type dispatcher struct {
	e                        *Embedder
	g                        *generation
	cfg                      model.Config
	seg                      *shm.Segment
	readers                  []*shm.RequestReader
	bw                       *shm.BatchWriter
	batcher                  *batch.Batcher
	jobs                     chan job
	batches                  []*openBatch // by staging index
	open                     *openBatch
	held                     shm.Request // a request read but not yet placed
	hasHeld                  bool
	next                     int // lane to read first in the next round
	lastReclaim, lastMetrics time.Time
	hasWork                  func() bool
	laneLbl                  []string
	self                     *worker
	tracer                   trace.Tracer // nil when tracing is off
	drainStart               time.Time    // when a newer generation took over
	// lookupNanos and lookupExamples are the embedder's lookup totals at
	// the last cost update (SLO mode).
	lookupNanos, lookupExamples int64
	// sleptIdle is whether the device was idle when the dispatcher last
	// computed how long to sleep.
	sleptIdle bool
}

// DefaultSLOBatchBytes is SLO mode's default bound on a merged batch's
// staged rows: 16 MiB, 1,024 examples of the DLRMv2 tables (13 KiB of
// pooled rows each). Larger batches push the rows the embedder writes and
// the accelerator copies out of the caches, so that overload cuts capacity
// below the load (figures in docs/design.md).
const DefaultSLOBatchBytes = 16 << 20

// mergeRows is the largest power of two of examples whose staging region
// (model.Config.Staging) fits SLOBatchBytes (at least 1, at most MaxBatch).
func mergeRows(cfg model.Config, o Options) int {
	rows := 1
	for rows < o.MaxBatch && int64(cfg.Staging(2*rows).Size) <= o.SLOBatchBytes {
		rows *= 2
	}
	return min(rows, o.MaxBatch)
}

// errDrained ends a replaced generation once nothing is left in it.
var errDrained = errors.New("embedder: generation drained")

func (e *Embedder) newDispatcher(g *generation, jobs chan job) (*dispatcher, error) {
	seg := g.seg
	bopts := batch.Options{Mode: e.opts.Mode, MaxBatch: e.opts.MaxBatch, MaxEntries: e.opts.MaxBatch,
		MergeRows: mergeRows(g.store.Config, e.opts), Window: e.opts.Window, LatencyTarget: e.opts.LatencyTarget}
	d := &dispatcher{
		e:       e,
		g:       g,
		cfg:     g.store.Config,
		seg:     seg,
		bw:      seg.BatchWriter(),
		batcher: batch.New(bopts, &batch.Costs{}),
		jobs:    jobs,
		tracer:  newTracer(e.opts.Tracer),
	}
	geo := seg.Geometry()
	for i := 0; i < geo.Lanes; i++ {
		r, err := seg.RequestReader(i)
		if err != nil {
			return nil, err
		}
		d.readers = append(d.readers, r)
		d.laneLbl = append(d.laneLbl, strconv.Itoa(i))
	}
	d.batches = make([]*openBatch, geo.StagingCount)
	d.hasWork = d.wake
	d.bw.Pulse = g.pulse
	return d, nil
}

// batchFor returns the reusable openBatch of a staging buffer.
func (d *dispatcher) batchFor(st *shm.Staging) *openBatch {
	if b := d.batches[st.Index()]; b != nil {
		return b
	}
	b := newOpenBatch(st, d.cfg, d.e.opts.MaxBatch)
	d.batches[st.Index()] = b
	return b
}

// Canceled reports whether the frontend has set the cancel flag of a
// request in its lane (batch.Canceler).
func (d *dispatcher) Canceled(lane, slot int) bool { return d.readers[lane].Canceled(slot) }

// idle reports whether the device has executed every batch published so
// far (their completions may still be being written): the one "device
// idle" signal, on which the zero-wait merger seals and from which SLO
// mode's predictions restart. It must not wait for the completions: a
// caller answered from a batch can send its next request before they are
// all written, and that request has nothing ahead of it.
func (d *dispatcher) idle() bool { return d.seg.ExecutedSeq() >= d.seg.PublishedSeq() }

// wake is the embedder doorbell's condition: requests to read, or the
// device idle with a batch to seal. A device that went idle while the
// dispatcher slept also wakes it, so an SLO batch waiting for its fill
// size gets the timer of an idle device (see run).
func (d *dispatcher) wake() bool {
	if d.seg.RequestsPending() {
		return true
	}
	if d.open == nil || !d.e.opts.Mode.SealsOnIdle() || !d.idle() {
		return false
	}
	return !d.sleptIdle || d.batcher.ShouldSeal(time.Now(), true)
}

// deviceIdle reads the device idle signal and, when it is set, tells the
// batcher, so predictions no longer queue behind batches already done.
func (d *dispatcher) deviceIdle(now time.Time) bool {
	if !d.idle() {
		return false
	}
	d.batcher.DeviceIdle(now)
	return true
}

// updateCosts refreshes SLO mode's predictions: the accelerator's
// execution time per bucket from the segment, and the lookups' wall time
// per example from the workers' totals since the last update.
func (d *dispatcher) updateCosts() {
	c := d.batcher.Costs()
	for b := 1; b <= model.PowerOfTwoCeil(d.e.opts.MaxBatch); b *= 2 {
		c.SetExec(b, d.seg.ExecTime(b))
	}
	ns, ex := d.e.lookupNanos.Load(), d.e.lookupExamples.Load()
	if dEx := ex - d.lookupExamples; dEx >= 64 {
		// The workers look up in parallel: wall time per example is a
		// worker's time per example over the workers.
		per := time.Duration((ns - d.lookupNanos) / dEx / int64(d.e.opts.Workers))
		d.lookupNanos, d.lookupExamples = ns, ex
		c.SetLookup(per)
	}
}

func (d *dispatcher) run(ctx context.Context) error {
	for {
		d.g.pulse.Tick()
		if err := ctx.Err(); err != nil {
			return err
		}
		now := time.Now()
		if now.Sub(d.lastReclaim) >= reclaimInterval {
			d.lastReclaim = now
			if err := d.housekeeping(now); err != nil {
				return err
			}
		}
		progressed, err := d.readRound(ctx)
		if err != nil {
			return err
		}
		if now := time.Now(); d.open != nil && d.batcher.ShouldSeal(now, d.deviceIdle(now)) {
			if err := d.seal(); err != nil {
				return err
			}
			continue
		}
		if progressed {
			continue
		}
		timeout := shm.DefaultLivenessTick
		now = time.Now()
		d.sleptIdle = d.idle()
		if dl, ok := d.batcher.Deadline(now, d.sleptIdle); ok {
			if w := dl.Sub(now); w < timeout {
				timeout = max(w, 0)
			}
		}
		if timeout > 0 {
			if _, err := d.seg.EmbedderBell().Wait(ctx, d.hasWork, timeout); err != nil {
				return err
			}
		}
	}
}

// housekeeping reclaims dead lanes, notices a dead accelerator and updates
// the gauges.
func (d *dispatcher) housekeeping(now time.Time) error {
	if _, err := d.seg.ReclaimLanes(0); err != nil {
		d.e.log.Warn("reclaim lanes", "err", err)
	}
	// Any state but "none" means an accelerator attached to this (fresh)
	// generation, so one that attached and died between two checks is a
	// death too, not something to wait out.
	if err := d.seg.AcceleratorAlive(0); err != nil && !errors.Is(err, shm.ErrNoAccelerator) {
		return errAcceleratorGone
	}
	if d.e.opts.Mode.FollowsFeedback() {
		// The frontends count the calls they served and those that missed
		// the target: the margin follows what the plans actually gave.
		d.e.m.sloMargin.Set(d.batcher.Feedback(d.seg.ServedCalls()).Seconds())
	}
	if d.e.opts.Mode.Sheds() {
		overloaded := 0.0
		if d.batcher.Overloaded() {
			overloaded = 1
		}
		d.e.m.sloOverloaded.Set(overloaded)
	}
	if d.g.replaced.Load() {
		if d.drainStart.IsZero() {
			d.drainStart = now
		}
		if d.drained() {
			return errDrained
		}
		if now.Sub(d.drainStart) > drainTimeout {
			d.e.log.Warn("replaced generation did not drain in time; closing it", "generation", d.seg.Generation(), "timeout", drainTimeout)
			return errDrained
		}
		return nil // the gauges describe the current generation
	}
	if now.Sub(d.lastMetrics) >= metricsInterval {
		d.lastMetrics = now
		inUse, depth := 0, 0
		ringCap := float64(d.seg.Geometry().RingCapacity)
		for _, l := range d.seg.Lanes() {
			if l.Owner != 0 {
				inUse++
			}
			depth += l.Queued
			d.e.m.occupancy.WithLabelValues(d.laneLbl[l.Index]).Set(float64(l.Queued) / ringCap)
		}
		if d.open != nil {
			depth += d.batcher.Entries()
		}
		d.e.m.lanesInUse.Set(float64(inUse))
		d.e.m.queueDepth.Set(float64(depth))
	}
	return nil
}

// drained reports whether a replaced generation has nothing left: no
// request held or batched, every batch executed, every lane given back.
func (d *dispatcher) drained() bool {
	if d.open != nil || d.hasHeld || d.seg.CompletedSeq() < d.seg.PublishedSeq() || d.seg.RequestsPending() {
		return false
	}
	for _, l := range d.seg.Lanes() {
		if l.Owner != 0 {
			return false
		}
	}
	return true
}

// readRound reads up to maxReadsPerLane requests from every lane, starting
// with a different lane each round for fairness. It stops early when no
// staging buffer is free: requests then stay in the rings, and full rings
// are the backpressure frontends see.
func (d *dispatcher) readRound(ctx context.Context) (progressed bool, err error) {
	if d.hasHeld {
		ok, err := d.place(ctx, d.held)
		if err != nil || !ok {
			return false, err
		}
		d.hasHeld = false
		progressed = true
	}
	n := len(d.readers)
	for k := 0; k < n; k++ {
		i := (d.next + k) % n
		r := d.readers[i]
		for c := 0; c < maxReadsPerLane && r.Pending(); c++ {
			req, ok, err := r.Next()
			if err != nil {
				d.e.m.reqCorrupt.Inc()
				if errors.Is(err, shm.ErrCorrupt) && req.Slot < 0 {
					d.e.log.Warn("evicting lane with corrupt ring", "lane", i, "err", err)
					_ = d.seg.EvictLane(i)
					break
				}
				d.e.log.Debug("dropped request entry", "lane", i, "err", err)
				continue
			}
			if !ok {
				break
			}
			progressed = true
			placed, err := d.place(ctx, req)
			if err != nil {
				return progressed, err
			}
			if !placed {
				d.held, d.hasHeld = req, true
				d.next = i
				return progressed, nil
			}
		}
	}
	d.next = (d.next + 1) % n
	return progressed, nil
}

// place adds a request to the open batch (sealing the open batch first if
// it does not fit). ok is false when no staging buffer is free. The checks
// it makes before lookup report to the request's batch.Task, which decides
// the outcome.
func (d *dispatcher) place(ctx context.Context, req shm.Request) (ok bool, err error) {
	now := time.Now()
	task := batch.Task{Lane: req.Lane, Slot: req.Slot, Epoch: req.Epoch, Examples: req.Examples,
		Deadline: req.Deadline, ReadAt: now, Trace: req.Trace}
	payload, status := decodeRequest(d.cfg, d.e.opts.MaxBatch, &req)
	task.Fail(status)
	switch {
	case !task.OK():
	case d.Canceled(req.Lane, req.Slot):
		task.Fail(shm.StatusCanceled)
	case task.Expired(now):
		task.Fail(shm.StatusExpired)
	}
	// The frontend stamps when the call reached it, so the time it spent
	// on the way here counts against the budget; a request without a
	// stamp is taken as arriving now.
	arrival, ok := shm.ArrivalTime(req.Arrival, now)
	if ok {
		d.e.m.arrivalWait.Observe(now.Sub(arrival).Seconds())
	} else {
		arrival = now
	}
	if task.OK() && d.e.opts.Mode.Sheds() {
		d.deviceIdle(now)
		var deadline time.Time
		if req.Deadline != 0 {
			deadline = time.Unix(0, req.Deadline)
		}
		if !d.batcher.Admit(req.Examples, arrival, deadline, now) {
			task.Fail(shm.StatusOverloaded)
		}
	}
	rows := task.Rows()
	if d.open != nil && !d.batcher.Fits(rows, arrival, now) {
		if err := d.seal(); err != nil {
			return false, err
		}
	}
	if d.open == nil {
		st, free := d.bw.TryAcquire()
		if !free {
			if err := d.waitStaging(ctx); err != nil {
				return false, err
			}
			return false, nil
		}
		d.open = d.batchFor(st)
		d.open.tasks.Reset()
	}
	b := d.open
	task.FirstRow = d.batcher.Add(rows, arrival)
	k := b.tasks.Add(task)
	for first := 0; first < rows; first += DefaultChunk {
		n := min(DefaultChunk, rows-first)
		b.wg.Add(1)
		d.jobs <- job{b: b, entry: k, payload: payload, first: first, n: n, row: task.FirstRow + first}
	}
	d.count(task.Status())
	return true, nil
}

func (d *dispatcher) count(status shm.Status) {
	m := d.e.m
	switch status {
	case shm.StatusOK:
		m.reqOK.Inc()
	case shm.StatusCanceled:
		m.reqCanceled.Inc()
	case shm.StatusOverloaded:
		m.reqShed.Inc()
	case shm.StatusExpired:
		m.reqExpired.Inc()
	default:
		m.reqInvalid.Inc()
	}
}

// waitStaging blocks until the accelerator frees a staging buffer, or
// fails when it died.
func (d *dispatcher) waitStaging(ctx context.Context) error {
	st, err := d.bw.Acquire(ctx)
	if err != nil {
		if errors.Is(err, shm.ErrAcceleratorDead) {
			return errAcceleratorGone
		}
		return err
	}
	// Acquire took the buffer; hand it back to the normal path.
	return d.bw.Abort(st)
}

// seal finishes the open batch's lookups (the dispatcher helps the
// workers), settles each request's outcome (batch.Tasks.Settle), and
// publishes the batch.
func (d *dispatcher) seal() error {
	b := d.open
	for {
		select {
		case j := <-d.jobs:
			d.helper().run(j)
			continue
		default:
		}
		break
	}
	b.wg.Wait()
	now := time.Now()
	for k := range b.tasks.Len() {
		if b.tasks.Settle(k, now, d) {
			d.e.m.reqInvalid.Inc()
		}
		t := b.tasks.At(k)
		if err := b.st.SetEntry(k, t.Entry()); err != nil {
			return err
		}
		d.e.m.queueWait.Observe(now.Sub(t.ReadAt).Seconds())
	}
	rows := d.batcher.Rows()
	var tc shm.TraceContext
	if d.tracer != nil {
		tc = d.traceBatch(b, rows, now)
	}
	if _, err := d.bw.Publish(b.st, shm.BatchDesc{Examples: rows, Entries: b.tasks.Len(), Trace: tc}); err != nil {
		return err
	}
	if d.e.opts.Mode.Predicts() {
		d.updateCosts()
		if p := d.batcher.Sealed(now); p > 0 {
			d.e.m.predictedExec.Observe(p.Seconds())
		}
	}
	d.e.m.batch.Observe(float64(rows))
	d.batcher.Reset()
	d.open = nil
	return nil
}

// helper is the dispatcher's own worker, used while it waits for a seal.
func (d *dispatcher) helper() *worker {
	if d.self == nil {
		d.self = newWorker(d.e, d.g.store)
	}
	return d.self
}
