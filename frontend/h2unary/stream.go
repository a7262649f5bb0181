package h2unary

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"golang.org/x/net/http2"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/recmesh/recmesh/proto/grpcwire"
)

// stream is one call.
type stream struct {
	id     uint32
	path   string
	m      method
	ctx    context.Context
	cancel context.CancelFunc
	born   uint32 // the watchdog's tick when the headers arrived
	// Reader-owned while the request arrives.
	buf           []byte // the request: 5-byte prefix, then the message
	msgLen        int    // from the prefix; -1 until it has arrived
	recvUnacked   int32  // stream bytes not yet returned by WINDOW_UPDATE
	contentLength int64  // the content-length header's, -1 without one
	// Guarded by wmu.
	requestDone bool  // the client ended its side
	running     bool  // a handler is running or about to
	reset       bool  // the client reset it, or it was refused
	reserved    int64 // buffered bytes taken from the budgets (limits.go)
	sendWindow  int64
	out         []byte // response data not yet sent
}

// reserved are the request headers that are the transport's, not the
// call's metadata.
var reserved = map[string]bool{
	"content-type": true, "te": true, "grpc-timeout": true, "grpc-encoding": true,
	"grpc-accept-encoding": true, "user-agent": true, "content-length": true,
}

// onBlock decodes a fragment of the header block being read and, once it
// is complete, acts on it.
func (c *conn) onBlock(frag []byte, last bool) bool {
	if err := c.hdr.write(frag, last); err != nil {
		if c.hdr.tooLarge {
			c.s.refused(ReasonHeaderList)
		}
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
		// A second block: the client's trailers, which must end its side
		// and carry no pseudo-field (RFC 9113 8.1).
		switch {
		case s.reset:
		case s.requestDone:
			c.resetLocked(s, http2.ErrCodeStreamClosed)
		case !f.endStream || f.hasPseudo():
			c.resetLocked(s, http2.ErrCodeProtocol)
		default:
			c.unlock()
			c.endRequest(s)
			return true
		}
		c.unlock()
		return true
	}
	if id%2 == 0 || id <= c.lastID {
		c.goAwayLocked(http2.ErrCodeProtocol, "stream id "+strconv.FormatUint(uint64(id), 10)+" out of order")
		c.unlock()
		return false
	}
	c.lastID = id
	switch {
	case f.selfDep:
		c.refuseNewLocked(id, http2.ErrCodeProtocol)
		c.unlock()
		return true
	case c.goingAway:
		c.refuseNewLocked(id, http2.ErrCodeRefusedStream)
		c.unlock()
		return true
	case uint32(len(c.streams)) >= c.s.opts.MaxConcurrentStreams:
		// A call counts until its handler returns, so a flood of
		// resets cannot run more handlers than this at once.
		c.s.refused(ReasonStreams)
		c.refuseNewLocked(id, http2.ErrCodeRefusedStream)
		c.unlock()
		return true
	}
	c.unlock()

	var (
		httpMethod, scheme, path, contentType, timeout, length string
		md                                                     metadata.MD
	)
	for _, hf := range f.fields {
		switch hf.Name {
		case ":method":
			httpMethod = hf.Value
		case ":scheme":
			scheme = hf.Value
		case ":path":
			path = hf.Value
		case "content-type":
			contentType = hf.Value
		case "grpc-timeout":
			timeout = hf.Value
		case "content-length":
			length = hf.Value
		}
		if strings.HasPrefix(hf.Name, ":") || reserved[hf.Name] {
			continue
		}
		v := hf.Value
		if strings.HasSuffix(hf.Name, "-bin") {
			if b, err := grpcwire.DecodeBinHeader(v); err == nil {
				v = string(b)
			}
		}
		if md == nil {
			md = metadata.MD{}
		}
		md[hf.Name] = append(md[hf.Name], v)
	}
	contentLength := int64(-1)
	if length != "" {
		n, err := strconv.ParseInt(length, 10, 64)
		if err != nil || n < 0 {
			contentLength = -2
		} else {
			contentLength = n
		}
	}
	// Malformed requests are stream errors (RFC 9113 8.1.1, 8.3.1): every
	// request names its method, and all but CONNECT a scheme and a path.
	if httpMethod == "" || httpMethod != "CONNECT" && (scheme == "" || path == "") || contentLength == -2 {
		c.lock()
		c.refuseNewLocked(id, http2.ErrCodeProtocol)
		c.unlock()
		return true
	}
	s := &stream{id: id, path: path, msgLen: -1, contentLength: contentLength}
	ctx := c.ctx
	if len(md) > 0 {
		ctx = metadata.NewIncomingContext(ctx, md)
	}
	d, ok := grpcwire.ParseTimeout(timeout)
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
	s.born = c.tick.Load()
	// A block that ends the stream leaves nothing to reset when refused.
	s.requestDone = f.endStream
	c.streams[id] = s
	c.opened++
	c.unlock()

	if f.truncated {
		c.s.refused(ReasonHeaderList)
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
		c.lock()
		if !s.reset {
			c.dispatchLocked(s)
		}
		c.unlock()
	}
	return true
}

// refuseNewLocked resets a stream refused before it was opened; wmu held.
func (c *conn) refuseNewLocked(id uint32, code http2.ErrCode) {
	_ = c.fr.WriteRSTStream(id, code)
	c.noteReset(id)
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
	c.refuseLocked(s, httpStatus, code, msg)
}

// refuseLocked is refuse with wmu held.
func (c *conn) refuseLocked(s *stream, httpStatus int, code codes.Code, msg string) {
	if s.reset || c.streams[s.id] != s {
		return
	}
	c.writeTrailersOnly(s.id, httpStatus, code, msg)
	if !s.requestDone {
		_ = c.fr.WriteRSTStream(s.id, http2.ErrCodeNo)
		c.noteReset(s.id)
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
	data := f.Data()
	c.lock()
	if c.recvConn >= c.s.opts.ConnWindow/2 {
		_ = c.fr.WriteWindowUpdate(0, uint32(c.recvConn))
		c.recvConn = 0
	}
	s := c.streams[f.StreamID]
	switch {
	case s == nil && f.StreamID > c.lastID:
		c.goAwayLocked(http2.ErrCodeProtocol, "DATA on a stream never opened")
		c.unlock()
		return false
	case s == nil:
		// A closed stream: DATA on it is a stream error (RFC 9113 5.1),
		// unless this server reset it and the client had not heard yet.
		if !c.wasReset(f.StreamID) {
			c.refuseNewLocked(f.StreamID, http2.ErrCodeStreamClosed)
		}
		c.unlock()
		return true
	case s.reset: // refused or reset, its handler still running: discard
		c.unlock()
		return true
	case s.requestDone: // half-closed (remote)
		c.resetLocked(s, http2.ErrCodeStreamClosed)
		c.unlock()
		return true
	}
	s.recvUnacked += n
	if s.recvUnacked > c.s.opts.StreamWindow {
		c.resetLocked(s, http2.ErrCodeFlowControl)
		c.unlock()
		return true
	}
	if err := c.checkMessageLocked(s, data); err != nil {
		st := status.Convert(err)
		c.refuseLocked(s, 200, st.Code(), st.Message())
		c.unlock()
		return true
	}
	c.unlock()
	s.appendData(data)
	if f.StreamEnded() {
		c.endRequest(s)
		return true
	}
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

// checkMessageLocked checks request bytes before they are added: the
// message prefix as soon as it is there (one message, uncompressed,
// within MaxRecvMsgSize, and room in the budgets for all of it), and no
// byte past the message; wmu held.
func (c *conn) checkMessageLocked(s *stream, data []byte) error {
	if s.msgLen < 0 && len(s.buf)+len(data) >= grpcwire.PrefixLen {
		var prefix [grpcwire.PrefixLen]byte
		k := copy(prefix[:], s.buf)
		copy(prefix[k:], data)
		compressed, n := grpcwire.ParsePrefix(prefix[:])
		if compressed {
			return status.Error(codes.Unimplemented, "compressed request: this server accepts identity encoding only")
		}
		msgLen := int64(n)
		if limit := c.s.opts.MaxRecvMsgSize; msgLen > int64(limit) {
			return status.Errorf(codes.ResourceExhausted, "request message of %d bytes is larger than the limit of %d", msgLen, limit)
		}
		if err := c.reserveLocked(s, 5+msgLen); err != nil {
			return err
		}
		s.msgLen = int(msgLen)
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
	return nil
}

// appendData adds request bytes that checkMessageLocked let through. The
// buffer doubles as it grows, but never past the message's size: what it
// holds stays within what was reserved for it.
func (s *stream) appendData(data []byte) {
	if need := len(s.buf) + len(data); need > cap(s.buf) {
		size := max(2*cap(s.buf), need)
		if s.msgLen >= 0 {
			size = min(size, 5+s.msgLen)
		}
		buf := make([]byte, len(s.buf), size)
		copy(buf, s.buf)
		s.buf = buf
	}
	s.buf = append(s.buf, data...)
}

// endRequest: the client's side is complete; the call runs.
func (c *conn) endRequest(s *stream) {
	c.lock()
	defer c.unlock()
	if s.reset || s.requestDone {
		return
	}
	s.requestDone = true
	c.dispatchLocked(s)
}

// dispatchLocked runs the call whose request is complete, if it is whole;
// wmu held.
func (c *conn) dispatchLocked(s *stream) {
	if s.contentLength >= 0 && int64(len(s.buf)) != s.contentLength {
		// RFC 9113 8.1.1: a content-length the DATA does not match is a
		// malformed request.
		c.resetLocked(s, http2.ErrCodeProtocol)
		return
	}
	if s.msgLen < 0 || len(s.buf) != 5+s.msgLen {
		c.refuseLocked(s, 200, codes.Internal, fmt.Sprintf("request ended after %d bytes, before its whole message", len(s.buf)))
		return
	}
	s.running = true
	// A call earns the client its pings back (onPing); a refused request
	// does not.
	c.pingStrikes = 0
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
			grpcwire.PutPrefix(out, false, uint32(len(out)-5))
		}
	}
	c.lock()
	defer c.unlock()
	// The request (and what the handler decoded from it) is garbage now.
	c.releaseLocked(s)
	s.running = false
	if s.reset || c.closed {
		c.removeLocked(s)
		return
	}
	c.answered.Store(true)
	if err != nil {
		st := status.Convert(err)
		c.writeTrailersOnly(s.id, 200, st.Code(), st.Message())
		c.removeLocked(s)
		return
	}
	c.hbuf.Reset()
	c.writeField(":status", "200")
	c.writeField("content-type", "application/grpc")
	c.writeBlockLocked(s.id, false)
	s.out = out
	if !c.sendLocked(s) {
		c.pending = append(c.pending, s)
	}
}
