package frontend

import (
	"context"
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"

	"github.com/recmesh/recmesh/frontend/h2unary"
)

// bodyGuard bounds the request bodies grpc-go holds, which it offers no
// setting for: it reads a body chunk by chunk as it arrives, into the
// call's own buffers, before the handler runs, so a client that declares
// a large message and never finishes it holds what it sent, on as many
// streams as MaxStreams allows.
//
// grpc-go does not say how many bytes a stream holds, so the guard bounds
// them from outside: every connection is metered (limitedConn counts the
// bytes it reads), and a stream is "pending" from its headers (the tap
// handle, which gives it a context the guard can cancel) until its body
// is complete (the interceptors, which run once grpc-go has read and
// decoded it). What a connection's pending streams hold is at most
//
//	min(bytes read since its oldest pending stream began,
//	    pending streams × the largest request)
//
// — its charge. A connection's charge is held within MaxConnBufferedBytes
// and the sum of all charges within MaxBufferedBytes: past either, new
// streams are refused RESOURCE_EXHAUSTED at their headers, and pending
// ones are cancelled, newest first (the client sees CANCELLED), as the
// bytes arrive (in Read) and every sweep. The charge over-counts (the
// bytes of calls that completed meanwhile, frame headers, TLS), never
// under: honest calls complete within moments, so their charge is what
// arrived in those moments, while a body that stalls is charged for all
// its connection reads until it completes or is cancelled. A sweep every
// period also cancels a stream pending longer than BodyTimeout.
type bodyGuard struct {
	metrics           *metrics
	connCap, totalCap int64
	maxRequest        int64 // the largest request, prefix included
	period            time.Duration
	bodyTicks         uint32 // BodyTimeout in periods, one more for the tick a stream began in

	tick  atomic.Uint32
	total atomic.Int64 // the connections' charges

	mu    sync.RWMutex
	conns map[connKey]*connMeter
}

// connKey names a connection as grpc-go's peer does: its two addresses.
type connKey struct{ remote, local netip.AddrPort }

func keyOf(remote, local net.Addr) (connKey, bool) {
	r, ok1 := remote.(*net.TCPAddr)
	l, ok2 := local.(*net.TCPAddr)
	if !ok1 || !ok2 {
		return connKey{}, false
	}
	rp, lp := r.AddrPort(), l.AddrPort()
	return connKey{netip.AddrPortFrom(rp.Addr().Unmap(), rp.Port()), netip.AddrPortFrom(lp.Addr().Unmap(), lp.Port())}, true
}

// connMeter is one connection's account.
type connMeter struct {
	key  connKey
	read atomic.Int64 // bytes read from the socket
	live atomic.Int32 // pending streams

	mu      sync.Mutex
	queue   []*pendingBody // in the order they began; finished ones dropped lazily
	charged int64          // this connection's part of bodyGuard.total
}

// pendingBody is a stream whose body is not complete yet, and the context
// grpc-go gives it (the tap handle's): the guard cancels it to end the
// stream, and the interceptors find it through Value.
type pendingBody struct {
	context.Context
	cancel context.CancelFunc
	meter  *connMeter
	start  int64  // meter.read when it began
	born   uint32 // bodyGuard.tick when it began
	done   bool   // complete, ended or cancelled; meter.mu
}

type pendingKey struct{}

func (p *pendingBody) Value(key any) any {
	if key == (pendingKey{}) {
		return p
	}
	return p.Context.Value(key)
}

func newBodyGuard(o Options, maxRecv int, m *metrics) *bodyGuard {
	// As h2unary's watchdog: an eighth of the timeout, between 5 ms and
	// 100 ms (the sweep also enforces the total, which bytes from many
	// connections can outrun between Reads on any one of them).
	p := min(max(o.BodyTimeout/8, 5*time.Millisecond), 100*time.Millisecond)
	return &bodyGuard{
		metrics:    m,
		connCap:    o.MaxConnBufferedBytes,
		totalCap:   o.MaxBufferedBytes,
		maxRequest: int64(maxRecv) + 5,
		period:     p,
		bodyTicks:  uint32((o.BodyTimeout+p-1)/p) + 1,
		conns:      map[connKey]*connMeter{},
	}
}

// register starts metering an accepted connection.
func (g *bodyGuard) register(c net.Conn) *connMeter {
	key, ok := keyOf(c.RemoteAddr(), c.LocalAddr())
	if !ok {
		return nil
	}
	m := &connMeter{key: key}
	g.mu.Lock()
	g.conns[key] = m
	g.mu.Unlock()
	return m
}

// forget drops a closed connection's account; grpc-go has ended its
// streams' contexts.
func (g *bodyGuard) forget(m *connMeter) {
	g.mu.Lock()
	if g.conns[m.key] == m {
		delete(g.conns, m.key)
	}
	g.mu.Unlock()
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, p := range m.queue {
		p.done = true
	}
	m.queue = nil
	m.live.Store(0)
	g.total.Add(-m.charged)
	m.charged = 0
}

// tap admits a stream (the tap handle, after the service's own): refused
// when its connection's charge or the total is at its limit, else made
// pending.
func (g *bodyGuard) tap(ctx context.Context) (context.Context, error) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return ctx, nil
	}
	key, ok := keyOf(p.Addr, p.LocalAddr)
	if !ok {
		return ctx, nil
	}
	g.mu.RLock()
	m := g.conns[key]
	g.mu.RUnlock()
	if m == nil {
		return ctx, nil // not from the guarded listener
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	g.updateLocked(m)
	if m.charged >= g.connCap {
		g.metrics.refuse(h2unary.ReasonBodyBytesConn)
		return nil, status.Errorf(codes.ResourceExhausted, "this connection's unfinished requests may hold %d of its %d buffered bytes", m.charged, g.connCap)
	}
	if t := g.total.Load(); t >= g.totalCap {
		g.metrics.refuse(h2unary.ReasonBodyBytesTotal)
		return nil, status.Errorf(codes.ResourceExhausted, "the server's unfinished requests may hold %d of its %d buffered bytes", t, g.totalCap)
	}
	pb := &pendingBody{meter: m, start: m.read.Load(), born: g.tick.Load()}
	pb.Context, pb.cancel = context.WithCancel(ctx)
	m.queue = append(m.queue, pb)
	m.live.Add(1)
	return pb, nil
}

// complete ends a stream's pending: its body has been read.
func (g *bodyGuard) complete(ctx context.Context) {
	pb, ok := ctx.Value(pendingKey{}).(*pendingBody)
	if !ok {
		return
	}
	m := pb.meter
	m.mu.Lock()
	defer m.mu.Unlock()
	if !pb.done {
		pb.done = true
		m.live.Add(-1)
		g.updateLocked(m)
	}
}

// unaryDone and streamDone are the interceptors: grpc-go calls them once
// the request is read (unary) or the stream's handler starts.
func (g *bodyGuard) unaryDone(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	g.complete(ctx)
	return handler(ctx, req)
}

func (g *bodyGuard) streamDone(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	g.complete(ss.Context())
	return handler(srv, ss)
}

// onRead meters n bytes read by m's connection and, while it has pending
// streams, holds its charge and the total within their limits.
func (g *bodyGuard) onRead(m *connMeter, n int) {
	m.read.Add(int64(n))
	if m.live.Load() == 0 {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	g.updateLocked(m)
	for m.charged > g.connCap && g.cancelNewestLocked(m, h2unary.ReasonBodyBytesConn) {
	}
	// Past the total, the connections that hold much give way as they
	// read; the sweep takes the rest from the largest.
	for g.total.Load() > g.totalCap && m.charged >= g.totalCap/64 && g.cancelNewestLocked(m, h2unary.ReasonBodyBytesTotal) {
	}
}

// updateLocked drops the finished streams at the front of m's queue (and,
// now and then, all of them) and recomputes its charge; m.mu held.
func (g *bodyGuard) updateLocked(m *connMeter) {
	q := m.queue
	for len(q) > 0 && (q[0].done || q[0].Err() != nil) {
		// A stream whose context ended without completing (grpc-go
		// refused it after the tap, or the client reset it) is over too.
		if !q[0].done {
			q[0].done = true
			m.live.Add(-1)
		}
		q[0] = nil
		q = q[1:]
	}
	if live := int(m.live.Load()); len(q) > 2*live+16 {
		q = slices.DeleteFunc(q, func(p *pendingBody) bool { return p.done })
	}
	m.queue = q
	var charge int64
	if len(q) > 0 {
		charge = min(m.read.Load()-q[0].start, int64(m.live.Load())*g.maxRequest)
	}
	g.total.Add(charge - m.charged)
	m.charged = charge
}

// cancelNewestLocked cancels m's newest pending stream, counted as
// reason; false when it has none; m.mu held.
func (g *bodyGuard) cancelNewestLocked(m *connMeter, reason string) bool {
	for i := len(m.queue) - 1; i >= 0; i-- {
		if p := m.queue[i]; !p.done {
			p.done = true
			m.live.Add(-1)
			p.cancel()
			g.metrics.refuse(reason)
			g.updateLocked(m)
			return true
		}
	}
	return false
}

// sweep runs every period until stop is closed: it cancels streams
// pending past BodyTimeout, and takes the total back within its limit
// from the connections charged most.
func (g *bodyGuard) sweep(stop <-chan struct{}) {
	t := time.NewTicker(g.period)
	defer t.Stop()
	var busy []*connMeter
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		now := g.tick.Add(1)
		busy = busy[:0]
		g.mu.RLock()
		for _, m := range g.conns {
			if m.live.Load() > 0 {
				busy = append(busy, m)
			}
		}
		g.mu.RUnlock()
		for _, m := range busy {
			m.mu.Lock()
			for _, p := range m.queue {
				if !p.done && now-p.born >= g.bodyTicks {
					p.done = true
					m.live.Add(-1)
					p.cancel()
					g.metrics.refuse(h2unary.ReasonBodyTimeout)
				}
			}
			g.updateLocked(m)
			m.mu.Unlock()
		}
		for g.total.Load() > g.totalCap {
			var top *connMeter
			var most int64
			for _, m := range busy {
				m.mu.Lock()
				if c := m.charged; c > most {
					top, most = m, c
				}
				m.mu.Unlock()
			}
			if top == nil {
				break
			}
			top.mu.Lock()
			ok := g.cancelNewestLocked(top, h2unary.ReasonBodyBytesTotal)
			top.mu.Unlock()
			if !ok {
				break
			}
		}
	}
}

// admit is the gRPC tap in front of every call: the service's admission,
// then the guard's.
func (s *Server) tap(ctx context.Context, info *tap.Info) (context.Context, error) {
	ctx, err := s.svc.admit(ctx, info)
	if err != nil || s.guard == nil {
		return ctx, err
	}
	return s.guard.tap(ctx)
}
