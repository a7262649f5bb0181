package h2unary

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// maxFrameSize is the largest frame this server reads (advertised in
// SETTINGS_MAX_FRAME_SIZE): large requests arrive in fewer frames.
const maxFrameSize = 1 << 20

// maxWindow is the largest flow-control window HTTP/2 allows.
const maxWindow = 1<<31 - 1

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

	// answered is set whenever response headers or data are written: a
	// ping after them is no strike (keepalive enforcement, as grpc-go's:
	// clients probe bandwidth with a ping when data arrives).
	answered atomic.Bool
	// calls counts the handlers running, so that a stop waits for them.
	calls sync.WaitGroup

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
	pending   []*stream
	goingAway bool
	closed    bool
	// ackPending: the write buffer holds PING acks left for an answer to
	// carry out (onPing), ackBytes of them and nothing else while its
	// length is still that. ackTimer flushes them after pingAckDelay;
	// ackArmed while it runs.
	ackPending bool
	ackBytes   int
	ackTimer   *time.Timer
	ackArmed   bool
	ackSince   time.Time // when the oldest ack still buffered was written
}

// pingAckDelay bounds how long a PING ack may wait in the write buffer for
// an answer to ride out with. gRPC clients probe bandwidth with a PING
// after every response they read; flushed at once, each ack is a write
// syscall of its own (a third of a lean frontend's writes at B_req 1),
// though the client's next request, and so another answer, usually
// follows within a millisecond. Clients only time the ack to size their
// windows, and keepalive waits seconds for it.
//
// While a call is in flight on the connection its answer is sure to come,
// so the acks wait for it, up to pingAckMaxDelay: under load the answer
// often takes longer than pingAckDelay (queueing), and with a timer of
// 5 ms alone 0.3 writes per call at B_req 1, 64 clients, were acks flushed
// on their own (9 % of a lean frontend's CPU). 25 ms is past the 20 ms
// latency target: only an answer that has already missed it leaves its
// acks to the timer.
const (
	pingAckDelay    = 5 * time.Millisecond
	pingAckMaxDelay = 25 * time.Millisecond
)

// stream is one call.
type stream struct {
	id     uint32
	path   string
	m      method
	ctx    context.Context
	cancel context.CancelFunc
	// Reader-owned while the request arrives.
	buf         []byte // the request: 5-byte prefix, then the message
	msgLen      int    // from the prefix; -1 until it has arrived
	recvUnacked int32  // stream bytes not yet returned by WINDOW_UPDATE
	// Guarded by wmu.
	requestDone bool // the client ended its side
	running     bool // a handler is running or about to
	reset       bool // the client reset it, or it was refused
	sendWindow  int64
	out         []byte // response data not yet sent
}

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

// closeLocked ends the connection; wmu held. The reader sees the closed
// socket and returns.
func (c *conn) closeLocked() {
	if c.closed {
		return
	}
	c.closed = true
	if c.ackTimer != nil {
		c.ackTimer.Stop()
	}
	c.end()
	c.raw.Close()
}

// close ends the connection at once without waiting for wmu, which a
// write to a client that does not read may hold: the closed socket fails
// that write.
func (c *conn) close() {
	c.end()
	c.raw.Close()
}

// goAway tells the client to open no more streams; the connection closes
// once the streams it has are answered.
func (c *conn) goAway() {
	c.lock()
	defer c.unlock()
	c.goAwayLocked(http2.ErrCodeNo, "")
}

func (c *conn) goAwayLocked(code http2.ErrCode, debug string) {
	if c.closed || c.fr == nil {
		c.closeLocked() // still in the handshake: nothing to finish
		return
	}
	if !c.goingAway {
		c.goingAway = true
		_ = c.fr.WriteGoAway(c.lastID, code, []byte(debug))
	}
	if len(c.streams) == 0 || code != http2.ErrCodeNo {
		_ = c.bw.Flush()
		c.closeLocked()
	}
}

// serve is the connection's reader: the handshake, then frames until the
// connection ends.
func (c *conn) serve() {
	defer func() {
		c.lock()
		c.closeLocked()
		c.wmu.Unlock()
		c.calls.Wait()
	}()
	_ = c.raw.SetDeadline(time.Now().Add(c.s.opts.HandshakeTimeout))
	nc, err := c.s.handshake(c.raw)
	if err != nil {
		c.s.opts.Logger.Debug("h2unary: connection refused", "remote", c.raw.RemoteAddr().String(), "err", err)
		return
	}
	c.br = bufio.NewReaderSize(nc, 32<<10)
	preface := make([]byte, len(http2.ClientPreface))
	if _, err := io.ReadFull(c.br, preface); err != nil || string(preface) != http2.ClientPreface {
		c.s.opts.Logger.Debug("h2unary: no HTTP/2 client preface", "remote", c.raw.RemoteAddr().String(), "err", err)
		return
	}
	_ = c.raw.SetDeadline(time.Time{})

	o := c.s.opts
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
	c.unlock()

	for {
		f, err := c.fr.ReadFrame()
		if err != nil {
			var se http2.StreamError
			if errors.As(err, &se) {
				c.resetStream(se.StreamID, se.Code)
				continue
			}
			var ce http2.ConnectionError
			if errors.As(err, &ce) {
				c.connError(http2.ErrCode(ce), err.Error())
			}
			return
		}
		if !c.handle(f) {
			return
		}
	}
}

// connError ends the connection with a GOAWAY carrying code.
func (c *conn) connError(code http2.ErrCode, debug string) {
	c.lock()
	defer c.unlock()
	c.goAwayLocked(code, debug)
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
		return c.onBlock(f.HeaderBlockFragment(), f.HeadersEnded())
	case *http2.ContinuationFrame: // the Framer checks that one is due
		return c.onBlock(f.HeaderBlockFragment(), f.HeadersEnded())
	case *http2.DataFrame:
		return c.onData(f)
	case *http2.WindowUpdateFrame:
		return c.onWindowUpdate(f)
	case *http2.RSTStreamFrame:
		c.onReset(f.StreamID)
	case *http2.PingFrame:
		return c.onPing(f)
	case *http2.GoAwayFrame:
		// The client opens nothing more; finish what it has, then close.
		c.goAway()
	case *http2.PushPromiseFrame:
		c.connError(http2.ErrCodeProtocol, "client sent PUSH_PROMISE")
		return false
	}
	return true
}

func (c *conn) onSettings(f *http2.SettingsFrame) bool {
	c.lock()
	defer c.unlock()
	err := f.ForeachSetting(func(st http2.Setting) error {
		switch st.ID {
		case http2.SettingInitialWindowSize:
			delta := int64(st.Val) - c.peerWindow
			c.peerWindow = int64(st.Val)
			for _, s := range c.streams {
				s.sendWindow += delta
			}
		case http2.SettingMaxFrameSize:
			c.peerFrame = st.Val
		case http2.SettingHeaderTableSize:
			c.henc.SetMaxDynamicTableSizeLimit(st.Val)
		}
		return nil
	})
	if err != nil {
		c.goAwayLocked(http2.ErrCodeProtocol, err.Error())
		return false
	}
	_ = c.fr.WriteSettingsAck()
	c.sendPendingLocked()
	return true
}

func (c *conn) onPing(f *http2.PingFrame) bool {
	if f.IsAck() {
		return true
	}
	now := time.Now()
	if c.answered.Swap(false) {
		c.pingStrikes = 0
	} else if !c.lastPing.IsZero() && now.Sub(c.lastPing) < c.s.opts.KeepaliveMinTime {
		c.pingStrikes++
	}
	c.lastPing = now
	c.lock()
	if c.pingStrikes > 2 {
		c.goAwayLocked(http2.ErrCodeEnhanceYourCalm, "too_many_pings")
		c.unlock()
		return false
	}
	// The ack waits for the next answer's flush, or the timer's, unless
	// something else is buffered already: that goes out now, with it.
	wait := c.bw.Buffered() == 0 || c.onlyAcks()
	_ = c.fr.WritePing(true, f.Data)
	if wait && !c.closed {
		if !c.ackPending {
			c.ackSince = now
		}
		c.ackPending, c.ackBytes = true, c.bw.Buffered()
		if !c.ackArmed {
			c.ackArmed = true
			if c.ackTimer == nil {
				c.ackTimer = time.AfterFunc(pingAckDelay, c.flushAcks)
			} else {
				c.ackTimer.Reset(pingAckDelay)
			}
		}
	}
	c.unlock()
	return true
}

// flushAcks sends the PING acks onPing left buffered, unless an answer
// took them out already or a call in flight will (pingAckMaxDelay).
func (c *conn) flushAcks() {
	c.lock()
	if c.ackPending && !c.closed && len(c.streams) > 0 {
		if left := pingAckMaxDelay - time.Since(c.ackSince); left > 0 {
			c.ackTimer.Reset(min(left, pingAckDelay))
			c.wmu.Unlock() // unflushed: the acks wait for the answer
			return
		}
	}
	c.ackArmed, c.ackPending = false, false
	c.unlock()
}

func (c *conn) onWindowUpdate(f *http2.WindowUpdateFrame) bool {
	c.lock()
	defer c.unlock()
	inc := int64(f.Increment)
	if f.StreamID == 0 {
		if c.sendConn+inc > maxWindow {
			c.goAwayLocked(http2.ErrCodeFlowControl, "connection window overflow")
			return false
		}
		c.sendConn += inc
	} else if s := c.streams[f.StreamID]; s != nil {
		if s.sendWindow+inc > maxWindow {
			c.resetLocked(s, http2.ErrCodeFlowControl)
			return true
		}
		s.sendWindow += inc
	}
	c.sendPendingLocked()
	return true
}

// onReset: the client gave up on a stream; its handler's context ends and
// its answer, if any, is dropped.
func (c *conn) onReset(id uint32) {
	c.lock()
	defer c.unlock()
	if s := c.streams[id]; s != nil {
		s.reset = true
		s.cancel()
		if !s.running {
			c.removeLocked(s)
		}
	}
}

// resetStream resets a stream the Framer found at fault.
func (c *conn) resetStream(id uint32, code http2.ErrCode) {
	c.lock()
	defer c.unlock()
	if s := c.streams[id]; s != nil {
		c.resetLocked(s, code)
		return
	}
	_ = c.fr.WriteRSTStream(id, code)
}

// resetLocked resets s with code; its handler, if running, finds it reset.
func (c *conn) resetLocked(s *stream, code http2.ErrCode) {
	_ = c.fr.WriteRSTStream(s.id, code)
	s.reset = true
	s.cancel()
	if !s.running {
		c.removeLocked(s)
	}
}

// removeLocked forgets a finished stream; the connection closes after the
// last one when it is going away.
func (c *conn) removeLocked(s *stream) {
	if c.streams[s.id] != s {
		return
	}
	delete(c.streams, s.id)
	s.cancel()
	for i, p := range c.pending {
		if p == s {
			c.pending = append(c.pending[:i], c.pending[i+1:]...)
			break
		}
	}
	if c.goingAway && len(c.streams) == 0 {
		_ = c.bw.Flush()
		c.closeLocked()
	}
}

// reserved are the request headers that are the transport's, not the
// call's metadata.
var reserved = map[string]bool{
	"content-type": true, "te": true, "grpc-timeout": true, "grpc-encoding": true,
	"grpc-accept-encoding": true, "user-agent": true, "connection": true,
}

// onBlock decodes a fragment of the header block being read and, once it
// is complete, acts on it.
func (c *conn) onBlock(frag []byte, last bool) bool {
	if err := c.hdr.write(frag, last); err != nil {
		var se http2.StreamError
		if errors.As(err, &se) {
			c.resetStream(se.StreamID, se.Code)
			return true
		}
		var ce http2.ConnectionError
		errors.As(err, &ce)
		c.connError(http2.ErrCode(ce), "header block: "+err.Error())
		return false
	}
	if !last {
		return true
	}
	return c.onHeaders(c.hdr)
}

func (c *conn) onHeaders(f *headerBlock) bool {
	id := f.streamID
	c.lock()
	if s := c.streams[id]; s != nil {
		// Trailers from the client: they only end its side.
		c.unlock()
		if f.endStream {
			c.endRequest(s)
		}
		return true
	}
	if id%2 == 0 || id <= c.lastID {
		c.goAwayLocked(http2.ErrCodeProtocol, "stream id "+strconv.FormatUint(uint64(id), 10)+" out of order")
		c.unlock()
		return false
	}
	c.lastID = id
	switch {
	case c.goingAway:
		_ = c.fr.WriteRSTStream(id, http2.ErrCodeRefusedStream)
		c.unlock()
		return true
	case uint32(len(c.streams)) >= c.s.opts.MaxConcurrentStreams:
		// A call counts until its handler returns, so a flood of
		// resets cannot run more handlers than this at once.
		_ = c.fr.WriteRSTStream(id, http2.ErrCodeRefusedStream)
		c.unlock()
		return true
	}
	c.unlock()
	c.pingStrikes = 0

	var (
		httpMethod, path, contentType, timeout string
		md                                     metadata.MD
	)
	for _, hf := range f.fields {
		switch hf.Name {
		case ":method":
			httpMethod = hf.Value
		case ":path":
			path = hf.Value
		case "content-type":
			contentType = hf.Value
		case "grpc-timeout":
			timeout = hf.Value
		}
		if strings.HasPrefix(hf.Name, ":") || reserved[hf.Name] {
			continue
		}
		v := hf.Value
		if strings.HasSuffix(hf.Name, "-bin") {
			if b, err := decodeBinHeader(v); err == nil {
				v = string(b)
			}
		}
		if md == nil {
			md = metadata.MD{}
		}
		md[hf.Name] = append(md[hf.Name], v)
	}
	s := &stream{id: id, path: path, msgLen: -1}
	ctx := c.ctx
	if len(md) > 0 {
		ctx = metadata.NewIncomingContext(ctx, md)
	}
	d, ok := parseTimeout(timeout)
	if max := c.s.opts.MaxCallTime; max > 0 && (!ok || d > max) {
		d, ok = max, true
	}
	if ok {
		s.ctx, s.cancel = context.WithTimeout(ctx, d)
	} else {
		s.ctx, s.cancel = context.WithCancel(ctx)
	}
	c.lock()
	s.sendWindow = c.peerWindow
	c.streams[id] = s
	c.unlock()

	if f.truncated {
		c.refuse(s, 431, codes.Internal, "request headers are larger than the limit of "+strconv.Itoa(DefaultMaxHeaderListSize)+" bytes")
		return true
	}
	if httpMethod != "POST" {
		c.refuse(s, 405, codes.Internal, fmt.Sprintf("HTTP method %q: gRPC calls are POST", httpMethod))
		return true
	}
	if ct := contentType; ct != "application/grpc" && !strings.HasPrefix(ct, "application/grpc+") && !strings.HasPrefix(ct, "application/grpc;") {
		c.refuse(s, 415, codes.Internal, fmt.Sprintf("content-type %q: want application/grpc", ct))
		return true
	}
	m, ok := c.s.methods[path]
	if !ok {
		msg := fmt.Sprintf("unknown method %s", path)
		if c.s.streams[path] {
			msg = fmt.Sprintf("streaming method %s is not served by this transport (h2unary serves unary calls only)", path)
		}
		c.refuse(s, 200, codes.Unimplemented, msg)
		return true
	}
	s.m = m
	if admit := c.s.opts.Admit; admit != nil {
		if err := admit(path); err != nil {
			c.refuseWith(s, err)
			return true
		}
	}
	if f.endStream {
		c.endRequest(s)
	}
	return true
}

// refuseWith is refuse with a status error's code and message.
func (c *conn) refuseWith(s *stream, err error) {
	st := status.Convert(err)
	c.refuse(s, 200, st.Code(), st.Message())
}

// refuse answers s with an error before its request is read (trailers
// only) and resets it if the client is still sending.
func (c *conn) refuse(s *stream, httpStatus int, code codes.Code, msg string) {
	c.lock()
	defer c.unlock()
	c.writeTrailersOnly(s, httpStatus, code, msg)
	if !s.requestDone {
		_ = c.fr.WriteRSTStream(s.id, http2.ErrCodeNo)
	}
	s.reset = true
	c.removeLocked(s)
}

func (c *conn) onData(f *http2.DataFrame) bool {
	n := int32(f.Length) // padding counts against the windows too
	c.recvConn += n
	if c.recvConn > c.s.opts.ConnWindow {
		c.connError(http2.ErrCodeFlowControl, "connection window exceeded")
		return false
	}
	c.lock()
	s := c.streams[f.StreamID]
	if c.recvConn >= c.s.opts.ConnWindow/2 {
		_ = c.fr.WriteWindowUpdate(0, uint32(c.recvConn))
		c.recvConn = 0
	}
	if s == nil || s.reset || s.requestDone {
		if f.StreamID > c.lastID {
			c.goAwayLocked(http2.ErrCodeProtocol, "DATA on a stream never opened")
			c.unlock()
			return false
		}
		c.unlock()
		return true // a stream already answered or reset: discard
	}
	c.unlock()
	if err := s.add(f.Data(), c.s.opts.MaxRecvMsgSize); err != nil {
		c.refuseWith(s, err)
		return true
	}
	if f.StreamEnded() {
		c.endRequest(s)
		return true
	}
	s.recvUnacked += n
	if s.recvUnacked >= c.s.opts.StreamWindow/2 {
		c.lock()
		_ = c.fr.WriteWindowUpdate(s.id, uint32(s.recvUnacked))
		c.unlock()
		s.recvUnacked = 0
	}
	return true
}

// preallocLimit is the most a request's buffer is given before its bytes
// arrive.
const preallocLimit = 64 << 10

// add appends request bytes, checking the message prefix as soon as it is
// there: one message, uncompressed, within limit bytes.
func (s *stream) add(data []byte, limit int) error {
	if s.msgLen < 0 && len(s.buf)+len(data) >= 5 {
		var prefix [5]byte
		k := copy(prefix[:], s.buf)
		copy(prefix[k:], data)
		if prefix[0] != 0 {
			return status.Error(codes.Unimplemented, "compressed request: this server accepts identity encoding only")
		}
		s.msgLen = int(binary.BigEndian.Uint32(prefix[1:]))
		if s.msgLen > limit {
			return status.Errorf(codes.ResourceExhausted, "request message of %d bytes is larger than the limit of %d", s.msgLen, limit)
		}
		// Room for the whole of a small message at once; a large one grows
		// as its bytes arrive, so a prefix alone (cheap to send) cannot
		// make the server allocate the limit.
		buf := make([]byte, len(s.buf), min(5+s.msgLen, preallocLimit))
		copy(buf, s.buf)
		s.buf = buf
	}
	if s.msgLen >= 0 && len(s.buf)+len(data) > 5+s.msgLen {
		return status.Error(codes.Internal, "more than one request message in a unary call")
	}
	s.buf = append(s.buf, data...)
	return nil
}

// endRequest: the client's side is complete; the call runs.
func (c *conn) endRequest(s *stream) {
	c.lock()
	if s.reset || s.requestDone {
		c.unlock()
		return
	}
	s.requestDone = true
	c.unlock()
	if s.msgLen < 0 || len(s.buf) != 5+s.msgLen {
		c.refuse(s, 200, codes.Internal, fmt.Sprintf("request ended after %d bytes, before its whole message", len(s.buf)))
		return
	}
	c.lock()
	s.running = true
	c.unlock()
	c.calls.Add(1)
	c.s.run(func() { c.call(s) })
}

// call runs the handler and answers.
func (c *conn) call(s *stream) {
	defer c.calls.Done()
	msg := s.buf[5:]
	dec := func(v any) error {
		if u := c.s.opts.Unmarshal; u != nil {
			if err := u(msg, v); err != nil {
				return status.Errorf(codes.Internal, "grpc: error unmarshalling request: %v", err)
			}
			return nil
		}
		pm, ok := v.(proto.Message)
		if !ok {
			return status.Errorf(codes.Internal, "h2unary: %T is not a protobuf message", v)
		}
		if err := proto.Unmarshal(msg, pm); err != nil {
			return status.Errorf(codes.Internal, "grpc: error unmarshalling request: %v", err)
		}
		return nil
	}
	resp, err := s.m.handler(s.m.impl, s.ctx, dec, c.s.opts.Interceptor)
	s.buf = nil
	var out []byte
	if err == nil {
		pm, ok := resp.(proto.Message)
		if !ok {
			err = status.Errorf(codes.Internal, "h2unary: response %T is not a protobuf message", resp)
		} else if out, err = (proto.MarshalOptions{}).MarshalAppend(make([]byte, 5, 5+proto.Size(pm)), pm); err != nil {
			err = status.Errorf(codes.Internal, "grpc: error marshalling response: %v", err)
		} else {
			binary.BigEndian.PutUint32(out[1:5], uint32(len(out)-5))
		}
	}
	c.lock()
	defer c.unlock()
	s.running = false
	if s.reset || c.closed {
		c.removeLocked(s)
		return
	}
	if err != nil {
		st := status.Convert(err)
		c.writeTrailersOnly(s, 200, st.Code(), st.Message())
		c.removeLocked(s)
		return
	}
	c.hbuf.Reset()
	c.writeField(":status", "200")
	c.writeField("content-type", "application/grpc")
	_ = c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: s.id, BlockFragment: c.hbuf.Bytes(), EndHeaders: true})
	c.answered.Store(true)
	s.out = out
	if !c.sendLocked(s) {
		c.pending = append(c.pending, s)
	}
}

// sendLocked writes as much of s's response as the windows allow, then
// its trailers (status OK: errors are answered trailers-only); true when
// it is all written.
func (c *conn) sendLocked(s *stream) bool {
	for len(s.out) > 0 {
		n := min(int64(len(s.out)), c.sendConn, s.sendWindow, int64(c.peerFrame))
		if n <= 0 {
			return false
		}
		_ = c.fr.WriteData(s.id, false, s.out[:n])
		c.answered.Store(true)
		s.out = s.out[n:]
		c.sendConn -= n
		s.sendWindow -= n
	}
	c.hbuf.Reset()
	c.writeField("grpc-status", "0")
	_ = c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: s.id, BlockFragment: c.hbuf.Bytes(), EndHeaders: true, EndStream: true})
	c.removeLocked(s)
	return true
}

// sendPendingLocked resumes the answers flow control held back, in order;
// one held by its own stream's window does not hold up the others.
func (c *conn) sendPendingLocked() {
	for _, s := range slices.Clone(c.pending) {
		if c.sendConn <= 0 {
			return
		}
		c.sendLocked(s) // a finished one leaves pending
	}
}

// writeTrailersOnly answers s with headers that carry the status and end
// the stream.
func (c *conn) writeTrailersOnly(s *stream, httpStatus int, code codes.Code, msg string) {
	c.hbuf.Reset()
	c.writeField(":status", strconv.Itoa(httpStatus))
	c.writeField("content-type", "application/grpc")
	c.writeField("grpc-status", strconv.Itoa(int(code)))
	if msg != "" {
		c.writeField("grpc-message", encodeGrpcMessage(msg))
	}
	_ = c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: s.id, BlockFragment: c.hbuf.Bytes(), EndHeaders: true, EndStream: true})
	c.answered.Store(true)
}

func (c *conn) writeField(name, value string) {
	_ = c.henc.WriteField(hpack.HeaderField{Name: name, Value: value})
}

// parseTimeout reads grpc-timeout: up to 8 digits and a unit.
func parseTimeout(v string) (time.Duration, bool) {
	if len(v) < 2 || len(v) > 9 {
		return 0, false
	}
	n, err := strconv.ParseInt(v[:len(v)-1], 10, 64)
	if err != nil || n < 0 {
		return 0, false
	}
	var unit time.Duration
	switch v[len(v)-1] {
	case 'H':
		unit = time.Hour
	case 'M':
		unit = time.Minute
	case 'S':
		unit = time.Second
	case 'm':
		unit = time.Millisecond
	case 'u':
		unit = time.Microsecond
	case 'n':
		unit = time.Nanosecond
	default:
		return 0, false
	}
	if n > int64(1<<63-1)/int64(unit) {
		return 1<<63 - 1, true
	}
	return time.Duration(n) * unit, true
}

// decodeBinHeader decodes a -bin header, padded or not.
func decodeBinHeader(v string) ([]byte, error) {
	if len(v)%4 == 0 {
		return base64.StdEncoding.DecodeString(v)
	}
	return base64.RawStdEncoding.DecodeString(v)
}

// encodeGrpcMessage percent-encodes what the gRPC spec requires of
// grpc-message: bytes outside printable ASCII, and '%'.
func encodeGrpcMessage(msg string) string {
	clean := true
	for i := 0; i < len(msg); i++ {
		if b := msg[i]; b < ' ' || b > '~' || b == '%' {
			clean = false
			break
		}
	}
	if clean {
		return msg
	}
	var sb strings.Builder
	for i := 0; i < len(msg); i++ {
		if b := msg[i]; b < ' ' || b > '~' || b == '%' {
			fmt.Fprintf(&sb, "%%%02X", b)
		} else {
			sb.WriteByte(b)
		}
	}
	return sb.String()
}
