// Package embedder is the mesh's embedding service: it owns the single copy
// of the tables (Store), creates each generation's shared-memory segment,
// reads every frontend lane, batches requests (package batch decides when),
// gathers and sum-pools their rows into staging buffers with worker
// goroutines (package lookup), and hands the batches to the accelerator.
package embedder

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/recmesh/recmesh/model"
	"github.com/recmesh/recmesh/shm"
)

// Defaults for Options.
const (
	DefaultSegment   = shm.DefaultSegment
	DefaultLanes     = 16
	DefaultChunk     = 32 // examples per lookup job: big requests spread over workers
	DefaultStaging   = 2
	reclaimInterval  = 10 * time.Millisecond
	metricsInterval  = 250 * time.Millisecond
	maxReadsPerLane  = 64 // per round, so one busy lane cannot starve the others
	regenerateBackof = 100 * time.Millisecond
	// regenerateMaxBackoff bounds the wait between generations that keep
	// failing; one that served regenerateReset resets it.
	regenerateMaxBackoff = 5 * time.Second
	regenerateReset      = 30 * time.Second
)

// Embedder serves one model's tables to the mesh.
type Embedder struct {
	opts Options
	m    *metrics
	log  *slog.Logger

	// lookupNanos and lookupExamples add up every lookup job, so SLO mode
	// can predict lookup time from what the workers actually do.
	lookupNanos, lookupExamples atomic.Int64

	// loads hands a rollout's new store to Run, which answers on done.
	loads chan loadRequest
	// stopped is closed when Run has returned: a Load then fails at once.
	stopped chan struct{}

	// pulses are the dispatcher loops' proofs of progress, one per
	// generation being served (Live).
	pulses shm.PulseSet

	mu    sync.Mutex
	store *Store // serving store; Run owns it
	gen   Generation
	seg   *shm.Segment
}

type loadRequest struct {
	store *Store
	done  chan Generation
}

// New loads the tables; Run serves them.
func New(opts Options) (*Embedder, error) {
	opts = opts.withDefaults()
	if err := opts.validate(); err != nil {
		return nil, err
	}
	e := &Embedder{opts: opts, m: newMetrics(opts.Registry), log: opts.Log, loads: make(chan loadRequest), stopped: make(chan struct{})}
	store, err := e.loadStore(opts.Bundle)
	if err != nil {
		return nil, err
	}
	e.store = store
	return e, nil
}

func (e *Embedder) loadStore(dir string) (*Store, error) {
	start := time.Now()
	store, err := LoadStore(dir)
	if err != nil {
		return nil, err
	}
	e.log.Info("tables loaded", "bundle", dir, "model", store.Config.ID(), "bytes", store.Bytes(), "rows", store.Config.TotalRows(),
		"pages", store.Mode.String(), "page_bytes", store.PageSize, "huge_page_fraction", store.HugePageFraction,
		"table_dtype", store.Config.TableDtype.String(), "kernel", store.Tables.Kernel(), "seconds", time.Since(start).Seconds())
	return store, nil
}

// Live reports whether every generation's dispatcher loop is making
// progress (true with none running).
func (e *Embedder) Live() bool { return e.pulses.Live(0) }

// Store is the serving table store.
func (e *Embedder) Store() *Store {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.store
}

// Current returns the generation being served (zero before the first).
func (e *Embedder) Current() Generation {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.gen
}

// Lanes returns a snapshot of the current segment's lanes.
func (e *Embedder) Lanes() []shm.LaneInfo {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.seg == nil {
		return nil
	}
	// Status requests read the mapping from NATS's goroutine: a truncated
	// file must cost them the lanes, not the process.
	var lanes []shm.LaneInfo
	_ = shm.GuardFaults(func() error { lanes = e.seg.Lanes(); return nil })
	return lanes
}

// Load rolls out the bundle at dir: it loads the new tables while the
// current generation keeps serving, calls prepare (which has the
// accelerator compile the new program and must succeed before anything
// switches), then starts a new generation on them. The old generation
// drains: requests already in its lanes finish there, new ones go to the
// new generation. On any error the old model keeps serving.
//
// switchVia, when not nil, chooses the moment of the switch: it is given
// the loaded store and switchTo, which starts the new generation, and
// calls switchTo at most once, when the store is ready to serve (the row
// updates replay onto it first: Rollouts). An error from switchVia before
// switchTo leaves the old model serving.
func (e *Embedder) Load(ctx context.Context, dir string, prepare func(ctx context.Context, modelID string) error,
	switchVia func(ctx context.Context, store *Store, switchTo func() error) error) (Generation, error) {
	store, err := e.loadStore(dir)
	if err != nil {
		return Generation{}, fmt.Errorf("embedder: rollout of %s: %w", dir, err)
	}
	if prepare != nil {
		if err := prepare(ctx, store.Config.ID()); err != nil {
			store.Close()
			return Generation{}, fmt.Errorf("embedder: rollout of %s: accelerator: %w", dir, err)
		}
	}
	var g Generation
	handed := false // switchTo owns the store from its first call
	switchTo := func() error {
		if handed {
			return fmt.Errorf("embedder: rollout of %s: switched twice", dir)
		}
		handed = true
		g, err = e.switchTo(ctx, dir, store)
		return err
	}
	if switchVia == nil {
		err = switchTo()
	} else {
		err = switchVia(ctx, store, switchTo)
	}
	if !handed {
		store.Close()
	}
	return g, err
}

// switchTo hands store to Run, which starts a generation on it, and
// waits for that generation. Run owns the store once it has it.
func (e *Embedder) switchTo(ctx context.Context, dir string, store *Store) (Generation, error) {
	req := loadRequest{store: store, done: make(chan Generation, 1)}
	select {
	case e.loads <- req:
	case <-e.stopped:
		store.Close()
		return Generation{}, fmt.Errorf("embedder: rollout of %s: %w", dir, errStopped)
	case <-ctx.Done():
		store.Close()
		return Generation{}, ctx.Err()
	}
	select {
	case g := <-req.done:
		if g.Generation == 0 {
			return g, fmt.Errorf("embedder: rollout of %s: the new generation did not start", dir)
		}
		return g, nil
	case <-ctx.Done():
		return Generation{}, ctx.Err()
	}
}

// errStopped answers a Load after Run has returned.
var errStopped = errors.New("the embedder has stopped serving")

// errAcceleratorGone ends a generation whose accelerator died: its
// in-flight batches are lost, so the next generation starts clean.
var errAcceleratorGone = errors.New("embedder: accelerator died")

// drainTimeout bounds how long a replaced generation waits for its
// frontends to move their lanes to the new one.
const drainTimeout = 30 * time.Second

// Run creates a segment generation and serves it until ctx is done. When
// the accelerator dies it starts a new generation, so a restarted
// accelerator and the frontends re-attach to fresh rings; when Load hands
// it new tables, the new generation serves beside the draining old one.
//
// Run has one way out, shutdown, whatever ends it: ctx, or a generation
// that cannot be started. Every generation it leaves is drained and
// closed. It returns nil when ctx ended it. Run may be called once.
func (e *Embedder) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	r := &running{ended: make(chan ended, 64)}
	err := e.serveGenerations(ctx, r)
	return e.shutdown(cancel, r, err)
}

// running is what Run holds: the generations not yet closed and the
// goroutines serving them.
type running struct {
	gens  []*generation // every generation not yet closed
	cur   *generation   // the one new work goes to
	wg    sync.WaitGroup
	ended chan ended // a generation's serve returned
}

type ended struct {
	g   *generation
	err error
}

// start creates a generation on store, makes it the current one and
// serves it until it ends or ctx is done.
func (e *Embedder) start(ctx context.Context, r *running, store *Store) error {
	g, err := e.create(store)
	if err != nil {
		return err
	}
	r.gens = append(r.gens, g)
	r.cur = g
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		err := e.serve(ctx, g)
		r.ended <- ended{g, err}
	}()
	return nil
}

// serveGenerations is Run's loop. It returns nil when ctx is done and the
// error that stops serving otherwise; it leaves the generations still
// open to shutdown.
func (e *Embedder) serveGenerations(ctx context.Context, r *running) error {
	if err := e.start(ctx, r, e.Store()); err != nil {
		return err
	}
	backoff := regenerateBackof / 2
	for {
		select {
		case <-ctx.Done():
			return nil
		case req := <-e.loads:
			e.rollout(ctx, r, req)
		case end := <-r.ended:
			if ctx.Err() != nil {
				return nil
			}
			g := end.g
			r.gens = slices.DeleteFunc(r.gens, func(x *generation) bool { return x == g })
			e.closeGeneration(g)
			if g.store != e.Store() {
				_ = g.store.Close()
			}
			if g != r.cur {
				// A replaced generation finished draining.
				e.log.Info("generation drained", "generation", g.seg.Generation(), "err", end.err)
				continue
			}
			// Whatever ended the generation, the accelerator's death or
			// corrupt shared words, the process lives on:
			// a new generation takes over, and frontends and the
			// accelerator re-attach to it. Back off while generations keep
			// failing fast.
			if errors.Is(end.err, errAcceleratorGone) {
				e.log.Warn("accelerator died; starting a new generation", "generation", g.seg.Generation())
			} else {
				e.m.genFailures.Inc()
				e.log.Error("generation failed; starting a new one", "generation", g.seg.Generation(), "err", end.err)
			}
			if time.Since(g.started) > regenerateReset {
				backoff = regenerateBackof
			} else {
				backoff = min(2*backoff, regenerateMaxBackoff)
			}
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(backoff):
			}
			if err := e.start(ctx, r, e.Store()); err != nil {
				return fmt.Errorf("replacing generation %d: %w", g.seg.Generation(), err)
			}
		}
	}
}

// rollout starts a generation on a loaded store beside the current one,
// which drains, and answers the Load.
func (e *Embedder) rollout(ctx context.Context, r *running, req loadRequest) {
	old := r.cur
	if err := e.start(ctx, r, req.store); err != nil {
		e.log.Error("rollout: new generation", "err", err)
		req.store.Close()
		req.done <- Generation{}
		return
	}
	e.mu.Lock()
	e.store = req.store
	e.mu.Unlock()
	old.replaced.Store(true)
	e.log.Info("rollout: new generation serving; old one draining", "old", old.seg.Generation(), "new", r.cur.seg.Generation(), "model", req.store.Config.ID())
	req.done <- e.Current()
}

// shutdown is Run's one way out. It stops every generation's goroutines,
// drains and closes every generation not yet closed (the current one and
// any predecessor still draining), closes the stores, tells Load that
// nothing serves any more, and returns why Run ended, wrapped.
func (e *Embedder) shutdown(cancel context.CancelFunc, r *running, cause error) error {
	cancel()
	r.wg.Wait()
	stores := map[*Store]bool{e.Store(): true}
	for _, g := range r.gens {
		e.closeGeneration(g)
		stores[g.store] = true
	}
	r.gens, r.cur = nil, nil
	for s := range stores {
		_ = s.Close()
	}
	close(e.stopped)
	if cause != nil {
		return fmt.Errorf("embedder: stopped serving: %w", cause)
	}
	return nil
}

// closeGeneration ends a generation whose goroutines have returned: it
// marks the segment draining and then closed, so frontends and the
// accelerator see their generation end, and removes its file if the path
// still names it: no one may attach to a segment without an owner.
func (e *Embedder) closeGeneration(g *generation) {
	// The mapping may have been truncated under us (that may be what
	// ended the generation): a fault costs the words, not the process.
	_ = shm.GuardFaults(g.seg.Drain)
	_ = g.seg.Close()
	_ = g.seg.Remove()
	e.mu.Lock()
	if e.seg == g.seg {
		e.seg = nil // Lanes must not read a closed mapping
	}
	e.mu.Unlock()
}

// generation is one segment and the store it serves.
type generation struct {
	seg      *shm.Segment
	store    *Store
	replaced atomic.Bool // a newer generation took over: drain and stop
	// pulse is the dispatcher loop's proof of progress: the owner
	// heartbeat and the process's /healthz follow it.
	pulse   *shm.Pulse
	started time.Time
}

func (e *Embedder) create(store *Store) (*generation, error) {
	cfg := store.Config
	// Sized for the bucket of a full batch: the accelerator reads whole
	// buckets, padding rows included, from the staging buffer.
	staging := cfg.Staging(model.PowerOfTwoCeil(e.opts.MaxBatch))
	// Generations count on from our own last one, not only from the file
	// at the path, which may have been truncated past reading.
	var next uint64
	if last := e.Current().Generation; last != 0 {
		next = last + 1
	}
	seg, err := shm.Create(shm.Options{
		Name:       e.opts.Segment,
		Dir:        e.opts.ShmDir,
		Mode:       e.opts.SegmentMode,
		Generation: next,
		ModelID:    cfg.ID(),
		Geometry: shm.Geometry{
			Lanes:           e.opts.Lanes,
			MaxExamples:     e.opts.MaxBatch,
			ExampleBytes:    (cfg.NumDense + cfg.SparseWidth()) * 4,
			StagingCount:    e.opts.Staging,
			StagingBytes:    staging.Size,
			MaxBatchEntries: e.opts.MaxBatch,
		},
		Reserve:         !e.opts.LazySegment,
		AcceleratorKey:  e.opts.AcceleratorKey,
		MaxLanesPerPeer: e.opts.LanesPerFrontend,
	})
	if errors.Is(err, unix.ENOSPC) {
		var st unix.Statfs_t
		free := "unknown"
		if unix.Statfs(e.opts.ShmDir, &st) == nil {
			free = fmt.Sprintf("%d MiB", int64(st.Bavail)*st.Bsize>>20)
		}
		return nil, fmt.Errorf("embedder: reserve the segment in %s: %s free is too little (a rollout holds two generations at once): "+
			"enlarge it (docker --shm-size, compose RECMESH_SHM_SIZE, the Kubernetes shm emptyDir's sizeLimit) or lower --lanes or --max-batch: %w",
			e.opts.ShmDir, free, err)
	}
	if err != nil {
		return nil, fmt.Errorf("embedder: create segment %s/%s (check --shm-dir and its free space): %w", e.opts.ShmDir, e.opts.Segment, err)
	}
	g := Generation{Path: seg.Path(), Generation: seg.Generation(), ModelID: seg.ModelID()}
	e.mu.Lock()
	e.gen, e.seg = g, seg
	e.mu.Unlock()
	e.m.generation.Set(float64(g.Generation))
	e.m.tableBytes.Set(float64(store.Bytes()))
	e.m.hugeFraction.Set(store.HugePageFraction)
	e.log.Info("segment ready", "path", g.Path, "generation", g.Generation, "model", g.ModelID, "lanes", e.opts.Lanes,
		"mode", e.opts.Mode.String(), "max_batch", e.opts.MaxBatch, "slo_merge_rows", mergeRows(store.Config, e.opts), "workers", e.opts.Workers)
	if e.opts.OnGeneration != nil {
		e.opts.OnGeneration(g)
	}
	return &generation{seg: seg, store: store, pulse: shm.NewPulse(), started: time.Now()}, nil
}

// serve runs one generation: heartbeat, workers and the dispatcher.
func (e *Embedder) serve(ctx context.Context, g *generation) error {
	seg := g.seg
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	// Stop the heartbeat and the workers before returning: the caller
	// closes the mapping they use.
	defer func() {
		cancel()
		wg.Wait()
	}()
	// The owner heartbeat stands for the dispatcher loop: it beats only
	// while the loop ticks, so a stuck dispatcher is declared hung.
	pulse := g.pulse
	pulse.Tick()
	e.pulses.Add(pulse)
	defer e.pulses.Remove(pulse)
	// Every goroutine that touches the mapping guards against faults, the
	// last line behind the sealed memfds: a fault ends this generation
	// (the first fault is its error), never the embedder.
	var fault atomic.Pointer[error]
	guard := func(fn func() error) {
		if err := shm.GuardFaults(fn); errors.Is(err, shm.ErrSegmentLost) {
			fault.CompareAndSwap(nil, &err)
			cancel()
		}
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		guard(func() error { return seg.Heartbeat(ctx, 0, pulse) })
	}()

	jobs := make(chan job, 4096)
	for i := 0; i < e.opts.Workers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w := newWorker(e, g.store)
			guard(func() error {
				for {
					select {
					case <-ctx.Done():
						return nil
					case j := <-jobs:
						w.run(j)
					}
				}
			})
		}()
	}
	err := shm.GuardFaults(func() error {
		d, err := e.newDispatcher(g, jobs)
		if err != nil {
			return err
		}
		return d.run(ctx)
	})
	if f := fault.Load(); f != nil {
		return *f
	}
	return err
}

// Close releases the tables if Run was never called.
func (e *Embedder) Close() error { return e.Store().Close() }
