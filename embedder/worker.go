package embedder

import (
	"errors"
	"time"

	"github.com/recmesh/recmesh/embedder/lookup"
	"github.com/recmesh/recmesh/model"
	"github.com/recmesh/recmesh/shm"
)

// job is one chunk of one request's lookups.
type job struct {
	b       *openBatch
	entry   int                  // the request's index in b.tasks
	payload model.RequestPayload // the whole request's arrays (decodeRequest)
	first   int                  // first example of the chunk within the request
	n       int
	row     int // staging row of the chunk's first example
}

// worker does lookup jobs with its own scratch, so ids read from shared
// memory are copied once and then validated and used from private memory:
// a frontend rewriting them mid-lookup cannot make the kernel read out of
// bounds.
type worker struct {
	e     *Embedder
	store *Store
	ids   []int32
}

func newWorker(e *Embedder, store *Store) *worker {
	return &worker{e: e, store: store, ids: make([]int32, DefaultChunk*store.Config.SparseWidth())}
}

// run does job j. A failed lookup is reported to the batch's tasks, which
// decide the request's outcome when the batch is sealed.
func (w *worker) run(j job) {
	defer j.b.wg.Done()
	start := time.Now()
	cfg := w.store.Config
	width := cfg.SparseWidth()
	ids := w.ids[:j.n*width]
	copy(ids, j.payload.Sparse[j.first*width:(j.first+j.n)*width])
	tables := w.store.Tables
	per := len(cfg.VocabSizes) * cfg.EmbeddingDim
	out := j.b.pooled[j.row*per : (j.row+j.n)*per]
	// Pool checks every id before it reads a row. The read lock keeps a
	// row update from landing mid-job (updates.go).
	w.store.rows.RLock()
	err := tables.Pool(out, ids, j.n)
	w.store.rows.RUnlock()
	if err != nil {
		st := shm.StatusInternal
		if errors.Is(err, lookup.ErrBadID) {
			st = shm.StatusInvalid
		}
		j.b.tasks.LookupFailed(j.entry, st)
		return
	}
	nd := cfg.NumDense
	copy(j.b.dense[j.row*nd:(j.row+j.n)*nd], j.payload.Dense[j.first*nd:(j.first+j.n)*nd])
	took := time.Since(start)
	w.e.m.lookup.Observe(took.Seconds())
	if w.e.opts.Mode.Predicts() {
		// Shared by every worker: only the mode that predicts pays for it.
		w.e.lookupNanos.Add(int64(took))
		w.e.lookupExamples.Add(int64(j.n))
	}
}
