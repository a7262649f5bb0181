package frontend

import (
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/recmesh/recmesh/frontend/h2unary"
)

// Reasons of recmesh_frontend_refused_total that package frontend counts
// itself; the rest are h2unary's (h2unary.Reason*), which the grpc
// transport counts too where grpc-go lets it see them.
const reasonConnections = "connections"

// limitListener bounds the connections the gRPC port holds open, for
// both transports: one past MaxConnections is closed as it is accepted,
// before any byte of it is read (and counted). Each connection it hands
// out is a limitedConn.
//
// It also lets the drain stop accepting before the server stops
// (stopAccepting): both servers close, unserved, a connection they accept
// once their stop has begun (grpc-go in a goroutine per connection, so
// even one accepted just before), which a client sees as a reset of a
// connection that the kernel had already completed.
type limitListener struct {
	net.Listener
	max     int64
	open    atomic.Int64
	metrics *metrics
	// guard, for the grpc transport, meters what each connection reads
	// (bodyguard.go) and counts handshake timeouts, which grpc-go keeps
	// to itself; nil for lean, which does both in h2unary.
	guard *bodyGuard

	// unclaimed counts the connections handed out that the server has
	// not yet touched (limitedConn.claim).
	unclaimed atomic.Int64
	// stopping is set by stopAccepting; acceptStopped closes when Accept
	// has seen the socket closed after that, and closed when the server
	// closes the listener.
	stopping      atomic.Bool
	acceptStopped chan struct{}
	stoppedOnce   sync.Once
	closed        chan struct{}
	closeOnce     sync.Once
}

func newLimitListener(lis net.Listener, max int, m *metrics, guard *bodyGuard) *limitListener {
	return &limitListener{Listener: lis, max: int64(max), metrics: m, guard: guard,
		acceptStopped: make(chan struct{}), closed: make(chan struct{})}
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			if l.stopping.Load() {
				// Every connection accepted before the socket closed
				// has been handed out (and counted in unclaimed). The
				// server learns of the stop only from its own Close,
				// so that it returns from Serve as from any stop.
				l.stoppedOnce.Do(func() { close(l.acceptStopped) })
				<-l.closed
				return nil, net.ErrClosed
			}
			return nil, err
		}
		if l.open.Add(1) > l.max {
			l.open.Add(-1)
			c.Close()
			l.metrics.refuse(reasonConnections)
			continue
		}
		l.metrics.conns.Inc()
		l.unclaimed.Add(1)
		lc := &limitedConn{Conn: c, l: l}
		if l.guard != nil {
			lc.meter = l.guard.register(c)
		}
		return lc, nil
	}
}

// Close closes the socket, and ends an Accept held after stopAccepting.
func (l *limitListener) Close() error {
	l.closeOnce.Do(func() { close(l.closed) })
	return l.Listener.Close()
}

// stopAccepting closes the listening socket while the server still runs
// and waits, for at most timeout, until the server has taken up every
// connection accepted before: the listener's Accept has returned the
// socket's error, and each connection handed out has been touched. The
// server's own stop then finds no connection it would drop (limitedConn.
// claimed says how a connection counts as taken up). With eBPF
// steering the kernel moves the connections still queued on the socket
// to a live frontend of the port as it closes. Accept returns only once
// the server closes the listener.
func (l *limitListener) stopAccepting(timeout time.Duration) error {
	l.stopping.Store(true)
	if err := l.Listener.Close(); err != nil {
		return fmt.Errorf("close the listener: %w", err)
	}
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	select {
	case <-l.acceptStopped:
	case <-deadline.C:
		return fmt.Errorf("accept did not return within %v", timeout)
	}
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for l.unclaimed.Load() > 0 {
		select {
		case <-tick.C:
		case <-deadline.C:
			return fmt.Errorf("%d accepted connections not taken up by the server within %v", l.unclaimed.Load(), timeout)
		}
	}
	return nil
}

// limitedConn is an accepted connection, counted until it is closed.
type limitedConn struct {
	net.Conn
	l     *limitListener
	once  sync.Once
	meter *connMeter // grpc only
	// claimed: the server has taken the connection up, past the point
	// where a stop would drop it unserved. Both servers' first call on a
	// connection is SetDeadline (the handshake's bound), or Close when
	// they drop it; only those two claim, so reads and writes pay nothing.
	claimed atomic.Bool
	// handshook: grpc-go cleared the handshake deadline (grpc only).
	handshook  atomic.Bool
	timeoutHit atomic.Bool
}

// claim notes that the server took the connection up.
func (c *limitedConn) claim() {
	if !c.claimed.Load() && !c.claimed.Swap(true) {
		c.l.unclaimed.Add(-1)
	}
}

func (c *limitedConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if m := c.meter; m != nil {
		if n > 0 {
			c.l.guard.onRead(m, n)
		}
		// grpc-go bounds its handshake (TLS, preface, first SETTINGS)
		// with a deadline on the socket and logs the failure only.
		if err != nil && !c.handshook.Load() && errors.Is(err, os.ErrDeadlineExceeded) && !c.timeoutHit.Swap(true) {
			c.l.metrics.refuse(h2unary.ReasonHandshakeTimeout)
		}
	}
	return n, err
}

// SetDeadline notes the end of grpc-go's handshake: it clears the
// deadline it set for it.
func (c *limitedConn) SetDeadline(t time.Time) error {
	c.claim()
	if t.IsZero() {
		c.handshook.Store(true)
	}
	return c.Conn.SetDeadline(t)
}

// CloseWrite shuts the write side where the socket can (h2unary does,
// lingering after a connection error).
func (c *limitedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.ErrUnsupported
}

func (c *limitedConn) Close() error {
	c.claim()
	c.once.Do(func() {
		c.l.open.Add(-1)
		c.l.metrics.conns.Dec()
		if c.meter != nil {
			c.l.guard.forget(c.meter)
		}
	})
	return c.Conn.Close()
}
