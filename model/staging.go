package model

// StagingAlign is the alignment of every array in a staging region: PJRT
// reads the region in place on the CPU plugin, and XLA wants 64-byte aligned
// buffers; 4096 keeps each array on its own pages.
const StagingAlign = 4096

// StagingLayout is where the embedder writes one batch and the accelerator
// reads it: pooled [rows, tables, dim] f32 at PooledOffset, then dense
// [rows, NumDense] f32 at DenseOffset. Row r of a batch is row r of both
// arrays, so the first b rows of each are the inputs of bucket b.
type StagingLayout struct {
	Rows         int
	PooledOffset int
	DenseOffset  int
	Size         int
}

// Staging returns the layout of a staging region for up to rows examples.
func (c Config) Staging(rows int) StagingLayout {
	pooled := rows * len(c.VocabSizes) * c.EmbeddingDim * 4
	denseOff := alignUp(pooled, StagingAlign)
	dense := rows * c.NumDense * 4
	return StagingLayout{
		Rows:         rows,
		PooledOffset: 0,
		DenseOffset:  denseOff,
		Size:         alignUp(denseOff+dense, StagingAlign),
	}
}

func alignUp(n, a int) int { return (n + a - 1) / a * a }
