package embedder

import (
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/recmesh/recmesh/embedder/batch"
	"github.com/recmesh/recmesh/model"
	"github.com/recmesh/recmesh/shm"
)

// Options configure an Embedder. Zero fields take the defaults.
type Options struct {
	// Bundle is the model bundle directory.
	Bundle string
	// ShmDir and Segment name the segment file (default /dev/shm/recmesh).
	ShmDir, Segment string
	// SegmentMode is the segment socket's permission: 0600 (default), or
	// 0660 to admit frontends running as other users in this process's
	// group (docs/security.md).
	SegmentMode os.FileMode
	// Lanes is how many frontends can attach at once. Default 16.
	Lanes int
	// LanesPerFrontend is the most lanes one frontend process may hold.
	// Default shm.DefaultMaxLanesPerPeer (1).
	LanesPerFrontend int
	// AcceleratorKey, when set, is the secret the accelerator must present
	// to attach (shm.Options.AcceleratorKey).
	AcceleratorKey []byte
	// Batching: mode, max examples per batch (default 4096), the Full
	// mode window (default 1 ms) and SLO mode's end-to-end latency target
	// (default 20 ms).
	Mode          batch.Mode
	MaxBatch      int
	Window        time.Duration
	LatencyTarget time.Duration
	// SLOBatchBytes bounds what SLO mode merges into one batch: the
	// largest power-of-two batch whose staged rows (pooled embeddings and
	// dense features) fit in it. Default DefaultSLOBatchBytes.
	SLOBatchBytes int64
	// Workers is the number of lookup goroutines. Default GOMAXPROCS.
	Workers int
	// Staging is the number of staging buffers: the batches in flight to
	// the accelerator. Default 2 (one filling while one executes).
	Staging int
	// LazySegment leaves the segment's memory to be allocated on first
	// touch instead of reserving it all when a generation is created; a
	// full shared-memory directory then surfaces as SIGBUS mid-serve.
	LazySegment bool
	// Log and Registry; defaults discard logs and use a private registry.
	Log      *slog.Logger
	Registry prometheus.Registerer
	// Tracer records the lookup span of each batch (linked to every request
	// it carries) and a queue-wait span inside each sampled request's trace.
	// Nil or a no-op provider: no tracing work at all.
	Tracer trace.TracerProvider
	// OnGeneration is called each time a new segment generation is ready
	// (the control plane announces it).
	OnGeneration func(Generation)
}

// Generation describes a segment the embedder serves.
type Generation struct {
	Path       string
	Generation uint64
	ModelID    string
}

func (o Options) withDefaults() Options {
	if o.ShmDir == "" {
		o.ShmDir = shm.DefaultDir
	}
	if o.Segment == "" {
		o.Segment = DefaultSegment
	}
	if o.Lanes <= 0 {
		o.Lanes = DefaultLanes
	}
	if o.MaxBatch <= 0 {
		o.MaxBatch = batch.DefaultMaxBatch
	}
	if o.Window == 0 {
		o.Window = batch.DefaultWindow
	}
	if o.LatencyTarget == 0 {
		o.LatencyTarget = batch.DefaultLatencyTarget
	}
	if o.SLOBatchBytes <= 0 {
		o.SLOBatchBytes = DefaultSLOBatchBytes
	}
	if o.Workers <= 0 {
		o.Workers = runtime.GOMAXPROCS(0)
	}
	if o.Staging <= 0 {
		o.Staging = DefaultStaging
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.Registry == nil {
		o.Registry = prometheus.NewRegistry()
	}
	return o
}

// Limits validate puts on Options.
const (
	MaxLanes         = 1024
	MaxWindow        = time.Second
	MinLatencyTarget = time.Millisecond
	MaxLatencyTarget = time.Minute
	MaxSLOBatchBytes = 64 << 30
)

// OptionError is an invalid Options field.
type OptionError struct {
	// Option is the Options field, e.g. "MaxBatch".
	Option string
	// Err says what is wrong with it.
	Err error
}

func (e *OptionError) Error() string { return "embedder: option " + e.Option + ": " + e.Err.Error() }
func (e *OptionError) Unwrap() error { return e.Err }

// validate checks o once its defaults are set: every range the embedder
// relies on, so a bad configuration fails at start naming the field.
func (o Options) validate() error {
	bad := func(option, format string, args ...any) error {
		return &OptionError{Option: option, Err: fmt.Errorf(format, args...)}
	}
	switch {
	case o.Bundle == "":
		return bad("Bundle", "no bundle directory")
	case o.Lanes > MaxLanes:
		return bad("Lanes", "%d: want 1..%d", o.Lanes, MaxLanes)
	case o.LanesPerFrontend < 0 || o.LanesPerFrontend > o.Lanes:
		return bad("LanesPerFrontend", "%d: want 1..Lanes (%d)", o.LanesPerFrontend, o.Lanes)
	case o.MaxBatch > model.MaxBatchLimit:
		return bad("MaxBatch", "%d: want 1..%d", o.MaxBatch, model.MaxBatchLimit)
	case o.Window < 0 || o.Window > MaxWindow:
		return bad("Window", "%v: want 0..%v", o.Window, MaxWindow)
	case o.LatencyTarget < MinLatencyTarget || o.LatencyTarget > MaxLatencyTarget:
		return bad("LatencyTarget", "%v: want %v..%v", o.LatencyTarget, MinLatencyTarget, MaxLatencyTarget)
	case o.SLOBatchBytes > MaxSLOBatchBytes:
		return bad("SLOBatchBytes", "%d: want 1..%d", o.SLOBatchBytes, int64(MaxSLOBatchBytes))
	}
	return nil
}
