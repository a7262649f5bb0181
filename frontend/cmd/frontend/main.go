// Command frontend runs one recmesh frontend process: the Open Inference
// Protocol v2 gRPC server in front of a model backend. Run N of them on one
// port (SO_REUSEPORT) to scale; SIGTERM drains gracefully.
//
// Every flag has an environment twin (shown in -help); a flag given on the
// command line wins over its twin.
//
// The frontend bounds what clients may make it hold: connections
// (--max-connections), handshake, idle, header and body times, and the
// request bytes buffered per connection and in all; each refusal counts
// in recmesh_frontend_refused_total. GOGC defaults to 400 and GOMEMLIMIT
// to 192 MiB (the environment's win), so that garbage does not multiply
// what those limits leave live.
//
// Backends:
//
//	reference  scores in-process with the plain-Go reference forward pass
//	           over --bundle: the development and test backend (real
//	           scores, tens of milliseconds per example), not for production
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/trace"

	"github.com/recmesh/recmesh/frontend"
	"github.com/recmesh/recmesh/frontend/internal/refbackend"
	"github.com/recmesh/recmesh/frontend/shmbackend"
	"github.com/recmesh/recmesh/frontend/steering"
	"github.com/recmesh/recmesh/model"
	"github.com/recmesh/recmesh/proto/control"
	"github.com/recmesh/recmesh/shm"
	"github.com/recmesh/recmesh/shm/sched"
	"github.com/recmesh/recmesh/telemetry"
	"github.com/recmesh/recmesh/telemetry/flagenv"
)

// Defaults that are the command's own; the rest come from package frontend.
const (
	defaultBundle  = model.DefaultDevBundle
	defaultBackend = "shm"
)

// defaultGCPercent is the frontend's GOGC when the environment sets none.
// Nearly all of a frontend's garbage is grpc-go's per-call objects around a
// live heap of a few MiB, so at Go's default of 100 it collects many times a
// second: 5 % of the server core at B_req 1 in perf, 1.4 % at 400, for
// about 13 MiB more RSS. GOGC (and GOMEMLIMIT) in the environment still win.
const defaultGCPercent = 400

// defaultMemoryLimit is the frontend's soft memory limit (GOMEMLIMIT) when
// the environment sets none. GOGC 400 lets the heap grow to five times
// what is live before a collection: with the request bytes an attacker
// may make a frontend hold (64 MiB by default, --max-buffered-bytes) or
// 2,048 idle connections' buffers live, that is past 256 MiB of garbage
// not yet collected. Near the limit the collector runs sooner instead, so
// RSS stays about here; an honest frontend's heap, a few tens of MiB, is
// far below it and collected as before. GOMEMLIMIT in the environment
// still wins (GOMEMLIMIT=off: none).
const defaultMemoryLimit = 192 << 20

func main() {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(defaultGCPercent)
	}
	if os.Getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(defaultMemoryLimit)
	}
	if err := run(context.Background(), os.Args[1:], os.Stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "frontend:", err)
		os.Exit(1)
	}
}

// config is the parsed command line.
type config struct {
	listen         string
	port           int
	metricsAddr    string
	modelName      string
	modelVersion   string
	maxBatch       int
	bundle         string
	backend        string
	shmDir         string
	segment        string
	segmentOwner   int
	natsURL        string
	referenceDelay time.Duration
	drainDelay     time.Duration
	drainTimeout   time.Duration
	latencyTarget  time.Duration
	maxRequestTime time.Duration
	maxInflight    int
	maxStreams     int
	streamWorkers  int
	schedBatch     bool
	transport      string
	steering       string
	steeringDir    string
	tlsCert        string
	tlsKey         string
	tlsClientCA    string
	logLevel       slog.Level

	// The limits on what clients hold (frontend.Options).
	maxConnections       int
	handshakeTimeout     time.Duration
	idleTimeout          time.Duration
	headerTimeout        time.Duration
	bodyTimeout          time.Duration
	maxConnBufferedBytes int64
	maxBufferedBytes     int64
}

func parseFlags(args []string, stderr io.Writer) (config, error) {
	var c config
	fs := newFlagSet(&c)
	fs.SetOutput(stderr)
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	return c, finishFlags(fs, &c)
}

// newFlagSet defines every flag of the frontend into c.
func newFlagSet(c *config) *flag.FlagSet {
	fs := flag.NewFlagSet("frontend", flag.ContinueOnError)
	fs.StringVar(&c.listen, "listen", "", "gRPC listen address host:port (default: every interface, --port)")
	fs.IntVar(&c.port, "port", frontend.DefaultPort, "gRPC port, when --listen is not given")
	fs.StringVar(&c.metricsAddr, "metrics-addr", frontend.DefaultMetricsAddr, "address of /metrics, /healthz and /readyz; \"off\" disables; one per process (host:0 picks a free port)")
	fs.StringVar(&c.modelName, "model-name", frontend.DefaultModelName, "model name clients must use")
	fs.StringVar(&c.modelVersion, "model-version", frontend.DefaultModelVersion, "model version served")
	fs.IntVar(&c.maxBatch, "max-batch", frontend.DefaultMaxBatch, "most examples per request")
	fs.StringVar(&c.bundle, "bundle", defaultBundle, "model bundle directory (its config.json gives the vocabulary sizes)")
	fs.StringVar(&c.backend, "backend", defaultBackend, "model backend: shm (the mesh: a lane of the embedder's shared-memory segment) or reference (development and tests: scores in-process from --bundle)")
	fs.StringVar(&c.shmDir, "shm-dir", shm.DefaultDir, "shm backend: directory of the embedder's segment")
	fs.StringVar(&c.segment, "segment", shmbackend.DefaultSegment, "shm backend: segment file name")
	fs.IntVar(&c.segmentOwner, "segment-owner-uid", 0, "shm backend: the uid the embedder runs as, when this frontend runs as another user (in the group the embedder's --segment-mode 0660 admits), so it cannot signal the embedder, replace its socket or take the accelerator's memory; 0: this process's own uid")
	fs.StringVar(&c.natsURL, "nats-url", "", "NATS server of the control plane (default $NATS_URL; empty: none, new generations are then found by watching the segment file)")
	fs.DurationVar(&c.referenceDelay, "reference-delay", 0, "reference backend only, for tests: extra delay per call")
	fs.DurationVar(&c.drainDelay, "drain-delay", frontend.DefaultDrainDelay, "on SIGTERM, keep serving unready this long before refusing new calls")
	fs.DurationVar(&c.drainTimeout, "drain-timeout", frontend.DefaultDrainTimeout, "on SIGTERM, give calls in flight this long to finish")
	fs.StringVar(&c.steering, "steering", frontend.SteeringAuto, "how the port's frontends share new connections: auto (ebpf where this process may load it, else kernel-hash), ebpf (the least loaded ready frontend; needs CAP_BPF and a bpffs directory this user owns), kernel-hash (the kernel's hash; listen only once ready)")
	fs.StringVar(&c.tlsCert, "tls-cert", "", "PEM certificate of the gRPC port (with --tls-key turns on TLS; re-read when it changes)")
	fs.StringVar(&c.tlsKey, "tls-key", "", "PEM private key of --tls-cert")
	fs.StringVar(&c.tlsClientCA, "tls-client-ca", "", "PEM CA bundle: require clients to present a certificate it signed (mutual TLS)")
	fs.StringVar(&c.steeringDir, "steering-dir", steering.DefaultPinRoot, "ebpf steering: bpffs directory where the port's frontends pin their shared maps")
	fs.DurationVar(&c.latencyTarget, "latency-target", frontend.DefaultLatencyTarget, "latency budget of a call; slower answers count in recmesh_frontend_budget_misses_total and, through the lane, steer the embedder's slo batching")
	fs.DurationVar(&c.maxRequestTime, "max-request-time", frontend.DefaultMaxRequestTime, "the longest any ModelInfer call may take, whatever the client's deadline (DEADLINE_EXCEEDED after it)")
	fs.IntVar(&c.maxInflight, "max-inflight", frontend.DefaultMaxInflight, "most ModelInfer calls in flight at once; more are refused with RESOURCE_EXHAUSTED before their request is decoded")
	fs.IntVar(&c.maxStreams, "max-streams", frontend.DefaultMaxStreams, "most concurrent calls on one client connection (gRPC MaxConcurrentStreams)")
	fs.StringVar(&c.transport, "transport", frontend.TransportGRPC, "what serves the gRPC port: grpc (grpc-go: every feature) or lean (recmesh's own HTTP/2 transport for unary calls, about a quarter less CPU per small call; no server reflection, no health Watch)")
	fs.IntVar(&c.streamWorkers, "stream-workers", frontend.DefaultStreamWorkers, "goroutines kept to run calls, so their stacks are grown once rather than per call; a call beyond them gets its own goroutine")
	fs.IntVar(&c.maxConnections, "max-connections", frontend.DefaultMaxConnections, "most client connections held open; one more is closed as it is accepted")
	fs.DurationVar(&c.handshakeTimeout, "handshake-timeout", frontend.DefaultHandshakeTimeout, "time a new connection has for its TLS handshake, HTTP/2 preface and first SETTINGS")
	fs.DurationVar(&c.idleTimeout, "idle-timeout", frontend.DefaultIdleTimeout, "a connection with no call for this long is closed (GOAWAY; clients reconnect at their next call)")
	fs.DurationVar(&c.headerTimeout, "header-timeout", frontend.DefaultHeaderTimeout, "time a request's header block may stay unfinished before its connection is closed (lean transport)")
	fs.DurationVar(&c.bodyTimeout, "body-timeout", frontend.DefaultBodyTimeout, "time a request's body may take to arrive after its headers; the call is then ended and its bytes freed")
	fs.Int64Var(&c.maxConnBufferedBytes, "max-conn-buffered-bytes", 0, "most request bytes one connection's unfinished or running calls hold; more are refused with RESOURCE_EXHAUSTED (0: 32 MiB, or two of the largest request when --max-batch makes that more)")
	fs.Int64Var(&c.maxBufferedBytes, "max-buffered-bytes", 0, "most request bytes all connections' unfinished or running calls hold (0: 64 MiB, or --max-conn-buffered-bytes when more)")
	fs.BoolVar(&c.schedBatch, "sched-batch", true, sched.BatchUsage)
	fs.TextVar(&c.logLevel, "log-level", slog.LevelInfo, "log level: debug, info, warn, error")
	flagenv.DefinePrintConfig(fs)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: frontend [flags]\n\nEvery flag has an environment twin (RECMESH_<FLAG>); the command line wins.\n\n")
		flagenv.Usage(fs)
	}
	return fs
}

// finishFlags applies the environment twins of the flags not given and
// checks the result.
func finishFlags(fs *flag.FlagSet, c *config) error {
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if err := flagenv.Apply(fs, os.Getenv); err != nil {
		return err
	}
	if c.natsURL == "" {
		c.natsURL = os.Getenv("NATS_URL") // the variable NATS' own tools read
	}
	if c.port < 0 || c.port > 65535 {
		return fmt.Errorf("--port: %d is not a port number (0..65535)", c.port)
	}
	if c.listen == "" {
		c.listen = ":" + strconv.Itoa(c.port)
	}
	if c.referenceDelay < 0 {
		return fmt.Errorf("--reference-delay: %v is negative", c.referenceDelay)
	}
	if c.segmentOwner < 0 {
		return fmt.Errorf("--segment-owner-uid: %d is not a uid (0 for this process's own)", c.segmentOwner)
	}
	return nil
}

// flagOf names the flag that sets each frontend.Options field, so that a
// configuration error says what to change.
var flagOf = map[string]string{
	"Listen":         "--listen (or --port)",
	"MetricsAddr":    "--metrics-addr",
	"ModelName":      "--model-name",
	"ModelVersion":   "--model-version",
	"MaxBatch":       "--max-batch",
	"Model":          "--bundle",
	"DrainDelay":     "--drain-delay",
	"DrainTimeout":   "--drain-timeout",
	"LatencyTarget":  "--latency-target",
	"MaxRequestTime": "--max-request-time",
	"MaxInflight":    "--max-inflight",
	"MaxStreams":     "--max-streams",
	"StreamWorkers":  "--stream-workers",
	"Transport":      "--transport",
	"Steering":       "--steering",
	"SteeringDir":    "--steering-dir",
	"TLSCert":        "--tls-cert / --tls-key",
	"TLSClientCA":    "--tls-client-ca",

	"MaxConnections":       "--max-connections",
	"HandshakeTimeout":     "--handshake-timeout",
	"IdleTimeout":          "--idle-timeout",
	"HeaderTimeout":        "--header-timeout",
	"BodyTimeout":          "--body-timeout",
	"MaxConnBufferedBytes": "--max-conn-buffered-bytes",
	"MaxBufferedBytes":     "--max-buffered-bytes",
}

func run(ctx context.Context, args []string, stderr io.Writer) error {
	c, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: c.logLevel}))
	if c.schedBatch {
		if err := sched.UseBatchScheduling(); err != nil {
			return fmt.Errorf("--sched-batch: %w (--sched-batch=false keeps the default policy)", err)
		}
	}

	cfg, err := readModelConfig(c.bundle)
	if err != nil {
		return fmt.Errorf("--bundle=%s: %w", c.bundle, err)
	}
	tel, err := telemetry.New(ctx, control.ServiceFrontend, telemetry.Options{Version: telemetry.Version()})
	if err != nil {
		return err
	}
	defer tel.Shutdown(context.Background())
	notify := make(chan struct{}, 1)
	var nc *nats.Conn
	if c.natsURL != "" {
		if nc, err = control.Connect(c.natsURL, control.ServiceFrontend, log); err != nil {
			return err
		}
		defer nc.Close()
		// A new generation is announced: look for it now rather than at
		// the next periodic check of the segment file.
		if err := control.WatchAnnounce(ctx, nc, func(control.Announce) {
			select {
			case notify <- struct{}{}:
			default:
			}
		}); err != nil {
			return err
		}
	}
	backend, err := newBackend(c, cfg, log, notify)
	if err != nil {
		return err
	}
	var srv atomic.Pointer[frontend.Server] // set once built, for the status
	if nc != nil {
		svc, err := control.Register(nc, control.ServiceFrontend, telemetry.Version(), func() control.Status {
			st := control.Status{State: "waiting", ModelID: cfg.ID(), Detail: "port " + c.listen}
			if s := srv.Load(); s != nil && s.SteeringMode() != "" {
				st.Detail += ", steering " + s.SteeringMode()
			}
			if g, ok := backend.(interface{ Generation() uint64 }); ok {
				st.Generation = g.Generation()
			}
			if backend.Ready() {
				st.State, st.Ready = "ready", true
			}
			return st
		})
		if err != nil {
			backend.Close()
			return err
		}
		defer svc.Stop()
	}
	var tp trace.TracerProvider
	if tel.TracingOn {
		tp = tel.Tracer
	}

	// telemetry's registry: the Go and process collectors and
	// recmesh_build_info.
	reg := tel.Registry
	server, err := frontend.New(frontend.Options{
		Listen:         c.listen,
		MetricsAddr:    c.metricsAddr,
		ModelName:      c.modelName,
		ModelVersion:   c.modelVersion,
		MaxBatch:       c.maxBatch,
		Model:          cfg,
		Backend:        backend,
		DrainDelay:     c.drainDelay,
		DrainTimeout:   c.drainTimeout,
		LatencyTarget:  c.latencyTarget,
		MaxRequestTime: c.maxRequestTime,
		MaxInflight:    c.maxInflight,
		MaxStreams:     c.maxStreams,
		StreamWorkers:  c.streamWorkers,
		Transport:      c.transport,

		MaxConnections:       c.maxConnections,
		HandshakeTimeout:     c.handshakeTimeout,
		IdleTimeout:          c.idleTimeout,
		HeaderTimeout:        c.headerTimeout,
		BodyTimeout:          c.bodyTimeout,
		MaxConnBufferedBytes: c.maxConnBufferedBytes,
		MaxBufferedBytes:     c.maxBufferedBytes,

		Steering:       c.steering,
		SteeringDir:    c.steeringDir,
		TLSCert:        c.tlsCert,
		TLSKey:         c.tlsKey,
		TLSClientCA:    c.tlsClientCA,
		Registerer:     reg,
		Gatherer:       reg,
		Profiling:      tel.Profiling,
		Logger:         log,
		TracerProvider: tp,
	})
	if err != nil {
		backend.Close()
		return nameFlag(err)
	}
	// Bind now, so a busy port fails before serving and the status can
	// name the steering mode.
	if err := server.Listen(); err != nil {
		backend.Close()
		return nameFlag(err)
	}
	srv.Store(server)

	ctx, stop := signal.NotifyContext(ctx, syscall.SIGTERM, os.Interrupt)
	defer stop()
	go func() {
		<-ctx.Done()
		stop() // a second signal ends the process at once, drain or not
	}()
	return nameFlag(server.Run(ctx))
}

// nameFlag rewrites an *frontend.OptionError to name the flag to change.
func nameFlag(err error) error {
	var oe *frontend.OptionError
	if errors.As(err, &oe) {
		if f, ok := flagOf[oe.Option]; ok {
			return fmt.Errorf("%s: %w", f, oe.Err)
		}
	}
	return err
}

// readModelConfig reads and validates dir/config.json: the frontend needs
// only the vocabulary sizes, not the weights.
func readModelConfig(dir string) (model.Config, error) {
	var cfg model.Config
	raw, err := os.ReadFile(filepath.Join(dir, model.ConfigFile))
	if err != nil {
		return cfg, fmt.Errorf("%w (export a bundle first: `make run` does, or `go run ./cli/cmd/recmesh export --max-vocab 1000 --seed 1 --out %s`)", err, dir)
	}
	if err := json.Unmarshal(raw, &cfg); err != nil {
		return cfg, fmt.Errorf("%s: %w", model.ConfigFile, err)
	}
	if err := cfg.Validate(); err != nil {
		return cfg, fmt.Errorf("%s: %w", model.ConfigFile, err)
	}
	return cfg, nil
}

func newBackend(c config, cfg model.Config, log *slog.Logger, notify <-chan struct{}) (frontend.Backend, error) {
	switch c.backend {
	case "shm":
		return shmbackend.New(shmbackend.Options{ShmDir: c.shmDir, Segment: c.segment, OwnerUID: c.segmentOwner, Model: cfg,
			LatencyTarget: c.latencyTarget, Log: log, Notify: notify})
	case "reference":
		b, err := model.Open(c.bundle)
		if err != nil {
			return nil, fmt.Errorf("--bundle=%s: %w", c.bundle, err)
		}
		ref, err := model.NewReference(b)
		if err != nil {
			b.Close()
			return nil, fmt.Errorf("--bundle=%s: %w", c.bundle, err)
		}
		return refbackend.New(ref, b.Config, refbackend.Options{Delay: c.referenceDelay, OnClose: b.Close}), nil
	default:
		return nil, fmt.Errorf("--backend: unknown backend %q (want shm or reference)", c.backend)
	}
}
