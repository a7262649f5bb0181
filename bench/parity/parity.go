// Package parity checks that a server scores like the plain-Go reference:
// it sends fixed examples in requests of several sizes and compares every
// score with model.Reference on the same bundle. A serving arm that fails
// is not benchmarked: its throughput would be of a different computation.
package parity

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/recmesh/recmesh/model"
	pb "github.com/recmesh/recmesh/proto/inference"
	"github.com/recmesh/recmesh/proto/oip"
)

// Defaults of a check.
const (
	// DefaultTolerance is the project's parity bound, max|Δ| ≤ 1e-4.
	DefaultTolerance = 1e-4
	DefaultExamples  = 256
	// DefaultSeed keeps the parity inputs apart from the load generator's
	// (seed 1), so a server cannot pass by caching what it served.
	DefaultSeed = 0x7061726974 // "parit"
)

// DefaultBatchSizes mixes a single example, sizes that pad to a
// power-of-two bucket, and the benchmark's request sizes.
var DefaultBatchSizes = []int{1, 3, 16, 37, 128}

// Predictor computes reference scores; *model.Reference is one.
type Predictor interface {
	Predict(dense []float32, sparse []int32, n int) ([]float32, error)
}

// OpenReference opens the bundle in dir and its plain-Go reference, for
// Check against b.Config; the reference reads b's weights, so close b only
// after the check.
func OpenReference(dir string) (b *model.Bundle, ref *model.Reference, err error) {
	if b, err = model.Open(dir); err != nil {
		return nil, nil, err
	}
	if ref, err = model.NewReference(b); err != nil {
		b.Close()
		return nil, nil, err
	}
	return b, ref, nil
}

// Options shape a check; zero values take the defaults.
type Options struct {
	ModelName  string
	Examples   int
	BatchSizes []int
	Seed       uint64
	Tolerance  float64
	// SparseType is the datatype the ids are sent as (INT32 or INT64).
	SparseType string
	// Timeout bounds each request (default 60 s: a reference backend takes
	// tens of milliseconds per example).
	Timeout time.Duration
}

// Result is the outcome of a check.
type Result struct {
	Pass       bool    `json:"pass"`
	Tolerance  float64 `json:"tolerance"`
	Examples   int     `json:"examples"`
	Requests   int     `json:"requests"`
	BatchSizes []int   `json:"batch_sizes"`
	SparseType string  `json:"sparse_type"`
	// MaxAbsDiff and MeanAbsDiff are over every score.
	MaxAbsDiff  float64 `json:"max_abs_diff"`
	MeanAbsDiff float64 `json:"mean_abs_diff"`
	// OverTolerance counts the scores off by more than Tolerance.
	OverTolerance int `json:"over_tolerance"`
	// Worst is the example with the largest difference.
	Worst struct {
		Example int     `json:"example"`
		Got     float32 `json:"got"`
		Want    float32 `json:"want"`
	} `json:"worst"`
}

func (r *Result) String() string {
	verdict := "PASS"
	if !r.Pass {
		verdict = "FAIL"
	}
	return fmt.Sprintf("parity %s: %d examples in %d requests (sizes %v, %s ids): max|Δ| %.3g (tolerance %.3g), mean|Δ| %.3g, %d over; worst example %d got %.7f want %.7f",
		verdict, r.Examples, r.Requests, r.BatchSizes, r.SparseType, r.MaxAbsDiff, r.Tolerance, r.MeanAbsDiff, r.OverTolerance, r.Worst.Example, r.Worst.Got, r.Worst.Want)
}

// Check sends opts.Examples examples drawn from opts.Seed to client, in
// requests whose sizes cycle through opts.BatchSizes, and compares every
// score with ref. A failed request or a malformed answer is an error; a
// score off by more than the tolerance is a Result with Pass false.
func Check(ctx context.Context, client pb.GRPCInferenceServiceClient, cfg model.Config, ref Predictor, opts Options) (*Result, error) {
	if opts.ModelName == "" {
		opts.ModelName = oip.DefaultModelName
	}
	if opts.Examples <= 0 {
		opts.Examples = DefaultExamples
	}
	if len(opts.BatchSizes) == 0 {
		opts.BatchSizes = DefaultBatchSizes
	}
	for _, b := range opts.BatchSizes {
		if b <= 0 {
			return nil, fmt.Errorf("parity: batch size %d, want ≥ 1", b)
		}
	}
	if opts.Seed == 0 {
		opts.Seed = DefaultSeed
	}
	if opts.Tolerance <= 0 {
		opts.Tolerance = DefaultTolerance
	}
	if opts.SparseType == "" {
		opts.SparseType = oip.TypeINT32
	}
	if opts.Timeout <= 0 {
		opts.Timeout = time.Minute
	}

	n := opts.Examples
	dense, sparse := model.RandomInputs(cfg, opts.Seed, n)
	want, err := ref.Predict(dense, sparse, n)
	if err != nil {
		return nil, fmt.Errorf("parity: reference: %w", err)
	}
	if len(want) != n {
		return nil, fmt.Errorf("parity: reference gave %d scores for %d examples", len(want), n)
	}

	r := &Result{Tolerance: opts.Tolerance, Examples: n, BatchSizes: opts.BatchSizes, SparseType: opts.SparseType}
	dw, sw := cfg.NumDense, cfg.SparseWidth()
	var sum float64
	for lo, i := 0, 0; lo < n; i++ {
		b := min(opts.BatchSizes[i%len(opts.BatchSizes)], n-lo)
		hi := lo + b
		req, err := oip.BuildRequest(opts.ModelName, cfg, dense[lo*dw:hi*dw], sparse[lo*sw:hi*sw], b, opts.SparseType)
		if err != nil {
			return nil, fmt.Errorf("parity: %w", err)
		}
		rctx, cancel := context.WithTimeout(ctx, opts.Timeout)
		resp, err := client.ModelInfer(rctx, req)
		cancel()
		if err != nil {
			return nil, fmt.Errorf("parity: request %d (examples %d..%d): %w", i, lo, hi-1, err)
		}
		got, err := oip.Scores(resp, b)
		if err != nil {
			return nil, fmt.Errorf("parity: request %d (examples %d..%d): %w", i, lo, hi-1, err)
		}
		for j, g := range got {
			e := lo + j
			d := math.Abs(float64(g) - float64(want[e]))
			if math.IsNaN(d) {
				d = math.Inf(1) // a NaN score must fail, and NaN compares false
			}
			sum += d
			if d > opts.Tolerance {
				r.OverTolerance++
			}
			if d > r.MaxAbsDiff || (e == 0 && d == 0) {
				r.MaxAbsDiff = d
				r.Worst.Example, r.Worst.Got, r.Worst.Want = e, g, want[e]
			}
		}
		r.Requests++
		lo = hi
	}
	r.MeanAbsDiff = sum / float64(n)
	r.Pass = r.OverTolerance == 0
	return r, nil
}
