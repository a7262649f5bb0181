package frontend

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/recmesh/recmesh/frontend/h2unary"
	"github.com/recmesh/recmesh/frontend/steering"
	"github.com/recmesh/recmesh/model"
	"github.com/recmesh/recmesh/telemetry"
)

// Defaults for the zero values of Options.
const (
	// DefaultPort is the gRPC port of the Open Inference Protocol (Triton's
	// and KServe's gRPC default).
	DefaultPort = 8001
	// DefaultListen is DefaultPort on every interface.
	DefaultListen = ":8001"
	// DefaultMetricsAddr serves /metrics, /healthz and /readyz, on loopback
	// only: a deployment that is scraped from elsewhere sets ":9110-9125".
	DefaultMetricsAddr = "127.0.0.1:9110-9125"
	// MetricsOff as Options.MetricsAddr serves no metrics endpoint (the
	// metrics are still registered with Options.Registerer).
	MetricsOff = "off"
	// DefaultModelName is the name clients address the model by.
	DefaultModelName = "dlrm"
	// DefaultModelVersion is the one version served; a request naming no
	// version gets it.
	DefaultModelVersion = "1"
	// DefaultMaxBatch is the most examples one request may carry, the
	// largest batch bucket of the accelerator.
	DefaultMaxBatch = model.DefaultMaxBatch
	// MaxMaxBatch bounds Options.MaxBatch so that the largest request stays
	// far below gRPC's 2 GiB message limit.
	MaxMaxBatch = model.MaxBatchLimit
	// DefaultDrainDelay is how long the server keeps serving, unready, after
	// shutdown begins and before it stops accepting. 0 suits a process that
	// shares its port through SO_REUSEPORT (the kernel stops routing to it
	// the moment its listener closes); behind a load balancer that polls
	// readiness, set it to a little more than the polling period.
	DefaultDrainDelay = 0
	// DefaultDrainTimeout bounds how long calls in flight may take to finish
	// once the server stops accepting; the rest are cancelled.
	DefaultDrainTimeout = 30 * time.Second
	// DefaultLatencyTarget is the end-to-end budget a ModelInfer call is
	// counted against (recmesh_frontend_budget_misses_total); the mesh's
	// SLO batching keeps the same default.
	DefaultLatencyTarget = model.DefaultLatencyTarget
	// DefaultReadyPollInterval is how often Backend.Ready is polled to update
	// the health service.
	DefaultReadyPollInterval = 100 * time.Millisecond
	// DefaultMaxRequestTime bounds every ModelInfer call, whatever deadline
	// the client gave (or none): a hung peer costs a call this long at
	// most, never forever.
	DefaultMaxRequestTime = 5 * time.Second
	// DefaultMaxInflight caps the ModelInfer calls one frontend holds at
	// once; beyond it a call is refused with RESOURCE_EXHAUSTED before it
	// is decoded into a slot.
	DefaultMaxInflight = 4096
	// DefaultMaxStreams caps the concurrent streams (calls) of one
	// connection, so one client cannot take the whole in-flight budget.
	DefaultMaxStreams = 1024
	// TransportGRPC serves the port with grpc-go.
	TransportGRPC = "grpc"
	// TransportLean serves it with package h2unary, recmesh's own HTTP/2
	// transport for unary calls: about a quarter less CPU per small call.
	TransportLean = "lean"
	// DefaultStreamWorkers is how many goroutines are kept to run calls.
	// grpc-go otherwise starts a goroutine per call, whose stack then grows
	// through the handler and the protobuf decoder on every call:
	// runtime.morestack was 6 % of the server core at B_req 1 in perf
	// (make bench's hostbound workload), 0.2 % with them. A call
	// arriving while every worker is busy gets its own goroutine as before,
	// so the count bounds idle memory (a grown stack each), not concurrency.
	DefaultStreamWorkers = 64
	// maxStreamWorkers bounds StreamWorkers: each idle one holds a stack.
	maxStreamWorkers = 1 << 16
	// DefaultMaxConnections caps the connections one frontend holds open.
	// An idle connection costs about 20 KB on the grpc transport and
	// 75 KB on lean (its read and write buffers), so 2,048 of them cost
	// at most 150 MB, and 1,000 clients that connect and never call
	// leave room for a thousand more.
	DefaultMaxConnections = 2048
	// DefaultHandshakeTimeout bounds a connection's TLS handshake, client
	// preface and first SETTINGS.
	DefaultHandshakeTimeout = 10 * time.Second
	// DefaultIdleTimeout closes a connection that has had no call for a
	// minute (GOAWAY, which gRPC clients answer by reconnecting at their
	// next call, a TCP and TLS handshake). A connection that never
	// completes a request, one byte at a time, holds its slot no longer.
	DefaultIdleTimeout = time.Minute
	// DefaultHeaderTimeout bounds how long a request's header block may
	// stay unfinished (lean; grpc-go has no such timer).
	DefaultHeaderTimeout = 10 * time.Second
	// DefaultBodyTimeout bounds how long a request's body may take to
	// arrive once its headers have. A call's own deadline ends it sooner
	// (and on lean MaxRequestTime, which runs from the headers). Ten
	// seconds is the largest request (4,096 examples, about 8 MB) at
	// 6.6 Mbit/s: twice what a client needs whose whole call must fit in
	// the default MaxRequestTime, and a stalled body holds its bytes no
	// longer than that.
	DefaultBodyTimeout = 10 * time.Second
	// DefaultMaxConnBufferedBytes bounds the request bytes one connection
	// holds at once (in bodies still arriving, or in calls running):
	// three of the largest requests at the default MaxBatch.
	DefaultMaxConnBufferedBytes = 32 << 20
	// DefaultMaxBufferedBytes bounds them for the whole frontend: eight
	// of the largest requests, which keeps a frontend under attack well
	// within 256 MiB.
	DefaultMaxBufferedBytes = 64 << 20
	// maxHeaderListSize is the largest request header list served, on
	// both transports (SETTINGS_MAX_HEADER_LIST_SIZE); a gRPC call's
	// headers take a few hundred bytes.
	maxHeaderListSize = h2unary.DefaultMaxHeaderListSize
	// Steering modes (Options.Steering).
	SteeringOff        = ""
	SteeringAuto       = "auto"
	SteeringEBPF       = string(steering.ModeEBPF)
	SteeringKernelHash = string(steering.ModeKernelHash)
	// ServerName is what ServerMetadata reports.
	ServerName = "recmesh"
	// Platform is what ModelMetadata reports as the model's platform.
	Platform = "recmesh_dlrm"
)

// Options configure a Server. The zero value of each field means its
// default; Model and Backend are required.
type Options struct {
	// Listen is the gRPC listen address, host:port. Default DefaultListen.
	// The socket has SO_REUSEPORT, so several processes may listen on the
	// same address and the kernel spreads new connections among them.
	Listen string

	// MetricsAddr is the HTTP address of /metrics (Prometheus), /healthz
	// (liveness) and /readyz (readiness). Default DefaultMetricsAddr;
	// MetricsOff disables it. Each process needs its own address: use
	// "host:0" for any free port (Server.MetricsAddr tells which).
	MetricsAddr string

	// ModelName is the model name requests must use. Default
	// DefaultModelName.
	ModelName string

	// ModelVersion is the version served; requests may name it or leave the
	// version empty. Default DefaultModelVersion.
	ModelVersion string

	// MaxBatch is the most examples one request may carry, 1..MaxMaxBatch;
	// larger requests fail with INVALID_ARGUMENT. Default DefaultMaxBatch.
	MaxBatch int

	// Model describes the served model; the frontend needs its vocabulary
	// sizes to check every id before a request reaches the backend. It must
	// pass model.Config.Validate. Required.
	Model model.Config

	// Backend scores the requests; the Server closes it after draining.
	// Required.
	Backend Backend

	// DrainDelay is how long the server keeps serving after shutdown begins
	// and readiness turns false, so that load balancers stop sending first.
	// Default DefaultDrainDelay (0).
	DrainDelay time.Duration

	// DrainTimeout bounds how long calls in flight may take to finish after
	// the server stops accepting; calls still running then are cancelled.
	// Default DefaultDrainTimeout.
	DrainTimeout time.Duration

	// Steering is how the port's frontends share new connections:
	// SteeringOff (the default) listens at once and leaves placement to
	// the kernel's hash; SteeringKernelHash joins the reuseport group only
	// once the backend is first ready; SteeringEBPF also attaches the
	// steering program (package steering) so connections go to the least
	// loaded ready frontend and migrate off a closing listener;
	// SteeringAuto is SteeringEBPF where this process may load it, else
	// SteeringKernelHash. The frontend command defaults to SteeringAuto.
	Steering string

	// TLSCert and TLSKey, PEM files, turn on TLS for the gRPC port;
	// TLSClientCA, a PEM bundle, also requires every client to present a
	// certificate it signed (mutual TLS). The files are re-read when they
	// change, so certificates rotate without a restart. Default: plaintext.
	TLSCert, TLSKey, TLSClientCA string

	// SteeringDir is the bpffs directory under which eBPF steering pins
	// its maps, one subdirectory per port. Default steering.DefaultPinRoot.
	SteeringDir string

	// LatencyTarget is the latency budget of one call: answers slower than
	// it are counted as budget misses. Default DefaultLatencyTarget.
	LatencyTarget time.Duration

	// ReadyPollInterval is how often Backend.Ready is polled for the health
	// service. Default DefaultReadyPollInterval.
	ReadyPollInterval time.Duration

	// MaxRequestTime bounds each ModelInfer call from its arrival: a call
	// still waiting then ends with DEADLINE_EXCEEDED. A client deadline
	// that is sooner wins. Default DefaultMaxRequestTime.
	MaxRequestTime time.Duration

	// MaxInflight is the most ModelInfer calls served at once; more are
	// refused with RESOURCE_EXHAUSTED. Default DefaultMaxInflight.
	MaxInflight int

	// MaxStreams is gRPC's MaxConcurrentStreams: the most calls one
	// connection may have open. Default DefaultMaxStreams.
	MaxStreams int

	// StreamWorkers is how many long-lived goroutines run calls (gRPC's
	// NumStreamWorkers). Default DefaultStreamWorkers.
	StreamWorkers int

	// Transport is what serves the gRPC port: TransportGRPC (grpc-go,
	// every feature, the default) or TransportLean (package h2unary:
	// unary calls only, less CPU per call; no server reflection, no health
	// Watch).
	Transport string

	// MaxConnections is the most connections the gRPC port holds open;
	// one more is closed as it is accepted (counted in
	// recmesh_frontend_refused_total{reason="connections"}). Default
	// DefaultMaxConnections.
	MaxConnections int

	// HandshakeTimeout bounds a new connection's TLS handshake, HTTP/2
	// preface and first SETTINGS. Default DefaultHandshakeTimeout.
	HandshakeTimeout time.Duration

	// IdleTimeout closes a connection that has had no call open for this
	// long (GOAWAY). Default DefaultIdleTimeout.
	IdleTimeout time.Duration

	// HeaderTimeout bounds how long a header block may stay unfinished
	// (lean only: grpc-go has no such timer; there an unfinished block
	// holds at most the 16 KiB header limit, and its connection, having
	// no call, is closed at IdleTimeout). Default DefaultHeaderTimeout.
	HeaderTimeout time.Duration

	// BodyTimeout bounds how long a request body may take to arrive after
	// its headers; the call is then ended (lean: DEADLINE_EXCEEDED; grpc:
	// CANCELLED) and its bytes freed. Default DefaultBodyTimeout.
	BodyTimeout time.Duration

	// MaxConnBufferedBytes and MaxBufferedBytes bound the request bytes
	// one connection, and the whole frontend, hold in calls whose body is
	// still arriving. Past them a new call is refused RESOURCE_EXHAUSTED,
	// and on grpc calls still arriving are cancelled. Lean counts each
	// request's declared size from its 5-byte prefix until its handler
	// returns, exactly; grpc-go says nothing of a call's bytes, so the
	// grpc transport charges a connection the bytes it read since its
	// oldest unfinished call began (bodyguard.go), an upper bound. Both
	// must admit the largest request (MaxBatch examples), and
	// MaxConnBufferedBytes may not exceed MaxBufferedBytes. Defaults
	// DefaultMaxConnBufferedBytes and DefaultMaxBufferedBytes, or two of
	// the largest requests when MaxBatch makes that more.
	MaxConnBufferedBytes, MaxBufferedBytes int64

	// Registerer receives the recmesh_frontend_* metrics. Default: a new
	// registry of the server's own (never the global default registry).
	Registerer prometheus.Registerer

	// Gatherer is what /metrics serves. Default: Registerer when it is a
	// prometheus.Gatherer (a *prometheus.Registry is), else required when
	// the metrics endpoint is on.
	Gatherer prometheus.Gatherer

	// Profiling serves net/http/pprof under /debug/pprof/ on the metrics
	// address. Default off.
	Profiling bool

	// TracerProvider enables tracing: with it, otelgrpc's stats handler
	// creates a server span per call and the span's context is handed to
	// Slot.Submit. Default nil: no stats handler, no tracing cost, and
	// Submit gets a zero TraceContext.
	TracerProvider trace.TracerProvider

	// Propagator extracts the caller's trace context from gRPC metadata when
	// tracing is on. Default: W3C trace context and baggage.
	Propagator propagation.TextMapPropagator

	// Logger receives start-up, readiness and drain events (nothing per
	// request). Default slog.Default().
	Logger *slog.Logger

	// Version is the server version ServerMetadata reports. Default:
	// telemetry.Version(), from the build info.
	Version string
}

// OptionError is returned by New for an invalid Options field, so that a
// command can name the flag to change.
type OptionError struct {
	// Option is the Options field, e.g. "MaxBatch".
	Option string
	// Err says what is wrong with it.
	Err error
}

func (e *OptionError) Error() string { return "frontend: option " + e.Option + ": " + e.Err.Error() }
func (e *OptionError) Unwrap() error { return e.Err }

func optionErr(option, format string, args ...any) error {
	return &OptionError{Option: option, Err: fmt.Errorf(format, args...)}
}

// withDefaults returns o with every zero field set to its default, or the
// first invalid field.
func (o Options) withDefaults() (Options, error) {
	if o.Listen == "" {
		o.Listen = DefaultListen
	}
	if o.MetricsAddr == "" {
		o.MetricsAddr = DefaultMetricsAddr
	}
	if o.ModelName == "" {
		o.ModelName = DefaultModelName
	}
	if o.ModelVersion == "" {
		o.ModelVersion = DefaultModelVersion
	}
	if o.MaxBatch == 0 {
		o.MaxBatch = DefaultMaxBatch
	}
	if o.MaxBatch < 1 || o.MaxBatch > MaxMaxBatch {
		return o, optionErr("MaxBatch", "%d is not in 1..%d", o.MaxBatch, MaxMaxBatch)
	}
	if err := o.Model.Validate(); err != nil {
		return o, &OptionError{Option: "Model", Err: err}
	}
	if o.Backend == nil {
		return o, &OptionError{Option: "Backend", Err: errors.New("required")}
	}
	if o.DrainDelay < 0 {
		return o, optionErr("DrainDelay", "%v is negative", o.DrainDelay)
	}
	if o.DrainTimeout == 0 {
		o.DrainTimeout = DefaultDrainTimeout
	}
	switch o.Steering {
	case SteeringOff, SteeringAuto, SteeringEBPF, SteeringKernelHash:
	default:
		return o, optionErr("Steering", "%q: want %q, %q, %q or empty (off)", o.Steering, SteeringAuto, SteeringEBPF, SteeringKernelHash)
	}
	if (o.TLSCert == "") != (o.TLSKey == "") {
		return o, optionErr("TLSCert", "a certificate needs its key and a key its certificate (got cert %q, key %q)", o.TLSCert, o.TLSKey)
	}
	if o.TLSClientCA != "" && o.TLSCert == "" {
		return o, optionErr("TLSClientCA", "mutual TLS needs the server's own certificate and key too")
	}
	if o.SteeringDir == "" {
		o.SteeringDir = steering.DefaultPinRoot
	}
	if o.LatencyTarget == 0 {
		o.LatencyTarget = DefaultLatencyTarget
	}
	if o.LatencyTarget < 0 {
		return o, optionErr("LatencyTarget", "%v is negative", o.LatencyTarget)
	}
	if o.DrainTimeout < 0 {
		return o, optionErr("DrainTimeout", "%v is negative", o.DrainTimeout)
	}
	if o.ReadyPollInterval == 0 {
		o.ReadyPollInterval = DefaultReadyPollInterval
	}
	if o.MaxRequestTime == 0 {
		o.MaxRequestTime = DefaultMaxRequestTime
	}
	if o.MaxRequestTime < 0 {
		return o, optionErr("MaxRequestTime", "%v is negative", o.MaxRequestTime)
	}
	if o.MaxInflight == 0 {
		o.MaxInflight = DefaultMaxInflight
	}
	if o.MaxInflight < 0 {
		return o, optionErr("MaxInflight", "%d is negative", o.MaxInflight)
	}
	if o.MaxStreams == 0 {
		o.MaxStreams = DefaultMaxStreams
	}
	if o.MaxStreams < 0 || o.MaxStreams > 1<<20 {
		return o, optionErr("MaxStreams", "%d is not in 1..%d", o.MaxStreams, 1<<20)
	}
	if o.StreamWorkers == 0 {
		o.StreamWorkers = DefaultStreamWorkers
	}
	if o.StreamWorkers < 0 || o.StreamWorkers > maxStreamWorkers {
		return o, optionErr("StreamWorkers", "%d is not in 1..%d", o.StreamWorkers, maxStreamWorkers)
	}
	switch o.Transport {
	case "":
		o.Transport = TransportGRPC
	case TransportGRPC, TransportLean:
	default:
		return o, optionErr("Transport", "%q: want %q or %q", o.Transport, TransportGRPC, TransportLean)
	}
	if o.ReadyPollInterval < 0 {
		return o, optionErr("ReadyPollInterval", "%v is negative", o.ReadyPollInterval)
	}
	if err := o.limitDefaults(); err != nil {
		return o, err
	}
	if o.Registerer == nil {
		reg := prometheus.NewRegistry()
		o.Registerer = reg
		if o.Gatherer == nil {
			o.Gatherer = reg
		}
	}
	if o.Gatherer == nil {
		if g, ok := o.Registerer.(prometheus.Gatherer); ok {
			o.Gatherer = g
		} else if o.MetricsAddr != MetricsOff {
			return o, optionErr("Gatherer", "required when Registerer is not a prometheus.Gatherer and the metrics endpoint is on")
		}
	}
	if o.Propagator == nil {
		o.Propagator = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Version == "" {
		o.Version = telemetry.Version()
	}
	return o, nil
}

// limitDefaults sets and checks the limits on what clients hold; MaxBatch
// and Model are valid already.
func (o *Options) limitDefaults() error {
	if o.MaxConnections == 0 {
		o.MaxConnections = DefaultMaxConnections
	}
	if o.MaxConnections < 0 {
		return optionErr("MaxConnections", "%d is negative", o.MaxConnections)
	}
	for _, d := range []struct {
		name string
		v    *time.Duration
		def  time.Duration
	}{
		{"HandshakeTimeout", &o.HandshakeTimeout, DefaultHandshakeTimeout},
		{"IdleTimeout", &o.IdleTimeout, DefaultIdleTimeout},
		{"HeaderTimeout", &o.HeaderTimeout, DefaultHeaderTimeout},
		{"BodyTimeout", &o.BodyTimeout, DefaultBodyTimeout},
	} {
		if *d.v == 0 {
			*d.v = d.def
		}
		if *d.v < 0 {
			return optionErr(d.name, "%v is negative", *d.v)
		}
	}
	largest := int64(maxRecvMsgSize(o.MaxBatch, o.Model.SparseWidth())) + 5
	if o.MaxConnBufferedBytes == 0 {
		o.MaxConnBufferedBytes = max(DefaultMaxConnBufferedBytes, 2*largest)
	}
	if o.MaxBufferedBytes == 0 {
		o.MaxBufferedBytes = max(DefaultMaxBufferedBytes, o.MaxConnBufferedBytes)
	}
	if o.MaxConnBufferedBytes < largest {
		return optionErr("MaxConnBufferedBytes", "%d bytes would refuse the largest request (%d examples: %d bytes)", o.MaxConnBufferedBytes, o.MaxBatch, largest)
	}
	if o.MaxBufferedBytes < o.MaxConnBufferedBytes {
		return optionErr("MaxBufferedBytes", "%d bytes is less than MaxConnBufferedBytes (%d)", o.MaxBufferedBytes, o.MaxConnBufferedBytes)
	}
	return nil
}
