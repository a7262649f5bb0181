package shm

import (
	"fmt"
	"sync/atomic"
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
// Where the records live is layout.go's business; changing a record here
// changes the layout and means bumping LayoutVersion.

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
