package shm

import (
	"fmt"
	"time"
)

// TraceContext is the binary W3C trace context (traceparent without the
// version byte) carried in slot headers and batch descriptors, so the
// embedder and accelerator can link their spans to each request.
type TraceContext struct {
	TraceID [16]byte
	SpanID  [8]byte
	Flags   byte
}

// SlotHeader is what a frontend writes into a slot before submitting it.
type SlotHeader struct {
	RequestID     uint64
	Deadline      int64 // unix ns; 0 means none
	Examples      int   // 1..MaxExamples
	PayloadOffset int   // bytes into the lane arena
	PayloadLength int
	ScoresOffset  int // bytes into the lane arena, 4-byte aligned; Examples float32 scores
	Trace         TraceContext
	// Arrival is when the frontend received the request, as ArrivalStamp
	// encodes it; 0 means unknown. It lets the embedder count the time a
	// request spent before it was read against the latency target.
	Arrival uint32
}

// maxArrivalAge bounds the age ArrivalTime believes: a stamp older than
// this is a clock step or garbage, not a request that waited that long.
const maxArrivalAge = time.Minute

// ArrivalStamp encodes t for SlotHeader.Arrival: its unix time in
// microseconds modulo 2^32, which fits the header's spare word and wraps
// only every 71 minutes, far beyond any request's life. 0 is reserved for
// unknown, so that instant is stamped 1 µs late.
func ArrivalStamp(t time.Time) uint32 {
	if s := uint32(t.UnixMicro()); s != 0 {
		return s
	}
	return 1
}

// ArrivalTime decodes a stamp read at now: the latest instant not after
// now with that stamp. ok is false for an unknown stamp or one that would
// be older than a minute.
func ArrivalTime(stamp uint32, now time.Time) (t time.Time, ok bool) {
	if stamp == 0 {
		return time.Time{}, false
	}
	age := time.Duration(uint32(now.UnixMicro())-stamp) * time.Microsecond
	if age > maxArrivalAge {
		return time.Time{}, false
	}
	return now.Add(-age), true
}

// Status is a request's outcome as batch entries and completions carry it
// (a u32 in shared memory). 0 is success; a producer may use any other
// code, the constants are the ones the recmesh services agree on.
type Status uint32

// Completion statuses.
const (
	StatusOK          Status = 0
	StatusCanceled    Status = 1 // the frontend set the cancel flag
	StatusExpired     Status = 2 // the deadline passed before lookup or execute
	StatusInvalid     Status = 3 // the request failed validation
	StatusUnavailable Status = 4 // the serving side could not run it
	StatusInternal    Status = 5 // anything else
	StatusOverloaded  Status = 6 // shed before lookup: it could not finish within the latency target
)

var statusNames = [...]string{"ok", "canceled", "expired", "invalid", "unavailable", "internal", "overloaded"}

// String names the agreed statuses and shows any other code as a number.
func (s Status) String() string {
	if int(s) < len(statusNames) {
		return statusNames[s]
	}
	return fmt.Sprintf("status(%d)", uint32(s))
}

// checkSlotHeader validates a header against the geometry: the checks both
// the writer (to catch its own bugs) and every reader (to survive a hostile
// writer) apply.
func checkSlotHeader(h *SlotHeader, g Geometry) error {
	if h.Examples < 1 || h.Examples > g.MaxExamples {
		return errorf(ErrCorrupt, "example count %d outside [1, %d]", h.Examples, g.MaxExamples)
	}
	if !inArena(h.PayloadOffset, h.PayloadLength, g.ArenaBytes) {
		return errorf(ErrCorrupt, "payload [%d, +%d) outside the %d-byte arena", h.PayloadOffset, h.PayloadLength, g.ArenaBytes)
	}
	if h.ScoresOffset%4 != 0 || !inArena(h.ScoresOffset, 4*h.Examples, g.ArenaBytes) {
		return errorf(ErrCorrupt, "scores [%d, +%d) misaligned or outside the %d-byte arena", h.ScoresOffset, 4*h.Examples, g.ArenaBytes)
	}
	return nil
}

// inArena reports whether [off, off+n) lies within an arena of size bytes.
// Both values come from u32 fields, so the sum cannot overflow an int.
func inArena(off, n, size int) bool { return off >= 0 && n >= 0 && off <= size && n <= size-off }
