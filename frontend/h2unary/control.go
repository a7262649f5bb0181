package h2unary

import (
	"errors"
	"time"

	"golang.org/x/net/http2"
)

func (c *conn) onSettings(f *http2.SettingsFrame) bool {
	c.lock()
	defer c.unlock()
	err := f.ForeachSetting(func(st http2.Setting) error {
		// Out-of-range values are connection errors (RFC 9113 6.5.2):
		// PROTOCOL_ERROR, FLOW_CONTROL_ERROR for a window past 2³¹-1.
		if err := st.Valid(); err != nil {
			return err
		}
		switch st.ID {
		case http2.SettingInitialWindowSize:
			delta := int64(st.Val) - c.peerWindow
			for _, s := range c.streams {
				if s.sendWindow+delta > maxWindow {
					return http2.ConnectionError(http2.ErrCodeFlowControl)
				}
			}
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
		code := http2.ErrCodeProtocol
		var ce http2.ConnectionError
		if errors.As(err, &ce) {
			code = http2.ErrCode(ce)
		}
		c.goAwayLocked(code, "SETTINGS: "+err.Error())
		return false
	}
	_ = c.fr.WriteSettingsAck()
	c.sendPendingLocked()
	return true
}

func (c *conn) onPing(f *http2.PingFrame) bool {
	if f.IsAck() {
		if f.Data == drainPing {
			c.finalGoAway()
		}
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
		c.s.refused(ReasonPings)
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
	switch s := c.streams[f.StreamID]; {
	case f.StreamID == 0:
		if c.sendConn+inc > maxWindow {
			c.goAwayLocked(http2.ErrCodeFlowControl, "connection window overflow")
			return false
		}
		c.sendConn += inc
	case s != nil:
		if s.sendWindow+inc > maxWindow {
			c.resetLocked(s, http2.ErrCodeFlowControl)
			return true
		}
		s.sendWindow += inc
	case f.StreamID > c.lastID:
		// An idle stream may receive nothing but HEADERS and PRIORITY
		// (RFC 9113 5.1).
		c.goAwayLocked(http2.ErrCodeProtocol, "WINDOW_UPDATE on a stream never opened")
		return false
	}
	c.sendPendingLocked()
	return true
}

// onReset: the client gave up on a stream; its handler's context ends and
// its answer, if any, is dropped.
func (c *conn) onReset(id uint32) bool {
	c.lock()
	defer c.unlock()
	if id > c.lastID {
		c.goAwayLocked(http2.ErrCodeProtocol, "RST_STREAM on a stream never opened")
		return false
	}
	if s := c.streams[id]; s != nil {
		s.reset = true
		s.cancel()
		if !s.running {
			c.removeLocked(s)
		}
	} else {
		// The client closed the stream itself: DATA after its own
		// RST_STREAM is no frame in flight but an error (onData), even on
		// a stream this server reset too.
		c.forgetReset(id)
	}
	return true
}

// resetStream resets a stream the Framer or the server found at fault.
func (c *conn) resetStream(id uint32, code http2.ErrCode) {
	c.lock()
	defer c.unlock()
	if s := c.streams[id]; s != nil {
		c.resetLocked(s, code)
		return
	}
	if id > c.lastID && id%2 == 1 {
		c.lastID = id // a new stream refused: its id is spent
	}
	_ = c.fr.WriteRSTStream(id, code)
	c.noteReset(id)
}

// resetLocked resets s with code; its handler, if running, finds it reset.
func (c *conn) resetLocked(s *stream, code http2.ErrCode) {
	_ = c.fr.WriteRSTStream(s.id, code)
	c.noteReset(s.id)
	s.reset = true
	s.cancel()
	if !s.running {
		c.removeLocked(s)
	}
}

// removeLocked forgets a finished stream and returns its buffered bytes;
// the connection closes after the last one when it is going away.
func (c *conn) removeLocked(s *stream) {
	c.releaseLocked(s)
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
	if c.goingAway && len(c.streams) == 0 && !c.closed {
		c.closeDrainedLocked()
	}
}
