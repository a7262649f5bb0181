package loadgen

import (
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"
)

// TestBucketLayout checks that buckets tile the non-negative int64s: each
// value maps to the bucket whose bounds hold it, bounds are contiguous,
// and a bucket is never wider than 1/128 of its lower bound.
func TestBucketLayout(t *testing.T) {
	prevHi := int64(0)
	for i := range numBuckets {
		lo, hi := bucketBounds(i)
		if lo != prevHi {
			t.Fatalf("bucket %d starts at %d, previous ended at %d", i, lo, prevHi)
		}
		if hi <= lo {
			t.Fatalf("bucket %d is [%d, %d)", i, lo, hi)
		}
		if lo >= subBucketCount && float64(hi-lo) > float64(lo)/subBucketCount {
			t.Fatalf("bucket %d [%d, %d) wider than 1/%d of its start", i, lo, hi, subBucketCount)
		}
		for _, v := range []int64{lo, hi - 1, lo + (hi-lo)/2} {
			if b := bucketOf(v); b != i {
				t.Fatalf("value %d maps to bucket %d, want %d [%d, %d)", v, b, i, lo, hi)
			}
		}
		prevHi = hi
	}
	if prevHi != math.MaxInt64 {
		t.Fatalf("buckets end at %d, want MaxInt64", prevHi)
	}
	if b := bucketOf(math.MaxInt64); b != numBuckets-1 {
		t.Fatalf("MaxInt64 in bucket %d", b)
	}
}

// TestQuantileAccuracy compares percentiles with the exact nearest-rank
// values of a heavy-tailed sample: each must be within 1/128.
func TestQuantileAccuracy(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	h := NewHistogram()
	vals := make([]int64, 100000)
	for i := range vals {
		// Log-normal around 2 ms, spanning microseconds to seconds.
		vals[i] = int64(2e6 * math.Exp(1.5*rng.NormFloat64()))
		h.Record(time.Duration(vals[i]))
	}
	slices.Sort(vals)
	for _, q := range []float64{0, 0.001, 0.25, 0.5, 0.9, 0.99, 0.999, 0.9999, 1} {
		rank := max(int(math.Ceil(q*float64(len(vals)))), 1)
		exact := vals[rank-1]
		got := int64(h.Quantile(q))
		if rel := math.Abs(float64(got-exact)) / float64(exact); rel > 1.0/subBucketCount {
			t.Errorf("q%v = %d, exact %d (%.3f%% off)", q, got, exact, 100*rel)
		}
	}
	if h.Min() != time.Duration(vals[0]) || h.Max() != time.Duration(vals[len(vals)-1]) {
		t.Errorf("min/max %v/%v, want %v/%v", h.Min(), h.Max(), vals[0], vals[len(vals)-1])
	}
	var sum int64
	for _, v := range vals {
		sum += v
	}
	if h.Mean() != time.Duration(sum/int64(len(vals))) {
		t.Errorf("mean %v, want %v", h.Mean(), time.Duration(sum/int64(len(vals))))
	}
	var n uint64
	for _, b := range h.Buckets() {
		n += b.Count
	}
	if n != uint64(len(vals)) || h.Count() != n {
		t.Errorf("buckets hold %d, count %d, want %d", n, h.Count(), len(vals))
	}
}

func TestHistogramSmall(t *testing.T) {
	h := NewHistogram()
	if h.Quantile(0.5) != 0 || h.Min() != 0 || h.Max() != 0 || h.Mean() != 0 {
		t.Error("empty histogram not all zero")
	}
	for _, v := range []time.Duration{-5, 3, 7, 100} {
		h.Record(v)
	}
	// Values below 128 ns are exact; -5 counts as 0.
	if h.Min() != 0 || h.Quantile(0.5) != 3 || h.Quantile(0.75) != 7 || h.Max() != 100 {
		t.Errorf("min %v p50 %v p75 %v max %v", h.Min(), h.Quantile(0.5), h.Quantile(0.75), h.Max())
	}
	// One value: every percentile is it, exactly (clamped to min and max).
	h = NewHistogram()
	h.Record(2*time.Millisecond + 345)
	for _, q := range []float64{0, 0.5, 0.999, 1} {
		if got := h.Quantile(q); got != 2*time.Millisecond+345 {
			t.Errorf("q%v of one value = %v", q, got)
		}
	}
}

func TestHistogramConcurrent(t *testing.T) {
	h := NewHistogram()
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 10000 {
				h.Record(time.Duration(g*10000 + i))
			}
		})
	}
	wg.Wait()
	if h.Count() != 80000 || h.Min() != 0 || h.Max() != 79999 {
		t.Errorf("count %d min %v max %v", h.Count(), h.Min(), h.Max())
	}
}
