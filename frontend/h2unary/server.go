// Package h2unary serves the unary methods of gRPC services over HTTP/2
// with a transport of its own, for the frontends' hot path.
//
// grpc-go's server spends most of a small call's CPU on its generality: a
// transport stream, a context chain and a goroutine hand-off to its writer
// per call, and the writer's own scheduling. This server keeps only what a
// unary call needs. Each connection has one goroutine that reads frames
// (x/net/http2's Framer and hpack, the same ones grpc-go uses); a call runs
// on a kept worker goroutine, and its response is written by the goroutine
// that produced it, under the connection's write lock. Writers combine: the
// last of them to leave the lock flushes, so calls that finish together
// share one write(2).
//
// What it serves: every unary method registered, with deadlines
// (grpc-timeout), cancellation (RST_STREAM), incoming metadata, flow
// control both ways, size and concurrency limits, ping-flood and
// reset-flood defences, TLS with ALPN h2, and graceful stop (GOAWAY). What
// it does not: streaming methods (answered UNIMPLEMENTED, so server
// reflection and health Watch need grpc-go), compression (UNIMPLEMENTED
// unless identity), and HTTP/1.1.
//
// What bounds a client's hold on the server (limits.go): the header list
// (DefaultMaxHeaderListSize), the request bytes buffered per connection
// and per server, the time a request body may take to arrive, the time a
// header block may stay unfinished, the time a connection may go without
// a call, and the handshake time. Each refusal is reported to
// Options.OnRefuse with one of the Reason* values. The number of
// connections is bounded by whoever owns the listener (package frontend
// wraps it).
package h2unary

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
)

// Defaults of Options.
const (
	DefaultMaxConcurrentStreams = 1024
	DefaultMaxRecvMsgSize       = 4 << 20
	DefaultStreamWindow         = 1 << 20
	DefaultConnWindow           = 2 << 20
	DefaultKeepaliveMinTime     = 10 * time.Second
	DefaultHandshakeTimeout     = 10 * time.Second
	DefaultMaxHeaderListSize    = 16 << 10
	DefaultMaxConnBufferedBytes = 32 << 20
	DefaultMaxBufferedBytes     = 64 << 20
	DefaultBodyTimeout          = 10 * time.Second
	DefaultHeaderTimeout        = 10 * time.Second
	DefaultIdleTimeout          = time.Minute
)

// Options configures a Server; zero fields take the defaults above.
type Options struct {
	// MaxConcurrentStreams caps the calls one connection may have open or
	// running; more are refused (REFUSED_STREAM, which clients retry). A
	// call counts until its handler returns, even when the client reset
	// it, so resets cannot pile up work.
	MaxConcurrentStreams uint32
	// MaxRecvMsgSize is the largest request message; a larger one is
	// refused with RESOURCE_EXHAUSTED before it is read.
	MaxRecvMsgSize int
	// StreamWindow and ConnWindow are the receive flow-control windows
	// (static: no bandwidth probing).
	StreamWindow, ConnWindow int32
	// TLS, when set, is the server's TLS configuration; it must offer ALPN
	// "h2". nil serves plaintext HTTP/2 (prior knowledge, as gRPC clients
	// speak it).
	TLS *tls.Config
	// Admit, when set, is asked before a call's request is read; an error
	// (a status error) refuses the call with it.
	Admit func(method string) error
	// MaxCallTime, when positive, bounds every call from its arrival: the
	// handler's context ends then, whatever (or whether) the client's
	// deadline; a sooner client deadline wins. One timer serves both.
	MaxCallTime time.Duration
	// Interceptor, when set, wraps every handler (as grpc.UnaryInterceptor).
	Interceptor grpc.UnaryServerInterceptor
	// Unmarshal, when set, decodes request messages instead of
	// proto.Unmarshal (as a codec would); an error fails the call with
	// INTERNAL, as grpc-go fails one its codec cannot read. msg is the
	// call's own buffer, never reused, so what is decoded may alias it.
	Unmarshal func(msg []byte, v any) error
	// Workers is how many goroutines are kept to run calls (their stacks
	// grow once); a call beyond them gets its own goroutine. 0: 64.
	Workers int
	// KeepaliveMinTime is the shortest interval between client pings
	// tolerated; three pings sooner than that with no call in between end
	// the connection (GOAWAY ENHANCE_YOUR_CALM).
	KeepaliveMinTime time.Duration
	// HandshakeTimeout bounds the TLS handshake, the client preface and
	// the SETTINGS frame that must follow it.
	HandshakeTimeout time.Duration
	// MaxConnBufferedBytes and MaxBufferedBytes bound the request bytes
	// one connection, and the whole server, hold: a request reserves its
	// declared size (5-byte prefix included) when its prefix arrives, and
	// returns it when its handler returns or the stream ends; its buffer
	// never grows past that size. A request that would take more than is
	// left is refused with RESOURCE_EXHAUSTED before more of it is read.
	// Both must admit a request of MaxRecvMsgSize.
	MaxConnBufferedBytes, MaxBufferedBytes int64
	// BodyTimeout bounds the time from a request's headers to the end of
	// its body; the call's own deadline, when sooner, bounds it too. A
	// request still incomplete then is answered DEADLINE_EXCEEDED and its
	// buffer freed. A connection's watchdog checks every eighth of the
	// smallest of the three timeouts (at most every second), so each may
	// fire up to that much late.
	BodyTimeout time.Duration
	// HeaderTimeout bounds the time a header block may stay unfinished (a
	// HEADERS frame whose CONTINUATIONs do not end it); the connection is
	// then closed (GOAWAY ENHANCE_YOUR_CALM).
	HeaderTimeout time.Duration
	// IdleTimeout closes (GOAWAY NO_ERROR) a connection that has had no
	// call open, and opened none, for this long since its handshake or
	// its last call: what a connection that never completes a request
	// (one that dribbles bytes, or only pings) holds its slot for.
	IdleTimeout time.Duration
	// OnRefuse, when set, is called with a Reason* value for each refusal
	// the limits make, from the goroutine that made it: it must be quick
	// and must not block.
	OnRefuse func(reason string)
	// Logger receives connection errors at debug level.
	Logger *slog.Logger
}

func (o Options) withDefaults() Options {
	if o.MaxConcurrentStreams == 0 {
		o.MaxConcurrentStreams = DefaultMaxConcurrentStreams
	}
	orDefault(&o.MaxRecvMsgSize, DefaultMaxRecvMsgSize)
	orDefault(&o.StreamWindow, DefaultStreamWindow)
	orDefault(&o.ConnWindow, DefaultConnWindow)
	// HTTP/2 windows start at 65,535 and may not exceed 2³¹-1.
	o.StreamWindow = max(o.StreamWindow, initialWindow)
	o.ConnWindow = max(o.ConnWindow, initialWindow)
	orDefault(&o.Workers, 64)
	orDefault(&o.KeepaliveMinTime, DefaultKeepaliveMinTime)
	orDefault(&o.HandshakeTimeout, DefaultHandshakeTimeout)
	orDefault(&o.MaxConnBufferedBytes, DefaultMaxConnBufferedBytes)
	orDefault(&o.MaxBufferedBytes, DefaultMaxBufferedBytes)
	orDefault(&o.BodyTimeout, DefaultBodyTimeout)
	orDefault(&o.HeaderTimeout, DefaultHeaderTimeout)
	orDefault(&o.IdleTimeout, DefaultIdleTimeout)
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return o
}

// orDefault sets *v to d when it is zero or negative: unset, in Options.
func orDefault[T int | int32 | int64 | time.Duration](v *T, d T) {
	if *v <= 0 {
		*v = d
	}
}

// initialWindow is HTTP/2's initial flow-control window (RFC 9113 6.9.2).
const initialWindow = 65535

// method is one registered unary method.
type method struct {
	impl    any
	handler grpc.MethodHandler
}

// ErrServerStopped is returned by Serve after Stop or GracefulStop.
var ErrServerStopped = errors.New("h2unary: server stopped")

// Server serves registered unary methods. Register every service, then
// Serve; Stop and GracefulStop end it. Its methods are safe for concurrent
// use, except that RegisterService must precede Serve.
type Server struct {
	opts  Options
	watch watchTicks // the connections' watchdog period, in ticks
	// buffered is the request bytes reserved by every connection.
	buffered atomic.Int64
	methods  map[string]method // by full path, "/pkg.Service/Method"
	streams  map[string]bool   // streaming methods: UNIMPLEMENTED, with a hint
	work     chan func()

	mu        sync.Mutex
	listeners map[net.Listener]bool
	conns     map[*conn]bool
	stopped   bool
	draining  bool
	connsDone sync.WaitGroup
	quit      chan struct{} // closed by the first Stop/GracefulStop
	quitOnce  sync.Once
}

// NewServer makes a Server; see Options for the defaults.
func NewServer(opts Options) *Server {
	opts = opts.withDefaults()
	s := &Server{
		opts:      opts,
		watch:     newWatchTicks(opts),
		methods:   map[string]method{},
		streams:   map[string]bool{},
		listeners: map[net.Listener]bool{},
		conns:     map[*conn]bool{},
		quit:      make(chan struct{}),
	}
	s.work = make(chan func())
	for range s.opts.Workers {
		go s.worker()
	}
	return s
}

// worker runs calls until the server stops.
func (s *Server) worker() {
	for {
		select {
		case f := <-s.work:
			f()
		case <-s.quit:
			return
		}
	}
}

// run runs f on an idle worker, or on a goroutine of its own when none is.
func (s *Server) run(f func()) {
	select {
	case s.work <- f:
	default:
		go f()
	}
}

// RegisterService registers impl's unary methods under desc's names, as
// grpc.Server.RegisterService does; desc's streaming methods are answered
// UNIMPLEMENTED.
func (s *Server) RegisterService(desc *grpc.ServiceDesc, impl any) {
	for _, m := range desc.Methods {
		s.methods["/"+desc.ServiceName+"/"+m.MethodName] = method{impl: impl, handler: m.Handler}
	}
	for _, st := range desc.Streams {
		s.streams["/"+desc.ServiceName+"/"+st.StreamName] = true
	}
}

// Serve accepts connections on lis until Stop or GracefulStop, or until
// Accept fails; it then closes lis. After a stop it returns nil.
func (s *Server) Serve(lis net.Listener) error {
	s.mu.Lock()
	if s.stopped || s.draining {
		s.mu.Unlock()
		lis.Close()
		return ErrServerStopped
	}
	s.listeners[lis] = true
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		if s.listeners[lis] {
			delete(s.listeners, lis)
			lis.Close()
		}
		s.mu.Unlock()
	}()
	var delay time.Duration
	for {
		nc, err := lis.Accept()
		if err != nil {
			select {
			case <-s.quit:
				return nil
			default:
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				// Out of file descriptors and the like: back off, as
				// net/http does, instead of spinning.
				delay = min(max(2*delay, 5*time.Millisecond), time.Second)
				time.Sleep(delay)
				continue
			}
			return fmt.Errorf("h2unary: accept: %w", err)
		}
		delay = 0
		c := newConn(s, nc)
		s.mu.Lock()
		if s.stopped || s.draining {
			s.mu.Unlock()
			nc.Close()
			continue
		}
		s.conns[c] = true
		s.connsDone.Add(1)
		s.mu.Unlock()
		go func() {
			defer s.connsDone.Done()
			c.serve()
			s.mu.Lock()
			delete(s.conns, c)
			s.mu.Unlock()
		}()
	}
}

// closeListeners stops accepting; s.mu must be held.
func (s *Server) closeListeners() {
	s.quitOnce.Do(func() { close(s.quit) })
	for lis := range s.listeners {
		lis.Close()
		delete(s.listeners, lis)
	}
}

// GracefulStop stops accepting, tells every connection to start no new
// call (GOAWAY), and returns once the calls in flight have been answered
// and the connections closed. Stop, called meanwhile, ends it sooner.
func (s *Server) GracefulStop() {
	for _, c := range s.stopping(true) {
		c.goAway()
	}
	s.connsDone.Wait()
}

// stopping marks the server draining (or stopped), stops accepting and
// returns the connections; they are told outside s.mu, so that one whose
// client does not read cannot hold up a Stop.
func (s *Server) stopping(graceful bool) []*conn {
	s.mu.Lock()
	defer s.mu.Unlock()
	if graceful {
		s.draining = true
	} else {
		s.stopped = true
	}
	s.closeListeners()
	conns := make([]*conn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	return conns
}

// Stop closes the listeners and every connection at once; calls in flight
// see their contexts cancelled and their answers are dropped.
func (s *Server) Stop() {
	for _, c := range s.stopping(false) {
		c.close()
	}
	s.connsDone.Wait()
}

// handshake completes TLS (when configured) within the handshake timeout
// and checks that the client chose HTTP/2.
func (s *Server) handshake(nc net.Conn) (net.Conn, error) {
	if s.opts.TLS == nil {
		return nc, nil
	}
	tc := tls.Server(nc, s.opts.TLS)
	ctx, cancel := context.WithTimeout(context.Background(), s.opts.HandshakeTimeout)
	defer cancel()
	if err := tc.HandshakeContext(ctx); err != nil {
		return nil, fmt.Errorf("tls handshake: %w", err)
	}
	if p := tc.ConnectionState().NegotiatedProtocol; p != "h2" {
		return nil, fmt.Errorf("tls: client negotiated %q, want h2 (ALPN)", p)
	}
	return tc, nil
}
