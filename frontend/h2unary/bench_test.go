package h2unary

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"net"
	"testing"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/protobuf/proto"

	"github.com/recmesh/recmesh/proto/inference"
)

// BenchmarkUnaryCall measures one call through the server, from its
// HEADERS and DATA frames to its answer, with a hand-driven client that
// allocates nothing per call: allocs/op is the server's own per-call
// garbage (the stream, its context, the request buffer, the handler's
// request and response messages).
func BenchmarkUnaryCall(b *testing.B) {
	for _, bc := range []struct {
		name   string
		method string
		msg    proto.Message
	}{
		{"ServerReady", inference.GRPCInferenceService_ServerReady_FullMethodName, &inference.ServerReadyRequest{}},
		{"ModelInfer-1KiB", inference.GRPCInferenceService_ModelInfer_FullMethodName, echo(1 << 10)},
	} {
		b.Run(bc.name, func(b *testing.B) {
			s := NewServer(Options{})
			s.RegisterService(&inference.GRPCInferenceService_ServiceDesc, &testService{})
			lis, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			go s.Serve(lis)
			defer s.Stop()
			nc, err := net.Dial("tcp", lis.Addr().String())
			if err != nil {
				b.Fatal(err)
			}
			defer nc.Close()
			bw := bufio.NewWriter(nc)
			bw.WriteString(http2.ClientPreface)
			fr := http2.NewFramer(bw, bufio.NewReader(nc))
			fr.SetReuseFrames()
			fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1<<31 - 1})
			fr.WriteWindowUpdate(0, 1<<31-1-initialWindow)
			// Never-indexed fields leave the decoder's table alone, so one
			// encoded block serves every call.
			var hb bytes.Buffer
			enc := hpack.NewEncoder(&hb)
			for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", bc.method}, {"content-type", "application/grpc"}, {"te", "trailers"}} {
				enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1], Sensitive: true})
			}
			msg, err := proto.Marshal(bc.msg)
			if err != nil {
				b.Fatal(err)
			}
			body := make([]byte, 5+len(msg))
			binary.BigEndian.PutUint32(body[1:], uint32(len(msg)))
			copy(body[5:], msg)
			var received uint32
			id := uint32(1)
			b.ReportAllocs()
			for b.Loop() {
				fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: hb.Bytes(), EndHeaders: true})
				fr.WriteData(id, true, body)
				if err := bw.Flush(); err != nil {
					b.Fatal(err)
				}
				for done := false; !done; {
					f, err := fr.ReadFrame()
					if err != nil {
						b.Fatal(err)
					}
					switch f := f.(type) {
					case *http2.DataFrame:
						received += f.Length
					case *http2.HeadersFrame:
						done = f.StreamEnded() && f.StreamID == id
					case *http2.RSTStreamFrame:
						b.Fatalf("stream %d reset: %v", f.StreamID, f.ErrCode)
					case *http2.GoAwayFrame:
						b.Fatalf("GOAWAY %v", f.ErrCode)
					}
				}
				if received > 1<<30 {
					fr.WriteWindowUpdate(0, received)
					received = 0
				}
				id += 2
			}
		})
	}
}
