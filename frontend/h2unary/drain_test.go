package h2unary

import (
	"bufio"
	"errors"
	"io"
	"testing"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/recmesh/recmesh/proto/inference"
)

// drainClient reads one raw connection's frames through a graceful stop.
type drainClient struct {
	t    *testing.T
	name string
	r    *rawConn
}

// next reads frames until one that match accepts; it skips SETTINGS,
// WINDOW_UPDATE, DATA and answers' leading HEADERS, and fails on others.
func (d *drainClient) next(what string, match func(http2.Frame) bool) http2.Frame {
	d.t.Helper()
	for {
		f, err := d.r.fr.ReadFrame()
		if err != nil {
			d.t.Fatalf("%s: no %s before %v", d.name, what, err)
		}
		if match(f) {
			return f
		}
		switch f := f.(type) {
		case *http2.SettingsFrame, *http2.WindowUpdateFrame, *http2.DataFrame:
		case *http2.MetaHeadersFrame:
			if f.StreamEnded() {
				d.t.Fatalf("%s: stream %d ended while waiting for %s", d.name, f.StreamID, what)
			}
		default:
			d.t.Fatalf("%s: %v while waiting for %s", d.name, f.Header(), what)
		}
	}
}

func (d *drainClient) goAway(want uint32) {
	d.t.Helper()
	g := d.next("GOAWAY", func(f http2.Frame) bool { _, ok := f.(*http2.GoAwayFrame); return ok }).(*http2.GoAwayFrame)
	if g.ErrCode != http2.ErrCodeNo || g.LastStreamID != want {
		d.t.Fatalf("%s: GOAWAY %v last stream %d, want NO_ERROR and %d", d.name, g.ErrCode, g.LastStreamID, want)
	}
}

// call opens stream id with a ServerReady call.
func (d *drainClient) call(id uint32) {
	d.t.Helper()
	d.r.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: requestBlock(inference.GRPCInferenceService_ServerReady_FullMethodName), EndHeaders: true})
	d.r.fr.WriteData(id, true, []byte{0, 0, 0, 0, 0})
	if err := d.r.bw.Flush(); err != nil {
		d.t.Fatal(err)
	}
}

func (d *drainClient) answered(id uint32) {
	d.t.Helper()
	f := d.next("the answer's trailers", func(f http2.Frame) bool {
		h, ok := f.(*http2.MetaHeadersFrame)
		return ok && h.StreamEnded()
	}).(*http2.MetaHeadersFrame)
	if f.StreamID != id || headerValue(f, "grpc-status") != "0" {
		d.t.Fatalf("%s: stream %d ended with grpc-status %q, want stream %d OK", d.name, f.StreamID, headerValue(f, "grpc-status"), id)
	}
}

// closedCleanly: the server shuts its side with a FIN, not a reset that
// could drop what it sent last.
func (d *drainClient) closedCleanly() {
	d.t.Helper()
	for {
		_, err := d.r.fr.ReadFrame()
		if errors.Is(err, io.EOF) {
			d.r.nc.Close() // as clients do, which ends the server's lingering
			return
		}
		if err != nil {
			d.t.Fatalf("%s: connection ended with %v, want EOF", d.name, err)
		}
	}
}

// TestGracefulStopTwoGoAways: a graceful stop first sends GOAWAY naming
// the largest stream id and a PING; a call the client opens before it
// acks the PING (one that crossed the GOAWAY) is served, not refused; the
// ack brings the GOAWAY naming the last stream served, and the connection
// closes with a FIN once idle. A connection still in its handshake when
// the stop begins is not dropped: it gets the server preface, the same
// two GOAWAYs, and its call served.
func TestGracefulStopTwoGoAways(t *testing.T) {
	s, addr := start(t, Options{}, &testService{})
	idle := &drainClient{t: t, name: "idle connection", r: rawDial(t, addr)}
	idle.call(1)
	idle.answered(1)
	// An ack of the drain PING that no drain sent changes nothing.
	idle.r.fr.WritePing(true, drainPing)
	idle.call(3)
	idle.answered(3)

	nc := rawConnTo(t, addr) // the handshake waits for its preface
	bw := bufio.NewWriter(nc)
	fr := http2.NewFramer(bw, nc)
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	shaking := &drainClient{t: t, name: "connection in its handshake", r: &rawConn{nc: nc, fr: fr, bw: bw}}
	waitUntil(t, "both connections accepted", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return len(s.conns) == 2
	})

	stopped := make(chan struct{})
	go func() { s.GracefulStop(); close(stopped) }()

	isPing := func(f http2.Frame) bool { p, ok := f.(*http2.PingFrame); return ok && !p.IsAck() }
	idle.goAway(maxStreamID)
	ping := idle.next("the drain PING", isPing).(*http2.PingFrame)
	idle.call(5)
	idle.answered(5)
	idle.r.fr.WritePing(true, ping.Data)
	idle.r.bw.Flush()
	idle.goAway(5)
	idle.closedCleanly()

	bw.WriteString(http2.ClientPreface)
	fr.WriteSettings()
	shaking.call(1)
	shaking.goAway(maxStreamID)
	ping = shaking.next("the drain PING", isPing).(*http2.PingFrame)
	shaking.answered(1)
	fr.WritePing(true, ping.Data)
	bw.Flush()
	shaking.goAway(1)
	shaking.closedCleanly()
	<-stopped
}
