package batch

import (
	"math/bits"
	"time"
)

// Costs predicts how long the embedder's lookups and the device's
// execution take. The accelerator measures each bucket's execution time
// (calibrated at start-up, then a high quantile of recent runs) and
// publishes it; the embedder measures its lookups. Zero values mean
// unknown and predict nothing.
type Costs struct {
	exec [maxBuckets]time.Duration // by log2 of the bucket
	// expect is what Exec answers, by log2 of the bucket, derived from
	// exec whenever it changes: the batcher asks for many sizes per
	// request, the accelerator's figures change a few times a second.
	expect [maxBuckets]time.Duration
	// lookupPerExample is the lookups' wall time per example with every
	// worker busy.
	lookupPerExample time.Duration
}

// maxBuckets covers buckets 1 … 2^15.
const maxBuckets = 16

// SetExec sets the expected execution time of a power-of-two bucket.
func (c *Costs) SetExec(bucket int, d time.Duration) {
	i, ok := bucketIndex(bucket)
	if !ok || c.exec[i] == max(d, 0) {
		return
	}
	c.exec[i] = max(d, 0)
	c.derive()
}

// SetLookup sets the lookups' wall time per example.
func (c *Costs) SetLookup(perExample time.Duration) { c.lookupPerExample = max(perExample, 0) }

// derive computes expect from exec. A bucket's expected time is the least
// estimate of it and every larger bucket (a larger bucket is never faster,
// so a smaller bucket's higher estimate is stale or noise: it runs rarely,
// or ran on a busy core), or failing that the largest smaller bucket's
// scaled by size (execution is at most linear in the bucket beyond the
// per-call cost). 0 when nothing is known.
func (c *Costs) derive() {
	var least time.Duration
	for i := maxBuckets - 1; i >= 0; i-- {
		if d := c.exec[i]; d > 0 && (least == 0 || d < least) {
			least = d
		}
		c.expect[i] = least
	}
	var below time.Duration // the largest smaller bucket's estimate, scaled
	for i := range maxBuckets {
		switch {
		case c.expect[i] > 0:
		case below > 0:
			c.expect[i] = 2 * below
		}
		if c.exec[i] > 0 {
			below = c.exec[i]
		} else {
			below *= 2
		}
	}
}

// Exec is the expected execution time of a batch of rows examples: that
// of the smallest power-of-two bucket that holds it (see derive).
func (c *Costs) Exec(rows int) time.Duration {
	if rows <= 0 {
		return 0
	}
	return c.expect[min(bits.Len(uint(rows-1)), maxBuckets-1)]
}

// Lookup is the expected wall time of looking up rows examples.
func (c *Costs) Lookup(rows int) time.Duration {
	return c.lookupPerExample * time.Duration(max(rows, 0))
}

func bucketIndex(bucket int) (int, bool) {
	for i := range maxBuckets {
		if bucket == 1<<i {
			return i, true
		}
	}
	return 0, false
}
