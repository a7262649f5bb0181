package grpcwire

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"
)

// The tests here hold the rules to grpc-go both ways: a raw HTTP/2 client
// that writes with this package against grpc-go's server, and grpc-go's
// client against a raw HTTP/2 server that writes with it. The repository's
// peers are tested against grpc-go end to end in their own packages:
// frontend/h2unary (TestErrorsAndLimits, TestDeadlineCancelAndMetadata)
// and bench/h2client (TestStatusAndMessage, TestDeadline).

// interopMessages are status messages grpc-go's server sends as they are
// (it replaces invalid UTF-8, so all of these are valid).
var interopMessages = []string{
	"plain words", "bad input: 100% wrong\nsecond line", "ünïcode ✓ 🚀", "tab\tcr\rnul\x00del\x7f", "%25 is literal", "%zz%4",
}

// rawFrames writes frames with an hpack encoder and reads them back.
type rawFrames struct {
	nc   net.Conn
	bw   *bufio.Writer
	fr   *http2.Framer
	hbuf bytes.Buffer
	henc *hpack.Encoder
}

func newRawFrames(nc net.Conn) *rawFrames {
	r := &rawFrames{nc: nc, bw: bufio.NewWriter(nc)}
	r.fr = http2.NewFramer(r.bw, bufio.NewReader(nc))
	r.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	r.henc = hpack.NewEncoder(&r.hbuf)
	return r
}

// headers writes one HEADERS frame of name, value pairs and flushes.
func (r *rawFrames) headers(id uint32, endStream bool, fields ...string) error {
	r.hbuf.Reset()
	for i := 0; i < len(fields); i += 2 {
		r.henc.WriteField(hpack.HeaderField{Name: fields[i], Value: fields[i+1]})
	}
	if err := r.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: r.hbuf.Bytes(), EndHeaders: true, EndStream: endStream}); err != nil {
		return err
	}
	return r.bw.Flush()
}

// control answers SETTINGS and PING frames; false for any other frame.
func (r *rawFrames) control(f http2.Frame) bool {
	switch f := f.(type) {
	case *http2.SettingsFrame:
		if !f.IsAck() {
			r.fr.WriteSettingsAck()
		}
	case *http2.PingFrame:
		if !f.IsAck() {
			r.fr.WritePing(true, f.Data)
		}
	default:
		return false
	}
	r.bw.Flush()
	return true
}

func field(f *http2.MetaHeadersFrame, name string) (string, bool) {
	for _, hf := range f.Fields {
		if hf.Name == name {
			return hf.Value, true
		}
	}
	return "", false
}

// TestGRPCGoServer: grpc-go's server reads the deadline EncodeTimeout
// writes, and its grpc-message trailers decode with DecodeMessage.
func TestGRPCGoServer(t *testing.T) {
	var mu sync.Mutex
	left := map[string]time.Duration{} // by method: the deadline the handler saw, from its start
	srv := grpc.NewServer(grpc.UnknownServiceHandler(func(_ any, st grpc.ServerStream) error {
		method, _ := grpc.MethodFromServerStream(st)
		d := time.Duration(-1)
		if dl, ok := st.Context().Deadline(); ok {
			d = time.Until(dl)
		}
		mu.Lock()
		left[method] = d
		mu.Unlock()
		i, _ := strconv.Atoi(strings.TrimPrefix(method, "/t/"))
		return status.Error(codes.InvalidArgument, interopMessages[i%len(interopMessages)])
	}))
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(lis)
	defer srv.Stop()
	nc, err := net.Dial("tcp", lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	r := newRawFrames(nc)
	r.bw.WriteString(http2.ClientPreface)
	r.fr.WriteSettings()
	r.bw.Flush()

	timeouts := []time.Duration{0, 1500 * time.Microsecond, 100*time.Millisecond + time.Nanosecond,
		3 * time.Second, 99999999*time.Millisecond + 1, 90 * time.Minute, 7 * 24 * time.Hour, 99999999*time.Minute + 1}
	n := max(len(timeouts), len(interopMessages))
	var prefix [PrefixLen]byte
	PutPrefix(prefix[:], false, 0)
	for i := range n {
		id := uint32(2*i + 1)
		fields := []string{":method", "POST", ":scheme", "http", ":path", "/t/" + strconv.Itoa(i), ":authority", "x",
			"content-type", "application/grpc", "te", "trailers"}
		if d := timeouts[i%len(timeouts)]; d > 0 {
			fields = append(fields, "grpc-timeout", EncodeTimeout(d))
		}
		if err := r.headers(id, false, fields...); err != nil {
			t.Fatal(err)
		}
		r.fr.WriteData(id, true, prefix[:])
		r.bw.Flush()
	}
	nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	for ended := 0; ended < n; {
		f, err := r.fr.ReadFrame()
		if err != nil {
			t.Fatalf("after %d of %d calls: %v", ended, n, err)
		}
		h, ok := f.(*http2.MetaHeadersFrame)
		if r.control(f) || !ok || !h.StreamEnded() {
			continue
		}
		ended++
		i := int(h.StreamID-1) / 2
		want := interopMessages[i%len(interopMessages)]
		code, _ := field(h, "grpc-status")
		raw, _ := field(h, "grpc-message")
		if code != strconv.Itoa(int(codes.InvalidArgument)) || DecodeMessage(raw) != want {
			t.Errorf("call %d: grpc-status %s, grpc-message %q decodes to %q, want %q", i, code, raw, DecodeMessage(raw), want)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for i := range n {
		d, sent := left["/t/"+strconv.Itoa(i)], timeouts[i%len(timeouts)]
		// What the server reads is sent rounded up to the header's unit.
		parsed, _ := ParseTimeout(EncodeTimeout(sent))
		switch {
		case sent == 0 && d != -1:
			t.Errorf("call %d: no grpc-timeout, yet the handler's deadline is %v away", i, d)
		case sent > 0 && (d > parsed || d < sent-2*time.Second):
			t.Errorf("call %d: grpc-timeout %s for %v, the handler's deadline %v away", i, EncodeTimeout(sent), sent, d)
		}
	}
}

// rawServer answers each call by its path:
//
//	/rst/N   RST_STREAM with error code N
//	/http/N  HTTP status N, not a gRPC response
//	/msg/N   INVALID_ARGUMENT with interopMessages[N], encoded here
//	/timeout its grpc-timeout header, parsed here, sent back as the status
//	         message (UNKNOWN when absent or malformed)
func rawServer(t *testing.T) string {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lis.Close() })
	go func() {
		for {
			nc, err := lis.Accept()
			if err != nil {
				return
			}
			go serveRaw(nc)
		}
	}()
	return lis.Addr().String()
}

func serveRaw(nc net.Conn) {
	defer nc.Close()
	preface := make([]byte, len(http2.ClientPreface))
	if _, err := io.ReadFull(nc, preface); err != nil {
		return
	}
	r := newRawFrames(nc)
	r.fr.WriteSettings()
	r.bw.Flush()
	for {
		f, err := r.fr.ReadFrame()
		if err != nil {
			return
		}
		r.control(f)
		if f, ok := f.(*http2.MetaHeadersFrame); ok {
			path, _ := field(f, ":path")
			kind, arg, _ := strings.Cut(strings.TrimPrefix(path, "/"), "/")
			n, _ := strconv.Atoi(arg)
			id := f.StreamID
			switch kind {
			case "rst":
				r.fr.WriteRSTStream(id, http2.ErrCode(n))
				r.bw.Flush()
			case "http":
				r.headers(id, true, ":status", strconv.Itoa(n), "content-type", "text/plain")
			case "msg":
				r.headers(id, true, ":status", "200", "content-type", "application/grpc",
					"grpc-status", strconv.Itoa(int(codes.InvalidArgument)), "grpc-message", EncodeMessage(interopMessages[n]))
			case "timeout":
				v, _ := field(f, "grpc-timeout")
				code, msg := codes.Unknown, "no grpc-timeout "+strconv.Quote(v)
				if d, ok := ParseTimeout(v); ok {
					code, msg = codes.OutOfRange, strconv.FormatInt(int64(d), 10)
				}
				r.headers(id, true, ":status", "200", "content-type", "application/grpc",
					"grpc-status", strconv.Itoa(int(code)), "grpc-message", EncodeMessage(msg))
			}
		}
	}
}

// TestGRPCGoClient: grpc-go's client reads the status messages
// EncodeMessage writes, its grpc-timeout parses with ParseTimeout, and it
// maps resets and HTTP statuses as ResetCode and HTTPStatusCode do, but
// for the differences ResetCode documents.
func TestGRPCGoClient(t *testing.T) {
	cc, err := grpc.NewClient(rawServer(t), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	invoke := func(ctx context.Context, method string) *status.Status {
		return status.Convert(cc.Invoke(ctx, method, &emptypb.Empty{}, &emptypb.Empty{}))
	}
	ctx := context.Background()
	for i, want := range interopMessages {
		if st := invoke(ctx, "/msg/"+strconv.Itoa(i)); st.Code() != codes.InvalidArgument || st.Message() != want {
			t.Errorf("grpc-message %q: grpc-go's client read %v %q, want %q", EncodeMessage(want), st.Code(), st.Message(), want)
		}
	}
	for _, d := range []time.Duration{time.Millisecond, 1500 * time.Millisecond, time.Minute, 50 * time.Hour} {
		tctx, cancel := context.WithTimeout(ctx, d)
		st := invoke(tctx, "/timeout")
		cancel()
		got, err := strconv.ParseInt(st.Message(), 10, 64)
		if st.Code() != codes.OutOfRange || err != nil || time.Duration(got) > d || time.Duration(got) < d-2*time.Second {
			t.Errorf("deadline %v: the server parsed %v %q", d, st.Code(), st.Message())
		}
	}
	// grpc-go's client and ResetCode part here (see ResetCode).
	grpcGo := map[http2.ErrCode]codes.Code{http2.ErrCodeFlowControl: codes.ResourceExhausted, 0x77: codes.Unknown}
	for e := http2.ErrCodeNo; e <= http2.ErrCodeHTTP11Required+1; e++ {
		if e == http2.ErrCodeHTTP11Required+1 {
			e = 0x77
		}
		want, ok := grpcGo[e]
		if !ok {
			want = ResetCode(e)
		}
		if st := invoke(ctx, "/rst/"+strconv.Itoa(int(e))); st.Code() != want {
			t.Errorf("RST_STREAM %v: grpc-go's client read %v, want %v", e, st.Code(), want)
		}
	}
	for _, h := range []int{400, 401, 403, 404, 405, 429, 500, 502, 503, 504} {
		if st := invoke(ctx, "/http/"+strconv.Itoa(h)); st.Code() != HTTPStatusCode(h) {
			t.Errorf("HTTP %d: grpc-go's client read %v, HTTPStatusCode %v", h, st.Code(), HTTPStatusCode(h))
		}
	}
}
