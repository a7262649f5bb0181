package loadgen

import (
	"math"
	"math/bits"
	"sync/atomic"
	"time"
)

// subBucketBits sets the histogram's precision: every power-of-two range of
// values is split into 2^subBucketBits equal buckets, so a recorded value
// is known to within 1/128 (0.8 %) of itself, and a reported percentile,
// the midpoint of its bucket, to within 0.4 %. That is finer than the
// run-to-run noise of any latency measured here, at 7,296 counters.
const (
	subBucketBits  = 7
	subBucketCount = 1 << subBucketBits
	// numBuckets covers every non-negative int64: the exact values below
	// subBucketCount, then subBucketCount buckets per binary exponent
	// from subBucketBits to 62.
	numBuckets = (64 - subBucketBits) * subBucketCount
)

// Histogram is a log-linear histogram of durations (HdrHistogram's
// layout, written out here because it is fifty lines). Record is safe for
// concurrent use and does not allocate, so every client goroutine can
// record into one shared histogram; the read methods may run concurrently
// with Record but then see a moving target.
type Histogram struct {
	counts [numBuckets]atomic.Uint64
	total  atomic.Uint64
	sum    atomic.Int64 // nanoseconds; overflows only after 292 years of latency
	min    atomic.Int64 // nanoseconds, math.MaxInt64 while empty
	max    atomic.Int64 // nanoseconds
}

// NewHistogram returns an empty histogram.
func NewHistogram() *Histogram {
	h := &Histogram{}
	h.min.Store(math.MaxInt64)
	return h
}

// bucketOf returns the index of the bucket holding v ≥ 0.
func bucketOf(v int64) int {
	if v < subBucketCount {
		return int(v)
	}
	// e is v's binary exponent, shift how many low bits a bucket ignores.
	e := bits.Len64(uint64(v)) - 1
	shift := e - subBucketBits
	sub := int(v>>shift) - subBucketCount
	return (shift+1)*subBucketCount + sub
}

// bucketBounds returns the half-open value range [lo, hi) of bucket i.
func bucketBounds(i int) (lo, hi int64) {
	if i < subBucketCount {
		return int64(i), int64(i) + 1
	}
	shift := i/subBucketCount - 1
	sub := i % subBucketCount
	lo = int64(subBucketCount+sub) << shift
	hi = lo + 1<<shift
	if hi < lo { // the top bucket ends at 2^63, one past MaxInt64
		hi = math.MaxInt64
	}
	return lo, hi
}

// Record adds one duration; negative durations (a clock step) count as 0.
func (h *Histogram) Record(d time.Duration) {
	v := max(int64(d), 0)
	h.counts[bucketOf(v)].Add(1)
	h.total.Add(1)
	h.sum.Add(v)
	for {
		m := h.min.Load()
		if v >= m || h.min.CompareAndSwap(m, v) {
			break
		}
	}
	for {
		m := h.max.Load()
		if v <= m || h.max.CompareAndSwap(m, v) {
			break
		}
	}
}

// Count is the number of recorded values.
func (h *Histogram) Count() uint64 { return h.total.Load() }

// Min and Max are the exact extremes (0 when empty).
func (h *Histogram) Min() time.Duration {
	if h.Count() == 0 {
		return 0
	}
	return time.Duration(h.min.Load())
}

// Max is the largest recorded value, exactly.
func (h *Histogram) Max() time.Duration { return time.Duration(h.max.Load()) }

// Mean is the exact mean of the recorded values (0 when empty).
func (h *Histogram) Mean() time.Duration {
	n := h.Count()
	if n == 0 {
		return 0
	}
	return time.Duration(h.sum.Load() / int64(n))
}

// Quantile returns the value below or at which a fraction q of the recorded
// values lie (the nearest-rank definition): the midpoint of the bucket
// holding the ceil(q·n)-th smallest value, clamped to the exact min and
// max, so Quantile(0) is Min and Quantile(1) is Max.
func (h *Histogram) Quantile(q float64) time.Duration {
	n := h.Count()
	if n == 0 {
		return 0
	}
	q = min(max(q, 0), 1)
	rank := uint64(math.Ceil(q * float64(n)))
	rank = min(max(rank, 1), n)
	var seen uint64
	for i := range h.counts {
		seen += h.counts[i].Load()
		if seen >= rank {
			lo, hi := bucketBounds(i)
			mid := lo + (hi-lo-1)/2
			return time.Duration(min(max(mid, h.min.Load()), h.max.Load()))
		}
	}
	return h.Max() // only when Record ran concurrently
}

// Bucket is one non-empty histogram bucket in a Snapshot: Count values in
// [LoNs, HiNs) nanoseconds.
type Bucket struct {
	LoNs  int64  `json:"lo_ns"`
	HiNs  int64  `json:"hi_ns"`
	Count uint64 `json:"count"`
}

// Buckets lists the non-empty buckets in increasing order, so a report can
// merge repeats or recompute any percentile from the JSON.
func (h *Histogram) Buckets() []Bucket {
	var out []Bucket
	for i := range h.counts {
		if c := h.counts[i].Load(); c > 0 {
			lo, hi := bucketBounds(i)
			out = append(out, Bucket{LoNs: lo, HiNs: hi, Count: c})
		}
	}
	return out
}
