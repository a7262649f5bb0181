package h2unary

import (
	"errors"
	"fmt"
	"strings"

	"golang.org/x/net/http/httpguts"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// headerBlock decodes a HEADERS frame and its CONTINUATIONs with the checks
// http2.Framer makes when it is given ReadMetaHeaders (field names and
// values valid on the wire, pseudo-fields first, known and not repeated,
// the header list within its limit, the encoded block not far past it),
// but into fields reused from one block to the next: the Framer's
// MetaHeadersFrame costs about eight allocations per call (the frame, the
// emit closure and what it captures, the growing field list).
type headerBlock struct {
	dec   *hpack.Decoder
	limit uint32 // SETTINGS_MAX_HEADER_LIST_SIZE, in hpack.HeaderField.Size units

	// The block being read.
	streamID  uint32
	endStream bool
	fields    []hpack.HeaderField
	remain    uint32 // of limit
	raw       uint32 // encoded bytes so far, frame headers included
	regular   bool   // a regular field was seen: no pseudo-field may follow
	truncated bool   // fields past limit were dropped
	tooLarge  bool   // the block ran so far past limit that it was not decoded
	selfDep   bool   // its HEADERS frame made the stream depend on itself
	invalid   error  // the first malformed field
}

// frameHeaderLen is an HTTP/2 frame header's size: what an empty
// CONTINUATION frame costs the sender and the reader.
const frameHeaderLen = 9

func newHeaderBlock(limit uint32) *headerBlock {
	h := &headerBlock{dec: hpack.NewDecoder(4096, nil), limit: limit}
	h.dec.SetMaxStringLength(int(limit))
	h.dec.SetEmitFunc(h.emit) // once: a method value made per block would allocate
	return h
}

// start begins the block of a HEADERS frame of stream id.
func (h *headerBlock) start(id uint32, endStream bool) {
	h.streamID, h.endStream = id, endStream
	clear(h.fields) // drop the last call's strings
	h.fields = h.fields[:0]
	h.remain, h.raw, h.regular, h.truncated, h.tooLarge, h.selfDep, h.invalid = h.limit, 0, false, false, false, false, nil
	h.dec.SetEmitEnabled(true)
}

// write decodes one fragment of the block; last says it ends the block.
// A connection error (http2.ConnectionError) ends the connection; a
// stream error (http2.StreamError) refuses the stream.
func (h *headerBlock) write(frag []byte, last bool) error {
	// A block far past the limit is not decoded at all, and nothing may
	// follow a malformed field: the size accounting stopped there. The
	// encoded block as a whole, frame headers counted, is bounded too, so
	// that a flood of empty or tiny CONTINUATION frames (which decode to
	// nothing) ends.
	h.raw += uint32(min(len(frag), 1<<24)) + frameHeaderLen
	if int64(len(frag)) > 2*int64(h.remain) || h.raw > 2*h.limit+16*frameHeaderLen {
		h.tooLarge = true
		return http2.ConnectionError(http2.ErrCodeProtocol)
	}
	if h.invalid != nil {
		return http2.ConnectionError(http2.ErrCodeProtocol)
	}
	if _, err := h.dec.Write(frag); err != nil {
		return http2.ConnectionError(http2.ErrCodeCompression)
	}
	if !last {
		return nil
	}
	if err := h.dec.Close(); err != nil {
		return http2.ConnectionError(http2.ErrCodeCompression)
	}
	if h.invalid != nil {
		return http2.StreamError{StreamID: h.streamID, Code: http2.ErrCodeProtocol, Cause: h.invalid}
	}
	if err := h.checkPseudos(); err != nil {
		return http2.StreamError{StreamID: h.streamID, Code: http2.ErrCodeProtocol, Cause: err}
	}
	return nil
}

func (h *headerBlock) emit(hf hpack.HeaderField) {
	if !httpguts.ValidHeaderFieldValue(hf.Value) {
		h.invalid = fmt.Errorf("invalid value of header field %q", hf.Name)
	}
	if strings.HasPrefix(hf.Name, ":") {
		if h.regular {
			h.invalid = errors.New("pseudo header field after a regular one")
		}
	} else {
		h.regular = true
		if !validWireName(hf.Name) {
			h.invalid = fmt.Errorf("invalid header field name %q", hf.Name)
		}
		// Connection-specific fields are HTTP/1's and make a request
		// malformed (RFC 9113 8.2.2); te may only say "trailers".
		switch hf.Name {
		case "connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade":
			h.invalid = fmt.Errorf("connection-specific header field %q", hf.Name)
		case "te":
			if hf.Value != "trailers" {
				h.invalid = fmt.Errorf("te header field %q: only \"trailers\" is allowed", hf.Value)
			}
		}
	}
	if h.invalid != nil {
		h.dec.SetEmitEnabled(false)
		return
	}
	size := hf.Size()
	if size > h.remain {
		h.dec.SetEmitEnabled(false)
		h.truncated, h.remain = true, 0
		return
	}
	h.remain -= size
	h.fields = append(h.fields, hf)
}

// validWireName: a token, lower case as HTTP/2 requires.
func validWireName(v string) bool {
	if v == "" {
		return false
	}
	for _, r := range v {
		if !httpguts.IsTokenRune(r) || 'A' <= r && r <= 'Z' {
			return false
		}
	}
	return true
}

// checkPseudos: only a request's pseudo-fields (a client sends no
// :status), none twice. Which ones a request must have is for the
// request's headers to say (onHeaders): trailers have none.
func (h *headerBlock) checkPseudos() error {
	for i, hf := range h.fields {
		if !strings.HasPrefix(hf.Name, ":") {
			break // pseudo-fields come first (emit)
		}
		switch hf.Name {
		case ":method", ":path", ":scheme", ":authority", ":protocol":
		default:
			return fmt.Errorf("invalid pseudo header field %q", hf.Name)
		}
		for _, prev := range h.fields[:i] {
			if prev.Name == hf.Name {
				return fmt.Errorf("duplicate pseudo header field %q", hf.Name)
			}
		}
	}
	return nil
}

// hasPseudo reports whether the block has a pseudo-field.
func (h *headerBlock) hasPseudo() bool {
	return len(h.fields) > 0 && strings.HasPrefix(h.fields[0].Name, ":")
}
