package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"
	"unsafe"

	"go.opentelemetry.io/otel/trace"

	"github.com/recmesh/recmesh/model"
	"github.com/recmesh/recmesh/shm"
)

// genLoop serves one attached generation: it waits on the batch ring, runs
// each batch from its staging buffer, completes the requests the batch
// carries into their lanes and hands the buffer back. It is the
// counterpart of the embedder's dispatcher, one per generation, and what
// it needs is made once, in newLoop, so serving a batch allocates nothing.
type genLoop struct {
	seg   *shm.Segment
	ex    program
	times *execTimes // ex's, shared with every generation ex serves
	// pulse is the loop's proof of progress, which the heartbeat follows.
	pulse   *shm.Pulse
	reader  *shm.BatchReader
	writers []*shm.CompletionWriter // by lane
	touched []bool                  // lanes completed into since their last flush
	scores  []float32
	// regions are the input regions batches run from, made on first use:
	// one per staging buffer (zero-copy), then the private one that
	// copyStaging copies each batch into.
	regions     []inputs
	copyStaging bool
	rows        int // a staging buffer's rows: the bucket of a full batch

	m      *metrics
	log    *slog.Logger
	tracer trace.Tracer // nil when tracing is off
}

// newLoop prepares the serving of seg with ex, whose execution time
// estimates are times.
func (s *Server) newLoop(seg *shm.Segment, ex program, times *execTimes, pulse *shm.Pulse) (*genLoop, error) {
	g := seg.Geometry()
	l := &genLoop{
		seg:         seg,
		ex:          ex,
		times:       times,
		pulse:       pulse,
		reader:      seg.BatchReader(),
		writers:     make([]*shm.CompletionWriter, g.Lanes),
		touched:     make([]bool, g.Lanes),
		scores:      make([]float32, ex.MaxBucket()),
		regions:     make([]inputs, g.StagingCount+1),
		copyStaging: s.opts.CopyStaging,
		rows:        model.PowerOfTwoCeil(g.MaxExamples),
		m:           s.m,
		log:         s.log,
		tracer:      s.tracer,
	}
	l.reader.Pulse = pulse
	for i := range l.writers {
		w, err := seg.CompletionWriter(i)
		if err != nil {
			return nil, err
		}
		l.writers[i] = w
	}
	return l, nil
}

// close releases the input regions.
func (l *genLoop) close() {
	for _, in := range l.regions {
		if in != nil {
			in.Close()
		}
	}
}

// run serves batches until ctx is done or the generation ends.
func (l *genLoop) run(ctx context.Context) error {
	for {
		l.pulse.Tick()
		b, err := l.reader.Wait(ctx)
		if err != nil {
			if errors.Is(err, shm.ErrCorrupt) {
				l.log.Warn("dropped a corrupt batch descriptor", "err", err)
				continue
			}
			return err
		}
		_, idx, _ := l.ex.BucketFor(max(b.Examples, 1))
		l.pulse.Expect(runAllowance(l.times.estimate(idx)))
		if err := l.serveBatch(b); err != nil {
			return err
		}
		// The embedder's zero-wait merger seals its open batch when the
		// device frees up: tell it now rather than at its next tick.
		l.seg.EmbedderBell().Ring()
	}
}

// serveBatch runs batch b, completes every request it carries and hands
// its staging buffer back. A batch claiming more examples than a staging
// buffer holds (rows) is corrupt: it is not run, its live requests fail
// with StatusInternal and the generation goes on. An error (no input
// region, or Done refusing the batch) ends the generation.
func (l *genLoop) serveBatch(b shm.Batch) error {
	var in inputs
	if b.Examples <= l.rows {
		var err error
		if in, err = l.batchInputs(b); err != nil {
			return err
		}
	} else {
		l.log.Warn("batch has more examples than a staging buffer holds", "batch", b.Seq, "examples", b.Examples, "rows", l.rows)
	}
	l.complete(b, l.execute(b, in))
	return l.reader.Done(b)
}

// batchInputs returns the inputs batch b runs from: the staging buffer
// itself (wrapped once per buffer in inputs), or with copyStaging the
// private region regions[len(regions)-1] with the batch's rows copied in.
// The copy runs in this goroutine, which the caller guards against faults.
func (l *genLoop) batchInputs(b shm.Batch) (inputs, error) {
	if !l.copyStaging {
		if l.regions[b.Staging] == nil {
			in, err := l.ex.NewInputs(b.Data, l.rows)
			if err != nil {
				return nil, fmt.Errorf("accelerator: wrap staging %d: %w", b.Staging, err)
			}
			l.regions[b.Staging] = in
		}
		return l.regions[b.Staging], nil
	}
	priv := &l.regions[len(l.regions)-1]
	if *priv == nil {
		in, err := l.ex.NewHostInputs(l.rows)
		if err != nil {
			return nil, fmt.Errorf("accelerator: private input region: %w", err)
		}
		*priv = in
	}
	if err := (*priv).CopyRows(b.Data, b.Examples); err != nil {
		return nil, fmt.Errorf("accelerator: copy batch %d: %w", b.Seq, err)
	}
	return *priv, nil
}

// execute runs batch b's examples from in into scores and reports how the
// run went: StatusOK, or StatusInternal when it failed or cannot run (a
// nil in: serveBatch says why). A batch of no examples runs nothing.
func (l *genLoop) execute(b shm.Batch, in inputs) shm.Status {
	n := b.Examples
	if n <= 0 {
		return shm.StatusOK
	}
	if in == nil {
		l.reader.Executed(b) // nothing will run: the device is free
		return shm.StatusInternal
	}
	start := time.Now()
	err := l.ex.Run(in, n, l.scores)
	// The device is free now, before the completions are written: the
	// embedder may seal its next batch while callers get their scores.
	l.reader.Executed(b)
	l.seg.EmbedderBell().Ring()
	if err != nil {
		l.log.Error("execute", "examples", n, "err", err)
		return shm.StatusInternal
	}
	end := time.Now()
	bucket, idx, _ := l.ex.BucketFor(n)
	if l.tracer != nil {
		l.traceBatch(b, bucket, start, end)
	}
	l.m.execute[idx].Observe(end.Sub(start).Seconds())
	l.publishExec(idx, bucket, l.times.observe(idx, end.Sub(start)))
	l.m.runs[idx].Inc()
	l.m.batch.Observe(float64(n))
	l.m.padding.Observe(float64(bucket-n) / float64(bucket))
	return shm.StatusOK
}

// publishExec puts bucket b's (index i) estimate into the segment and the
// predicted-time gauge.
func (l *genLoop) publishExec(i, b int, d time.Duration) {
	if d <= 0 {
		return
	}
	l.seg.SetExecTime(b, d)
	l.m.predicted[i].Set(d.Seconds())
}

// complete answers every request batch b carries, in its lane, and flushes
// the lanes it completed into. The embedder decided each request's outcome
// (batch.Task in package embedder/batch) and the entry carries it; here
// only a failed run (runStatus) or a failure to deliver the scores is
// added, and only to a request the embedder let through.
func (l *genLoop) complete(b shm.Batch, runStatus shm.Status) {
	for i := 0; i < b.Entries; i++ {
		e, err := l.reader.Entry(b, i)
		if err != nil {
			l.log.Warn("bad batch entry", "batch", b.Seq, "entry", i, "err", err)
			continue
		}
		if e.Lane < 0 || e.Lane >= len(l.writers) {
			continue
		}
		w := l.writers[e.Lane]
		status := e.Status
		if status == shm.StatusOK {
			status = runStatus
		}
		if status == shm.StatusOK {
			status = writeScores(w, e, b.Examples, l.scores)
		}
		c := shm.Completion{Slot: e.Slot, Epoch: e.Epoch, Status: status, Examples: e.Rows}
		if status != shm.StatusOK {
			c.Examples = 0
		}
		if err := w.Add(c); err != nil {
			// A stale epoch: the lane changed hands; nobody waits for it.
			continue
		}
		l.touched[e.Lane] = true
		if int(status) < len(l.m.completed) {
			l.m.completed[status].Inc()
		}
	}
	for i, t := range l.touched {
		if t {
			l.writers[i].Flush()
			l.touched[i] = false
		}
	}
}

// writeScores copies an entry's rows of the batch's scores into its slot.
func writeScores(w *shm.CompletionWriter, e shm.BatchEntry, n int, scores []float32) shm.Status {
	if e.Rows <= 0 || e.FirstRow < 0 || e.FirstRow+e.Rows > n {
		return shm.StatusInternal
	}
	dst, err := w.Scores(e.Slot, e.Epoch)
	if err != nil {
		if errors.Is(err, shm.ErrStaleEpoch) {
			return shm.StatusUnavailable
		}
		return shm.StatusInternal
	}
	if len(dst) != 4*e.Rows {
		return shm.StatusInternal
	}
	src := scores[e.FirstRow : e.FirstRow+e.Rows]
	copy(dst, unsafe.Slice((*byte)(unsafe.Pointer(&src[0])), 4*e.Rows))
	return shm.StatusOK
}
