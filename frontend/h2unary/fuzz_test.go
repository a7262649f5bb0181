package h2unary

import (
	"bytes"
	"io"
	"net"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/protobuf/proto"

	"github.com/recmesh/recmesh/proto/inference"
)

// FuzzConn feeds a connection arbitrary bytes after the client preface:
// whatever a client sends, the server neither panics nor hangs, and the
// connection ends once the client's side closes.
func FuzzConn(f *testing.F) {
	for _, seed := range seedStreams() {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		s := NewServer(Options{MaxRecvMsgSize: 1 << 16, Workers: 1, HandshakeTimeout: 2 * time.Second})
		s.RegisterService(&inference.GRPCInferenceService_ServiceDesc, &testService{})
		defer s.Stop()
		client, server := net.Pipe()
		c := newConn(s, server)
		done := make(chan struct{})
		go func() { c.serve(); close(done) }()
		go func() { _, _ = io.Copy(io.Discard, client) }()
		_ = client.SetWriteDeadline(time.Now().Add(5 * time.Second))
		_, _ = client.Write(append([]byte(http2.ClientPreface), data...))
		client.Close()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("the connection did not end after the client closed")
		}
	})
}

// seedStreams are well-formed and nearly well-formed client frame streams.
func seedStreams() [][]byte {
	req, _ := proto.Marshal(echo(100))
	msg := append([]byte{0, 0, 0, 0, byte(len(req))}, req...)
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", "/inference.GRPCInferenceService/ModelInfer"},
		{"content-type", "application/grpc"}, {"grpc-timeout", "1S"}, {"te", "trailers"}} {
		enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	frames := func(write func(fr *http2.Framer)) []byte {
		var b bytes.Buffer
		fr := http2.NewFramer(&b, nil)
		fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1 << 20})
		write(fr)
		return b.Bytes()
	}
	return [][]byte{
		frames(func(fr *http2.Framer) {
			fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: hb.Bytes(), EndHeaders: true})
			fr.WriteData(1, true, msg)
		}),
		frames(func(fr *http2.Framer) {
			fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: hb.Bytes(), EndHeaders: true})
			fr.WriteData(1, false, msg[:7])
			fr.WriteWindowUpdate(0, 1000)
			fr.WritePing(false, [8]byte{1})
			fr.WriteData(1, true, msg[7:])
			fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 3, BlockFragment: hb.Bytes(), EndHeaders: true})
			fr.WriteRSTStream(3, http2.ErrCodeCancel)
		}),
		frames(func(fr *http2.Framer) {
			fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 5, BlockFragment: hb.Bytes(), EndHeaders: false})
			fr.WriteContinuation(5, true, nil)
			fr.WriteData(5, true, []byte{1, 0, 0, 0, 3, 1, 2, 3})
			fr.WriteGoAway(5, http2.ErrCodeNo, nil)
		}),
	}
}
