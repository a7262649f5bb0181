// Package dense keeps the accelerator's dense weights in step with the
// JetStream object store bucket updates.DenseBucket, which holds one
// object per model id: a dense-weights file (model.ReadDenseWeights) of
// new values for that model's network, same shape. Each new revision of
// the object of a model the accelerator has compiled is downloaded,
// checked against the model and swapped in between two batches
// (executor.Executor.SwapWeights): nothing is compiled or restarted, and
// the frontends never notice.
//
// The Watcher watches the whole bucket and applies each object to the
// executors registered (Add) for the model it names: the serving one, and
// a rollout's while it is prepared, so the watch follows a rollout by
// itself. An executor registered while an object for its model is stored
// gets it at once (Add), before it serves its first batch: a restarted
// accelerator, or a rolled-out model, starts on the stored weights, not
// its bundle's. Deleting the object goes back to the bundle's weights
// (Options.Bundle). The accelerator only reads the bucket; a bucket that
// does not exist yet is looked for again every Options.Retry, quietly.
//
// An object that does not fit the model (a shape that differs, a missing
// or extra tensor, a value that is not finite) is refused: counted, logged
// once with the reason, reported in the status, never tried again, and the
// weights serving before keep serving.
package dense

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/recmesh/recmesh/accelerator/executor"
	"github.com/recmesh/recmesh/model"
	"github.com/recmesh/recmesh/proto/control"
	"github.com/recmesh/recmesh/proto/updates"
)

// SourceBundle is the Source of weights that came with the bundle.
const SourceBundle = "bundle"

// DefaultRetry is the wait between attempts to watch the bucket.
const DefaultRetry = 5 * time.Second

// downloadTimeout bounds one object's download.
const downloadTimeout = 2 * time.Minute

// headerSlack is what a dense-weights file may hold beyond its float32
// values: the safetensors header.
const headerSlack = 1 << 20

// Swapper is an executor that takes new dense weights
// (*executor.Executor).
type Swapper interface {
	Config() model.Config
	// SwapWeights switches to params between two batches, or refuses them
	// and keeps the old; after Close it returns executor.ErrClosed.
	SwapWeights(params map[string][]float32) error
}

// Options configure a Watcher.
type Options struct {
	// JS reads the bucket.
	JS       jetstream.JetStream
	Log      *slog.Logger
	Registry prometheus.Registerer
	// Bundle returns the bundle directory a model was compiled from, so
	// that deleting its object brings back the bundle's weights; nil, or
	// false, keeps serving the deleted object's weights.
	Bundle func(modelID string) (dir string, ok bool)
	// Retry is the wait between attempts to watch the bucket when it does
	// not exist or the watch broke. Default DefaultRetry.
	Retry time.Duration
	// Release, if set, runs once an object's or a bundle's weights were
	// read and offered to the executors: the accelerator hands what the
	// reading and the copies left in its heaps back to the kernel
	// (device.ReleaseHeap). The collector, paced by them while they
	// lived, would keep them for as long as serving allocates little.
	Release func()
}

// Watcher applies the bucket's objects to the registered executors.
type Watcher struct {
	opts Options
	m    *metrics

	// applyMu makes one object's download and swaps at a time: Add and
	// Run both apply.
	applyMu sync.Mutex
	// attempts counts Run's attempts to watch the bucket.
	attempts atomic.Int64

	mu      sync.Mutex
	targets map[Swapper]*target
	swaps   uint64
	refused uint64
	// watchErr is why the bucket is not watched, for the status; "" while
	// it is, or while there is none to watch (quiet).
	watchErr string
}

// target is what one registered executor serves.
type target struct {
	source   string // SourceBundle or bucket/name@revision
	revision string // the object's NUID, "" for the bundle's weights
	// refusedRev is the last revision refused for this executor, which is
	// not tried again; err why.
	refusedRev string
	err        string
}

// New returns a watcher with nothing registered; Run watches.
func New(opts Options) *Watcher {
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	if opts.Registry == nil {
		opts.Registry = prometheus.NewRegistry()
	}
	if opts.Retry <= 0 {
		opts.Retry = DefaultRetry
	}
	return &Watcher{opts: opts, m: newMetrics(opts.Registry), targets: map[Swapper]*target{}}
}

// Add registers s, serving its bundle's weights, and applies the stored
// object of its model if there is one, before returning (bounded by ctx:
// an object it could not read is applied by Run's watch later). An
// executor closed since is dropped at the next object for its model.
func (w *Watcher) Add(ctx context.Context, s Swapper) {
	w.Register(s)
	id := s.Config().ID()
	obs, err := w.opts.JS.ObjectStore(ctx, updates.DenseBucket)
	if quiet(err) {
		return // nothing stored; Run says so once
	}
	var info *jetstream.ObjectInfo
	if err == nil {
		info, err = obs.GetInfo(ctx, id)
		if errors.Is(err, jetstream.ErrObjectNotFound) {
			return
		}
	}
	if err == nil {
		err = w.apply(ctx, obs, info)
	}
	if err != nil {
		w.opts.Log.Warn("dense weights: stored object not read; the watch applies it when it can", "model", id, "bucket", updates.DenseBucket, "err", err)
	}
}

// Register registers s, serving its bundle's weights, without reading the
// bucket: Run's watch applies its model's stored object when it can (Add
// applies it at once).
func (w *Watcher) Register(s Swapper) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, ok := w.targets[s]; !ok {
		w.targets[s] = &target{source: SourceBundle}
	}
}

// Run watches the bucket and applies every new object until ctx ends.
func (w *Watcher) Run(ctx context.Context) error {
	t := time.NewTimer(0)
	defer t.Stop()
	lastErr := ""
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		w.attempts.Add(1)
		watched, err := w.watch(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if watched {
			lastErr = ""
		}
		msg := err.Error()
		if errors.Is(err, jetstream.ErrBucketNotFound) {
			msg = fmt.Sprintf("bucket %s does not exist yet", updates.DenseBucket)
		}
		w.mu.Lock()
		w.watchErr = ""
		if !quiet(err) {
			w.watchErr = msg
		}
		w.mu.Unlock()
		if msg != lastErr { // once per cause, not every retry
			log := w.opts.Log.Warn
			if quiet(err) {
				log = w.opts.Log.Info
			}
			log("dense weights: not watching the bucket; trying again", "bucket", updates.DenseBucket, "retry", w.opts.Retry, "reason", msg)
			lastErr = msg
		}
		t.Reset(w.opts.Retry)
	}
}

// quiet reports whether err only means that nothing can be stored yet:
// the bucket does not exist (no weights were ever pushed), or JetStream is
// off. Neither is an error of the accelerator's.
func quiet(err error) bool {
	return errors.Is(err, jetstream.ErrBucketNotFound) || errors.Is(err, jetstream.ErrJetStreamNotEnabled) ||
		errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount)
}

// errWatchEnded: the object store closed the watch.
var errWatchEnded = errors.New("the watch ended")

// watch applies the bucket's objects, the stored ones first, until the
// watch breaks or ctx ends; watched reports whether it got as far as
// watching.
func (w *Watcher) watch(ctx context.Context) (watched bool, err error) {
	obs, err := w.opts.JS.ObjectStore(ctx, updates.DenseBucket)
	if err != nil {
		return false, err
	}
	ow, err := obs.Watch(ctx)
	if err != nil {
		return false, fmt.Errorf("watch %s: %w", updates.DenseBucket, err)
	}
	defer ow.Stop()
	w.mu.Lock()
	w.watchErr = ""
	w.mu.Unlock()
	w.opts.Log.Info("dense weights: watching the bucket", "bucket", updates.DenseBucket)
	for {
		select {
		case <-ctx.Done():
			return true, ctx.Err()
		case info, ok := <-ow.Updates():
			if !ok {
				return true, errWatchEnded
			}
			if info == nil {
				continue // the stored objects are all delivered
			}
			if err := w.apply(ctx, obs, info); err != nil {
				// Not applied (a download failed): a new watch delivers
				// the object again.
				return true, err
			}
		}
	}
}

// apply brings info, an object's latest revision, to the executors of the
// model it names. It returns an error only when the object could not be
// read (the caller tries again later); a refusal is recorded.
func (w *Watcher) apply(ctx context.Context, obs jetstream.ObjectStore, info *jetstream.ObjectInfo) error {
	w.applyMu.Lock()
	defer w.applyMu.Unlock()
	ts := w.pending(info.Name, info.NUID, info.Deleted)
	if len(ts) == 0 {
		return nil
	}
	if info.Deleted {
		w.revert(info.Name, ts)
		return nil
	}
	cfg := ts[0].Config()
	start := time.Now()
	data, rev, err := download(ctx, obs, info, cfg)
	var refusal *refusalError
	if errors.As(err, &refusal) {
		for _, s := range ts {
			w.refuse(s, rev, refusal.Error())
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("download %s/%s: %w", updates.DenseBucket, info.Name, err)
	}
	defer w.release()
	fetched := time.Since(start)
	source := fmt.Sprintf("%s/%s@%s", updates.DenseBucket, info.Name, rev)
	for _, s := range ts {
		if w.settled(s, rev) {
			continue
		}
		params, err := model.ReadDenseWeights(s.Config(), data)
		if err == nil {
			t0 := time.Now()
			if err = s.SwapWeights(params); err == nil {
				w.swapped(s, source, rev)
				w.opts.Log.Info("dense weights swapped", "model", info.Name, "source", source, "bytes", len(data),
					"download_ms", fetched.Milliseconds(), "swap_ms", time.Since(t0).Milliseconds())
				continue
			}
		}
		if errors.Is(err, executor.ErrClosed) {
			w.forget(s)
			continue
		}
		w.refuse(s, rev, err.Error())
	}
	return nil
}

// revert brings the bundle's weights back to the executors ts of modelID,
// whose object was deleted.
func (w *Watcher) revert(modelID string, ts []Swapper) {
	dir, ok := "", false
	if w.opts.Bundle != nil {
		dir, ok = w.opts.Bundle(modelID)
	}
	if !ok {
		w.opts.Log.Warn("dense weights: object deleted, its weights keep serving (no bundle to go back to)", "model", modelID)
		return
	}
	b, err := model.Open(dir)
	if err != nil {
		w.opts.Log.Error("dense weights: object deleted; the bundle's weights could not be read, the object's keep serving", "model", modelID, "err", err)
		return
	}
	defer b.Close()
	defer w.release()
	params := model.DenseWeightsOf(b)
	for _, s := range ts {
		err := s.SwapWeights(params)
		switch {
		case errors.Is(err, executor.ErrClosed):
			w.forget(s)
		case err != nil:
			w.opts.Log.Error("dense weights: object deleted; the bundle's weights were refused, the object's keep serving", "model", modelID, "bundle", dir, "err", err)
		default:
			w.swapped(s, SourceBundle, "")
			w.opts.Log.Info("dense weights: object deleted, serving the bundle's weights again", "model", modelID, "bundle", dir)
		}
	}
}

// release runs Options.Release, if set.
func (w *Watcher) release() {
	if w.opts.Release != nil {
		w.opts.Release()
	}
}

// pending lists the executors of modelID the revision rev concerns: not
// serving it, not having refused it; for a deletion, those serving an
// object.
func (w *Watcher) pending(modelID, rev string, deleted bool) []Swapper {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []Swapper
	for s, t := range w.targets {
		if s.Config().ID() != modelID {
			continue
		}
		if deleted && t.revision != "" || !deleted && t.revision != rev && t.refusedRev != rev {
			out = append(out, s)
		}
	}
	return out
}

// settled reports whether s has nothing to do with revision rev: it
// serves it or refused it, or it is no longer registered.
func (w *Watcher) settled(s Swapper, rev string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	t := w.targets[s]
	return t == nil || t.revision == rev || t.refusedRev == rev
}

func (w *Watcher) swapped(s Swapper, source, rev string) {
	w.m.swaps.Inc()
	w.mu.Lock()
	defer w.mu.Unlock()
	w.swaps++
	if t := w.targets[s]; t != nil {
		t.source, t.revision, t.err = source, rev, ""
	}
}

func (w *Watcher) refuse(s Swapper, rev, reason string) {
	w.m.refused.Inc()
	w.mu.Lock()
	w.refused++
	if t := w.targets[s]; t != nil {
		t.refusedRev, t.err = rev, fmt.Sprintf("%s/%s@%s refused: %s", updates.DenseBucket, s.Config().ID(), rev, reason)
	}
	w.mu.Unlock()
	w.opts.Log.Warn("dense weights refused; the previous weights keep serving", "model", s.Config().ID(), "revision", rev, "reason", reason)
}

func (w *Watcher) forget(s Swapper) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.targets, s)
}

// Status is the dense weights of the executor serving modelID, and the
// process's counts. Source is SourceBundle or the object served, as
// bucket/model@revision (the revision is the object's NUID); Error is why
// the last revision of its object was refused, starting with that
// "bucket/model@revision refused: ", or else why the bucket is not
// watched, if it is not.
func (w *Watcher) Status(modelID string) *control.DenseStatus {
	w.mu.Lock()
	defer w.mu.Unlock()
	st := &control.DenseStatus{Source: SourceBundle, Swaps: w.swaps, Refused: w.refused, Error: w.watchErr}
	for s, t := range w.targets {
		if s.Config().ID() == modelID {
			st.Source = t.source
			if t.err != "" {
				st.Error = t.err
			}
			break
		}
	}
	return st
}

// refusalError is an object that cannot be the model's weights, as
// opposed to one that could not be read.
type refusalError struct{ msg string }

func (e *refusalError) Error() string { return e.msg }

// download reads the latest revision of info's object and returns it with
// its revision (it may be newer than info's). An object too large to be
// cfg's dense weights is refused before it is read.
func download(ctx context.Context, obs jetstream.ObjectStore, info *jetstream.ObjectInfo, cfg model.Config) ([]byte, string, error) {
	limit := 4*cfg.DenseParamCount() + headerSlack
	if int64(info.Size) > limit {
		return nil, info.NUID, &refusalError{fmt.Sprintf("object is %d bytes; model %s's dense weights in float32 are %d", info.Size, cfg.ID(), 4*cfg.DenseParamCount())}
	}
	ctx, cancel := context.WithTimeout(ctx, downloadTimeout)
	defer cancel()
	res, err := obs.Get(ctx, info.Name)
	if err != nil {
		return nil, info.NUID, err
	}
	defer res.Close()
	got, err := res.Info()
	if err != nil {
		return nil, info.NUID, err
	}
	data, err := io.ReadAll(io.LimitReader(res, limit+1))
	if err != nil {
		return nil, got.NUID, err
	}
	if int64(len(data)) > limit {
		return nil, got.NUID, &refusalError{fmt.Sprintf("object is over %d bytes; model %s's dense weights in float32 are %d", limit, cfg.ID(), 4*cfg.DenseParamCount())}
	}
	return data, got.NUID, nil
}

// metrics are the watcher's Prometheus series.
type metrics struct {
	swaps, refused prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		swaps: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "recmesh_accelerator_dense_swaps_total",
			Help: "Dense weight sets switched to between two batches (new object revisions, and the bundle's weights back when an object is deleted).",
		}),
		refused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "recmesh_accelerator_dense_refused_total",
			Help: "Dense weight objects refused (shape, tensors or values do not fit the model); the previous weights kept serving.",
		}),
	}
	reg.MustRegister(m.swaps, m.refused)
	return m
}
