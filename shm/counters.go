package shm

import (
	"fmt"
	"math"
	"sync/atomic"
	"time"
)

// Counters record, 8 × n bytes: the numbers one process keeps for another
// to read, as a block of n atomic u64 words. Each word is one named counter
// of one kind; the record's descriptor (counterRecord) names them, and
// every block in the segment is read and written through the same view
// (counterBlock), by word index. A block has one writer, and lives in a
// page of that writer's protection domain (layout.go places each block;
// memfd.go says who maps which page).
//
//	 0                   1                   2                   3
//	 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//	+---------------------------------------------------------------+
//	|                  Counter 0 (u64, atomic)                      |   0
//	+                                                               +
//	|                                                               |
//	+---------------------------------------------------------------+
//	|                  Counter 1 (u64, atomic)                      |   8
//	+                                                               +
//	|                                                               |
//	+---------------------------------------------------------------+
//	|                             ...                               |
//	+---------------------------------------------------------------+
//	|                 Counter n-1 (u64, atomic)                     | 8(n-1)
//	+                                                               +
//	|                                                               |
//	+---------------------------------------------------------------+
//
// Kinds of counter, and how a reader decodes each:
//
//	kind      writer                                reader
//	count     adds; never resets it (a lane keeps   differences successive readings;
//	          its counts across owners)             a reading below the last one is
//	                                                a restart (a new baseline), never
//	                                                a negative count
//	estimate  stores a replacement value (a gauge)  takes it as a prediction and
//	                                                bounds what it does with it;
//	                                                above MaxInt64 ns it reads 0
//	                                                (unknown)
//
// A hostile writer can put any value in its block: a count can jump,
// move backwards, or make a sum of counts wrap. A reader that follows the
// rule above takes the backwards moves as restarts, and bounds what one
// difference may do to it (the embedder's SLO feedback counts no more
// misses than calls). What a writer puts in its block never reaches
// another block.
//
// The blocks of the segment:
//
//	block                place (layout.go)                 words             writer           reader
//	lane counters        lane block + laneCounters         laneCounterWords  lane's frontend  embedder
//	execution estimates  accelerator page + hdrExecTable   ExecTableBuckets  accelerator      embedder

// counterWordBytes is the size of one counter word.
const counterWordBytes = 8

// counterKind is how a counter's word is written and read (the table
// above).
type counterKind uint8

const (
	counterCount    counterKind = iota + 1 // only grows; readers difference it
	counterEstimate                        // replaced by its writer; a prediction
)

// counterDesc names one word of a counters record.
type counterDesc struct {
	name string
	kind counterKind
}

// counterRecord describes a counters record: its words, in index order.
type counterRecord struct {
	name     string
	counters []counterDesc
}

// bytes is the record's size.
func (r *counterRecord) bytes() int { return counterWordBytes * len(r.counters) }

// Lane counters, the words of laneCounterRecord: what the lane's frontend
// counts of the calls it served, for the embedder's SLO feedback
// (Lane.CountServed, Segment.ServedCalls).
const (
	counterServed    = iota // calls served through the lane (answered with scores)
	counterMissed           // of those, answered later than the latency target
	laneCounterWords        // words in the lane counters block
)

var laneCounterRecord = counterRecord{name: "lane counters", counters: []counterDesc{
	counterServed: {"served", counterCount},
	counterMissed: {"missed", counterCount},
}}

// execCounterRecord is the execution estimates block: word i is the
// accelerator's expected execution time, in ns, of bucket 2^i
// (Segment.SetExecTime, Segment.ExecTime; execIndex maps a bucket to its
// word).
var execCounterRecord = counterRecord{name: "execution estimates", counters: execCounterDescs()}

func execCounterDescs() []counterDesc {
	d := make([]counterDesc, ExecTableBuckets)
	for i := range d {
		d[i] = counterDesc{fmt.Sprintf("exec ns, bucket %d", 1<<i), counterEstimate}
	}
	return d
}

// counterBlock is the view of one counters record in the mapping: its
// words, for sync/atomic. An index outside the record panics (the slice is
// bounds-checked); callers index with the record's constants.
type counterBlock struct{ w []uint64 }

// newCounterBlock views the record rec at off in b. The whole block is
// bounds-checked against b once, here; off must be 8-aligned (layout.go
// places every block on a word boundary).
func newCounterBlock(b []byte, off int, rec *counterRecord) counterBlock {
	return counterBlock{w: words64(b, off, len(rec.counters))}
}

// Add adds d to count i (the writer's encoder for counts).
func (c counterBlock) Add(i int, d uint64) { atomic.AddUint64(&c.w[i], d) }

// Store replaces word i (the writer's encoder for estimates).
func (c counterBlock) Store(i int, v uint64) { atomic.StoreUint64(&c.w[i], v) }

// Load reads word i as it is; a reader decodes it by its kind.
func (c counterBlock) Load(i int) uint64 { return atomic.LoadUint64(&c.w[i]) }

// writeEstimate and readEstimate are an estimate word's encoder and
// validating decoder as a duration: a negative duration is stored as 0
// (unknown), and a word that is no duration (above MaxInt64) reads 0.
func writeEstimate(c counterBlock, i int, d time.Duration) { c.Store(i, uint64(max(d, 0))) }

func readEstimate(c counterBlock, i int) time.Duration {
	v := c.Load(i)
	if v > math.MaxInt64 {
		return 0
	}
	return time.Duration(v)
}
