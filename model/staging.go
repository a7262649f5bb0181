package model

import "fmt"

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

// RequestLayout is how a frontend lays out the payload of one request in
// its lane arena and the embedder reads it: dense [n, NumDense] float32 at
// offset 0, then the ids [n, SparseWidth] int32 at SparseOffset, both
// native-endian.
type RequestLayout struct {
	Examples     int
	SparseOffset int
	Size         int
}

// Request returns the payload layout of a request of n examples.
func (c Config) Request(n int) RequestLayout {
	dense := n * c.NumDense * 4
	return RequestLayout{Examples: n, SparseOffset: dense, Size: dense + n*c.SparseWidth()*4}
}

// ID names a model in segment headers, so an accelerator built for one
// bundle never attaches to an embedder serving another. The precisions
// are part of it where they are not float32's: the bundles of one seed at
// other precisions are other models (their scores differ), and an
// accelerator with fp16 weights must not serve an embedder's fp32 model.
func (c Config) ID() string {
	id := fmt.Sprintf("%s-cap%d-seed%d", c.Name, c.MaxVocabSize, c.Seed)
	if d := c.TableDtype.norm(); d != DtypeFP32 {
		id += "-" + string(d)
	}
	if d := c.DenseDtype.norm(); d != DenseFP32 {
		id += "-dense-" + string(d)
	}
	return id
}

// PowerOfTwoCeil is the smallest power of two ≥ n (1 for n ≤ 1): the batch
// bucket that holds n examples.
func PowerOfTwoCeil(n int) int {
	b := 1
	for b < n {
		b *= 2
	}
	return b
}
