// Package h2client is a minimal gRPC client for unary calls over HTTP/2,
// made for load generation: it sends pre-encoded request messages and
// hands back the raw response message, with as little work per call as
// the protocol allows, so that a load generator on one core measures the
// server and not itself.
//
// grpc-go's client moves every call through three goroutines (the
// caller, the connection's writer, its reader) and a timer, and probes
// bandwidth with a PING after each response. On one core that costs about
// 75 µs per call, and at 8,000 Poisson arrivals per second against a
// server that answers at once it alone puts the p99 near 10 ms. Here the
// caller writes its request frames itself, under the connection's write
// lock, and the connection's reader finishes the call on its own
// goroutine: one hand-off per call, none per frame.
//
// What it implements of HTTP/2 and gRPC: the connection preface and
// SETTINGS (the server's max frame size, initial window and stream limit
// are obeyed), flow control both ways, PING acks, GOAWAY, RST_STREAM,
// grpc-timeout with a client-side deadline that cancels the stream, and
// status from trailers or trailers-only responses. Like grpc-go's client
// it sends a bandwidth-probe PING after response data when none is
// outstanding, so a server acks as many PINGs as real callers make it
// (Options.NoBandwidthProbe turns that off). What it leaves out:
// TLS, compression, streaming, retries and reconnection: a connection
// that fails stays failed, and its calls fail with UNAVAILABLE.
package h2client

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"sync"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/recmesh/recmesh/proto/grpcwire"
)

// Options configure a connection. Zero fields take the defaults.
type Options struct {
	// UserAgent is sent with every call. Default "recmesh-h2client".
	UserAgent string
	// MaxRecvMsgSize bounds a response message. Default 64 MiB.
	MaxRecvMsgSize int
	// WindowSize is the receive window offered per stream and, times 16,
	// for the connection. Default 4 MiB.
	WindowSize uint32
	// NoBandwidthProbe turns off the PING sent after response data when
	// none is outstanding. grpc-go's and gRPC C-core's clients send it to
	// size their windows (bandwidth-delay product estimation), so a server
	// acks about one per call from real callers; the windows here are
	// static and never use the answer, but by default the PING is sent
	// anyway, so that a server does the work real clients give it.
	NoBandwidthProbe bool
}

const (
	defaultMaxRecv    = 64 << 20
	defaultWindowSize = 4 << 20
	// The protocol's values until the server's SETTINGS say otherwise.
	initialWindow    = 65535
	initialFrameSize = 16384
	maxStreamID      = 1<<31 - 1
	bufferSize       = 64 << 10
)

func (o Options) withDefaults() Options {
	if o.UserAgent == "" {
		o.UserAgent = "recmesh-h2client"
	}
	if o.MaxRecvMsgSize <= 0 {
		o.MaxRecvMsgSize = defaultMaxRecv
	}
	if o.WindowSize < initialWindow {
		o.WindowSize = defaultWindowSize
	}
	return o
}

// Done receives a call's outcome: the response message, or a gRPC status
// error. It runs exactly once, on the connection's reader goroutine or on
// the goroutine that ended the call (deadline, failed write, closed
// connection), so it must not block. resp is the caller's until it
// returns; it is not reused after.
type Done func(resp []byte, err error)

// Conn is one HTTP/2 connection. Calls may be started from any number of
// goroutines.
type Conn struct {
	opts      Options
	authority string
	nc        net.Conn

	// wmu serialises writes: a HEADERS frame and its request's DATA frames
	// that fit the windows are written and flushed under one hold.
	wmu  sync.Mutex
	bw   *bufio.Writer
	fr   *http2.Framer
	henc *hpack.Encoder
	hbuf bytes.Buffer
	next uint32 // the next stream id; guarded by wmu
	// scratch assembles a DATA frame's payload; guarded by wmu.
	scratch []byte

	// mu guards what the reader and the callers share; cond wakes callers
	// waiting for send window or for a stream slot.
	mu        sync.Mutex
	cond      *sync.Cond
	streams   map[uint32]*stream
	err       error // set once: the connection is unusable
	goAway    bool
	sendWin   int64  // connection-level send window
	peerWin   int64  // the server's initial stream window
	peerFrame uint32 // the server's max frame size
	peerMax   uint32 // the server's stream limit; 0 until it says
	active    int    // streams counted against peerMax
	unacked   int64  // received connection-level bytes not yet returned
	probing   bool   // a bandwidth-probe PING is unanswered

	readerDone chan struct{}
}

type stream struct {
	id       uint32
	done     Done
	sendWin  int64
	deadline time.Time // zero: none
	timer    *time.Timer
	headers  bool
	msg      []byte // the gRPC-framed response as it arrives
	unacked  int64
	httpCode int
}

// Dial connects to addr (host:port), exchanges the preface and settings,
// and starts the connection's reader. ctx bounds the dial and the wait for
// the server's SETTINGS.
func Dial(ctx context.Context, addr string, opts Options) (*Conn, error) {
	opts = opts.withDefaults()
	var d net.Dialer
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("h2client: dial %s: %w", addr, err)
	}
	if tc, ok := nc.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	c := &Conn{
		opts: opts, authority: addr, nc: nc,
		bw:      bufio.NewWriterSize(nc, bufferSize),
		next:    1,
		streams: make(map[uint32]*stream),
		sendWin: initialWindow, peerWin: initialWindow, peerFrame: initialFrameSize,
		readerDone: make(chan struct{}),
	}
	c.cond = sync.NewCond(&c.mu)
	c.fr = http2.NewFramer(c.bw, bufio.NewReaderSize(nc, bufferSize))
	c.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	c.fr.MaxHeaderListSize = 16 << 10
	c.henc = hpack.NewEncoder(&c.hbuf)

	if dl, ok := ctx.Deadline(); ok {
		nc.SetDeadline(dl)
	}
	c.bw.WriteString(http2.ClientPreface)
	err = c.fr.WriteSettings(
		http2.Setting{ID: http2.SettingEnablePush, Val: 0},
		http2.Setting{ID: http2.SettingInitialWindowSize, Val: opts.WindowSize},
		http2.Setting{ID: http2.SettingMaxHeaderListSize, Val: 16 << 10},
	)
	if err == nil {
		err = c.fr.WriteWindowUpdate(0, 16*opts.WindowSize-initialWindow)
	}
	if err == nil {
		err = c.bw.Flush()
	}
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("h2client: %s: write preface: %w", addr, err)
	}
	// The server's first frame must be its SETTINGS.
	f, err := c.fr.ReadFrame()
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("h2client: %s: read the server's settings: %w", addr, err)
	}
	sf, ok := f.(*http2.SettingsFrame)
	if !ok || sf.IsAck() {
		nc.Close()
		return nil, fmt.Errorf("h2client: %s: the server's first frame is %v, want SETTINGS", addr, f.Header().Type)
	}
	if err := c.settings(sf); err != nil {
		nc.Close()
		return nil, fmt.Errorf("h2client: %s: %w", addr, err)
	}
	nc.SetDeadline(time.Time{})
	go c.read()
	return c, nil
}

// Close closes the connection; calls in flight fail with UNAVAILABLE.
func (c *Conn) Close() error {
	c.fail(status.Error(codes.Unavailable, "h2client: connection closed"))
	<-c.readerDone
	return nil
}

// Go starts a unary call of method (for example
// "/inference.GRPCInferenceService/ModelInfer") with the serialised
// request msg and a deadline of timeout from now (none if zero). done
// receives the outcome. Go returns once the request is written, or
// waits for send window or for a stream slot while the server's limits
// hold it back.
func (c *Conn) Go(method string, msg []byte, timeout time.Duration, done Done) {
	s := &stream{done: done}
	c.mu.Lock()
	for c.err == nil && !c.goAway && c.peerMax != 0 && c.active >= int(c.peerMax) {
		c.cond.Wait()
	}
	if err := c.unusable(); err != nil {
		c.mu.Unlock()
		done(nil, err)
		return
	}
	c.active++
	c.mu.Unlock()

	c.wmu.Lock()
	if c.next > maxStreamID {
		c.wmu.Unlock()
		c.mu.Lock()
		c.active--
		c.cond.Broadcast()
		c.mu.Unlock()
		done(nil, status.Error(codes.Unavailable, "h2client: stream ids exhausted"))
		return
	}
	s.id = c.next
	c.next += 2
	c.mu.Lock()
	if err := c.unusable(); err != nil {
		c.active--
		c.mu.Unlock()
		c.wmu.Unlock()
		done(nil, err)
		return
	}
	s.sendWin = c.peerWin
	c.streams[s.id] = s
	if timeout > 0 {
		id := s.id
		s.deadline = time.Now().Add(timeout)
		s.timer = time.AfterFunc(timeout, func() { c.expire(id) })
	}
	c.mu.Unlock()

	c.hbuf.Reset()
	c.field(":method", "POST")
	c.field(":scheme", "http")
	c.field(":path", method)
	c.field(":authority", c.authority)
	c.field("content-type", "application/grpc")
	c.field("te", "trailers")
	c.field("user-agent", c.opts.UserAgent)
	if timeout > 0 {
		c.field("grpc-timeout", grpcwire.EncodeTimeout(timeout))
	}
	err := c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: s.id, BlockFragment: c.hbuf.Bytes(), EndHeaders: true})
	if err != nil {
		c.wmu.Unlock()
		c.fail(status.Errorf(codes.Unavailable, "h2client: write headers: %v", err))
		return
	}
	var prefix [grpcwire.PrefixLen]byte
	grpcwire.PutPrefix(prefix[:], false, uint32(len(msg)))
	c.writeBody(s, prefix[:], msg)
}

func (c *Conn) field(name, value string) {
	c.henc.WriteField(hpack.HeaderField{Name: name, Value: value})
}

// writeBody writes the gRPC prefix and msg as DATA frames, the last with
// END_STREAM, as the windows allow. It is called holding wmu and returns
// having released it; it lets go of wmu (after a flush) while it waits
// for window, so other calls and the reader's acks are not held up.
func (c *Conn) writeBody(s *stream, prefix, msg []byte) {
	total := len(prefix) + len(msg)
	sent := 0
	for {
		c.mu.Lock()
		n := min(int64(total-sent), c.sendWin, s.sendWin, int64(c.peerFrame))
		for n <= 0 && total > sent && c.err == nil && c.streams[s.id] == s {
			// Out of window: flush what is written and wait without wmu.
			c.mu.Unlock()
			err := c.bw.Flush()
			c.wmu.Unlock()
			if err != nil {
				c.fail(status.Errorf(codes.Unavailable, "h2client: flush: %v", err))
				return
			}
			c.mu.Lock()
			for c.err == nil && c.streams[s.id] == s && min(c.sendWin, s.sendWin) <= 0 {
				c.cond.Wait()
			}
			c.mu.Unlock()
			c.wmu.Lock()
			c.mu.Lock()
			n = min(int64(total-sent), c.sendWin, s.sendWin, int64(c.peerFrame))
		}
		if c.err != nil || c.streams[s.id] != s {
			// The call ended (deadline, reset, failed connection) while its
			// body waited: whoever ended it has answered done.
			c.mu.Unlock()
			c.wmu.Unlock()
			return
		}
		c.sendWin -= n
		s.sendWin -= n
		c.mu.Unlock()
		// The frame is the prefix and message bytes [sent, sent+n): a slice
		// of msg, except the first, which joins the prefix to its start.
		lo, hi := sent, sent+int(n)
		var frame []byte
		if lo >= len(prefix) {
			frame = msg[lo-len(prefix) : hi-len(prefix)]
		} else {
			frame = append(c.scratch[:0], prefix[lo:min(hi, len(prefix))]...)
			frame = append(frame, msg[:max(hi-len(prefix), 0)]...)
			c.scratch = frame[:0]
		}
		sent += int(n)
		last := sent == total
		if err := c.fr.WriteData(s.id, last, frame); err != nil {
			c.wmu.Unlock()
			c.fail(status.Errorf(codes.Unavailable, "h2client: write data: %v", err))
			return
		}
		if last {
			err := c.bw.Flush()
			c.wmu.Unlock()
			if err != nil {
				c.fail(status.Errorf(codes.Unavailable, "h2client: flush: %v", err))
			}
			return
		}
	}
}

// unusable is the error new calls get, nil while the connection takes
// them. Called holding mu.
func (c *Conn) unusable() error {
	if c.err != nil {
		return c.err
	}
	if c.goAway {
		return status.Error(codes.Unavailable, "h2client: the server is going away (GOAWAY)")
	}
	return nil
}

// expire ends a call whose deadline passed and resets its stream.
func (c *Conn) expire(id uint32) {
	s := c.end(id)
	if s == nil {
		return
	}
	c.wmu.Lock()
	err := c.fr.WriteRSTStream(id, http2.ErrCodeCancel)
	if err == nil {
		err = c.bw.Flush()
	}
	c.wmu.Unlock()
	s.done(nil, status.Error(codes.DeadlineExceeded, "h2client: deadline exceeded"))
	if err != nil {
		c.fail(status.Errorf(codes.Unavailable, "h2client: write reset: %v", err))
	}
}

// end removes stream id and returns it, or nil if it already ended: the
// one who removes a stream answers its done.
func (c *Conn) end(id uint32) *stream {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.streams[id]
	if s == nil {
		return nil
	}
	delete(c.streams, id)
	c.active--
	c.cond.Broadcast()
	if s.timer != nil {
		s.timer.Stop()
	}
	return s
}

// fail makes the connection unusable with err, closes it and fails every
// call in flight with err. Only the first error counts.
func (c *Conn) fail(err error) {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return
	}
	c.err = err
	ended := c.streams
	c.streams = make(map[uint32]*stream)
	c.active = 0
	c.cond.Broadcast()
	c.mu.Unlock()
	c.nc.Close()
	for _, s := range ended {
		if s.timer != nil {
			s.timer.Stop()
		}
		s.done(nil, err)
	}
}
