package frontend

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Backend is what scores examples for the frontend: in production a lane of
// the shared-memory mesh (embedder + accelerator), in development and tests
// the in-process reference forward pass.
//
// The interface hands out buffers rather than taking them so that the hot
// path copies each request once, from the request's raw bytes straight into
// the memory the backend reads (a shared-memory slot), with no intermediate
// slice. A Backend must be safe for concurrent use by many calls.
type Backend interface {
	// Ready reports whether the backend can score requests now. It is
	// polled (see Options.ReadyPollInterval) to drive ServerReady,
	// ModelReady and the gRPC health service, so it must be cheap and must
	// not block.
	Ready() bool

	// Acquire reserves room for n examples, 1 ≤ n ≤ Options.MaxBatch. It
	// may wait for room only briefly and boundedly (the shared-memory
	// backend waits at most a couple of milliseconds); when there is none it
	// returns an error wrapping ErrFull, which the client sees as
	// RESOURCE_EXHAUSTED and may retry. When the backend cannot serve at all it returns an error
	// wrapping ErrUnavailable. The returned Slot belongs to the caller until
	// it calls Release.
	Acquire(ctx context.Context, n int) (Slot, error)

	// Close releases the backend. The frontend calls it once, after the gRPC
	// server has drained, so no Acquire or Slot call runs concurrently with
	// it or follows it.
	Close() error
}

// Slot is room for one request's examples in the backend. The caller fills
// Dense and Sparse, calls Submit at most once, then Release exactly once,
// whether or not it submitted and whatever Submit returned. A Slot is used
// by one goroutine at a time.
type Slot interface {
	// Dense is the slot's dense input, n×model.NumDense float32 values,
	// row-major. The caller overwrites all of it.
	Dense() []float32

	// Sparse is the slot's sparse input, n×SparseWidth (214) ids, row-major,
	// each example's 26 bags concatenated in table order. The caller
	// overwrites all of it, with ids already checked against their table's
	// vocabulary.
	Sparse() []int32

	// Submit publishes the slot and waits for its n scores, which stay valid
	// until Release. It honours ctx: when ctx ends first it returns ctx's
	// error (or one wrapping it), and the backend, not the caller, deals with
	// the work still in flight (Release must then not free memory the
	// backend may still write). call describes the call: when it arrived
	// and its trace context.
	Submit(ctx context.Context, call Call) (scores []float32, err error)

	// Release returns the slot to the backend. The slot and the scores must
	// not be used afterwards.
	Release()
}

// Call is what a backend learns about a call beside its inputs.
type Call struct {
	// Arrival is when the frontend received the call: the start of its
	// latency budget, which the backend's batching keeps to.
	Arrival time.Time
	// Trace is the caller's trace context, carried to the backend's own
	// spans; it is zero when the call is not traced.
	Trace TraceContext
}

// TraceContext is the W3C trace context of the call a slot belongs to, in
// the binary form the frontend writes into shared memory. The zero value
// means "not traced".
type TraceContext struct {
	TraceID [16]byte
	SpanID  [8]byte
	// Flags are the W3C trace flags (bit 0: sampled).
	Flags byte
}

// IsZero reports whether tc carries no trace.
func (tc TraceContext) IsZero() bool { return tc == TraceContext{} }

// MemoryGuard is implemented by a Backend whose slots are memory another
// process may pull away (the mesh's shared segment, which any process
// with write access could truncate). The frontend runs every call that
// touches a slot, its inputs written and its scores read, under Guard;
// a fault there must come back as an error wrapping ErrMemoryLost, not
// kill the process. Guard covers the calling goroutine only.
type MemoryGuard interface {
	Guard(fn func() error) error
}

// Sentinel errors a Backend wraps (fmt.Errorf("...: %w", ErrFull)) so that the
// frontend can pick the right status code; codes.go has the full table.
var (
	// ErrFull means the backend has no room now (a ring or queue bound was
	// hit). The call fails fast with RESOURCE_EXHAUSTED instead of queueing
	// without limit; the client may retry, ideally on another frontend.
	ErrFull = errors.New("backend full")

	// ErrUnavailable means the backend cannot serve: it is not attached yet,
	// its peer process died, or it is closed. The call fails with
	// UNAVAILABLE, which clients treat as safe to retry.
	ErrUnavailable = errors.New("backend unavailable")

	// ErrMemoryLost means a slot's memory faulted mid-call (MemoryGuard).
	// Scoring is idempotent and the request is still the frontend's, so
	// the call is tried again once the backend serves anew, and fails
	// with UNAVAILABLE if it does not within a couple of seconds.
	ErrMemoryLost = errors.New("backend memory lost")
)

// BadInputError is returned by a Backend that rejects one example's input,
// for example an id the embedder finds outside its table although the
// frontend checked it (a model rollout changed the vocabulary). The call
// fails with INVALID_ARGUMENT naming the example and the table.
type BadInputError struct {
	// Row is the example's index within the request.
	Row int
	// Table is the embedding table, or -1 when the dense input is at fault.
	Table int
	// Reason says what is wrong, for the client.
	Reason string
}

func (e *BadInputError) Error() string {
	if e.Table < 0 {
		return fmt.Sprintf("row %d, dense input: %s", e.Row, e.Reason)
	}
	return fmt.Sprintf("row %d, table %d: %s", e.Row, e.Table, e.Reason)
}
