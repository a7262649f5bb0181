package h2unary

import (
	"strconv"
	"time"

	"golang.org/x/net/http2"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Reasons given to Options.OnRefuse, one per limit.
const (
	// ReasonHeaderList: a request's header list was larger than
	// DefaultMaxHeaderListSize (answered 431, or the connection closed
	// when its encoded block ran far past the limit).
	ReasonHeaderList = "header_list"
	// ReasonBodyBytesConn and ReasonBodyBytesTotal: a request would have
	// taken more buffered bytes than its connection (MaxConnBufferedBytes)
	// or the server (MaxBufferedBytes) had left (RESOURCE_EXHAUSTED).
	ReasonBodyBytesConn  = "body_bytes_conn"
	ReasonBodyBytesTotal = "body_bytes_total"
	// ReasonBodyTimeout: a request body did not complete within
	// BodyTimeout or the call's deadline (DEADLINE_EXCEEDED).
	ReasonBodyTimeout = "body_timeout"
	// ReasonHeaderTimeout: a header block stayed unfinished past
	// HeaderTimeout (GOAWAY ENHANCE_YOUR_CALM).
	ReasonHeaderTimeout = "header_timeout"
	// ReasonHandshakeTimeout: TLS, the preface or the first SETTINGS did
	// not arrive within HandshakeTimeout (closed).
	ReasonHandshakeTimeout = "handshake_timeout"
	// ReasonIdleTimeout: a connection had no call for IdleTimeout (GOAWAY
	// NO_ERROR).
	ReasonIdleTimeout = "idle_timeout"
	// ReasonStreams: a stream beyond MaxConcurrentStreams (REFUSED_STREAM).
	ReasonStreams = "streams"
	// ReasonPings: pings too often with no call between them (GOAWAY
	// ENHANCE_YOUR_CALM).
	ReasonPings = "pings"
)

// refused reports a refusal to Options.OnRefuse.
func (s *Server) refused(reason string) {
	if f := s.opts.OnRefuse; f != nil {
		f(reason)
	}
}

// BufferedBytes is the request bytes the server's connections have
// reserved now (Options.MaxBufferedBytes bounds it).
func (s *Server) BufferedBytes() int64 { return s.buffered.Load() }

// watchTicks is each connection's watchdog period and the timeouts in
// periods. The watchdog counts ticks instead of reading the clock, so
// that a call costs no clock read and no timer of its own: a deadline is
// met within one period.
type watchTicks struct {
	period               time.Duration
	body, header, idle   uint32 // periods that make each timeout
	bodyText, headerText string // the timeouts, for messages
}

func newWatchTicks(o Options) watchTicks {
	// An eighth of the shortest timeout, so a deadline is met within an
	// eighth of it late; at most a second apart, so a thousand idle
	// connections cost a thousand wake-ups a second, and never more often
	// than every 5 ms.
	p := min(max(min(o.BodyTimeout, o.HeaderTimeout, o.IdleTimeout)/8, 5*time.Millisecond), time.Second)
	ticks := func(d time.Duration) uint32 {
		// A stream born within a period is n periods old at most n ticks
		// after, so one tick more makes sure a whole timeout has passed.
		return uint32((d+p-1)/p) + 1
	}
	return watchTicks{period: p, body: ticks(o.BodyTimeout), header: ticks(o.HeaderTimeout), idle: ticks(o.IdleTimeout),
		bodyText: o.BodyTimeout.String(), headerText: o.HeaderTimeout.String()}
}

// reserveLocked takes n request bytes from the connection's and the
// server's budgets for s, or says which is short; wmu held.
func (c *conn) reserveLocked(s *stream, n int64) error {
	o := &c.s.opts
	if c.buffered+n > o.MaxConnBufferedBytes {
		c.s.refused(ReasonBodyBytesConn)
		return status.Error(codes.ResourceExhausted, "request of "+strconv.FormatInt(n, 10)+" bytes: this connection's requests already hold "+
			strconv.FormatInt(c.buffered, 10)+" of its "+strconv.FormatInt(o.MaxConnBufferedBytes, 10)+" buffered bytes")
	}
	if c.s.buffered.Add(n) > o.MaxBufferedBytes {
		c.s.buffered.Add(-n)
		c.s.refused(ReasonBodyBytesTotal)
		return status.Error(codes.ResourceExhausted, "request of "+strconv.FormatInt(n, 10)+" bytes: the server's "+
			strconv.FormatInt(o.MaxBufferedBytes, 10)+" buffered request bytes are taken")
	}
	c.buffered += n
	s.reserved = n
	return nil
}

// releaseLocked returns s's reservation; wmu held. Idempotent.
func (c *conn) releaseLocked(s *stream) {
	if n := s.reserved; n > 0 {
		s.reserved = 0
		c.buffered -= n
		c.s.buffered.Add(-n)
	}
}

// startWatch arms the connection's watchdog, once its handshake is done.
func (c *conn) startWatch() {
	c.lock()
	defer c.unlock()
	if !c.closed {
		c.watchdog = time.AfterFunc(c.s.watch.period, c.watch)
	}
}

// watch is the connection's watchdog, every period while it is open: it
// ends a header block left unfinished, request bodies that did not
// complete in time, and an idle connection.
func (c *conn) watch() {
	c.lock()
	defer c.unlock()
	if c.closed {
		return
	}
	w := &c.s.watch
	t := c.tick.Add(1)
	if since := c.hdrSince.Load(); since != 0 && t-(since-1) >= w.header {
		c.s.refused(ReasonHeaderTimeout)
		c.goAwayLocked(http2.ErrCodeEnhanceYourCalm, "header block not complete within "+w.headerText)
		c.closeLocked()
		return
	}
	for _, s := range c.streams {
		if s.requestDone || s.reset {
			continue
		}
		if t-s.born >= w.body || s.ctx.Err() != nil {
			c.s.refused(ReasonBodyTimeout)
			// Deleting from the map while ranging over it is allowed.
			c.refuseLocked(s, 200, codes.DeadlineExceeded, "request body not complete within "+w.bodyText+" or the call's deadline")
		}
	}
	if len(c.streams) == 0 && c.hdrSince.Load() == 0 && c.opened == c.idleMark {
		c.idleTicks++
	} else {
		c.idleTicks, c.idleMark = 0, c.opened
	}
	if c.idleTicks >= w.idle {
		c.s.refused(ReasonIdleTimeout)
		c.goAwayLocked(http2.ErrCodeNo, "idle")
		c.closeLocked()
		return
	}
	c.watchdog.Reset(w.period)
}

// noteReset remembers that this server reset stream id, whose DATA frames
// still in flight are then ignored (RFC 9113 5.1) rather than answered
// STREAM_CLOSED; wmu held. The last few are enough: a client stops
// sending on a stream one round trip after the reset.
func (c *conn) noteReset(id uint32) {
	c.resets[c.resetsNext%uint32(len(c.resets))] = id
	c.resetsNext++
}

// wasReset reports whether noteReset remembers id; wmu held.
func (c *conn) wasReset(id uint32) bool {
	for _, r := range c.resets {
		if r == id && id != 0 {
			return true
		}
	}
	return false
}

// forgetReset drops id from what noteReset remembers; wmu held.
func (c *conn) forgetReset(id uint32) {
	for i, r := range c.resets {
		if r == id {
			c.resets[i] = 0
		}
	}
}
