package h2unary

import (
	"bytes"
	"context"
	"encoding/binary"
	"net"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/codes"

	"github.com/recmesh/recmesh/proto/inference"
)

// refusals counts what Options.OnRefuse reports.
type refusals struct {
	mu sync.Mutex
	n  map[string]int
}

func (r *refusals) add(reason string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.n == nil {
		r.n = map[string]int{}
	}
	r.n[reason]++
}

func (r *refusals) get(reason string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n[reason]
}

// ending is how the server ended one stream.
type ending struct {
	httpStatus, grpcStatus, grpcMessage string
	rst                                 http2.ErrCode
	reset                               bool
}

// frameLog reads a raw connection's frames on a goroutine of its own and
// records how each stream ended, and the GOAWAY.
type frameLog struct {
	mu      sync.Mutex
	ends    map[uint32]ending
	goAway  *http2.ErrCode
	closed  bool
	maxSeen uint32 // the largest frame read
}

func watchFrames(r *rawConn) *frameLog {
	l := &frameLog{ends: map[uint32]ending{}}
	go func() {
		for {
			f, err := r.fr.ReadFrame()
			l.mu.Lock()
			if err != nil {
				l.closed = true
				l.mu.Unlock()
				return
			}
			l.maxSeen = max(l.maxSeen, f.Header().Length)
			switch f := f.(type) {
			case *http2.MetaHeadersFrame:
				if f.StreamEnded() {
					e := l.ends[f.StreamID]
					e.httpStatus, e.grpcStatus, e.grpcMessage = f.PseudoValue("status"), headerValue(f, "grpc-status"), headerValue(f, "grpc-message")
					l.ends[f.StreamID] = e
				}
			case *http2.RSTStreamFrame:
				e := l.ends[f.StreamID]
				e.rst, e.reset = f.ErrCode, true
				l.ends[f.StreamID] = e
			case *http2.GoAwayFrame:
				code := f.ErrCode
				l.goAway = &code
			}
			l.mu.Unlock()
		}
	}()
	return l
}

// count is how many streams ended as match says.
func (l *frameLog) count(match func(ending) bool) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, e := range l.ends {
		if match(e) {
			n++
		}
	}
	return n
}

func (l *frameLog) end(id uint32) (ending, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e, ok := l.ends[id]
	return e, ok
}

// goAwayCode is the GOAWAY's code once one has arrived.
func (l *frameLog) goAwayCode() (http2.ErrCode, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.goAway == nil {
		return 0, false
	}
	return *l.goAway, true
}

func (l *frameLog) isClosed() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.closed
}

// withStatus matches a stream answered with gRPC status code c.
func withStatus(c codes.Code) func(ending) bool {
	want := strconv.Itoa(int(c))
	return func(e ending) bool { return e.grpcStatus == want }
}

// rawConnTo is a bare TCP connection to addr, closed after the test.
func rawConnTo(t *testing.T, addr string) net.Conn {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	return nc
}

// requestBlock encodes a call's headers with never-indexed fields, so that
// blocks need no shared encoder state.
func requestBlock(path string, extra ...string) []byte {
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	fields := append([]string{":method", "POST", ":scheme", "http", ":path", path, ":authority", "test", "content-type", "application/grpc", "te", "trailers"}, extra...)
	for i := 0; i < len(fields); i += 2 {
		enc.WriteField(hpack.HeaderField{Name: fields[i], Value: fields[i+1], Sensitive: true})
	}
	return hb.Bytes()
}

// sendPartial opens stream id with a request that declares a message of
// msgLen bytes and sends all of it but the last byte, in 16 KiB frames.
func sendPartial(t *testing.T, r *rawConn, id uint32, msgLen int) {
	t.Helper()
	r.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: requestBlock(inference.GRPCInferenceService_ModelInfer_FullMethodName), EndHeaders: true})
	body := make([]byte, 5+msgLen-1)
	binary.BigEndian.PutUint32(body[1:], uint32(msgLen))
	for len(body) > 0 {
		n := min(len(body), 16<<10)
		if err := r.fr.WriteData(id, false, body[:n]); err != nil {
			t.Fatal(err)
		}
		body = body[n:]
	}
	if err := r.bw.Flush(); err != nil {
		t.Fatal(err)
	}
}

func heapInUse() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(20 * time.Second); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("%s: not within 20 s", what)
}

// TestUnfinishedBodiesBounded: requests that declare a large message and
// never finish it hold no more than the connection's and the server's
// budgets (the rest are refused RESOURCE_EXHAUSTED before they are read),
// are ended DEADLINE_EXCEEDED after BodyTimeout, and give every byte
// back; honest calls are served afterwards.
func TestUnfinishedBodiesBounded(t *testing.T) {
	var refused refusals
	const msgLen = 1<<20 - 100
	const reserve = 5 + msgLen
	s, addr := start(t, Options{MaxRecvMsgSize: 1 << 20, MaxConnBufferedBytes: 4 << 20, MaxBufferedBytes: 6 << 20,
		BodyTimeout: 3 * time.Second, OnRefuse: refused.add}, &testService{})
	before := heapInUse()

	a := rawDial(t, addr)
	la := watchFrames(a)
	for i := range 40 {
		sendPartial(t, a, uint32(2*i+1), msgLen)
	}
	perConn := (4 << 20) / reserve // the requests one connection may hold
	waitUntil(t, "requests past the connection's budget refused", func() bool {
		return la.count(withStatus(codes.ResourceExhausted)) == 40-perConn
	})
	if got := s.BufferedBytes(); got != int64(perConn*reserve) {
		t.Fatalf("%d bytes buffered after one connection's attack, want %d", got, perConn*reserve)
	}

	b := rawDial(t, addr)
	lb := watchFrames(b)
	for i := range 10 {
		sendPartial(t, b, uint32(2*i+1), msgLen)
	}
	total := (6 << 20) / reserve
	waitUntil(t, "requests past the server's budget refused", func() bool {
		return lb.count(withStatus(codes.ResourceExhausted)) == 10-(total-perConn)
	})
	if got := s.BufferedBytes(); got > 6<<20 {
		t.Fatalf("%d bytes buffered, past the server's budget", got)
	}
	// 50 MB of requests were sent; a handful are held.
	if grown := int64(heapInUse()) - int64(before); grown > 24<<20 {
		t.Errorf("heap grew %d MiB under 50 unfinished 1 MiB requests, want the budgets' 6 MiB and change", grown>>20)
	}

	waitUntil(t, "unfinished requests ended after BodyTimeout", func() bool {
		return la.count(withStatus(codes.DeadlineExceeded))+lb.count(withStatus(codes.DeadlineExceeded)) == total
	})
	waitUntil(t, "buffered bytes given back", func() bool { return s.BufferedBytes() == 0 })
	if c, tot, to := refused.get(ReasonBodyBytesConn), refused.get(ReasonBodyBytesTotal), refused.get(ReasonBodyTimeout); c != 40-perConn || tot != 10-(total-perConn) || to != total {
		t.Errorf("refusals counted: %d body_bytes_conn, %d body_bytes_total, %d body_timeout; want %d, %d, %d", c, tot, to, 40-perConn, 10-(total-perConn), total)
	}
	if r, err := dial(t, addr).ModelInfer(context.Background(), echo(100_000)); err != nil || len(r.RawOutputContents[0]) != 100_000 {
		t.Fatalf("honest call after the attack: %v, %v", r, err)
	}
}

// TestBodyTimeoutFollowsTheCallsDeadline: a request body that has not
// arrived by the call's own (sooner) deadline is ended then, not at
// BodyTimeout.
func TestBodyTimeoutFollowsTheCallsDeadline(t *testing.T) {
	s, addr := start(t, Options{BodyTimeout: time.Hour, HeaderTimeout: 80 * time.Millisecond}, &testService{})
	r := rawDial(t, addr)
	l := watchFrames(r)
	r.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: requestBlock(inference.GRPCInferenceService_ModelInfer_FullMethodName, "grpc-timeout", "100m"), EndHeaders: true})
	r.fr.WriteData(1, false, []byte{0, 0, 0, 1, 0})
	r.bw.Flush()
	waitUntil(t, "the stream ended at its deadline", func() bool {
		e, ok := l.end(1)
		return ok && e.grpcStatus == "4"
	})
	waitUntil(t, "its bytes given back", func() bool { return s.BufferedBytes() == 0 })
}

// TestHPACKBomb: a small header block that references one large entry of
// the dynamic table thousands of times is refused at the header limit
// (431), without decoding it into memory, and the connection goes on.
func TestHPACKBomb(t *testing.T) {
	var refused refusals
	_, addr := start(t, Options{OnRefuse: refused.add}, &testService{})
	r := rawDial(t, addr)
	l := watchFrames(r)
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", inference.GRPCInferenceService_ServerReady_FullMethodName}, {"content-type", "application/grpc"}} {
		enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1], Sensitive: true})
	}
	bomb := hpack.HeaderField{Name: "x-bomb-bin", Value: strings.Repeat("A", 4000)}
	for range 4100 {
		enc.WriteField(bomb) // indexed after the first: a byte or two each
	}
	if hb.Len() > 16<<10 {
		t.Fatalf("bomb block of %d bytes", hb.Len())
	}
	r.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: hb.Bytes(), EndHeaders: true, EndStream: true})
	r.bw.Flush()
	waitUntil(t, "the bomb refused", func() bool { e, ok := l.end(1); return ok && e.httpStatus == "431" })
	if refused.get(ReasonHeaderList) != 1 {
		t.Errorf("header_list refusals counted: %d, want 1", refused.get(ReasonHeaderList))
	}
	// The same connection serves a call after it.
	r.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 3, BlockFragment: requestBlock(inference.GRPCInferenceService_ServerReady_FullMethodName), EndHeaders: true})
	r.fr.WriteData(3, true, []byte{0, 0, 0, 0, 0})
	r.bw.Flush()
	waitUntil(t, "a call after the bomb", func() bool { e, ok := l.end(3); return ok && e.grpcStatus == "0" })
}

// TestUnfinishedHeaderBlocks: a header block left unfinished closes its
// connection after HeaderTimeout, and a flood of CONTINUATION frames
// (empty ones decode to nothing) ends long before it could cost anything.
func TestUnfinishedHeaderBlocks(t *testing.T) {
	var refused refusals
	_, addr := start(t, Options{HeaderTimeout: 200 * time.Millisecond, OnRefuse: refused.add}, &testService{})
	block := requestBlock(inference.GRPCInferenceService_ServerReady_FullMethodName)

	r := rawDial(t, addr)
	l := watchFrames(r)
	r.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block[:10], EndHeaders: false})
	r.bw.Flush()
	waitUntil(t, "GOAWAY for the stalled block", func() bool { c, ok := l.goAwayCode(); return ok && c == http2.ErrCodeEnhanceYourCalm })
	waitUntil(t, "the connection closed", l.isClosed)
	if refused.get(ReasonHeaderTimeout) != 1 {
		t.Errorf("header_timeout refusals counted: %d, want 1", refused.get(ReasonHeaderTimeout))
	}

	r = rawDial(t, addr)
	l = watchFrames(r)
	r.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block[:10], EndHeaders: false})
	for range 100_000 { // 900 KB of frames, if all were read
		if err := r.fr.WriteContinuation(1, false, nil); err != nil {
			break
		}
	}
	r.bw.Flush()
	waitUntil(t, "GOAWAY for the flood", func() bool { c, ok := l.goAwayCode(); return ok && c == http2.ErrCodeProtocol })
	if refused.get(ReasonHeaderList) != 1 {
		t.Errorf("header_list refusals counted: %d, want 1", refused.get(ReasonHeaderList))
	}
	if _, err := dial(t, addr).ServerReady(context.Background(), &inference.ServerReadyRequest{}); err != nil {
		t.Fatalf("honest call after the header attacks: %v", err)
	}
}

// TestDribblers: a connection that never completes its preface is closed
// after HandshakeTimeout; one that completes it and then sends a byte now
// and then but never a call, after IdleTimeout; a connection with calls
// stays.
func TestDribblers(t *testing.T) {
	var refused refusals
	_, addr := start(t, Options{HandshakeTimeout: 200 * time.Millisecond, IdleTimeout: 300 * time.Millisecond, OnRefuse: refused.add}, &testService{})

	pre := rawConnTo(t, addr)
	pre.Write([]byte(http2.ClientPreface[:10]))
	pre.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := pre.Read(make([]byte, 1)); err == nil {
		t.Fatal("read something from a server that still waits for the preface")
	}
	waitUntil(t, "handshake_timeout counted", func() bool { return refused.get(ReasonHandshakeTimeout) == 1 })

	// After the preface, a frame (of a type no one knows, 16 KB) a byte
	// every 20 ms: it would take five minutes.
	r := rawDial(t, addr)
	l := watchFrames(r)
	r.nc.Write([]byte{0, 0x40, 0, 0xee, 0, 0, 0, 0, 0})
	go func() {
		for !l.isClosed() {
			r.nc.Write([]byte{0})
			time.Sleep(20 * time.Millisecond)
		}
	}()
	waitUntil(t, "the dribbler sent GOAWAY", func() bool { c, ok := l.goAwayCode(); return ok && c == http2.ErrCodeNo })
	waitUntil(t, "the dribbler closed", l.isClosed)
	if refused.get(ReasonIdleTimeout) != 1 {
		t.Errorf("idle_timeout refusals counted: %d, want 1", refused.get(ReasonIdleTimeout))
	}

	c := dial(t, addr)
	for range 10 {
		if _, err := c.ServerReady(context.Background(), &inference.ServerReadyRequest{}); err != nil {
			t.Fatalf("call on a connection in use: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestConformance: what h2spec found (and more), each on its own
// connection: answers split at the client's frame size, FRAME_SIZE_ERROR
// for an oversized frame, malformed requests reset, settings out of range
// refused.
func TestConformance(t *testing.T) {
	_, addr := start(t, Options{}, &testService{})
	call := func(r *rawConn, id uint32, extra ...string) {
		r.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: requestBlock(inference.GRPCInferenceService_ServerReady_FullMethodName, extra...), EndHeaders: true})
		r.fr.WriteData(id, true, []byte{0, 0, 0, 0, 0})
		r.bw.Flush()
	}

	t.Run("long answer in CONTINUATIONs", func(t *testing.T) {
		r := rawDial(t, addr)
		l := watchFrames(r)
		path := "/" + strings.Repeat("%", 12_000) // percent-encoded thrice over in the answer
		r.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: requestBlock(path), EndHeaders: true, EndStream: true})
		r.bw.Flush()
		waitUntil(t, "the answer", func() bool { _, ok := l.end(1); return ok })
		if e, _ := l.end(1); e.grpcStatus != "12" {
			t.Errorf("answer %+v, want UNIMPLEMENTED", e)
		}
		l.mu.Lock()
		defer l.mu.Unlock()
		if e, _ := l.ends[1]; len(e.grpcMessage) < 16384 {
			t.Errorf("grpc-message of %d bytes: the answer fits one frame, nothing to split", len(e.grpcMessage))
		}
		if l.maxSeen > 16384 {
			t.Errorf("a frame of %d bytes, past the client's SETTINGS_MAX_FRAME_SIZE", l.maxSeen)
		}
	})
	t.Run("oversized frame", func(t *testing.T) {
		r := rawDial(t, addr)
		l := watchFrames(r)
		go func() {
			r.fr.WriteData(1, false, make([]byte, maxFrameSize+1))
			r.bw.Flush()
		}()
		waitUntil(t, "GOAWAY FRAME_SIZE_ERROR", func() bool { c, ok := l.goAwayCode(); return ok && c == http2.ErrCodeFrameSize })
	})
	for _, bad := range [][]string{{"connection", "keep-alive"}, {"te", "gzip"}, {"upgrade", "h2c"}, {"transfer-encoding", "chunked"}} {
		t.Run("header "+bad[0], func(t *testing.T) {
			r := rawDial(t, addr)
			l := watchFrames(r)
			call(r, 1, bad...)
			call(r, 3)
			waitUntil(t, "both streams ended", func() bool { _, a := l.end(1); _, b := l.end(3); return a && b })
			if e, _ := l.end(1); !e.reset || e.rst != http2.ErrCodeProtocol {
				t.Errorf("stream with %s: %+v, want RST_STREAM PROTOCOL_ERROR", bad[0], e)
			}
			if e, _ := l.end(3); e.grpcStatus != "0" {
				t.Errorf("the call after it: %+v", e)
			}
		})
	}
	t.Run("no scheme", func(t *testing.T) {
		r := rawDial(t, addr)
		l := watchFrames(r)
		var hb bytes.Buffer
		enc := hpack.NewEncoder(&hb)
		for _, f := range [][2]string{{":method", "POST"}, {":path", inference.GRPCInferenceService_ServerReady_FullMethodName}, {"content-type", "application/grpc"}} {
			enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
		}
		r.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: hb.Bytes(), EndHeaders: true, EndStream: true})
		r.bw.Flush()
		waitUntil(t, "the stream reset", func() bool { e, ok := l.end(1); return ok && e.reset && e.rst == http2.ErrCodeProtocol })
	})
	t.Run("content-length", func(t *testing.T) {
		r := rawDial(t, addr)
		l := watchFrames(r)
		call(r, 1, "content-length", "6")
		call(r, 3, "content-length", "5")
		waitUntil(t, "both streams ended", func() bool { _, a := l.end(1); _, b := l.end(3); return a && b })
		if e, _ := l.end(1); !e.reset || e.rst != http2.ErrCodeProtocol {
			t.Errorf("content-length 6 with 5 bytes: %+v, want RST_STREAM PROTOCOL_ERROR", e)
		}
		if e, _ := l.end(3); e.grpcStatus != "0" {
			t.Errorf("content-length that matches: %+v", e)
		}
	})
	for _, st := range []struct {
		name string
		s    http2.Setting
		code http2.ErrCode
	}{
		{"max frame size 0", http2.Setting{ID: http2.SettingMaxFrameSize, Val: 0}, http2.ErrCodeProtocol},
		{"max frame size 2^24", http2.Setting{ID: http2.SettingMaxFrameSize, Val: 1 << 24}, http2.ErrCodeProtocol},
		{"initial window 2^31", http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1 << 31}, http2.ErrCodeFlowControl},
		{"enable push 2", http2.Setting{ID: http2.SettingEnablePush, Val: 2}, http2.ErrCodeProtocol},
	} {
		t.Run(st.name, func(t *testing.T) {
			r := rawDial(t, addr)
			l := watchFrames(r)
			r.fr.WriteSettings(st.s)
			r.bw.Flush()
			waitUntil(t, "GOAWAY", func() bool { c, ok := l.goAwayCode(); return ok && c == st.code })
		})
	}
	t.Run("idle stream", func(t *testing.T) {
		for _, write := range []func(*http2.Framer){
			func(fr *http2.Framer) { fr.WriteRSTStream(5, http2.ErrCodeCancel) },
			func(fr *http2.Framer) { fr.WriteWindowUpdate(5, 100) },
		} {
			r := rawDial(t, addr)
			l := watchFrames(r)
			write(r.fr)
			r.bw.Flush()
			waitUntil(t, "GOAWAY PROTOCOL_ERROR", func() bool { c, ok := l.goAwayCode(); return ok && c == http2.ErrCodeProtocol })
		}
	})
	t.Run("DATA after a refusal", func(t *testing.T) {
		// Refused at its headers (unknown method) while the client still
		// sends: its DATA in flight is dropped, not answered (RFC 9113
		// 5.1), until the client itself resets the stream.
		r := rawDial(t, addr)
		l := watchFrames(r)
		r.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: requestBlock("/no.Such/Method"), EndHeaders: true})
		r.bw.Flush()
		waitUntil(t, "the refusal", func() bool {
			e, ok := l.end(1)
			return ok && e.grpcStatus == "12" && e.reset && e.rst == http2.ErrCodeNo
		})
		r.fr.WriteData(1, false, []byte{0, 0, 0, 0})
		call(r, 3)
		waitUntil(t, "the next call answered", func() bool { e, ok := l.end(3); return ok && e.grpcStatus == "0" })
		if e, _ := l.end(1); e.rst != http2.ErrCodeNo {
			t.Fatalf("DATA in flight after a refusal answered %v", e.rst)
		}
		r.fr.WriteRSTStream(1, http2.ErrCodeCancel)
		r.fr.WriteData(1, true, []byte{0})
		r.bw.Flush()
		waitUntil(t, "RST_STREAM STREAM_CLOSED", func() bool { e, _ := l.end(1); return e.rst == http2.ErrCodeStreamClosed })
	})
	t.Run("DATA on a closed stream", func(t *testing.T) {
		r := rawDial(t, addr)
		l := watchFrames(r)
		call(r, 1)
		waitUntil(t, "the call answered", func() bool { e, ok := l.end(1); return ok && e.grpcStatus == "0" })
		r.fr.WriteData(1, true, []byte{0})
		r.bw.Flush()
		waitUntil(t, "RST_STREAM STREAM_CLOSED", func() bool { e, _ := l.end(1); return e.reset && e.rst == http2.ErrCodeStreamClosed })
	})
}

// TestPingStrikesSurviveRefusedRequests: requests the server refuses
// (here, GETs) do not earn the client its pings back.
func TestPingStrikesSurviveRefusedRequests(t *testing.T) {
	var refused refusals
	_, addr := start(t, Options{KeepaliveMinTime: time.Minute, OnRefuse: refused.add}, &testService{})
	r := rawDial(t, addr)
	l := watchFrames(r)
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for _, f := range [][2]string{{":method", "GET"}, {":scheme", "http"}, {":path", "/"}} {
		enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1], Sensitive: true})
	}
	for i := range 6 {
		r.fr.WritePing(false, [8]byte{byte(i)})
		r.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: uint32(2*i + 1), BlockFragment: hb.Bytes(), EndHeaders: true, EndStream: true})
	}
	r.bw.Flush()
	waitUntil(t, "GOAWAY ENHANCE_YOUR_CALM", func() bool { c, ok := l.goAwayCode(); return ok && c == http2.ErrCodeEnhanceYourCalm })
	if refused.get(ReasonPings) != 1 {
		t.Errorf("pings refusals counted: %d, want 1", refused.get(ReasonPings))
	}
}
