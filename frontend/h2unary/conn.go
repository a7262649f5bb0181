package h2unary

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// maxFrameSize is the largest frame this server reads (advertised in
// SETTINGS_MAX_FRAME_SIZE): large requests arrive in fewer frames.
const maxFrameSize = 1 << 20

// maxWindow is the largest flow-control window HTTP/2 allows.
const maxWindow = 1<<31 - 1

// Lingering after a connection error: the GOAWAY is written, the write
// side shut, and what the client still sends read and dropped for up to
// lingerTime, so that the close does not reset the socket (which would
// let the client's kernel drop the GOAWAY unread).
const (
	lingerTime  = time.Second
	lingerBytes = 1 << 20
)

// conn is one client connection. Its reader goroutine (serve) owns the
// Framer's read side; everything below wmu is shared with the goroutines
// that answer calls and is guarded by it.
type conn struct {
	s   *Server
	raw net.Conn        // the socket: closing it ends everything
	ctx context.Context // cancelled when the connection ends
	end context.CancelFunc
	br  *bufio.Reader
	fr  *http2.Framer
	hdr *headerBlock // the reader's

	// Owned by the reader.
	recvConn    int32 // connection bytes received and not yet returned by WINDOW_UPDATE
	lastPing    time.Time
	pingStrikes int

	// answered is set whenever a call's response headers or data are
	// written: a ping after them is no strike (keepalive enforcement, as
	// grpc-go's: clients probe bandwidth with a ping when data arrives).
	// Refusals do not set it, so that refused requests between pings
	// cannot reset the count.
	answered atomic.Bool
	// calls counts the handlers running, so that a stop waits for them.
	calls sync.WaitGroup
	// tick counts the watchdog's periods (limits.go); hdrSince is the
	// tick+1 at which an unfinished header block began, 0 when none.
	tick, hdrSince atomic.Uint32
	// rawClosed: the socket is closed (close may run outside wmu).
	rawClosed atomic.Bool

	waiters atomic.Int32 // goroutines waiting for wmu: the last one out flushes
	wmu     sync.Mutex
	bw      *bufio.Writer
	henc    *hpack.Encoder
	hbuf    bytes.Buffer
	streams map[uint32]*stream // open or being answered: counted against MaxConcurrentStreams
	lastID  uint32             // highest stream the client opened
	// sendConn is the connection's send window; peerWindow the client's
	// initial stream window; peerFrame its largest frame.
	sendConn   int64
	peerWindow int64
	peerFrame  uint32
	// pending are answers held back by flow control, in order.
	pending []*stream
	// goingAway: the GOAWAY naming the last stream served is sent; later
	// streams are refused and the connection closes once idle. warned:
	// a graceful stop's first GOAWAY (and its PING) is sent; drainTimer
	// sends the second if the PING's ack is late.
	goingAway  bool
	warned     bool
	drainTimer *time.Timer
	// goAwayOnReady: GracefulStop came during the handshake; serve warns
	// as soon as the server preface is out.
	goAwayOnReady bool
	closed        bool
	// ackPending: the write buffer holds PING acks left for an answer to
	// carry out (onPing), ackBytes of them and nothing else while its
	// length is still that. ackTimer flushes them after pingAckDelay;
	// ackArmed while it runs.
	ackPending bool
	ackBytes   int
	ackTimer   *time.Timer
	ackArmed   bool
	ackSince   time.Time // when the oldest ack still buffered was written
	// buffered is the request bytes this connection's streams reserved.
	buffered int64
	// The watchdog (limits.go): opened counts the streams ever opened;
	// idleTicks the periods since one was last open, idleMark what opened
	// was then.
	watchdog  *time.Timer
	opened    uint64
	idleMark  uint64
	idleTicks uint32
	// resets are the streams this server reset last (noteReset).
	resets     [16]uint32
	resetsNext uint32
}

// pingAckDelay bounds how long a PING ack may wait in the write buffer for
// an answer to ride out with: gRPC clients probe bandwidth with a PING
// after every response they read, an ack flushed at once is a write
// syscall of its own, and clients only time the ack to size their windows
// (keepalive waits seconds for it). While a call is in flight on the
// connection its answer is sure to come, so the acks wait for it, up to
// pingAckMaxDelay: past the 20 ms latency target, so only an answer that
// has already missed it leaves its acks to the timer (figures in
// docs/design.md).
const (
	pingAckDelay    = 5 * time.Millisecond
	pingAckMaxDelay = 25 * time.Millisecond
)

func newConn(s *Server, nc net.Conn) *conn {
	ctx, end := context.WithCancel(context.Background())
	return &conn{
		s: s, raw: nc, ctx: ctx, end: end,
		streams:    map[uint32]*stream{},
		sendConn:   initialWindow,
		peerWindow: initialWindow,
		peerFrame:  16384,
	}
}

// lock takes wmu, counted as a waiter while it waits.
func (c *conn) lock() {
	c.waiters.Add(1)
	c.wmu.Lock()
	c.waiters.Add(-1)
}

// unlock flushes what is buffered unless another goroutine waits for the
// lock (it will flush, with its own frames) or all of it is PING acks
// waiting for an answer to ride out with (onPing), then releases it.
func (c *conn) unlock() {
	if c.bw != nil && c.bw.Buffered() > 0 && c.waiters.Load() == 0 && !c.closed && !c.onlyAcks() {
		c.ackPending = false
		if err := c.bw.Flush(); err != nil {
			c.closeLocked()
		}
	}
	c.wmu.Unlock()
}

// onlyAcks reports whether the write buffer holds nothing but PING acks
// left for an answer to carry out; wmu held.
func (c *conn) onlyAcks() bool { return c.ackPending && c.bw.Buffered() == c.ackBytes }

// shutdownLocked ends the connection for every goroutine but the reader:
// nothing more is written and the calls' contexts end; wmu held. The
// socket stays open for the reader to linger on (finish).
func (c *conn) shutdownLocked() {
	if c.closed {
		return
	}
	c.closed = true
	if c.ackTimer != nil {
		c.ackTimer.Stop()
	}
	if c.watchdog != nil {
		c.watchdog.Stop()
	}
	if c.drainTimer != nil {
		c.drainTimer.Stop()
	}
	c.end()
}

// closeLocked ends the connection and closes its socket; wmu held. The
// reader sees the closed socket and returns.
func (c *conn) closeLocked() {
	c.shutdownLocked()
	c.close()
}

// close ends the connection at once without waiting for wmu, which a
// write to a client that does not read may hold: the closed socket fails
// that write.
func (c *conn) close() {
	c.end()
	c.rawClosed.Store(true)
	c.raw.Close()
}

// goAway tells the client to open no more streams; the connection closes
// once the streams it has are answered. It takes two GOAWAYs (RFC 9113
// 6.8), as grpc-go's server does: the first, naming the largest stream
// id, warns the client off new streams while still serving the ones
// already on their way, which a single GOAWAY would refuse (and a client
// retries a refused call only once); a PING's ack then shows they have
// all arrived, and the second GOAWAY names the last.
//
// A connection still in its handshake is not closed: the kernel completed
// it, and the client may already have a call waiting on it, which a
// closed socket would fail. It is warned as soon as the server preface is
// out, and serves what the client sent meanwhile.
func (c *conn) goAway() {
	c.lock()
	defer c.unlock()
	switch {
	case c.closed:
	case c.fr == nil:
		c.goAwayOnReady = true
	default:
		c.warnLocked()
	}
}

// drainPing is the payload of the PING that follows the first GOAWAY of a
// graceful stop; drainAckTimeout is how long its ack may take before the
// second GOAWAY goes out anyway.
var drainPing = [8]byte{'r', 'm', 'd', 'r', 'a', 'i', 'n', '1'}

const (
	drainAckTimeout = time.Second
	maxStreamID     = 1<<31 - 1
)

// warnLocked sends a graceful stop's first GOAWAY and its PING; wmu held.
func (c *conn) warnLocked() {
	if c.warned || c.goingAway {
		return
	}
	c.warned = true
	_ = c.fr.WriteGoAway(maxStreamID, http2.ErrCodeNo, nil)
	_ = c.fr.WritePing(false, drainPing)
	if err := c.bw.Flush(); err != nil {
		c.closeLocked()
		return
	}
	c.drainTimer = time.AfterFunc(drainAckTimeout, c.finalGoAway)
}

// finalGoAway sends a graceful stop's second GOAWAY (goAwayLocked): on the
// ack of the drain PING, or when it is late. An ack no drain asked for
// changes nothing.
func (c *conn) finalGoAway() {
	c.lock()
	defer c.unlock()
	if c.warned && !c.closed {
		c.goAwayLocked(http2.ErrCodeNo, "")
	}
}

// goAwayLocked sends GOAWAY with code. NO_ERROR closes the connection
// once its streams are answered; an error code shuts it down now, and the
// reader, returning, lingers (finish). A goroutine other than the reader
// must close the socket itself after an error code.
func (c *conn) goAwayLocked(code http2.ErrCode, debug string) {
	if c.closed || c.fr == nil {
		c.closeLocked() // still in the handshake: nothing to finish
		return
	}
	if !c.goingAway {
		c.goingAway = true
		_ = c.fr.WriteGoAway(c.lastID, code, []byte(debug))
	}
	switch {
	case code != http2.ErrCodeNo:
		_ = c.bw.Flush()
		c.shutdownLocked()
	case len(c.streams) == 0:
		c.closeDrainedLocked()
	}
}

// closeDrainedLocked ends a connection going away (NO_ERROR) once no
// stream is left; wmu held. Closing the socket at once would reset it
// when the client sent anything meanwhile (a WINDOW_UPDATE, a PING, a
// stream begun as the GOAWAY crossed it), and a reset drops what was not
// yet sent: the last answer, the GOAWAY. So the write side is shut after
// a flush, and the reader reads on until the client closes, for at most
// lingerTime, before finish closes the socket.
func (c *conn) closeDrainedLocked() {
	_ = c.bw.Flush()
	c.shutdownLocked()
	if cw, ok := c.raw.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
	_ = c.raw.SetReadDeadline(time.Now().Add(lingerTime))
}

// onGoAway answers the client's GOAWAY: the streams it has are answered,
// then the connection closes (goAwayLocked). With none in flight the
// reader ends it itself, as after a connection error: it returns, and
// finish lingers, reading what the client sent after its GOAWAY (h2spec
// sends a PING) before closing. Closed at once with those bytes unread,
// the socket would be reset, and the client would see a reset rather than
// our GOAWAY and a clean close.
func (c *conn) onGoAway() bool {
	c.lock()
	defer c.unlock()
	if len(c.streams) > 0 || c.closed {
		c.goAwayLocked(http2.ErrCodeNo, "")
		return !c.closed
	}
	if !c.goingAway {
		c.goingAway = true
		_ = c.fr.WriteGoAway(c.lastID, http2.ErrCodeNo, nil)
	}
	_ = c.bw.Flush()
	c.shutdownLocked()
	return false
}

// connError ends the connection with a GOAWAY carrying code; the reader's.
func (c *conn) connError(code http2.ErrCode, debug string) {
	c.lock()
	defer c.unlock()
	c.goAwayLocked(code, debug)
}

// serve is the connection's reader: the handshake, then frames until the
// connection ends.
func (c *conn) serve() {
	defer c.finish()
	o := &c.s.opts
	_ = c.raw.SetDeadline(time.Now().Add(o.HandshakeTimeout))
	nc, err := c.s.handshake(c.raw)
	if err != nil {
		c.handshakeFailed("TLS handshake", err)
		return
	}
	c.br = bufio.NewReaderSize(nc, 32<<10)
	preface := make([]byte, len(http2.ClientPreface))
	if _, err := io.ReadFull(c.br, preface); err != nil || string(preface) != http2.ClientPreface {
		if err == nil {
			err = errors.New("not the HTTP/2 client preface")
		}
		c.handshakeFailed("preface", err)
		return
	}

	c.lock()
	if c.closed { // stopped during the handshake
		c.wmu.Unlock()
		return
	}
	c.bw = bufio.NewWriterSize(nc, 32<<10)
	c.fr = http2.NewFramer(c.bw, c.br)
	c.hdr = newHeaderBlock(DefaultMaxHeaderListSize)
	c.fr.SetMaxReadFrameSize(maxFrameSize)
	c.fr.SetReuseFrames()
	c.henc = hpack.NewEncoder(&c.hbuf)
	_ = c.fr.WriteSettings(
		http2.Setting{ID: http2.SettingMaxConcurrentStreams, Val: o.MaxConcurrentStreams},
		http2.Setting{ID: http2.SettingInitialWindowSize, Val: uint32(o.StreamWindow)},
		http2.Setting{ID: http2.SettingMaxFrameSize, Val: maxFrameSize},
		http2.Setting{ID: http2.SettingMaxHeaderListSize, Val: DefaultMaxHeaderListSize},
	)
	if inc := o.ConnWindow - initialWindow; inc > 0 {
		_ = c.fr.WriteWindowUpdate(0, uint32(inc))
	}
	if c.goAwayOnReady {
		c.warnLocked()
	}
	c.unlock()

	// The preface ends with the client's SETTINGS (RFC 9113 3.4), still
	// within the handshake time.
	f, err := c.fr.ReadFrame()
	if err != nil {
		if isTimeout(err) {
			c.handshakeFailed("first SETTINGS", err)
			return
		}
		c.readError(err)
		return
	}
	if sf, ok := f.(*http2.SettingsFrame); !ok || sf.IsAck() {
		c.connError(http2.ErrCodeProtocol, "the client preface must end with SETTINGS")
		return
	}
	_ = c.raw.SetDeadline(time.Time{})
	c.startWatch()
	for c.handle(f) {
		for f, err = c.fr.ReadFrame(); err != nil; f, err = c.fr.ReadFrame() {
			if !c.readError(err) {
				return
			}
		}
	}
}

// handshakeFailed logs (and counts, when it ran out of time) a handshake
// that failed.
func (c *conn) handshakeFailed(step string, err error) {
	if isTimeout(err) {
		c.s.refused(ReasonHandshakeTimeout)
	}
	c.s.opts.Logger.Debug("h2unary: connection refused", "remote", c.raw.RemoteAddr().String(), "step", step, "err", err)
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// readError acts on an error from ReadFrame: true when reading may go on
// (the error was one stream's).
func (c *conn) readError(err error) bool {
	var se http2.StreamError
	if errors.As(err, &se) {
		c.resetStream(se.StreamID, se.Code)
		return true
	}
	var ce http2.ConnectionError
	switch {
	case errors.As(err, &ce):
		c.connError(http2.ErrCode(ce), err.Error())
	case errors.Is(err, http2.ErrFrameTooLarge):
		c.connError(http2.ErrCodeFrameSize, "frame larger than SETTINGS_MAX_FRAME_SIZE")
	}
	return false
}

// finish ends the connection when its reader returns: the streams not
// running give their buffers back, the socket lingers if a connection
// error shut it down, and the handlers still running are waited for.
func (c *conn) finish() {
	c.lock()
	linger := c.closed && !c.rawClosed.Load() && c.br != nil
	c.shutdownLocked()
	for _, s := range c.streams {
		if !s.running {
			c.removeLocked(s)
		}
	}
	c.wmu.Unlock()
	if linger {
		if cw, ok := c.raw.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		}
		_ = c.raw.SetReadDeadline(time.Now().Add(lingerTime))
		_, _ = io.Copy(io.Discard, io.LimitReader(c.br, lingerBytes))
	}
	c.close()
	c.calls.Wait()
}

// handle processes one frame; false ends the connection.
func (c *conn) handle(f http2.Frame) bool {
	switch f := f.(type) {
	case *http2.SettingsFrame:
		if f.IsAck() {
			return true
		}
		return c.onSettings(f)
	case *http2.HeadersFrame:
		c.hdr.start(f.StreamID, f.StreamEnded())
		// A stream may not depend on itself (RFC 9113 5.3.1): a stream
		// error, known once the block is decoded.
		c.hdr.selfDep = f.HasPriority() && f.Priority.StreamDep == f.StreamID
		if !f.HeadersEnded() {
			c.hdrSince.Store(c.tick.Load() + 1)
		}
		return c.onBlock(f.HeaderBlockFragment(), f.HeadersEnded())
	case *http2.ContinuationFrame: // the Framer checks that one is due
		if f.HeadersEnded() {
			c.hdrSince.Store(0)
		}
		return c.onBlock(f.HeaderBlockFragment(), f.HeadersEnded())
	case *http2.DataFrame:
		return c.onData(f)
	case *http2.WindowUpdateFrame:
		return c.onWindowUpdate(f)
	case *http2.RSTStreamFrame:
		return c.onReset(f.StreamID)
	case *http2.PriorityFrame:
		if f.StreamDep == f.StreamID {
			c.resetStream(f.StreamID, http2.ErrCodeProtocol)
		}
	case *http2.PingFrame:
		return c.onPing(f)
	case *http2.GoAwayFrame:
		// The client opens nothing more; finish what it has, then close.
		return c.onGoAway()
	case *http2.PushPromiseFrame:
		c.connError(http2.ErrCodeProtocol, "client sent PUSH_PROMISE")
		return false
	}
	return true
}
