package frontend

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"
	grpcstats "google.golang.org/grpc/stats"

	"github.com/recmesh/recmesh/frontend/h2unary"
	"github.com/recmesh/recmesh/frontend/steering"
	"github.com/recmesh/recmesh/model"
	"github.com/recmesh/recmesh/proto/inference"
	"github.com/recmesh/recmesh/telemetry"
)

// handoffTimeout bounds how long the drain waits for the server to take up
// the connections it accepted before the listener closed: a goroutine
// each, scheduled within milliseconds even on a loaded host.
const handoffTimeout = 5 * time.Second

// settleTimeout bounds how long the drain waits for the handshakes the
// steering program began here before it retired: a round trip each, so
// only a client that never completes its handshake makes it wait that
// long.
const settleTimeout = time.Second

// metricsShutdownTimeout bounds how long the metrics endpoint may take to
// close once the gRPC server has drained; scrapes are short.
const metricsShutdownTimeout = 2 * time.Second

// Server is one frontend process's gRPC server. Build it with New, then
// call Run once; Listen may be called before Run to learn the addresses.
type Server struct {
	opts Options
	log  *slog.Logger
	svc  *service
	// rpc is made by Run: grpc-go from grpcOpts, or h2unary (Options.
	// Transport).
	rpc      rpcServer
	grpcOpts []grpc.ServerOption
	// tls is the port's TLS configuration; nil for plaintext.
	tls     *tls.Config
	health  *health.Server
	metrics *metrics
	http    *http.Server
	// guard bounds grpc-go's unfinished request bodies; nil on lean.
	guard *bodyGuard
	// held is the grpc codec's record of the received messages that calls
	// in progress alias, and grpcService the service description whose
	// ModelInfer hands them back.
	held        *heldMessages
	grpcService *grpc.ServiceDesc
	// tracing is otelgrpc's handler for both transports; nil untraced.
	tracing grpcstats.Handler
	// lean is the port's server on TransportLean, once Run made it.
	lean atomic.Pointer[h2unary.Server]

	// draining turns readiness off for good once shutdown begins.
	draining atomic.Bool
	// accepting is the listener the port's server serves, once it does;
	// the drain stops it accepting before the server stops.
	accepting atomic.Pointer[limitListener]
	// streamsDone is cancelled when the server stops accepting, to end
	// long-lived streams (health Watch, reflection) that would otherwise
	// hold GracefulStop until DrainTimeout.
	streamsDone context.Context
	endStreams  context.CancelFunc

	mu    sync.Mutex
	lis   net.Listener // gRPC, SO_REUSEPORT; nil until listening when steered
	steer *steered     // nil when Options.Steering is off
	mlis  net.Listener // metrics; nil when off
	ran   bool
}

// New builds a Server from opts (see Options for the defaults). It
// registers the metrics but does not listen; an invalid option is an
// *OptionError.
func New(opts Options) (*Server, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	m, err := newMetrics(opts.Registerer, opts.LatencyTarget)
	if err != nil {
		return nil, err
	}
	s := &Server{opts: opts, log: opts.Logger, metrics: m, health: health.NewServer()}
	s.streamsDone, s.endStreams = context.WithCancel(context.Background())
	s.svc = &service{
		schema:   newSchema(opts),
		backend:  opts.Backend,
		metrics:  m,
		version:  opts.Version,
		draining: &s.draining,
		model:    opts.Model,
		maxTime:  opts.MaxRequestTime,
		maxCalls: int64(opts.MaxInflight),
	}
	if err := opts.Registerer.Register(newTritonMetrics(s.svc)); err != nil {
		return nil, fmt.Errorf("frontend: register Triton's metrics: %w", err)
	}

	maxRecv := maxRecvMsgSize(opts.MaxBatch, s.svc.schema.width)
	if opts.Transport == TransportGRPC {
		s.guard = newBodyGuard(opts, maxRecv, m)
	}
	if err := m.registerLimits(opts.Registerer, opts.Transport, s.bufferedBytes); err != nil {
		return nil, err
	}
	streamWindow, connWindow := flowWindows(maxRecv)
	codec := newRequestCodec(s.svc.schema)
	s.held = codec.held
	s.grpcService = codec.inferenceService()
	sopts := []grpc.ServerOption{
		grpc.MaxRecvMsgSize(maxRecv),
		grpc.StaticStreamWindowSize(streamWindow),
		grpc.StaticConnWindowSize(connWindow),
		grpc.MaxConcurrentStreams(uint32(opts.MaxStreams)),
		grpc.NumStreamWorkers(uint32(opts.StreamWorkers)),
		// grpc-go's default is 16 MiB, which a few KB of HPACK (one
		// large entry referenced thousands of times) fill per stream.
		grpc.MaxHeaderListSize(maxHeaderListSize),
		// TLS handshake, preface and first SETTINGS (grpc-go: 120 s).
		grpc.ConnectionTimeout(opts.HandshakeTimeout),
		// A client may ping no more often than every 10 s (more is a
		// GOAWAY), idle connections are pinged after a minute and closed
		// when the ping goes unanswered, so dead peers do not pile up;
		// a connection with no call for IdleTimeout is sent GOAWAY and
		// closed (5 s later, when the client does not answer its ping).
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: keepaliveMinTime, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: time.Minute, Timeout: 20 * time.Second, MaxConnectionIdle: opts.IdleTimeout}),
		grpc.InTapHandle(s.tap),
		grpc.ForceServerCodecV2(codec),
	}
	if s.guard != nil {
		// They tell the guard that a call's body has been read.
		sopts = append(sopts, grpc.ChainUnaryInterceptor(s.guard.unaryDone), grpc.ChainStreamInterceptor(s.guard.streamDone))
	}
	sopts = append(sopts, grpc.ChainStreamInterceptor(s.endStreamsOnDrain))
	if opts.TLSCert != "" {
		files, err := newTLSFiles(opts.TLSCert, opts.TLSKey, opts.TLSClientCA)
		if err != nil {
			return nil, &OptionError{Option: "TLSCert", Err: err}
		}
		s.tls = files.config()
		sopts = append(sopts, grpc.Creds(credentials.NewTLS(s.tls)))
	}
	if opts.TracerProvider != nil {
		s.tracing = newTraceHandler(opts)
		sopts = append(sopts, grpc.StatsHandler(s.tracing))
	}
	s.grpcOpts = sopts
	s.setServing(false)

	if opts.MetricsAddr != MetricsOff {
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", promhttp.HandlerFor(opts.Gatherer, promhttp.HandlerOpts{}))
		mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
			fmt.Fprintln(w, "ok")
		})
		mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
			if !s.svc.ready() {
				http.Error(w, "not ready", http.StatusServiceUnavailable)
				return
			}
			fmt.Fprintln(w, "ready")
		})
		if opts.Profiling {
			telemetry.MountProfiling(mux)
		}
		s.http = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	}
	return s, nil
}

// keepaliveMinTime is the shortest interval between client pings the
// server tolerates; gRPC clients default to none, and 10 s is what grpc-go
// documents as a reasonable floor.
const keepaliveMinTime = 10 * time.Second

// maxRecvMsgSize admits the largest valid request, MaxBatch examples with
// INT64 ids sent raw, plus room for names, parameters and the request id;
// anything bigger is refused by grpc-go before it is read into memory.
func maxRecvMsgSize(maxBatch, width int) int {
	return maxBatch*(model.NumDense*4+width*8) + 1<<20
}

// flowWindows sizes the HTTP/2 flow-control windows from the largest
// request. They are static because grpc-go's dynamic windows estimate the
// bandwidth-delay product with a PING (and a window update) whenever data
// arrives while no estimate is in flight: with one small request per round
// trip that is a PING written and its ack read for almost every call, a
// third of the frontend's read syscalls at B_req 1, for windows that never
// needed to grow. The stream window lets the largest request arrive
// without waiting for a window update (capped at grpc-go's own 16 MiB
// limit for dynamic windows, halved per stream); the connection window
// holds two of them, so one large request does not stall its neighbours.
func flowWindows(maxRecv int) (stream, conn int32) {
	const least, most = 64 << 10, 8 << 20 // grpc-go ignores less than 64 KiB
	w := int32(min(max(maxRecv, least), most))
	return w, 2 * w
}

// Listen binds the gRPC listener (with SO_REUSEPORT) and the metrics
// listener. Run calls it; calling it first lets a caller learn Addr and
// MetricsAddr when the options asked for port 0. It is idempotent. A bind
// failure is an *OptionError naming Listen or MetricsAddr.
func (s *Server) Listen() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lis != nil || s.steer != nil {
		return nil
	}
	var lis net.Listener
	var st *steered
	var err error
	if s.opts.Steering == SteeringOff {
		lis, err = listenReusePort(context.Background(), s.opts.Listen)
	} else {
		st, err = bindSteered(s.opts.Listen, s.opts.Steering, s.opts.SteeringDir)
	}
	if err != nil {
		return &OptionError{Option: "Listen", Err: err}
	}
	if s.http != nil {
		mlis, err := telemetry.ListenRange(s.opts.MetricsAddr)
		if err != nil {
			if lis != nil {
				lis.Close()
			}
			if st != nil {
				st.close()
			}
			return &OptionError{Option: "MetricsAddr", Err: err}
		}
		s.mlis = mlis
	}
	s.lis, s.steer = lis, st
	if st != nil {
		s.svc.load = st
	}
	return nil
}

// limitConns wraps the port's listener for both transports: the
// connection cap, and on grpc the metering of bodyGuard.
func (s *Server) limitConns(lis net.Listener) *limitListener {
	return newLimitListener(lis, s.opts.MaxConnections, s.metrics, s.guard)
}

// bufferedBytes is recmesh_frontend_buffered_request_bytes.
func (s *Server) bufferedBytes() float64 {
	if s.guard != nil {
		return float64(s.guard.total.Load())
	}
	if l := s.lean.Load(); l != nil {
		return float64(l.BufferedBytes())
	}
	return 0
}

// Addr is the gRPC listener's address, nil before Listen.
func (s *Server) Addr() net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.steer != nil {
		return s.steer.addr
	}
	if s.lis == nil {
		return nil
	}
	return s.lis.Addr()
}

// SteeringMode is how new connections reach this frontend ("ebpf" or
// "kernel-hash"), known after Listen; empty when Options.Steering is off.
func (s *Server) SteeringMode() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.steer == nil {
		return ""
	}
	return string(s.steer.mode)
}

// MetricsAddr is the metrics listener's address, nil before Listen or when
// the endpoint is off.
func (s *Server) MetricsAddr() net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mlis == nil {
		return nil
	}
	return s.mlis.Addr()
}

// Run serves until ctx is done, then drains:
//
//  1. readiness turns false for good (ServerReady, ModelReady, /readyz, and
//     the health service answers NOT_SERVING), while calls are still served
//     for Options.DrainDelay;
//  2. the listener closes and new calls are refused, while calls in flight
//     run to completion, for at most Options.DrainTimeout, after which the
//     rest are cancelled;
//  3. the backend is closed, then the metrics endpoint.
//
// Run closes the backend before it returns, whatever happens. It returns
// nil after a drain that ctx started, or the error that stopped serving.
// It may be called once.
func (s *Server) Run(ctx context.Context) (err error) {
	s.mu.Lock()
	ran := s.ran
	s.ran = true
	s.mu.Unlock()
	if ran {
		return errors.New("frontend: Run called twice")
	}
	defer func() {
		if cerr := s.opts.Backend.Close(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("frontend: close backend: %w", cerr))
		}
	}()
	if err := s.Listen(); err != nil {
		return err
	}
	// The gRPC server is made here, not in New: its stream workers run
	// from NewServer until Stop, which only Run's drain calls.
	if s.opts.Transport == TransportLean {
		l := s.newLean()
		s.lean.Store(l)
		s.rpc = l
	} else {
		g := grpc.NewServer(s.grpcOpts...)
		g.RegisterService(s.grpcService, s.svc)
		healthpb.RegisterHealthServer(g, s.health)
		reflection.Register(g)
		s.rpc = g
	}
	attrs := []any{"addr", s.Addr().String(), "model", s.opts.ModelName, "version", s.opts.ModelVersion, "max_batch", s.opts.MaxBatch, "transport", s.opts.Transport}
	if s.mlis != nil {
		attrs = append(attrs, "metrics_addr", s.mlis.Addr().String())
	}
	if st := s.steer; st != nil {
		attrs = append(attrs, "steering", st.mode)
		if st.mode == steering.ModeEBPF {
			attrs = append(attrs, "steering_dir", st.dir, "migrates", st.group.Migrates())
		} else if st.reason != "" {
			attrs = append(attrs, "ebpf_unavailable", st.reason)
		}
		s.metrics.steering.WithLabelValues(string(st.mode)).Set(1)
		defer st.close()
	}
	s.log.Info("frontend serving", attrs...)

	failed := make(chan error, 3)
	var wg sync.WaitGroup
	stopServe := make(chan struct{})
	wg.Go(func() {
		lis, err := s.listener(stopServe)
		if err != nil {
			failed <- fmt.Errorf("frontend: listen: %w", err)
			return
		}
		if lis == nil {
			return // stopped before the backend was ever ready
		}
		ll := s.limitConns(lis)
		s.accepting.Store(ll)
		err = s.rpc.Serve(ll)
		s.accepting.Store(nil) // nothing left for the drain to stop
		if err != nil {
			failed <- fmt.Errorf("frontend: serve gRPC: %w", err)
		}
	})
	if s.steer != nil {
		wg.Go(func() { s.steer.sweep(stopServe) })
	}
	if s.guard != nil {
		wg.Go(func() { s.guard.sweep(stopServe) })
	}
	if s.mlis != nil {
		wg.Go(func() {
			if err := s.http.Serve(s.mlis); !errors.Is(err, http.ErrServerClosed) {
				failed <- fmt.Errorf("frontend: serve metrics: %w", err)
			}
		})
	}
	stopPoll := make(chan struct{})
	wg.Go(func() { s.pollReady(stopPoll) })

	var runErr error
	select {
	case <-ctx.Done():
		s.log.Info("frontend draining", "cause", context.Cause(ctx), "drain_delay", s.opts.DrainDelay, "drain_timeout", s.opts.DrainTimeout)
	case runErr = <-failed:
		s.log.Error("frontend stopping", "err", runErr)
	}
	close(stopPoll)
	close(stopServe)
	s.drain()
	wg.Wait()
	return runErr
}

// listener returns the listener to serve: at once without steering; with
// it, once the backend is first ready, so that no connection reaches a
// frontend that would only answer UNAVAILABLE. nil when stop closes first.
func (s *Server) listener(stop <-chan struct{}) (net.Listener, error) {
	if s.steer == nil {
		return s.lis, nil
	}
	t := time.NewTicker(min(s.opts.ReadyPollInterval, 10*time.Millisecond))
	defer t.Stop()
	for !s.svc.ready() {
		select {
		case <-stop:
			return nil, nil
		case <-t.C:
		}
	}
	lis, err := s.steer.listen()
	if err != nil {
		return nil, err
	}
	s.log.Info("frontend listening", "addr", lis.Addr().String(), "steering", s.steer.mode)
	return lis, nil
}

// drain runs steps 1 and 2 of Run's shutdown and closes the metrics
// endpoint; Run closes the backend.
func (s *Server) drain() {
	s.draining.Store(true)
	if s.steer != nil {
		// New connections go elsewhere now, and those still queued when
		// the listener closes migrate to a ready frontend.
		s.steer.retire()
	}
	s.health.Shutdown()
	if d := s.opts.DrainDelay; d > 0 {
		time.Sleep(d) // serving on, unready, so that balancers move away first
	}
	if s.steer != nil && !s.steer.settle(settleTimeout) {
		s.log.Warn("frontend stops accepting with connections the steering program sent it still in their handshake", "waited", settleTimeout)
	}
	if ll := s.accepting.Load(); ll != nil {
		// Closed here rather than by GracefulStop, which would drop the
		// connections accepted as it begins (limitListener).
		if err := ll.stopAccepting(min(s.opts.DrainTimeout, handoffTimeout)); err != nil {
			s.log.Warn("frontend stopped accepting before every accepted connection was served", "err", err)
		}
	}

	stopped := make(chan struct{})
	go func() {
		s.rpc.GracefulStop()
		close(stopped)
	}()
	s.endStreams()
	timer := time.NewTimer(s.opts.DrainTimeout)
	defer timer.Stop()
	select {
	case <-stopped:
		s.log.Info("frontend drained")
	case <-timer.C:
		s.log.Warn("frontend drain timed out; cancelling the calls still in flight", "drain_timeout", s.opts.DrainTimeout)
		s.rpc.Stop()
		<-stopped
	}

	if s.http != nil {
		ctx, cancel := context.WithTimeout(context.Background(), metricsShutdownTimeout)
		defer cancel()
		if err := s.http.Shutdown(ctx); err != nil {
			s.http.Close()
		}
	}
}

// pollReady keeps the health service in step with readiness until stop is
// closed; Backend.Ready is a poll, so this is the one place that polls it.
func (s *Server) pollReady(stop <-chan struct{}) {
	t := time.NewTicker(s.opts.ReadyPollInterval)
	defer t.Stop()
	serving := false
	for {
		if ready := s.svc.ready(); ready != serving {
			serving = ready
			s.setServing(ready)
			if s.steer != nil {
				s.steer.setReady(ready)
			}
			s.log.Info("frontend readiness changed", "ready", ready)
		}
		select {
		case <-stop:
			return
		case <-t.C:
		}
	}
}

// setServing sets the health status of the server as a whole ("") and of
// the inference service. After health.Shutdown it is a no-op.
func (s *Server) setServing(ok bool) {
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if ok {
		st = healthpb.HealthCheckResponse_SERVING
	}
	s.health.SetServingStatus("", st)
	s.health.SetServingStatus(inference.GRPCInferenceService_ServiceDesc.ServiceName, st)
}

// endStreamsOnDrain ties every streaming call (health Watch, reflection; the
// inference service has none) to the drain, so that GracefulStop does not
// wait for streams that never end on their own.
func (s *Server) endStreamsOnDrain(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	ctx, cancel := context.WithCancel(ss.Context())
	defer cancel()
	stop := context.AfterFunc(s.streamsDone, cancel)
	defer stop()
	return handler(srv, &drainStream{ServerStream: ss, ctx: ctx})
}

type drainStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (d *drainStream) Context() context.Context { return d.ctx }
