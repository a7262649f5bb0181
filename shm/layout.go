package shm

import (
	"fmt"
	"math/bits"
)

// This file, records.go and counters.go are the single description of the
// segment's memory layout: this one places the regions, records.go formats
// the records inside them, and counters.go the one counters record every
// block of counters shares. Every offset the package uses is a named
// constant in one of them or is computed by computeLayout from the
// geometry in the header; nothing else in the package hard-codes a
// position. Changing anything in any of them means bumping LayoutVersion.
//
// A segment is one contiguous virtual image in every process that maps
// it, built from several sealed memfds (see memfd.go for which region is
// which memfd and who may map it how):
//
//	offset                         size                          region
//	0                              HeaderBytes                   header page (owner writes; all read)
//	layout.bell                    PageSize                      bell page (everyone writes)
//	layout.accel                   PageSize                      accelerator page (accelerator and owner)
//	layout.lanes                   Lanes × layout.laneStride     lane control blocks
//	layout.arenas                  Lanes × ArenaBytes            lane slot arenas
//	layout.batchRing               layout.batchRingBytes         batch ring
//	layout.stagingMeta             StagingCount × metaStride     staging state + entry tables
//	layout.stagingData             StagingCount × StagingBytes   staging buffers
//	layout.total                                                 end of the image
//
// Every region starts on a page (PageSize) boundary, so a staging buffer can
// be wrapped as a zero-copy device buffer and a lane arena never shares a page
// with control data. Words that two processes write are kept on separate
// cache-line pairs (LinePair bytes) because adjacent-line prefetch makes a
// single 64-byte line too small to stop false sharing.
//
// All multi-byte fields are native-endian: a segment never leaves the machine
// that created it. Fields marked (atomic) are only accessed with sync/atomic;
// the others are written by one side before a release store publishes them
// and read by the other side after the matching acquire load.

// Sizes shared by every region.
const (
	// PageSize is the allocation unit of lane arenas and the alignment of
	// every region. It is the small page size even on hugetlbfs: the file is
	// then rounded up to the huge page size as a whole.
	PageSize = 4096
	// CacheLine is the coherence unit on the machines recmesh runs on.
	CacheLine = 64
	// LinePair separates words written by different processes: two lines,
	// so the adjacent-line prefetcher does not couple them.
	LinePair = 2 * CacheLine
)

// LayoutVersion is stored in every header. Attach refuses any other value:
// the layout below is the only one this code can read.
const LayoutVersion = 5

// segmentMagic identifies a recmesh segment: the ASCII bytes "rmshseg1" read
// as a big-endian integer, so a hex dump of the file shows them.
const segmentMagic uint64 = 0x726d_7368_7365_6731

// Header page, the first HeaderBytes of the image. Fields written once are
// set before the segment is published at its path, so attachers read them
// without atomics. Rows marked [accel page] are the accelerator page's
// words at the same offset; the header holds the owner's copy of the first
// four (the mirror) and leaves the others unused.
//
//	off   size  field                                 written by
//	  0      8  magic ("rmshseg1")                    owner, once
//	  8      4  layout version                        owner, once
//	 12      4  segment state (atomic, State)         owner; a successor's Create (ready → draining)
//	 16      8  generation                            owner, once
//	 24      8  image size (layout.total)             owner, once
//	 32      8  created, unix ns (informational)      owner, once
//	 64      4  geometry: lanes                       owner, once
//	 68      4            ring capacity
//	 72      4            slots per lane
//	 76      4            staging count
//	 80      8            arena bytes (per lane)
//	 88      8            staging bytes (per buffer)
//	 96      4            max batch entries
//	100      4            batch ring capacity
//	104      4            max examples (per request)
//	108      4            example bytes
//	128      8  offsets: lanes                        owner, once; attachers recompute
//	136      8           lane stride                  them from the geometry and
//	144      8           arenas                       require equality
//	152      8           batch ring
//	160      8           staging meta
//	168      8           staging meta stride
//	176      8           staging data
//	184      8           total bytes the layout needs
//	192     64  model id, NUL padded                  owner, once
//	256      4  owner pid                             owner, once
//	264      8  owner pid namespace                   owner, once
//	272      8  owner heartbeat (atomic, mono ns)     owner, every beat
//	384      4  accelerator pid (atomic)              [accel page] accelerator (SetAccelerator); mirror: owner
//	388      4  accelerator state (atomic)            [accel page] accelerator; mirror: owner
//	392      8  accelerator pid namespace (atomic)    [accel page] accelerator; mirror: owner
//	400      8  accelerator heartbeat (atomic)        [accel page] accelerator, every beat; mirror: owner
//	512      8  completed batch seq (atomic)          [accel page] accelerator, per batch
//	520      8  executed batch seq (atomic)           [accel page] accelerator, per batch
//	640    128  embedder doorbell waiter count        embedder (futex word: bell page)
//	768    128  batch doorbell                        [accel page] embedder rings, accelerator waits
//	896    128  staging doorbell                      [accel page] accelerator rings, embedder waits
//	1024   128  execution estimates: counters record  [accel page] accelerator, after runs
//	            (counters.go), 16 estimates, u64 ns,
//	            word log2(bucket)
//	1152        reserved up to HeaderBytes
//
// Each group that a different process writes starts on its own LinePair.
//
// Only the owner writes the header page: every other process maps it
// read-only, and the memfd behind it is sealed against new writable
// mappings. So the words the accelerator writes (offsets 384 to 1152)
// really live at the same offsets in the accelerator page (layout.accel),
// which frontends never map; the owner copies the accelerator's pid,
// state, pid namespace and heartbeat into the header at every beat, and
// that copy is what frontends judge the accelerator by. The embedder
// doorbell's futex word, which frontends bump, is in the bell page
// (layout.bell, offset 0); its waiter count, which only the embedder
// writes, stays in the header.
const (
	HeaderBytes = PageSize

	// hdrMagic … hdrModelID, the segment's description, are the segment
	// header record in records.go.

	hdrOwner          = 256
	hdrOwnerPid       = hdrOwner + 0
	hdrOwnerPidNS     = hdrOwner + 8
	hdrOwnerHeartbeat = hdrOwner + 16

	hdrAccel          = hdrOwner + LinePair
	hdrAccelPid       = hdrAccel + 0
	hdrAccelState     = hdrAccel + 4
	hdrAccelPidNS     = hdrAccel + 8
	hdrAccelHeartbeat = hdrAccel + 16
	// hdrAccelLinked is 1 while the broker holds an accelerator's
	// connection open (header only; the owner writes it as the kernel
	// reports the connection): what vouches, to a peer in another pid
	// namespace, that the accelerator still exists (peerAlive).
	hdrAccelLinked = hdrAccel + 24

	hdrProgress     = hdrAccel + LinePair
	hdrCompletedSeq = hdrProgress + 0
	// hdrExecutedSeq is the seq of the last batch the device finished
	// executing: ahead of hdrCompletedSeq by the time completions take to
	// write, so the embedder sees the device idle before the first caller
	// has its answer (and sends the next request).
	hdrExecutedSeq = hdrProgress + 8

	hdrEmbedderBell = hdrProgress + LinePair
	hdrBatchBell    = hdrEmbedderBell + LinePair
	hdrStagingBell  = hdrBatchBell + LinePair

	// hdrExecTable is the execution estimates block, a counters record
	// (execCounterRecord, counters.go) of ExecTableBuckets words: the
	// accelerator's expected execution time of each power-of-two bucket,
	// which the embedder's latency-aware batching reads.
	hdrExecTable = hdrStagingBell + LinePair

	hdrUsed = hdrExecTable + LinePair
)

// ExecTableBuckets is how many buckets (1, 2, 4, … 2^15) the execution
// estimates block of the accelerator page holds: one counters record word
// each, filling its LinePair.
const ExecTableBuckets = LinePair / counterWordBytes

// State is the segment state word (header offset hdrState).
type State uint32

// Segment states.
const (
	StateInvalid  State = 0 // never written: a zeroed header is not a segment
	StateCreating State = 1 // being initialised; never visible at the public path
	StateReady    State = 2 // serving; frontends may attach and submit
	StateDraining State = 3 // a newer generation exists; finish in-flight work only
	StateClosed   State = 4 // the owner shut down cleanly
)

func (s State) String() string {
	switch s {
	case StateCreating:
		return "creating"
	case StateReady:
		return "ready"
	case StateDraining:
		return "draining"
	case StateClosed:
		return "closed"
	}
	return fmt.Sprintf("invalid(%d)", uint32(s))
}

// Accelerator states (header word at hdrAccelState).
const (
	accelNone    uint32 = 0 // no accelerator has attached yet
	accelRunning uint32 = 1 // an accelerator holds the segment (see pid/heartbeat)
	accelGone    uint32 = 2 // the accelerator detached cleanly
)

// Doorbell block, LinePair bytes, placed wherever a doorbell lives:
//
//	 0                   1                   2                   3
//	 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//	+---------------------------------------------------------------+
//	|              Futex word (u32, atomic, shared futex)           |  0
//	|                   Waiter count (u32, atomic)                  |  4
//	+---------------------------------------------------------------+
const (
	bellWord    = 0
	bellWaiters = 4
)

// Ring control block, 2 × LinePair bytes. Each counter counts entries ever
// published (tail) or consumed (head); they only grow, so an entry's ring
// index is its counter value masked by capacity-1. The producer owns tail,
// the consumer owns head, and each sits alone on its line pair.
//
//	+---------------------------------------------------------------+
//	|                 Tail (u64, atomic; producer)                  |  0
//	+---------------------------------------------------------------+
//	|                 Head (u64, atomic; consumer)                  | 128
//	+---------------------------------------------------------------+
const (
	ringTail     = 0
	ringHead     = LinePair
	ringCtlBytes = 2 * LinePair
)

// Lane control block, one per lane, laneStride bytes apart from layout.lanes:
//
//	offset            size               what
//	0                 LinePair           lane header (below)
//	laneBell          LinePair           completion doorbell (frontend sleeps on it)
//	laneReqCtl        ringCtlBytes       request ring counters
//	laneComplCtl      ringCtlBytes       completion ring counters
//	laneReqEntries    cap × 8            request ring entries
//	...               cap × 16           completion ring entries
//	...               slots × SlotBytes  slot table
//
// Lane header:
//
//	 0                   1                   2                   3
//	 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//	+---------------------------------------------------------------+
//	|       Owner pid (u32, atomic; 0 = free, claimed by CAS)       |   0
//	+---------------------------------------------------------------+
//	|      Epoch (u32, atomic; bumped on claim/release/reclaim)     |   4
//	+---------------------------------------------------------------+
//	|                    Lane state (u32, atomic)                   |   8
//	+---------------------------------------------------------------+
//	|                            reserved                           |  12
//	+---------------------------------------------------------------+
//	|          Heartbeat (i64, atomic, CLOCK_MONOTONIC ns)          |  16
//	+                                                               +
//	|                                                               |
//	+---------------------------------------------------------------+
//	|               Owner pid namespace (u64, atomic)               |  24
//	+                                                               +
//	|                                                               |
//	+---------------------------------------------------------------+
//	|                 Drain batch seq (u64, atomic)                 |  32
//	+                                                               +
//	|                                                               |
//	+---------------------------------------------------------------+
//	|   Lane counters: counters record (counters.go), written by    |  40
//	|   the lane's frontend, laneCounterWords counts: served calls, |
//	|   of those the ones over the latency target (u64 each)        |
//	+---------------------------------------------------------------+
//	|                    reserved up to LinePair                    |  56
//	+---------------------------------------------------------------+
const (
	laneOwner     = 0
	laneEpoch     = 4
	laneState     = 8
	laneHeartbeat = 16
	lanePidNS     = 24
	laneDrainSeq  = 32
	laneCounters  = 40 // laneCounterRecord, laneCounterWords words

	laneBell       = LinePair
	laneReqCtl     = 2 * LinePair
	laneComplCtl   = laneReqCtl + ringCtlBytes
	laneReqEntries = laneComplCtl + ringCtlBytes
)

// Lane states (lane word at laneState).
const (
	laneFree      uint32 = 0 // no owner; claimable once the owner word is 0
	laneActive    uint32 = 1 // a frontend owns it and submits
	laneReleasing uint32 = 2 // the frontend gave it back with work in flight
	laneDraining  uint32 = 3 // the embedder is reclaiming it; waits for in-flight batches
)

// noOwner is the owner pid of a free lane.
const noOwner uint32 = 0

// The records one process writes and another reads inside these regions
// (request and completion ring entries, slot headers, batch descriptors,
// staging entry rows) are described in records.go, each beside its encoder
// and its validating decoder; the counters (lane counters, execution
// estimates) in counters.go, as one counters record placed twice.

// Each counters block fits the place kept for it: the lane counters end
// before the lane's doorbell, the execution estimates before hdrUsed. A
// negative array length would not compile.
var (
	_ [laneBell - (laneCounters + laneCounterWords*counterWordBytes)]struct{}
	_ [hdrUsed - (hdrExecTable + ExecTableBuckets*counterWordBytes)]struct{}
)

// Batch ring: a ring control block followed by batchRingCap descriptors
// of batchEntryBytes (embedder → accelerator); the descriptor format is in
// records.go.
const batchEntriesOff = ringCtlBytes

// Staging meta block, metaStride bytes per staging buffer: a state line
// followed by the entries table, MaxBatchEntries rows of stagingEntryBytes
// (the row format is in records.go).
//
//	+---------------------------------------------------------------+
//	|       Staging state (u32, atomic: free/filling/ready)         |  0
//	+---------------------------------------------------------------+
//	|                     entries table                             | LinePair
//	+---------------------------------------------------------------+
const (
	stagingState      = 0
	stagingEntriesOff = LinePair
)

// Staging buffer states (meta word at stagingState).
const (
	stagingFree    uint32 = 0 // the embedder may claim it
	stagingFilling uint32 = 1 // claimed by the embedder, being written
	stagingReady   uint32 = 2 // published on the batch ring; the accelerator owns it
)

// Geometry limits. They keep every computed offset far below 2^63 and let
// arena offsets fit the u32 fields of the slot header.
const (
	maxLanes           = 1024
	maxRingCapacity    = 1 << 20
	maxSlotsPerLane    = 1 << 16
	maxArenaBytes      = 1 << 31
	maxStagingCount    = 64
	maxStagingBytes    = 1 << 36
	maxBatchEntries    = 1 << 20
	maxExamplesLimit   = 1 << 20
	maxExampleBytesLim = 1 << 20
)

// Geometry is the shape of a segment. The owner chooses it (see Options);
// attachers read it from the header and check it against layout rules and
// the file size before touching anything else.
type Geometry struct {
	Lanes           int // lane count
	RingCapacity    int // entries per request and completion ring; power of two, ≥ SlotsPerLane
	SlotsPerLane    int // slot headers per lane
	ArenaBytes      int // payload + scores arena per lane; multiple of PageSize
	StagingCount    int // staging buffers (2 = double buffering)
	StagingBytes    int // bytes per staging buffer; multiple of PageSize
	MaxBatchEntries int // requests one batch may carry
	MaxExamples     int // examples one request may carry
	ExampleBytes    int // payload bytes per example
}

// MinArenaBytes is the smallest arena that holds one request of MaxExamples
// examples and its float32 scores, each rounded up to whole pages as the
// frontend's PageAllocator hands them out.
func (g Geometry) MinArenaBytes() int {
	return roundUp(g.MaxExamples*g.ExampleBytes, PageSize) + roundUp(g.MaxExamples*4, PageSize)
}

// validate checks ranges before any arithmetic that could overflow.
func (g Geometry) validate() error {
	check := func(name string, v, lo, hi int) error {
		if v < lo || v > hi {
			return fmt.Errorf("%w: %s=%d outside [%d, %d]", ErrGeometry, name, v, lo, hi)
		}
		return nil
	}
	for _, c := range []struct {
		name      string
		v, lo, hi int
	}{
		{"lanes", g.Lanes, 1, maxLanes},
		{"ring capacity", g.RingCapacity, 2, maxRingCapacity},
		{"slots per lane", g.SlotsPerLane, 1, maxSlotsPerLane},
		{"arena bytes", g.ArenaBytes, PageSize, maxArenaBytes},
		{"staging count", g.StagingCount, 1, maxStagingCount},
		{"staging bytes", g.StagingBytes, PageSize, maxStagingBytes},
		{"max batch entries", g.MaxBatchEntries, 1, maxBatchEntries},
		{"max examples", g.MaxExamples, 1, maxExamplesLimit},
		{"example bytes", g.ExampleBytes, 1, maxExampleBytesLim},
	} {
		if err := check(c.name, c.v, c.lo, c.hi); err != nil {
			return err
		}
	}
	if !isPow2(g.RingCapacity) {
		return fmt.Errorf("%w: ring capacity %d is not a power of two", ErrGeometry, g.RingCapacity)
	}
	// A frontend has at most SlotsPerLane requests in flight, so rings of at
	// least that capacity can never be full for a well-behaved lane: the
	// accelerator never has to wait for room in a completion ring.
	if g.RingCapacity < g.SlotsPerLane {
		return fmt.Errorf("%w: ring capacity %d < slots per lane %d", ErrGeometry, g.RingCapacity, g.SlotsPerLane)
	}
	if g.ArenaBytes%PageSize != 0 || g.StagingBytes%PageSize != 0 {
		return fmt.Errorf("%w: arena bytes %d and staging bytes %d must be multiples of %d",
			ErrGeometry, g.ArenaBytes, g.StagingBytes, PageSize)
	}
	if min := g.MinArenaBytes(); g.ArenaBytes < min {
		return fmt.Errorf("%w: arena bytes %d < %d needed for %d examples of %d bytes plus scores",
			ErrGeometry, g.ArenaBytes, min, g.MaxExamples, g.ExampleBytes)
	}
	return nil
}

// layout holds the byte offsets computeLayout derives from a Geometry. The
// owner writes them into the header; an attacher recomputes them and requires
// an exact match, so a header can only describe the layout this code would
// have built itself.
type layout struct {
	bell           int // bell page: the embedder doorbell's futex word
	accel          int // accelerator page: header-shaped, accelerator words only
	lanes          int // first lane control block
	laneStride     int
	complEntries   int // within a lane block
	slots          int // within a lane block
	arenas         int // first lane arena
	batchRing      int // batch ring control block
	batchRingCap   int
	stagingMeta    int
	metaStride     int
	stagingData    int
	total          int // bytes the layout needs; the file may be larger
	batchRingBytes int // batch ring control block and entries, page-rounded
}

func computeLayout(g Geometry) (layout, error) {
	if err := g.validate(); err != nil {
		return layout{}, err
	}
	var l layout
	l.bell = HeaderBytes
	l.accel = l.bell + PageSize
	l.lanes = l.accel + PageSize
	l.complEntries = laneReqEntries + g.RingCapacity*reqEntryBytes
	l.slots = roundUp(l.complEntries+g.RingCapacity*complEntryBytes, LinePair)
	l.laneStride = roundUp(l.slots+g.SlotsPerLane*SlotBytes, PageSize)
	l.arenas = l.lanes + g.Lanes*l.laneStride
	l.batchRing = l.arenas + g.Lanes*g.ArenaBytes
	l.batchRingCap = nextPow2(max(g.StagingCount, 2))
	l.batchRingBytes = roundUp(batchEntriesOff+l.batchRingCap*batchEntryBytes, PageSize)
	l.stagingMeta = l.batchRing + l.batchRingBytes
	l.metaStride = roundUp(stagingEntriesOff+g.MaxBatchEntries*stagingEntryBytes, LinePair)
	l.stagingData = roundUp(l.stagingMeta+g.StagingCount*l.metaStride, PageSize)
	l.total = l.stagingData + g.StagingCount*g.StagingBytes
	return l, nil
}

// laneBase is the offset of lane i's control block.
func (l layout) laneBase(i int) int { return l.lanes + i*l.laneStride }

// arenaBase is the offset of lane i's arena.
func (l layout) arenaBase(i int, g Geometry) int { return l.arenas + i*g.ArenaBytes }

func roundUp(v, to int) int { return (v + to - 1) / to * to }

func isPow2(v int) bool { return v > 0 && v&(v-1) == 0 }

func nextPow2(v int) int {
	if v <= 1 {
		return 1
	}
	return 1 << bits.Len(uint(v-1))
}
