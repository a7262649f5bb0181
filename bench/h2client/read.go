package h2client

import (
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"

	"golang.org/x/net/http2"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/recmesh/recmesh/proto/grpcwire"
)

// The connection's read side: the reader goroutine, the frames it applies
// and the gRPC status of a finished call.

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
			code := grpcwire.ResetCode(f.ErrCode)
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
	if len(b) < grpcwire.PrefixLen {
		return nil, status.Errorf(codes.Internal, "h2client: response of %d bytes, shorter than a message prefix", len(b))
	}
	compressed, n := grpcwire.ParsePrefix(b)
	if compressed {
		return nil, status.Error(codes.Internal, "h2client: compressed response (no compression was asked for)")
	}
	if int64(n) != int64(len(b)-grpcwire.PrefixLen) {
		return nil, status.Errorf(codes.Internal, "h2client: response prefix says %d bytes, %d came", n, len(b)-grpcwire.PrefixLen)
	}
	return b[grpcwire.PrefixLen:], nil
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
			msg = grpcwire.DecodeMessage(hf.Value)
		}
	}
	return code, msg, has
}

// httpStatusError maps a non-200 HTTP status as gRPC's spec does.
func httpStatusError(code int) error {
	return status.Errorf(grpcwire.HTTPStatusCode(code), "h2client: HTTP status %d", code)
}
