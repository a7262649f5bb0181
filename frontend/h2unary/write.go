package h2unary

import (
	"slices"
	"strconv"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/codes"

	"github.com/recmesh/recmesh/proto/grpcwire"
)

// maxStatusMessage bounds the grpc-message of an answer: a message that
// quotes the request (an unknown method's path, up to the 16 KiB header
// limit) is cut there, so that a refusal stays a few frames at most
// (percent-encoding may triple it).
const maxStatusMessage = 8 << 10

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
	c.writeBlockLocked(s.id, true)
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

// writeTrailersOnly answers stream id with headers that carry the status
// and end the stream; wmu held.
func (c *conn) writeTrailersOnly(id uint32, httpStatus int, code codes.Code, msg string) {
	c.hbuf.Reset()
	c.writeField(":status", strconv.Itoa(httpStatus))
	c.writeField("content-type", "application/grpc")
	c.writeField("grpc-status", strconv.Itoa(int(code)))
	if len(msg) > maxStatusMessage {
		msg = msg[:maxStatusMessage] + "..."
	}
	if msg != "" {
		c.writeField("grpc-message", grpcwire.EncodeMessage(msg))
	}
	c.writeBlockLocked(id, true)
}

// writeBlockLocked writes the header block in hbuf for stream id: one
// HEADERS frame, and CONTINUATION frames after it for what does not fit
// in the client's SETTINGS_MAX_FRAME_SIZE (RFC 9113 4.3); wmu held, so
// that no other frame comes between them.
func (c *conn) writeBlockLocked(id uint32, endStream bool) {
	block, most := c.hbuf.Bytes(), int(c.peerFrame)
	frag := block[:min(len(block), most)]
	block = block[len(frag):]
	_ = c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: frag, EndHeaders: len(block) == 0, EndStream: endStream})
	for len(block) > 0 {
		frag = block[:min(len(block), most)]
		block = block[len(frag):]
		_ = c.fr.WriteContinuation(id, len(block) == 0, frag)
	}
}

func (c *conn) writeField(name, value string) {
	_ = c.henc.WriteField(hpack.HeaderField{Name: name, Value: value})
}
