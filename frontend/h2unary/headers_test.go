package h2unary

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// encodeBlock hpack-encodes fields with enc (which keeps its dynamic table
// across blocks, as a client's does).
func encodeBlock(t testing.TB, enc *hpack.Encoder, buf *bytes.Buffer, fields ...string) []byte {
	t.Helper()
	buf.Reset()
	for i := 0; i < len(fields); i += 2 {
		if err := enc.WriteField(hpack.HeaderField{Name: fields[i], Value: fields[i+1]}); err != nil {
			t.Fatal(err)
		}
	}
	return append([]byte(nil), buf.Bytes()...)
}

var callFields = []string{":method", "POST", ":scheme", "http", ":path", "/inference.GRPCInferenceService/ModelInfer",
	":authority", "127.0.0.1:8001", "content-type", "application/grpc", "te", "trailers", "user-agent", "grpc-go/1.79"}

// decodeBlock feeds block to h as a HEADERS frame of stream 1, split into
// fragments of at most frag bytes (CONTINUATIONs).
func decodeBlock(h *headerBlock, block []byte, frag int) error {
	h.start(1, true)
	for len(block) > frag {
		if err := h.write(block[:frag], false); err != nil {
			return err
		}
		block = block[frag:]
	}
	return h.write(block, true)
}

func TestHeaderBlock(t *testing.T) {
	var buf bytes.Buffer
	enc := hpack.NewEncoder(&buf)
	h := newHeaderBlock(DefaultMaxHeaderListSize)

	block := encodeBlock(t, enc, &buf, callFields...)
	for _, frag := range []int{len(block), 7, 1} {
		if err := decodeBlock(h, block, frag); err != nil {
			t.Fatalf("valid block in fragments of %d: %v", frag, err)
		}
		if len(h.fields) != len(callFields)/2 || h.fields[2].Value != callFields[5] || h.truncated {
			t.Fatalf("fragments of %d: decoded %v, truncated %v", frag, h.fields, h.truncated)
		}
	}
	// The point of it: once the client's table holds the fields, a call's
	// headers cost nothing.
	again := encodeBlock(t, enc, &buf, callFields...)
	if allocs := testing.AllocsPerRun(100, func() {
		if err := decodeBlock(h, again, len(again)); err != nil {
			t.Fatal(err)
		}
	}); allocs != 0 {
		t.Errorf("decoding an indexed block made %v allocations, want 0", allocs)
	}

	streamErr := func(name string, fields ...string) {
		t.Helper()
		var e bytes.Buffer
		err := decodeBlock(h, encodeBlock(t, hpack.NewEncoder(&e), &e, fields...), 1<<20)
		var se http2.StreamError
		if !errors.As(err, &se) || se.Code != http2.ErrCodeProtocol || se.StreamID != 1 {
			t.Errorf("%s: err = %v, want a PROTOCOL_ERROR stream error", name, err)
		}
	}
	streamErr("pseudo after regular", "content-type", "application/grpc", ":path", "/x")
	streamErr("upper-case name", ":path", "/x", "Content-Type", "application/grpc")
	streamErr("value with a newline", ":path", "/x", "x-id", "a\nb")
	streamErr("duplicate pseudo", ":path", "/x", ":path", "/y")
	streamErr("unknown pseudo", ":path", "/x", ":bogus", "1")
	streamErr("request and response pseudo", ":path", "/x", ":status", "200")

	// Past the list limit: truncated (the call is refused with 431), the
	// connection lives on.
	small := newHeaderBlock(64)
	var e bytes.Buffer
	big := encodeBlock(t, hpack.NewEncoder(&e), &e, ":path", "/x", "x-a", strings.Repeat("a", 40))
	if err := decodeBlock(small, big, len(big)); err != nil || !small.truncated {
		t.Errorf("block past the limit: err %v, truncated %v; want truncated", err, small.truncated)
	}
	// Far past it: not decoded; the connection ends.
	huge := encodeBlock(t, hpack.NewEncoder(&e), &e, ":path", "/x", "x-a", strings.Repeat("a", 400))
	var ce http2.ConnectionError
	if err := decodeBlock(small, huge, len(huge)); !errors.As(err, &ce) || http2.ErrCode(ce) != http2.ErrCodeProtocol {
		t.Errorf("block far past the limit: err %v, want a PROTOCOL_ERROR connection error", err)
	}
	// Not hpack: the connection ends.
	if err := decodeBlock(h, []byte{0xff, 0xff, 0xff, 0xff, 0xff}, 1<<20); !errors.As(err, &ce) || http2.ErrCode(ce) != http2.ErrCodeCompression {
		t.Errorf("garbage block: err %v, want a COMPRESSION_ERROR connection error", err)
	}
}
