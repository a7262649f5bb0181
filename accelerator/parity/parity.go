// Package parity compares the compiled DCNv2 program with the plain-Go
// reference of package model on the same inputs.
package parity

import (
	"fmt"
	"math"

	"github.com/recmesh/recmesh/accelerator/executor"
	"github.com/recmesh/recmesh/model"
)

// MaxCheckedRows bounds how many rows of one bucket go through the float64
// reference (about 32 MFLOP each); larger buckets are checked on an evenly
// spread sample that always includes the first and the last row.
const MaxCheckedRows = 64

// Result is the comparison of one bucket.
type Result struct {
	Bucket      int
	Rows        int // examples run
	CheckedRows int
	MaxAbsDiff  float64
}

// Bucket fills n rows of in from seed (random ids pooled by the
// reference), runs the executor, and compares the scores of up to
// MaxCheckedRows rows with the reference. Rows n … bucket-1 are filled with
// NaN first, so padding leaking into real rows shows up as a NaN difference.
func Bucket(ex *executor.Executor, ref *model.Reference, in *executor.Inputs, n int, seed uint64) (Result, error) {
	cfg := ex.Config()
	bucket, _, err := ex.BucketFor(n)
	if err != nil {
		return Result{}, err
	}
	if bucket > in.Rows() {
		return Result{}, fmt.Errorf("parity: bucket %d exceeds input region of %d rows", bucket, in.Rows())
	}
	dense, sparse := model.RandomInputs(cfg, seed, n)
	tables := len(cfg.VocabSizes) * cfg.EmbeddingDim
	pooled := in.Pooled()[:bucket*tables]
	if err := ref.Pool(sparse, n, pooled[:n*tables]); err != nil {
		return Result{}, fmt.Errorf("parity: pool: %w", err)
	}
	copy(in.Dense(), dense)
	nan := float32(math.NaN())
	for i := n * tables; i < bucket*tables; i++ {
		pooled[i] = nan
	}
	for i := n * cfg.NumDense; i < bucket*cfg.NumDense; i++ {
		in.Dense()[i] = nan
	}
	scores := make([]float32, n)
	if err := ex.Run(in, n, scores); err != nil {
		return Result{}, err
	}

	rows := SampleRows(n, MaxCheckedRows)
	sd := make([]float32, len(rows)*cfg.NumDense)
	sp := make([]float32, len(rows)*tables)
	for i, r := range rows {
		copy(sd[i*cfg.NumDense:], dense[r*cfg.NumDense:(r+1)*cfg.NumDense])
		copy(sp[i*tables:], pooled[r*tables:(r+1)*tables])
	}
	want := make([]float32, len(rows))
	if err := ref.Forward(sd, sp, len(rows), want); err != nil {
		return Result{}, fmt.Errorf("parity: reference: %w", err)
	}
	res := Result{Bucket: bucket, Rows: n, CheckedRows: len(rows)}
	for i, r := range rows {
		d := math.Abs(float64(scores[r]) - float64(want[i]))
		if math.IsNaN(d) {
			d = math.Inf(1)
		}
		res.MaxAbsDiff = math.Max(res.MaxAbsDiff, d)
	}
	return res, nil
}

// SampleRows picks up to max row indices of [0,n) spread evenly, always
// including 0 and n-1.
func SampleRows(n, max int) []int {
	if n <= max {
		rows := make([]int, n)
		for i := range rows {
			rows[i] = i
		}
		return rows
	}
	rows := make([]int, max)
	for i := range rows {
		rows[i] = i * (n - 1) / (max - 1)
	}
	return rows
}
