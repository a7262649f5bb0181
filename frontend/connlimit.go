package frontend

import (
	"errors"
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
type limitListener struct {
	net.Listener
	max     int64
	open    atomic.Int64
	metrics *metrics
	// guard, for the grpc transport, meters what each connection reads
	// (bodyguard.go) and counts handshake timeouts, which grpc-go keeps
	// to itself; nil for lean, which does both in h2unary.
	guard *bodyGuard
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.open.Add(1) > l.max {
			l.open.Add(-1)
			c.Close()
			l.metrics.refuse(reasonConnections)
			continue
		}
		l.metrics.conns.Inc()
		lc := &limitedConn{Conn: c, l: l}
		if l.guard != nil {
			lc.meter = l.guard.register(c)
		}
		return lc, nil
	}
}

// limitedConn is an accepted connection, counted until it is closed.
type limitedConn struct {
	net.Conn
	l     *limitListener
	once  sync.Once
	meter *connMeter // grpc only
	// handshook: grpc-go cleared the handshake deadline (grpc only).
	handshook  atomic.Bool
	timeoutHit atomic.Bool
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
	c.once.Do(func() {
		c.l.open.Add(-1)
		c.l.metrics.conns.Dec()
		if c.meter != nil {
			c.l.guard.forget(c.meter)
		}
	})
	return c.Conn.Close()
}
