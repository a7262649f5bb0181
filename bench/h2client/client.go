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
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strconv"
	"sync"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
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
		c.field("grpc-timeout", encodeTimeout(timeout))
	}
	err := c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: s.id, BlockFragment: c.hbuf.Bytes(), EndHeaders: true})
	if err != nil {
		c.wmu.Unlock()
		c.fail(status.Errorf(codes.Unavailable, "h2client: write headers: %v", err))
		return
	}
	var prefix [5]byte
	binary.BigEndian.PutUint32(prefix[1:], uint32(len(msg)))
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

// read is the connection's reader: it applies the server's frames and
// finishes calls. It owns the framer's read side.
func (c *Conn) read() {
	defer close(c.readerDone)
	for {
		f, err := c.fr.ReadFrame()
		if err != nil {
			var se http2.StreamError
			if errors.As(err, &se) {
				c.resetStream(se.StreamID, se.Code, status.Errorf(codes.Internal, "h2client: stream error: %v", se))
				continue
			}
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			c.fail(status.Errorf(codes.Unavailable, "h2client: connection lost: %v", err))
			return
		}
		if err := c.frame(f); err != nil {
			c.fail(status.Errorf(codes.Unavailable, "h2client: %v", err))
			return
		}
	}
}

// frame applies one frame; an error is a connection error.
func (c *Conn) frame(f http2.Frame) error {
	switch f := f.(type) {
	case *http2.SettingsFrame:
		if f.IsAck() {
			return nil
		}
		if err := c.settings(f); err != nil {
			return err
		}
	case *http2.PingFrame:
		if f.IsAck() {
			if f.Data == probeData {
				c.mu.Lock()
				c.probing = false
				c.mu.Unlock()
			}
			return nil
		}
		return c.write(func() error { return c.fr.WritePing(true, f.Data) })
	case *http2.WindowUpdateFrame:
		c.mu.Lock()
		if f.StreamID == 0 {
			c.sendWin += int64(f.Increment)
		} else if s := c.streams[f.StreamID]; s != nil {
			s.sendWin += int64(f.Increment)
		}
		c.cond.Broadcast()
		c.mu.Unlock()
	case *http2.GoAwayFrame:
		c.mu.Lock()
		c.goAway = true
		var late []*stream
		for id, s := range c.streams {
			if id > f.LastStreamID {
				late = append(late, s)
			}
		}
		c.cond.Broadcast()
		c.mu.Unlock()
		for _, s := range late {
			if c.end(s.id) != nil {
				s.done(nil, status.Errorf(codes.Unavailable, "h2client: the server went away before the call (GOAWAY %v)", f.ErrCode))
			}
		}
	case *http2.RSTStreamFrame:
		if s := c.end(f.StreamID); s != nil {
			code := resetCode(f.ErrCode)
			if code == codes.Canceled && !s.deadline.IsZero() && !time.Now().Before(s.deadline) {
				// The server saw the deadline pass first and cancelled the
				// stream, as grpc-go's client reads it too.
				code = codes.DeadlineExceeded
			}
			s.done(nil, status.Errorf(code, "h2client: the server reset the stream: %v", f.ErrCode))
		}
	case *http2.MetaHeadersFrame:
		c.headers(f)
	case *http2.DataFrame:
		return c.data(f)
	}
	return nil
}

// settings applies the server's SETTINGS and acknowledges them.
func (c *Conn) settings(f *http2.SettingsFrame) error {
	tableSize, setTable := uint32(0), false
	c.mu.Lock()
	err := f.ForeachSetting(func(s http2.Setting) error {
		if err := s.Valid(); err != nil {
			return err
		}
		switch s.ID {
		case http2.SettingHeaderTableSize:
			tableSize, setTable = s.Val, true
		case http2.SettingMaxFrameSize:
			c.peerFrame = s.Val
		case http2.SettingMaxConcurrentStreams:
			c.peerMax = s.Val
			if c.peerMax == 0 {
				// Zero streams would stall every call: wait for a
				// GOAWAY or a later setting rather than spin.
				c.peerMax = 1
			}
		case http2.SettingInitialWindowSize:
			delta := int64(s.Val) - c.peerWin
			c.peerWin = int64(s.Val)
			for _, st := range c.streams {
				st.sendWin += delta
			}
		}
		return nil
	})
	c.cond.Broadcast()
	c.mu.Unlock()
	if err != nil {
		return fmt.Errorf("bad settings: %w", err)
	}
	return c.write(func() error {
		if setTable {
			// Later header blocks use no more dynamic table than the
			// server keeps; the encoder announces the change itself.
			c.henc.SetMaxDynamicTableSizeLimit(tableSize)
		}
		return c.fr.WriteSettingsAck()
	})
}

// write runs w under the write lock and flushes.
func (c *Conn) write(w func() error) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if err := w(); err != nil {
		return err
	}
	return c.bw.Flush()
}

// resetStream ends a stream the reader found broken.
func (c *Conn) resetStream(id uint32, code http2.ErrCode, err error) {
	s := c.end(id)
	if s == nil {
		return
	}
	if werr := c.write(func() error { return c.fr.WriteRSTStream(id, code) }); werr != nil {
		c.fail(status.Errorf(codes.Unavailable, "h2client: write reset: %v", werr))
	}
	s.done(nil, err)
}

// headers handles response headers and trailers.
func (c *Conn) headers(f *http2.MetaHeadersFrame) {
	c.mu.Lock()
	s := c.streams[f.StreamID]
	if s == nil {
		c.mu.Unlock()
		return
	}
	first := !s.headers
	s.headers = true
	if first {
		if v := f.PseudoValue("status"); v != "" {
			s.httpCode, _ = strconv.Atoi(v)
		}
	}
	c.mu.Unlock()
	if !f.StreamEnded() {
		if first && s.httpCode != 200 {
			c.resetStream(f.StreamID, http2.ErrCodeProtocol, httpStatusError(s.httpCode))
		}
		return
	}
	// Trailers, or a trailers-only response.
	if c.end(f.StreamID) == nil {
		return
	}
	code, msg, hasStatus := grpcStatus(f)
	switch {
	case !hasStatus && s.httpCode != 200:
		s.done(nil, httpStatusError(s.httpCode))
	case !hasStatus:
		s.done(nil, status.Error(codes.Internal, "h2client: the response ended without grpc-status"))
	case code != codes.OK:
		s.done(nil, status.Error(code, msg))
	default:
		resp, err := unframe(s.msg)
		s.done(resp, err)
	}
}

// data collects a response's bytes and returns receive window.
func (c *Conn) data(f *http2.DataFrame) error {
	n := int64(f.Length)
	c.mu.Lock()
	c.unacked += n
	var connInc uint32
	if c.unacked >= int64(8*c.opts.WindowSize) {
		connInc, c.unacked = uint32(c.unacked), 0
	}
	probe := n > 0 && !c.probing && !c.opts.NoBandwidthProbe
	if probe {
		c.probing = true
	}
	s := c.streams[f.StreamID]
	var streamInc uint32
	tooBig := false
	if s != nil {
		s.msg = append(s.msg, f.Data()...)
		tooBig = len(s.msg) > c.opts.MaxRecvMsgSize+5
		s.unacked += n
		if s.unacked >= int64(c.opts.WindowSize/2) && !f.StreamEnded() {
			streamInc, s.unacked = uint32(s.unacked), 0
		}
	}
	c.mu.Unlock()
	if connInc > 0 || streamInc > 0 || probe {
		err := c.write(func() error {
			if probe {
				if err := c.fr.WritePing(false, probeData); err != nil {
					return err
				}
			}
			if connInc > 0 {
				if err := c.fr.WriteWindowUpdate(0, connInc); err != nil {
					return err
				}
			}
			if streamInc > 0 {
				return c.fr.WriteWindowUpdate(f.StreamID, streamInc)
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("write window update or probe: %w", err)
		}
	}
	switch {
	case s == nil:
	case tooBig:
		c.resetStream(f.StreamID, http2.ErrCodeCancel, status.Errorf(codes.ResourceExhausted,
			"h2client: response larger than the limit of %d bytes", c.opts.MaxRecvMsgSize))
	case f.StreamEnded():
		if c.end(f.StreamID) != nil {
			s.done(nil, status.Error(codes.Internal, "h2client: the server ended the stream without trailers"))
		}
	}
	return nil
}

// probeData marks the client's bandwidth-probe PINGs.
var probeData = [8]byte{'r', 'e', 'c', 'm', 'e', 's', 'h', 1}

// unframe checks the gRPC length prefix and returns the one message.
func unframe(b []byte) ([]byte, error) {
	if len(b) < 5 {
		return nil, status.Errorf(codes.Internal, "h2client: response of %d bytes, shorter than a message prefix", len(b))
	}
	if b[0] != 0 {
		return nil, status.Error(codes.Internal, "h2client: compressed response (no compression was asked for)")
	}
	n := binary.BigEndian.Uint32(b[1:5])
	if int64(n) != int64(len(b)-5) {
		return nil, status.Errorf(codes.Internal, "h2client: response prefix says %d bytes, %d came", n, len(b)-5)
	}
	return b[5:], nil
}

// grpcStatus reads grpc-status and grpc-message from trailers.
func grpcStatus(f *http2.MetaHeadersFrame) (codes.Code, string, bool) {
	v := f.RegularFields()
	var code codes.Code
	var msg string
	has := false
	for _, hf := range v {
		switch hf.Name {
		case "grpc-status":
			n, err := strconv.ParseUint(hf.Value, 10, 32)
			if err != nil {
				return codes.Internal, "h2client: malformed grpc-status " + strconv.Quote(hf.Value), true
			}
			code, has = codes.Code(n), true
		case "grpc-message":
			if m, err := url.PathUnescape(hf.Value); err == nil {
				msg = m
			} else {
				msg = hf.Value
			}
		}
	}
	return code, msg, has
}

// httpStatusError maps a non-200 HTTP status as gRPC's spec does.
func httpStatusError(code int) error {
	c := codes.Unknown
	switch code {
	case 400:
		c = codes.Internal
	case 401:
		c = codes.Unauthenticated
	case 403:
		c = codes.PermissionDenied
	case 404:
		c = codes.Unimplemented
	case 429, 502, 503, 504:
		c = codes.Unavailable
	}
	return status.Errorf(c, "h2client: HTTP status %d", code)
}

// resetCode maps an RST_STREAM error code as gRPC's spec does.
func resetCode(e http2.ErrCode) codes.Code {
	switch e {
	case http2.ErrCodeRefusedStream:
		return codes.Unavailable
	case http2.ErrCodeCancel:
		return codes.Canceled
	case http2.ErrCodeEnhanceYourCalm:
		return codes.ResourceExhausted
	case http2.ErrCodeInadequateSecurity:
		return codes.PermissionDenied
	}
	return codes.Internal
}

// encodeTimeout writes d as a grpc-timeout value: at most eight digits,
// in the finest unit that fits, rounded up so the server never sees a
// shorter deadline than the client keeps.
func encodeTimeout(d time.Duration) string {
	const maxDigits = 99999999
	units := []struct {
		d time.Duration
		s string
	}{{time.Nanosecond, "n"}, {time.Microsecond, "u"}, {time.Millisecond, "m"}, {time.Second, "S"}, {time.Minute, "M"}, {time.Hour, "H"}}
	for _, u := range units {
		n := (d + u.d - 1) / u.d
		if n <= maxDigits {
			return strconv.FormatInt(int64(n), 10) + u.s
		}
	}
	return strconv.Itoa(maxDigits) + "H"
}
