// Package telemetry is the one place where recmesh binaries set up logging,
// Prometheus metrics and OpenTelemetry tracing, so every process exposes the
// same endpoints and honours the same OTEL_* environment variables.
package telemetry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// Telemetry holds what one process reports through.
type Telemetry struct {
	Service  string
	Log      *slog.Logger
	Registry *prometheus.Registry
	// Tracer is a no-op tracer unless tracing is configured, so that
	// instrumented code costs nothing measurable when tracing is off.
	Tracer trace.TracerProvider
	// TracingOn reports whether Tracer records spans (false: a no-op).
	TracingOn bool
	// Profiling reports whether the metrics address serves /debug/pprof/
	// (Options.Profiling, RECMESH_PPROF).
	Profiling      bool
	shutdownTracer func(context.Context) error
}

// Options configure New. The zero value is valid.
type Options struct {
	// Version is reported as the service.version resource attribute.
	// Default: Version().
	Version string
	// SpanProcessor, if set, replaces the OTLP exporter (tests use an
	// in-memory exporter).
	SpanProcessor sdktrace.SpanProcessor
	// LogLevel, default from RECMESH_LOG_LEVEL (debug|info|warn|error), else info.
	LogLevel slog.Level
	// Profiling mounts net/http/pprof under /debug/pprof/ on the metrics
	// address. Default from RECMESH_PPROF (true|false), else off: a
	// profile costs the serving core CPU and shows the process's insides,
	// so it is something an operator turns on, not something a scraper
	// finds.
	Profiling bool
}

// New sets up logging, a registry with the Go and process collectors, and
// tracing. Tracing is on when OTEL_TRACES_EXPORTER=otlp or an
// OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT is set, off otherwise or when
// OTEL_SDK_DISABLED=true; the sampler follows OTEL_TRACES_SAMPLER(_ARG)
// (default parentbased_always_on), and a span linking a sampled span is
// always sampled (linkedSampler), so batches show in their requests' traces.
func New(ctx context.Context, service string, opts Options) (*Telemetry, error) {
	level := opts.LogLevel
	if v := os.Getenv("RECMESH_LOG_LEVEL"); v != "" {
		if err := level.UnmarshalText([]byte(v)); err != nil {
			return nil, fmt.Errorf("telemetry: RECMESH_LOG_LEVEL=%q: want debug, info, warn or error", v)
		}
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})).With("service", service)
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), buildInfo(service))
	profiling := opts.Profiling
	if v := os.Getenv("RECMESH_PPROF"); v != "" {
		on, err := strconv.ParseBool(v)
		if err != nil {
			return nil, fmt.Errorf("telemetry: RECMESH_PPROF=%q: want true or false", v)
		}
		profiling = profiling || on
	}
	t := &Telemetry{Service: service, Log: log, Registry: reg, Tracer: noop.NewTracerProvider(), Profiling: profiling}

	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	if opts.SpanProcessor == nil && !tracingConfigured() {
		return t, nil
	}
	if opts.Version == "" {
		opts.Version = Version()
	}
	res, err := resource.Merge(resource.Default(), resource.NewWithAttributes(semconv.SchemaURL,
		semconv.ServiceName(service), semconv.ServiceVersion(opts.Version)))
	if err != nil {
		return nil, fmt.Errorf("telemetry: resource: %w", err)
	}
	sampler, err := samplerFromEnv()
	if err != nil {
		return nil, err
	}
	tpOpts := []sdktrace.TracerProviderOption{sdktrace.WithResource(res), sdktrace.WithSampler(sampler)}
	if opts.SpanProcessor != nil {
		tpOpts = append(tpOpts, sdktrace.WithSpanProcessor(opts.SpanProcessor))
	} else {
		exp, err := otlptracegrpc.New(ctx)
		if err != nil {
			return nil, fmt.Errorf("telemetry: OTLP exporter: %w", err)
		}
		tpOpts = append(tpOpts, sdktrace.WithBatcher(exp))
	}
	tp := sdktrace.NewTracerProvider(tpOpts...)
	t.Tracer, t.TracingOn = tp, true
	t.shutdownTracer = tp.Shutdown
	otel.SetTracerProvider(tp)
	log.Info("tracing on", "exporter", exporterName(opts))
	return t, nil
}

func exporterName(opts Options) string {
	if opts.SpanProcessor != nil {
		return "custom"
	}
	return "otlp"
}

func tracingConfigured() bool {
	if strings.EqualFold(os.Getenv("OTEL_SDK_DISABLED"), "true") {
		return false
	}
	switch strings.ToLower(os.Getenv("OTEL_TRACES_EXPORTER")) {
	case "none":
		return false
	case "otlp":
		return true
	}
	return os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
}

// Shutdown flushes pending spans.
func (t *Telemetry) Shutdown(ctx context.Context) error {
	if t.shutdownTracer == nil {
		return nil
	}
	return t.shutdownTracer(ctx)
}

// ServeHTTP serves /metrics, /healthz and /readyz on addr until ctx ends,
// and /debug/pprof/ when profiling is on (Options.Profiling).
// /healthz is liveness, live (nil = always): the process's own loops are
// making progress, whatever its peers do, so an orchestrator restarts it
// only when it is itself stuck. /readyz is ready (nil = always): it can
// serve now. It returns the bound address
// once listening and runs the server in the background; the server stops
// when ctx is done. addr may use port 0, or a port range "host:9110-9125"
// meaning the first free port of the range: frontend replicas share one
// network namespace, and a range lets Prometheus find them all statically.
func (t *Telemetry) ServeHTTP(ctx context.Context, addr string, live, ready func() bool) (net.Addr, error) {
	if addr == "" {
		return nil, nil
	}
	ln, err := ListenRange(addr)
	if err != nil {
		return nil, fmt.Errorf("telemetry: listen on metrics address %s (change --metrics-addr): %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(t.Registry, promhttp.HandlerOpts{Registry: t.Registry}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		if live != nil && !live() {
			http.Error(w, "stuck: a work loop has made no progress", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		if ready != nil && !ready() {
			http.Error(w, "not ready", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	if t.Profiling {
		MountProfiling(mux)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			t.Log.Error("metrics server stopped", "err", err)
		}
	}()
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	return ln.Addr(), nil
}

// MountProfiling serves net/http/pprof's handlers under /debug/pprof/ on
// mux, for a process that serves its metrics address itself.
func MountProfiling(mux *http.ServeMux) {
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
}

// ListenRange listens on addr, where the port may be a range "lo-hi": the
// first port of the range that is free is used.
func ListenRange(addr string) (net.Listener, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	lo, hi, isRange := strings.Cut(port, "-")
	if !isRange {
		return net.Listen("tcp", addr)
	}
	first, err1 := strconv.Atoi(lo)
	last, err2 := strconv.Atoi(hi)
	if err1 != nil || err2 != nil || first <= 0 || last < first || last > 65535 {
		return nil, fmt.Errorf("port range %q: want lo-hi with 0 < lo <= hi <= 65535", port)
	}
	var lastErr error
	for p := first; p <= last; p++ {
		ln, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(p)))
		if err == nil {
			return ln, nil
		}
		lastErr = err
	}
	return nil, fmt.Errorf("no free port in %d-%d: %w", first, last, lastErr)
}
