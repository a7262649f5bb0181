package frontend

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"net"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/codes"

	"github.com/recmesh/recmesh/frontend/h2unary"
	"github.com/recmesh/recmesh/proto/inference"
)

// h2conn is a hand-driven HTTP/2 client on a raw TCP connection: an
// attacker, which does what real clients never do.
type h2conn struct {
	nc net.Conn
	fr *http2.Framer
	bw *bufio.Writer

	mu     sync.Mutex
	ends   map[uint32]string // stream → grpc-status of its end, or "RST_STREAM <code>"
	goAway *http2.ErrCode
	closed bool
}

// dialH2 connects, sends the preface and SETTINGS, and reads frames on a
// goroutine of its own, recording how streams and the connection end.
func dialH2(t *testing.T, addr string) *h2conn {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	c := &h2conn{nc: nc, bw: bufio.NewWriter(nc), ends: map[uint32]string{}}
	c.bw.WriteString(http2.ClientPreface)
	c.fr = http2.NewFramer(c.bw, bufio.NewReader(nc))
	c.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	c.fr.WriteSettings()
	c.bw.Flush()
	go c.read()
	return c
}

func (c *h2conn) read() {
	for {
		f, err := c.fr.ReadFrame()
		c.mu.Lock()
		if err != nil {
			c.closed = true
			c.mu.Unlock()
			return
		}
		switch f := f.(type) {
		case *http2.MetaHeadersFrame:
			if f.StreamEnded() {
				for _, hf := range f.RegularFields() {
					if hf.Name == "grpc-status" {
						c.ends[f.StreamID] = hf.Value
					}
				}
			}
		case *http2.RSTStreamFrame:
			if _, ok := c.ends[f.StreamID]; !ok {
				c.ends[f.StreamID] = "RST_STREAM " + f.ErrCode.String()
			}
		case *http2.GoAwayFrame:
			code := f.ErrCode
			c.goAway = &code
		}
		c.mu.Unlock()
	}
}

// ended counts the streams that ended as one of outcomes says.
func (c *h2conn) ended(outcomes ...string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, e := range c.ends {
		for _, o := range outcomes {
			if e == o {
				n++
				break
			}
		}
	}
	return n
}

func (c *h2conn) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

func (c *h2conn) goAwayCode() (http2.ErrCode, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.goAway == nil {
		return 0, false
	}
	return *c.goAway, true
}

// write sends frames (a dribbler writes to the socket between them).
func (c *h2conn) write(frames func(fr *http2.Framer) error) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := frames(c.fr); err != nil {
		return err
	}
	return c.bw.Flush()
}

func callHeaders(path string) []byte {
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", path}, {":authority", "test"}, {"content-type", "application/grpc"}, {"te", "trailers"}} {
		enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1], Sensitive: true})
	}
	return hb.Bytes()
}

// sendUnfinished opens stream id with a ModelInfer request that declares
// msgLen bytes and sends all of them but the last.
func (c *h2conn) sendUnfinished(id uint32, msgLen int) error {
	body := make([]byte, 5+msgLen-1)
	binary.BigEndian.PutUint32(body[1:], uint32(msgLen))
	return c.sendOpen(id, callHeaders(inference.GRPCInferenceService_ModelInfer_FullMethodName), body)
}

// sendOpen opens stream id with the header block and sends body in DATA
// frames of at most 16 KiB, leaving the stream open.
func (c *h2conn) sendOpen(id uint32, headers, body []byte) error {
	return c.write(func(fr *http2.Framer) error {
		if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: headers, EndHeaders: true}); err != nil {
			return err
		}
		for b := body; len(b) > 0; {
			n := min(len(b), 16<<10)
			if err := fr.WriteData(id, false, b[:n]); err != nil {
				return err
			}
			b = b[n:]
		}
		return nil
	})
}

// streamEnded reports whether the server has ended stream id.
func (c *h2conn) streamEnded(id uint32) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.ends[id]
	return ok
}

func refusedCount(ts *testServer, reason string) int {
	c, ok := ts.srv.metrics.refused[reason]
	if !ok {
		return -1
	}
	return int(testutil.ToFloat64(c))
}

func heapInUse() int64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapInuse)
}

func totalAlloc() int64 {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.TotalAlloc)
}

// honestCall checks that a real client is served.
func honestCall(t *testing.T, ts *testServer) {
	t.Helper()
	dense, sparse := inputs(testMaxBatch)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn := dial(t, ts.srv.Addr().String())
	if _, err := inference.NewGRPCInferenceServiceClient(conn).ModelInfer(ctx, rawRequest(dense, sparse, testMaxBatch, false)); err != nil {
		t.Fatalf("honest call: %v", err)
	}
}

func TestConnectionLimit(t *testing.T) { forEachTransport(t, testConnectionLimit) }

// testConnectionLimit: past MaxConnections a connection is closed as it
// is accepted, counted; the connections already open are served, and a
// freed slot is taken again.
func testConnectionLimit(t *testing.T, tr string) {
	ts := startServerOn(t, tr, newFakeBackend(), func(o *Options) { o.MaxConnections = 3 })
	if _, err := ts.api.ServerReady(context.Background(), &inference.ServerReadyRequest{}); err != nil {
		t.Fatal(err)
	}
	addr := ts.srv.Addr().String()
	a, b := dialH2(t, addr), dialH2(t, addr)
	waitFor(t, 10*time.Second, "three connections open", func() bool { return testutil.ToFloat64(ts.srv.metrics.conns) == 3 })
	over := dialH2(t, addr)
	waitFor(t, 10*time.Second, "the fourth connection closed", over.isClosed)
	if n := refusedCount(ts, reasonConnections); n != 1 {
		t.Errorf("refused{reason=connections} = %d, want 1", n)
	}
	if a.isClosed() || b.isClosed() {
		t.Error("a connection within the limit was closed")
	}
	if _, err := ts.api.ServerReady(context.Background(), &inference.ServerReadyRequest{}); err != nil {
		t.Errorf("call on a connection within the limit: %v", err)
	}
	a.nc.Close()
	waitFor(t, 10*time.Second, "the slot freed", func() bool { return testutil.ToFloat64(ts.srv.metrics.conns) == 2 })
	honestCall(t, ts)
}

func TestUnfinishedBodies(t *testing.T) { forEachTransport(t, testUnfinishedBodies) }

// testUnfinishedBodies: requests that declare a message of about the
// largest size and never finish it hold no more than the connection's
// budget (on a server whose own budget is far away), then no more than the
// frontend's (on one whose two connections can each hold all of it, so it
// is reached whatever order their requests arrive in), and give their bytes back when their connections go; honest calls are
// served after. The body time limit is far away too, so no request ends
// by it, however slow the machine (testBodyTimeout has it).
func testUnfinishedBodies(t *testing.T, tr string) {
	const small, large = 3 << 20, 1 << 30
	for _, tc := range []struct {
		reason            string
		connCap, totalCap int64
	}{
		{h2unary.ReasonBodyBytesConn, small, large},
		{h2unary.ReasonBodyBytesTotal, small, small}, // together past it, each within its own
	} {
		ts := startServerOn(t, tr, newFakeBackend(), func(o *Options) {
			o.MaxConnBufferedBytes, o.MaxBufferedBytes = tc.connCap, tc.totalCap
			o.BodyTimeout = 10 * time.Minute
		})
		addr := ts.srv.Addr().String()
		before := heapInUse()
		const msgLen = 1<<20 - 1000
		refusedOrCancelled := []string{strconv.Itoa(int(codes.ResourceExhausted)), strconv.Itoa(int(codes.Canceled))}
		conns := []*h2conn{dialH2(t, addr), dialH2(t, addr)}
		for _, c := range conns {
			for i := range 10 {
				if err := c.sendUnfinished(uint32(2*i+1), msgLen); err != nil {
					t.Fatal(err)
				}
			}
		}
		// 20 MB of requests; each budget holds 3 MiB: the server's (both
		// connections) or each connection's.
		want := 20 - 3
		if tc.reason == h2unary.ReasonBodyBytesConn {
			want = 20 - 2*3
		}
		waitFor(t, 20*time.Second, tc.reason+" refusals", func() bool {
			return conns[0].ended(refusedOrCancelled...)+conns[1].ended(refusedOrCancelled...) >= want
		})
		if got := ts.srv.bufferedBytes(); got > 2*small {
			t.Errorf("%s: %v request bytes buffered, past the budgets' %d", tc.reason, got, 2*small)
		}
		if grown := heapInUse() - before; grown > 16<<20 {
			t.Errorf("%s: heap grew %d MiB under 20 unfinished 1 MiB requests", tc.reason, grown>>20)
		}
		if n := refusedCount(ts, tc.reason); n < 1 {
			t.Errorf("%s refusals counted: %d", tc.reason, n)
		}
		// The connections go: what they held comes back.
		for _, c := range conns {
			c.nc.Close()
		}
		waitFor(t, 20*time.Second, "buffered bytes given back", func() bool { return ts.srv.bufferedBytes() == 0 })
		honestCall(t, ts)
	}
}

func TestBodyTimeout(t *testing.T) { forEachTransport(t, testBodyTimeout) }

// testBodyTimeout: a request whose body never completes is ended after
// BodyTimeout (DEADLINE_EXCEEDED on lean, CANCELLED on grpc: a cancelled
// context is all grpc-go lets the frontend end a call with) and gives its
// bytes back; honest calls are served after.
func testBodyTimeout(t *testing.T, tr string) {
	ts := startServerOn(t, tr, newFakeBackend(), func(o *Options) { o.BodyTimeout = time.Second })
	c := dialH2(t, ts.srv.Addr().String())
	for i := range 3 {
		if err := c.sendUnfinished(uint32(2*i+1), 1<<20); err != nil {
			t.Fatal(err)
		}
	}
	ended := []string{strconv.Itoa(int(codes.DeadlineExceeded)), strconv.Itoa(int(codes.Canceled))}
	waitFor(t, 30*time.Second, "every unfinished request ended", func() bool { return c.ended(ended...) == 3 })
	waitFor(t, 20*time.Second, "buffered bytes given back", func() bool { return ts.srv.bufferedBytes() == 0 })
	if refusedCount(ts, h2unary.ReasonBodyTimeout) < 1 {
		t.Errorf("body_timeout refusals: %d", refusedCount(ts, h2unary.ReasonBodyTimeout))
	}
	honestCall(t, ts)
}

func TestHeaderAttacks(t *testing.T) { forEachTransport(t, testHeaderAttacks) }

// testHeaderAttacks: an HPACK bomb (a 4 KB -bin entry referenced 4,100
// times, 16 MB of metadata from 12 KB on the wire) is refused without
// being decoded, and header blocks that CONTINUATION frames never finish
// hold nothing; honest calls are served after.
func testHeaderAttacks(t *testing.T, tr string) {
	ts := startServerOn(t, tr, newFakeBackend(), nil)
	addr := ts.srv.Addr().String()

	bomb := dialH2(t, addr)
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	value := strings.Repeat("QUFB", 1000) // base64, as -bin values are
	allocs := totalAlloc()
	for i := range 8 {
		hb.Reset()
		for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", inference.GRPCInferenceService_ServerReady_FullMethodName}, {"content-type", "application/grpc"}} {
			enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
		}
		for range 4100 {
			enc.WriteField(hpack.HeaderField{Name: "x-bomb-bin", Value: value})
		}
		id := uint32(2*i + 1)
		if err := bomb.write(func(fr *http2.Framer) error {
			if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: hb.Bytes(), EndHeaders: true}); err != nil {
				return err
			}
			return fr.WriteData(id, true, []byte{0, 0, 0, 0, 0})
		}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 10*time.Second, "every bomb answered", func() bool {
		bomb.mu.Lock()
		defer bomb.mu.Unlock()
		return len(bomb.ends) == 8 || bomb.closed
	})
	if ok := bomb.ended("0"); ok > 0 {
		t.Errorf("%d bombs served", ok)
	}
	if a := totalAlloc() - allocs; a > 32<<20 {
		t.Errorf("%d MiB allocated serving 8 bombs", a>>20)
	}

	// Two connections each send 15 MB of header fields in CONTINUATIONs
	// and never end the block.
	before := heapInUse()
	field := hpack.HeaderField{Name: "x-filler", Value: strings.Repeat("f", 4000), Sensitive: true}
	var flooders []*h2conn
	for range 2 {
		c := dialH2(t, addr)
		enc := hpack.NewEncoder(&hb)
		hb.Reset()
		enc.WriteField(hpack.HeaderField{Name: ":method", Value: "POST"})
		c.write(func(fr *http2.Framer) error {
			return fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: hb.Bytes(), EndHeaders: false})
		})
		sent := 0
		for sent < 15<<20 && !c.isClosed() {
			hb.Reset()
			for range 4 {
				enc.WriteField(field)
			}
			if err := c.write(func(fr *http2.Framer) error { return fr.WriteContinuation(1, false, hb.Bytes()) }); err != nil {
				break // closed by the server
			}
			sent += hb.Len()
		}
		flooders = append(flooders, c)
	}
	// Both transports end a block that runs far past the 16 KiB header
	// limit: x/net's reader after the limit (grpc), h2unary's after twice
	// it. Unbounded, each would hold 15 MB until the block ended.
	waitFor(t, 20*time.Second, "the flooding connections closed", func() bool { return flooders[0].isClosed() && flooders[1].isClosed() })
	if grown := heapInUse() - before; grown > 8<<20 {
		t.Errorf("heap grew %d MiB holding two unfinished 15 MB header blocks", grown>>20)
	}
	honestCall(t, ts)
}

func TestDribblers(t *testing.T) { forEachTransport(t, testDribblers) }

// testDribblers: a connection that does not finish its preface is closed
// after HandshakeTimeout, and one that sends a byte now and then but
// never a call, after IdleTimeout.
func testDribblers(t *testing.T, tr string) {
	ts := startServerOn(t, tr, newFakeBackend(), func(o *Options) {
		o.HandshakeTimeout, o.IdleTimeout = 300*time.Millisecond, 300*time.Millisecond
	})
	addr := ts.srv.Addr().String()

	pre, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer pre.Close()
	pre.Write([]byte(http2.ClientPreface[:10]))
	pre.SetReadDeadline(time.Now().Add(20 * time.Second))
	// grpc-go sends its SETTINGS before it reads the preface.
	if _, err := io.Copy(io.Discard, pre); err != nil {
		t.Fatalf("the connection with half a preface: %v, want it closed", err)
	}
	waitFor(t, 10*time.Second, "handshake_timeout counted", func() bool { return refusedCount(ts, h2unary.ReasonHandshakeTimeout) == 1 })

	// After the preface, a frame (of a type no one knows, 16 KB) a byte
	// every 20 ms: it would take five minutes.
	d := dialH2(t, addr)
	go func() {
		d.write(func(fr *http2.Framer) error { return nil })
		d.mu.Lock()
		d.nc.Write([]byte{0, 0x40, 0, 0xee, 0, 0, 0, 0, 0})
		d.mu.Unlock()
		for !d.isClosed() {
			d.nc.Write([]byte{0})
			time.Sleep(20 * time.Millisecond)
		}
	}()
	// grpc-go closes 5 s after its GOAWAY when its PING goes unanswered.
	waitFor(t, 20*time.Second, "the dribbler closed", d.isClosed)
	if code, ok := d.goAwayCode(); !ok || code != http2.ErrCodeNo {
		t.Errorf("dribbler's GOAWAY %v (sent %v), want NO_ERROR", code, ok)
	}
	honestCall(t, ts)
}

// TestLimitOptions: the limits' defaults and checks.
func TestLimitOptions(t *testing.T) {
	base := Options{Model: testConfig(), Backend: newFakeBackend()}
	o, err := base.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if o.MaxConnections != DefaultMaxConnections || o.HandshakeTimeout != DefaultHandshakeTimeout || o.IdleTimeout != DefaultIdleTimeout ||
		o.HeaderTimeout != DefaultHeaderTimeout || o.BodyTimeout != DefaultBodyTimeout ||
		o.MaxConnBufferedBytes != DefaultMaxConnBufferedBytes || o.MaxBufferedBytes != DefaultMaxBufferedBytes {
		t.Errorf("defaults: %+v", o)
	}
	// A MaxBatch whose largest request is past the default budget raises it.
	big := base
	big.MaxBatch = MaxMaxBatch
	if o, err := big.withDefaults(); err != nil || o.MaxConnBufferedBytes < int64(maxRecvMsgSize(MaxMaxBatch, testConfig().SparseWidth())) || o.MaxBufferedBytes < o.MaxConnBufferedBytes {
		t.Errorf("MaxBatch %d: budgets %d, %d, %v", MaxMaxBatch, o.MaxConnBufferedBytes, o.MaxBufferedBytes, err)
	}
	for _, bad := range []struct {
		option string
		edit   func(*Options)
	}{
		{"MaxConnections", func(o *Options) { o.MaxConnections = -1 }},
		{"BodyTimeout", func(o *Options) { o.BodyTimeout = -time.Second }},
		{"IdleTimeout", func(o *Options) { o.IdleTimeout = -time.Second }},
		{"MaxConnBufferedBytes", func(o *Options) { o.MaxConnBufferedBytes = 1000 }},
		{"MaxBufferedBytes", func(o *Options) { o.MaxConnBufferedBytes, o.MaxBufferedBytes = 64<<20, 32<<20 }},
	} {
		o := base
		bad.edit(&o)
		_, err := o.withDefaults()
		if oe, ok := err.(*OptionError); !ok || oe.Option != bad.option {
			t.Errorf("%s: %v, want an *OptionError naming it", bad.option, err)
		}
	}
}
