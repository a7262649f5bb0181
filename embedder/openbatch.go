package embedder

import (
	"sync"
	"unsafe"

	"github.com/recmesh/recmesh/embedder/batch"
	"github.com/recmesh/recmesh/model"
	"github.com/recmesh/recmesh/shm"
)

// openBatch is the batch being filled in one staging buffer: the rows the
// workers write into it and the requests it carries. One exists per
// staging buffer, made once, so filling a batch allocates nothing.
type openBatch struct {
	st     *shm.Staging
	pooled []float32
	dense  []float32
	tasks  *batch.Tasks // the requests, their outcomes decided there
	wg     sync.WaitGroup
}

// newOpenBatch views staging buffer st as the rows of up to maxBatch
// examples of cfg.
func newOpenBatch(st *shm.Staging, cfg model.Config, maxBatch int) *openBatch {
	lay := cfg.Staging(model.PowerOfTwoCeil(maxBatch))
	data := st.Data()
	per := len(cfg.VocabSizes) * cfg.EmbeddingDim
	return &openBatch{
		st:     st,
		pooled: unsafe.Slice((*float32)(unsafe.Pointer(&data[lay.PooledOffset])), maxBatch*per),
		dense:  unsafe.Slice((*float32)(unsafe.Pointer(&data[lay.DenseOffset])), maxBatch*cfg.NumDense),
		tasks:  batch.NewTasks(maxBatch),
	}
}
