package frontend

import (
	"bytes"
	"encoding/binary"
	"net"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/protobuf/proto"
)

// TestNoFlowControlPings speaks HTTP/2 frame by frame, as a client of one
// small request per round trip does, and checks what the server writes
// back: the static stream window in its SETTINGS, every call answered with
// grpc-status 0, and not one PING. With grpc-go's dynamic windows the server
// would send a bandwidth-probing PING (and a window update) for almost every
// call and read the client's ack, which cost the frontend a third of its
// read syscalls at B_req 1.
func TestNoFlowControlPings(t *testing.T) {
	const calls = 20
	f := newFakeBackend()
	f.record = false
	ts := startServer(t, f, nil)
	wantWindow, _ := flowWindows(maxRecvMsgSize(f.capacity, testConfig().SparseWidth()))

	c, err := net.DialTimeout("tcp", ts.srv.Addr().String(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.SetDeadline(time.Now().Add(30 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write([]byte(http2.ClientPreface)); err != nil {
		t.Fatal(err)
	}
	fr := http2.NewFramer(c, c)
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	if err := fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}

	dense, sparse := inputs(1)
	msg, err := proto.Marshal(rawRequest(dense, sparse, 1, false))
	if err != nil {
		t.Fatal(err)
	}
	body := make([]byte, 5, 5+len(msg)) // gRPC's message prefix: not compressed, length
	binary.BigEndian.PutUint32(body[1:], uint32(len(msg)))
	body = append(body, msg...)

	var hbuf bytes.Buffer
	enc := hpack.NewEncoder(&hbuf)
	var sawWindow bool
	pings := 0
	for i := range calls {
		stream := uint32(2*i + 1)
		hbuf.Reset()
		for _, h := range [][2]string{
			{":method", "POST"}, {":scheme", "http"}, {":authority", "frontend"},
			{":path", "/inference.GRPCInferenceService/ModelInfer"},
			{"content-type", "application/grpc"}, {"te", "trailers"},
		} {
			if err := enc.WriteField(hpack.HeaderField{Name: h[0], Value: h[1]}); err != nil {
				t.Fatal(err)
			}
		}
		if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: stream, BlockFragment: hbuf.Bytes(), EndHeaders: true}); err != nil {
			t.Fatal(err)
		}
		if err := fr.WriteData(stream, true, body); err != nil {
			t.Fatal(err)
		}
		// Read until this call's trailers, answering what HTTP/2 requires.
		for done := false; !done; {
			frame, err := fr.ReadFrame()
			if err != nil {
				t.Fatalf("call %d: read frame: %v", i, err)
			}
			switch fm := frame.(type) {
			case *http2.SettingsFrame:
				if fm.IsAck() {
					continue
				}
				if v, ok := fm.Value(http2.SettingInitialWindowSize); ok {
					sawWindow = true
					if v != uint32(wantWindow) {
						t.Errorf("SETTINGS_INITIAL_WINDOW_SIZE %d, want %d", v, wantWindow)
					}
				}
				if err := fr.WriteSettingsAck(); err != nil {
					t.Fatal(err)
				}
			case *http2.PingFrame:
				if !fm.IsAck() {
					pings++
					if err := fr.WritePing(true, fm.Data); err != nil {
						t.Fatal(err)
					}
				}
			case *http2.MetaHeadersFrame:
				if fm.StreamID != stream || !fm.StreamEnded() {
					continue
				}
				done = true
				if got := fm.PseudoValue("status"); got != "" && got != "200" {
					t.Fatalf("call %d: :status %s", i, got)
				}
				var grpcStatus string
				for _, h := range fm.RegularFields() {
					if h.Name == "grpc-status" {
						grpcStatus = h.Value
					}
				}
				if grpcStatus != "0" {
					t.Fatalf("call %d: grpc-status %q, want 0", i, grpcStatus)
				}
			case *http2.GoAwayFrame:
				t.Fatalf("call %d: GOAWAY %v", i, fm.ErrCode)
			case *http2.RSTStreamFrame:
				t.Fatalf("call %d: RST_STREAM %v", i, fm.ErrCode)
			}
		}
	}
	if !sawWindow {
		t.Error("the server's SETTINGS did not set the initial window size")
	}
	if pings != 0 {
		t.Errorf("the server sent %d PINGs over %d calls, want none", pings, calls)
	}
}

func TestFlowWindows(t *testing.T) {
	for _, tc := range []struct {
		maxRecv      int
		stream, conn int32
	}{
		{1 << 10, 64 << 10, 128 << 10}, // below grpc-go's floor
		{3 << 20, 3 << 20, 6 << 20},    // the largest request fits
		{64 << 20, 8 << 20, 16 << 20},  // capped
	} {
		if s, c := flowWindows(tc.maxRecv); s != tc.stream || c != tc.conn {
			t.Errorf("flowWindows(%d) = %d, %d; want %d, %d", tc.maxRecv, s, c, tc.stream, tc.conn)
		}
	}
}
