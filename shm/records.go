package shm

import (
	"bytes"
	"fmt"
	"sync/atomic"
	"time"
)

// The records of the segment: every structure one process writes and
// another reads. Each record's field offsets, its encoder (write…) and its
// validating decoder (read…) sit together here, as Agrona's record
// descriptors do, so a field cannot be written at one offset and read at
// another, and every reader applies the same checks. A decoder trusts
// nothing it reads: it checks what the record alone can tell against the
// geometry and returns an error wrapping ErrCorrupt (or ErrStaleEpoch)
// instead of a value that could index outside the segment; the handle
// that calls it adds what only it knows (ring position, lane, its own
// records) and the context of its error messages.
//
// The counters (a lane's served and missed calls, the accelerator's
// execution estimates) are one more record, the counters record, kept in
// counters.go with its view.
//
// Where the records live is layout.go's business; changing a record here
// changes the layout and means bumping LayoutVersion.

// Segment header record, the start of the header page (owner, once at
// creation; every other process reads it through a read-only mapping).
// The live words that follow it (owner, accelerator, progress, bells,
// execution estimates) are in layout.go's table.
//
//	+---------------------------------------------------------------+
//	|                        Magic (u64)                            |    0
//	|   Layout version (u32)      |   State word (u32, atomic)      |    8
//	|                      Generation (u64)                         |   16
//	|                  Image size in bytes (u64)                    |   24
//	|              Creation time, Unix ns (u64)                     |   32
//	+---------------------------------------------------------------+
//	| Geometry: lanes, ring capacity, slots per lane, staging count |   64
//	| (u32 each), arena bytes, staging bytes (u64 each), max batch  |
//	| entries, batch ring capacity, max examples, example bytes     |
//	| (u32 each)                                                    |
//	+---------------------------------------------------------------+
//	| Layout offsets (u64 each): lanes, lane stride, arenas, batch  |  128
//	| ring, staging meta, staging meta stride, staging data, total  |
//	+---------------------------------------------------------------+
//	|            Model id (ModelIDBytes, NUL-padded)                |  192
//	+---------------------------------------------------------------+
const (
	hdrMagic      = 0
	hdrVersion    = 8
	hdrState      = 12
	hdrGeneration = 16
	hdrFileSize   = 24
	hdrCreated    = 32

	hdrGeometry        = 64
	hdrLanes           = hdrGeometry + 0
	hdrRingCapacity    = hdrGeometry + 4
	hdrSlotsPerLane    = hdrGeometry + 8
	hdrStagingCount    = hdrGeometry + 12
	hdrArenaBytes      = hdrGeometry + 16
	hdrStagingBytes    = hdrGeometry + 24
	hdrMaxBatchEntries = hdrGeometry + 32
	hdrBatchRingCap    = hdrGeometry + 36
	hdrMaxExamples     = hdrGeometry + 40
	hdrExampleBytes    = hdrGeometry + 44

	hdrOffsets           = 128
	hdrLanesOff          = hdrOffsets + 0
	hdrLaneStride        = hdrOffsets + 8
	hdrArenasOff         = hdrOffsets + 16
	hdrBatchRingOff      = hdrOffsets + 24
	hdrStagingMetaOff    = hdrOffsets + 32
	hdrStagingMetaStride = hdrOffsets + 40
	hdrStagingDataOff    = hdrOffsets + 48
	hdrTotal             = hdrOffsets + 56

	hdrModelID = 192
	// ModelIDBytes is the fixed size of the model id field.
	ModelIDBytes = 64
)

// writeSegmentHeader fills the record in a zeroed header page. The state
// word stays StateCreating; the caller publishes StateReady when the owner
// fields are set.
func writeSegmentHeader(mem []byte, o Options, lay layout, gen uint64, size int) {
	g := o.Geometry
	put64(mem, hdrMagic, segmentMagic)
	put32(mem, hdrVersion, LayoutVersion)
	put32(mem, hdrState, uint32(StateCreating))
	put64(mem, hdrGeneration, gen)
	put64(mem, hdrFileSize, uint64(size))
	put64(mem, hdrCreated, uint64(time.Now().UnixNano()))

	put32(mem, hdrLanes, uint32(g.Lanes))
	put32(mem, hdrRingCapacity, uint32(g.RingCapacity))
	put32(mem, hdrSlotsPerLane, uint32(g.SlotsPerLane))
	put32(mem, hdrStagingCount, uint32(g.StagingCount))
	put64(mem, hdrArenaBytes, uint64(g.ArenaBytes))
	put64(mem, hdrStagingBytes, uint64(g.StagingBytes))
	put32(mem, hdrMaxBatchEntries, uint32(g.MaxBatchEntries))
	put32(mem, hdrBatchRingCap, uint32(lay.batchRingCap))
	put32(mem, hdrMaxExamples, uint32(g.MaxExamples))
	put32(mem, hdrExampleBytes, uint32(g.ExampleBytes))

	put64(mem, hdrLanesOff, uint64(lay.lanes))
	put64(mem, hdrLaneStride, uint64(lay.laneStride))
	put64(mem, hdrArenasOff, uint64(lay.arenas))
	put64(mem, hdrBatchRingOff, uint64(lay.batchRing))
	put64(mem, hdrStagingMetaOff, uint64(lay.stagingMeta))
	put64(mem, hdrStagingMetaStride, uint64(lay.metaStride))
	put64(mem, hdrStagingDataOff, uint64(lay.stagingData))
	put64(mem, hdrTotal, uint64(lay.total))

	copy(mem[hdrModelID:hdrModelID+ModelIDBytes], o.ModelID)
}

// readModelID decodes the model id field of a segment header record.
func readModelID(hdr []byte) string {
	id := hdr[hdrModelID : hdrModelID+ModelIDBytes]
	if i := bytes.IndexByte(id, 0); i >= 0 {
		id = id[:i]
	}
	return string(id)
}

// readSegmentHeader checks the record in a header page and returns the
// geometry and layout it describes. The layout is recomputed from the geometry and every stored
// offset must match it, so the header can only describe a layout this code
// would have built.
func readSegmentHeader(hdr []byte) (Geometry, layout, error) {
	if len(hdr) < HeaderBytes {
		return Geometry{}, layout{}, fmt.Errorf("%w: %d bytes, smaller than the header", ErrGeometry, len(hdr))
	}
	if m := get64(hdr, hdrMagic); m != segmentMagic {
		return Geometry{}, layout{}, fmt.Errorf("%w: %#x", ErrBadMagic, m)
	}
	if v := get32(hdr, hdrVersion); v != LayoutVersion {
		return Geometry{}, layout{}, fmt.Errorf("%w: segment has layout version %d, this build reads %d", ErrVersion, v, LayoutVersion)
	}
	// u64 fields go through int: values above MaxInt64 turn negative and
	// fail the range checks like any other out-of-range value.
	g := Geometry{
		Lanes:           int(get32(hdr, hdrLanes)),
		RingCapacity:    int(get32(hdr, hdrRingCapacity)),
		SlotsPerLane:    int(get32(hdr, hdrSlotsPerLane)),
		ArenaBytes:      int(get64(hdr, hdrArenaBytes)),
		StagingCount:    int(get32(hdr, hdrStagingCount)),
		StagingBytes:    int(get64(hdr, hdrStagingBytes)),
		MaxBatchEntries: int(get32(hdr, hdrMaxBatchEntries)),
		MaxExamples:     int(get32(hdr, hdrMaxExamples)),
		ExampleBytes:    int(get32(hdr, hdrExampleBytes)),
	}
	lay, err := computeLayout(g)
	if err != nil {
		return Geometry{}, layout{}, err
	}
	for _, c := range []struct {
		name      string
		got, want uint64
	}{
		{"batch ring capacity", uint64(get32(hdr, hdrBatchRingCap)), uint64(lay.batchRingCap)},
		{"lanes offset", get64(hdr, hdrLanesOff), uint64(lay.lanes)},
		{"lane stride", get64(hdr, hdrLaneStride), uint64(lay.laneStride)},
		{"arenas offset", get64(hdr, hdrArenasOff), uint64(lay.arenas)},
		{"batch ring offset", get64(hdr, hdrBatchRingOff), uint64(lay.batchRing)},
		{"staging meta offset", get64(hdr, hdrStagingMetaOff), uint64(lay.stagingMeta)},
		{"staging meta stride", get64(hdr, hdrStagingMetaStride), uint64(lay.metaStride)},
		{"staging data offset", get64(hdr, hdrStagingDataOff), uint64(lay.stagingData)},
		{"total", get64(hdr, hdrTotal), uint64(lay.total)},
		{"image size", get64(hdr, hdrFileSize), uint64(lay.total)},
	} {
		if c.got != c.want {
			return Geometry{}, layout{}, fmt.Errorf("%w: %s is %d, geometry implies %d", ErrGeometry, c.name, c.got, c.want)
		}
	}
	return g, lay, nil
}

// Request ring entry, reqEntryBytes (frontend → embedder):
//
//	+---------------------------------------------------------------+
//	|                       Slot index (u32)                        |  0
//	|                       Lane epoch (u32)                        |  4
//	+---------------------------------------------------------------+
const (
	reqSlot       = 0
	reqEpoch      = 4
	reqEntryBytes = 8
)

// writeReqEntry stores a request ring entry: the committed slot and the
// lane epoch it was committed under.
func writeReqEntry(e []byte, slot int, epoch uint32) {
	put32(e, reqSlot, uint32(slot))
	put32(e, reqEpoch, epoch)
}

// readReqEntry decodes a request ring entry. The epoch is returned even when
// the slot is outside the slot table (slot is then -1), so the caller can
// report both.
func readReqEntry(e []byte, g Geometry) (slot int, epoch uint32, err error) {
	s, epoch := get32(e, reqSlot), get32(e, reqEpoch)
	if s >= uint32(g.SlotsPerLane) {
		return -1, epoch, errorf(ErrCorrupt, "slot %d outside [0, %d)", s, g.SlotsPerLane)
	}
	return int(s), epoch, nil
}

// Completion ring entry, complEntryBytes (accelerator → frontend):
//
//	+---------------------------------------------------------------+
//	|                       Slot index (u32)                        |  0
//	|                       Lane epoch (u32)                        |  4
//	|            Status (u32; StatusOK or producer's code)          |  8
//	|                     Example count (u32)                       | 12
//	+---------------------------------------------------------------+
const (
	complSlot       = 0
	complEpoch      = 4
	complStatus     = 8
	complExamples   = 12
	complEntryBytes = 16
)

// writeCompletion stores a completion ring entry.
func writeCompletion(e []byte, c Completion) {
	put32(e, complSlot, uint32(c.Slot))
	put32(e, complEpoch, c.Epoch)
	put32(e, complStatus, uint32(c.Status))
	put32(e, complExamples, uint32(c.Examples))
}

// readCompletion decodes a completion ring entry read by the frontend that
// holds its lane under epoch: ErrStaleEpoch when the entry is addressed to
// another epoch (checked first: a previous owner's leftovers are harmless
// whatever they hold), ErrCorrupt when its slot is outside the slot table.
// The completion is returned with either error, for the caller's report; the
// caller still checks the slot against what it committed.
func readCompletion(e []byte, epoch uint32, g Geometry) (Completion, error) {
	c := Completion{
		Slot:     int(get32(e, complSlot)),
		Epoch:    get32(e, complEpoch),
		Status:   Status(get32(e, complStatus)),
		Examples: int(get32(e, complExamples)),
	}
	if c.Epoch != epoch {
		return c, errorf(ErrStaleEpoch, "epoch %d, lane holds %d", c.Epoch, epoch)
	}
	if c.Slot >= g.SlotsPerLane {
		return c, errorf(ErrCorrupt, "slot %d outside [0, %d)", c.Slot, g.SlotsPerLane)
	}
	return c, nil
}

// Slot header, SlotBytes, one per slot in a lane's slot table. The frontend
// writes the first line before publishing the slot index on the request ring;
// everything the embedder needs to start a lookup is on that one line.
//
//	 0                   1                   2                   3
//	 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//	+---------------------------------------------------------------+
//	|                        Request id (u64)                       |   0
//	+                                                               +
//	|                                                               |
//	+---------------------------------------------------------------+
//	|               Deadline (i64, unix ns; 0 = none)               |   8
//	+                                                               +
//	|                                                               |
//	+---------------------------------------------------------------+
//	|                      Example count (u32)                      |  16
//	+---------------------------------------------------------------+
//	|           Payload offset (u32, bytes into the arena)          |  20
//	+---------------------------------------------------------------+
//	|                      Payload length (u32)                     |  24
//	+---------------------------------------------------------------+
//	|        Scores offset (u32, arena bytes, 4-byte aligned)       |  28
//	+---------------------------------------------------------------+
//	|                                                               |  32
//	+                                                               +
//	|                Trace id (16 bytes, W3C binary)                |
//	+                                                               +
//	|                                                               |
//	+                                                               +
//	|                                                               |
//	+---------------------------------------------------------------+
//	|                 Span id (8 bytes, W3C binary)                 |  48
//	+                                                               +
//	|                                                               |
//	+---------------------------------------------------------------+
//	|  Trace flags  |                    reserved                   |  56
//	+---------------+-----------------------------------------------+
//	|       Arrival (u32, unix µs mod 2^32; 0 = unknown)            |  60
//	+===============================================================+  second cache line
//	|         Cancel flag (u32, atomic; set by the frontend)        |  64
//	+---------------------------------------------------------------+
//	|          Status (u32, atomic; mirrors the completion)         |  68
//	+---------------------------------------------------------------+
//	|                    reserved up to SlotBytes                   |  72
//	+---------------------------------------------------------------+
const (
	slotRequestID  = 0
	slotDeadline   = 8
	slotExamples   = 16
	slotPayloadOff = 20
	slotPayloadLen = 24
	slotScoresOff  = 28
	slotTraceID    = 32
	slotSpanID     = 48
	slotTraceFlags = 56
	slotArrival    = 60
	slotCancel     = 64
	slotStatus     = 68

	// SlotBytes is the size of one slot header: two lines, so the frontend's
	// cancel store never invalidates the line the embedder is reading.
	SlotBytes = LinePair
)

// writeSlotHeader stores h into slot (SlotBytes) and clears cancel and status.
func writeSlotHeader(slot []byte, h *SlotHeader) {
	put64(slot, slotRequestID, h.RequestID)
	put64(slot, slotDeadline, uint64(h.Deadline))
	put32(slot, slotExamples, uint32(h.Examples))
	put32(slot, slotPayloadOff, uint32(h.PayloadOffset))
	put32(slot, slotPayloadLen, uint32(h.PayloadLength))
	put32(slot, slotScoresOff, uint32(h.ScoresOffset))
	writeSlotTrace(slot, h.Trace)
	put32(slot, slotArrival, h.Arrival)
	// Cancel and status are adjacent u32s on an 8-byte boundary: one
	// atomic store clears both.
	atomic.StoreUint64(word64(slot, slotCancel), 0)
}

// readSlotHeader decodes slot's header and validates it against the
// geometry (checkSlotHeader), so the payload and scores it locates lie
// inside the lane arena.
func readSlotHeader(slot []byte, g Geometry) (SlotHeader, error) {
	var h SlotHeader
	h.RequestID = get64(slot, slotRequestID)
	h.Deadline = int64(get64(slot, slotDeadline))
	h.Examples = int(get32(slot, slotExamples))
	h.PayloadOffset = int(get32(slot, slotPayloadOff))
	h.PayloadLength = int(get32(slot, slotPayloadLen))
	h.ScoresOffset = int(get32(slot, slotScoresOff))
	h.Trace = readSlotTrace(slot)
	h.Arrival = get32(slot, slotArrival)
	return h, checkSlotHeader(&h, g)
}

// writeSlotTrace and readSlotTrace are the trace context fields alone: the
// accelerator reads them without the rest of the header. Any value is
// valid; a hostile one only makes a useless span link.
func writeSlotTrace(slot []byte, tc TraceContext) {
	copy(slot[slotTraceID:slotTraceID+16], tc.TraceID[:])
	copy(slot[slotSpanID:slotSpanID+8], tc.SpanID[:])
	slot[slotTraceFlags] = tc.Flags
}

func readSlotTrace(slot []byte) TraceContext {
	var tc TraceContext
	copy(tc.TraceID[:], slot[slotTraceID:slotTraceID+16])
	copy(tc.SpanID[:], slot[slotSpanID:slotSpanID+8])
	tc.Flags = slot[slotTraceFlags]
	return tc
}

// slotCancelWord and slotStatusWord are the slot's atomic words: the
// frontend's cancel flag and the status mirrored from the completion.
func slotCancelWord(slot []byte) *uint32 { return word32(slot, slotCancel) }
func slotStatusWord(slot []byte) *uint32 { return word32(slot, slotStatus) }

// Batch descriptor, batchEntryBytes, one per batch ring entry (embedder →
// accelerator):
//
//	 0                   1                   2                   3
//	 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//	+---------------------------------------------------------------+
//	|               Batch seq (u64; ring position + 1)              |   0
//	+                                                               +
//	|                                                               |
//	+---------------------------------------------------------------+
//	|                      Staging index (u32)                      |   8
//	+---------------------------------------------------------------+
//	|                      Example count (u32)                      |  12
//	+---------------------------------------------------------------+
//	|                       Entry count (u32)                       |  16
//	+---------------------------------------------------------------+
//	|                            reserved                           |  20
//	+---------------------------------------------------------------+
//	|                                                               |  24
//	+                                                               +
//	|             Trace id of the batch span (16 bytes)             |
//	+                                                               +
//	|                                                               |
//	+                                                               +
//	|                                                               |
//	+---------------------------------------------------------------+
//	|                       Span id (8 bytes)                       |  40
//	+                                                               +
//	|                                                               |
//	+---------------------------------------------------------------+
//	|  Trace flags  |            reserved up to 64 bytes            |  48
//	+---------------+-----------------------------------------------+
const (
	batchSeq        = 0
	batchStaging    = 8
	batchExamples   = 12
	batchEntries    = 16
	batchTraceID    = 24
	batchSpanID     = 40
	batchTraceFlags = 48
	batchEntryBytes = 64
)

// writeBatchDesc stores batch descriptor d; d.Seq and d.Staging must be
// set (Publish sets them).
func writeBatchDesc(e []byte, d BatchDesc) {
	put64(e, batchSeq, d.Seq)
	put32(e, batchStaging, uint32(d.Staging))
	put32(e, batchExamples, uint32(d.Examples))
	put32(e, batchEntries, uint32(d.Entries))
	copy(e[batchTraceID:batchTraceID+16], d.Trace.TraceID[:])
	copy(e[batchSpanID:batchSpanID+8], d.Trace.SpanID[:])
	e[batchTraceFlags] = d.Trace.Flags
}

// readBatchDesc decodes the descriptor at batch ring position pos and
// checks what the record can tell: its seq is pos+1, its staging index and
// entry count fit the geometry. On an error Staging and Entries are left
// zero, so nothing downstream can index with them; the caller still checks
// the staging buffer's state.
func readBatchDesc(e []byte, pos uint64, g Geometry) (BatchDesc, error) {
	var d BatchDesc
	d.Seq = get64(e, batchSeq)
	st := get32(e, batchStaging)
	d.Examples = int(get32(e, batchExamples))
	entries := get32(e, batchEntries)
	copy(d.Trace.TraceID[:], e[batchTraceID:batchTraceID+16])
	copy(d.Trace.SpanID[:], e[batchSpanID:batchSpanID+8])
	d.Trace.Flags = e[batchTraceFlags]
	if d.Seq != pos+1 {
		return d, fmt.Errorf("shm: batch at position %d: %w: seq %d", pos, ErrCorrupt, d.Seq)
	}
	if st >= uint32(g.StagingCount) {
		return d, fmt.Errorf("shm: batch %d: %w: staging %d outside [0, %d)", d.Seq, ErrCorrupt, st, g.StagingCount)
	}
	if entries > uint32(g.MaxBatchEntries) {
		return d, fmt.Errorf("shm: batch %d: %w: %d entries, max %d", d.Seq, ErrCorrupt, entries, g.MaxBatchEntries)
	}
	d.Staging, d.Entries = int(st), int(entries)
	return d, nil
}

// Staging entry row, stagingEntryBytes (one per request carried by the batch):
//
//	+---------------------------------------------------------------+
//	|                         Lane (u32)                            |  0
//	|                         Slot (u32)                            |  4
//	|                     Lane epoch (u32)                          |  8
//	|          First row (u32, example index in the batch)          | 12
//	|                 Rows (u32, examples of this request)          | 16
//	|    Status (u32; StatusOK, or why the embedder dropped it)     | 20
//	+---------------------------------------------------------------+
const (
	stLane            = 0
	stSlot            = 4
	stEpoch           = 8
	stFirstRow        = 12
	stRows            = 16
	stStatus          = 20
	stagingEntryBytes = 24
)

// writeStagingEntry stores one entries-table row.
func writeStagingEntry(p []byte, e BatchEntry) {
	put32(p, stLane, uint32(e.Lane))
	put32(p, stSlot, uint32(e.Slot))
	put32(p, stEpoch, e.Epoch)
	put32(p, stFirstRow, uint32(e.FirstRow))
	put32(p, stRows, uint32(e.Rows))
	put32(p, stStatus, uint32(e.Status))
}

// readStagingEntry decodes one entries-table row of a batch of examples
// rows: lane and slot inside the geometry, its rows inside the batch. Epoch
// and Status are returned with an error too (any value of them is safe);
// lane, slot and rows only when they passed.
func readStagingEntry(p []byte, g Geometry, examples int) (BatchEntry, error) {
	lane, slot := get32(p, stLane), get32(p, stSlot)
	first, rows := get32(p, stFirstRow), get32(p, stRows)
	e := BatchEntry{Epoch: get32(p, stEpoch), Status: Status(get32(p, stStatus))}
	if lane >= uint32(g.Lanes) || slot >= uint32(g.SlotsPerLane) {
		return e, errorf(ErrCorrupt, "lane %d slot %d out of range", lane, slot)
	}
	if uint64(first)+uint64(rows) > uint64(max(examples, 0)) {
		return e, errorf(ErrCorrupt, "rows [%d, +%d) beyond %d examples", first, rows, examples)
	}
	e.Lane, e.Slot, e.FirstRow, e.Rows = int(lane), int(slot), int(first), int(rows)
	return e, nil
}
