package h2client

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
)

// The tests drive a real grpc-go server whose handler takes any method and
// works on raw message bytes, so sizes and failures are the test's to
// choose.

// rawCodec passes message bytes through untouched.
type rawCodec struct{}

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(*v.(*[]byte))}, nil
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	*v.(*[]byte) = data.Materialize()
	return nil
}

func (rawCodec) Name() string { return "proto" }

var _ encoding.CodecV2 = rawCodec{}

type server struct {
	addr     string
	srv      *grpc.Server
	mu       sync.Mutex // makes the in-flight count and its peak one step
	inFlight atomic.Int32
	peak     atomic.Int32
	release  chan struct{} // /t/block waits on it
}

// startServer serves:
//
//	/t/echo   the request back
//	/t/error  INVALID_ARGUMENT with the request as the message
//	/t/sleep  nothing until the call's context ends
//	/t/block  the request back, once release is closed
//	/t/big    a response of the size the request's first 4 bytes give
func startServer(t *testing.T, opts ...grpc.ServerOption) *server {
	t.Helper()
	s := &server{release: make(chan struct{})}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s.addr = lis.Addr().String()
	opts = append(opts, grpc.ForceServerCodecV2(rawCodec{}), grpc.MaxRecvMsgSize(64<<20), grpc.MaxSendMsgSize(64<<20),
		grpc.UnknownServiceHandler(s.handle))
	s.srv = grpc.NewServer(opts...)
	go s.srv.Serve(lis)
	t.Cleanup(s.srv.Stop)
	return s
}

func (s *server) handle(_ any, st grpc.ServerStream) error {
	s.mu.Lock()
	s.peak.Store(max(s.peak.Load(), s.inFlight.Add(1)))
	s.mu.Unlock()
	defer s.inFlight.Add(-1)
	method, _ := grpc.MethodFromServerStream(st)
	var req []byte
	if err := st.RecvMsg(&req); err != nil {
		return err
	}
	switch method {
	case "/t/echo":
		return st.SendMsg(&req)
	case "/t/error":
		return status.Error(codes.InvalidArgument, string(req))
	case "/t/sleep":
		<-st.Context().Done()
		return st.Context().Err()
	case "/t/block":
		<-s.release
		return st.SendMsg(&req)
	case "/t/big":
		n := int(req[0]) | int(req[1])<<8 | int(req[2])<<16 | int(req[3])<<24
		resp := bytes.Repeat([]byte{7}, n)
		return st.SendMsg(&resp)
	}
	return status.Errorf(codes.Unimplemented, "no method %s", method)
}

func dial(t *testing.T, addr string, opts Options) *Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := Dial(ctx, addr, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

type result struct {
	resp []byte
	err  error
}

// call makes one blocking call.
func call(c *Conn, method string, msg []byte, timeout time.Duration) ([]byte, error) {
	ch := make(chan result, 1)
	c.Go(method, msg, timeout, func(resp []byte, err error) {
		ch <- result{append([]byte(nil), resp...), err}
	})
	r := <-ch
	return r.resp, r.err
}

func TestEchoSizes(t *testing.T) {
	s := startServer(t)
	c := dial(t, s.addr, Options{})
	// Past the protocol's 64 KiB initial windows both ways, and past the
	// client's own 4 MiB stream window on the way back.
	for _, n := range []int{0, 1, 16383, 16384, 65535, 65536, 200_000, 1 << 20, 5 << 20} {
		msg := make([]byte, n)
		for i := range msg {
			msg[i] = byte(i * 31)
		}
		got, err := call(c, "/t/echo", msg, 10*time.Second)
		if err != nil {
			t.Fatalf("%d bytes: %v", n, err)
		}
		if !bytes.Equal(got, msg) {
			t.Fatalf("%d bytes: echo of %d bytes differs", n, len(got))
		}
	}
}

func TestConcurrentCalls(t *testing.T) {
	s := startServer(t)
	c := dial(t, s.addr, Options{})
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for g := range 32 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 1))
			for range 40 {
				msg := make([]byte, rng.IntN(150_000))
				for i := range msg {
					msg[i] = byte(rng.Uint32())
				}
				got, err := call(c, "/t/echo", msg, 10*time.Second)
				if err == nil && !bytes.Equal(got, msg) {
					err = fmt.Errorf("echo of %d bytes came back as %d different bytes", len(msg), len(got))
				}
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestStatusAndMessage(t *testing.T) {
	s := startServer(t)
	c := dial(t, s.addr, Options{})
	msg := "bad input: 100% wrong, ünïcode\nand a newline"
	_, err := call(c, "/t/error", []byte(msg), time.Second)
	if st, ok := status.FromError(err); !ok || st.Code() != codes.InvalidArgument || st.Message() != msg {
		t.Errorf("got %v, want INVALID_ARGUMENT %q", err, msg)
	}
	_, err = call(c, "/t/nothing", nil, time.Second)
	if status.Code(err) != codes.Unimplemented {
		t.Errorf("unknown method: got %v, want UNIMPLEMENTED", err)
	}
	// The connection still serves after failed calls.
	if got, err := call(c, "/t/echo", []byte("ok"), time.Second); err != nil || string(got) != "ok" {
		t.Errorf("echo after errors: %q, %v", got, err)
	}
}

func TestDeadline(t *testing.T) {
	s := startServer(t)
	c := dial(t, s.addr, Options{})
	start := time.Now()
	_, err := call(c, "/t/sleep", []byte("x"), 50*time.Millisecond)
	if status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("got %v, want DEADLINE_EXCEEDED", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("deadline of 50 ms ended the call after %v", d)
	}
	// The server saw the deadline too: its handler returns.
	deadline := time.Now().Add(5 * time.Second)
	for s.inFlight.Load() != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the server's handler still runs: grpc-timeout not sent or stream not reset")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestServerStreamLimit(t *testing.T) {
	s := startServer(t, grpc.MaxConcurrentStreams(2))
	c := dial(t, s.addr, Options{})
	const calls = 6
	results := make(chan result, calls)
	for i := range calls {
		go c.Go("/t/block", []byte{byte(i)}, 10*time.Second, func(resp []byte, err error) {
			results <- result{append([]byte(nil), resp...), err}
		})
	}
	// Wait until the server holds its limit, then let them all go.
	deadline := time.Now().Add(5 * time.Second)
	for s.inFlight.Load() < 2 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	close(s.release)
	for range calls {
		if r := <-results; r.err != nil {
			t.Errorf("call failed: %v", r.err)
		}
	}
	if p := s.peak.Load(); p != 2 {
		t.Errorf("server ran %d calls at once, want its limit of 2", p)
	}
}

func TestResponseLimit(t *testing.T) {
	s := startServer(t)
	c := dial(t, s.addr, Options{MaxRecvMsgSize: 1000})
	_, err := call(c, "/t/big", []byte{0xe9, 0x03, 0, 0}, 5*time.Second) // 1001 bytes
	if status.Code(err) != codes.ResourceExhausted {
		t.Errorf("1001-byte response past a 1000-byte limit: got %v, want RESOURCE_EXHAUSTED", err)
	}
	got, err := call(c, "/t/big", []byte{0xe8, 0x03, 0, 0}, 5*time.Second)
	if err != nil || len(got) != 1000 {
		t.Errorf("1000-byte response: %d bytes, %v", len(got), err)
	}
}

func TestServerGoesAway(t *testing.T) {
	s := startServer(t)
	c := dial(t, s.addr, Options{})
	if _, err := call(c, "/t/echo", []byte("hi"), time.Second); err != nil {
		t.Fatal(err)
	}
	// A graceful stop lets the call in flight finish, then refuses more.
	inflight := make(chan result, 1)
	c.Go("/t/block", []byte("last"), 10*time.Second, func(resp []byte, err error) {
		inflight <- result{append([]byte(nil), resp...), err}
	})
	for s.inFlight.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	stopped := make(chan struct{})
	go func() { s.srv.GracefulStop(); close(stopped) }()
	// GOAWAY reaches the client before the blocked call is released.
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, err := call(c, "/t/echo", []byte("late"), time.Second)
		if status.Code(err) == codes.Unavailable {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("calls after GracefulStop still get %v, want UNAVAILABLE", err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	close(s.release)
	if r := <-inflight; r.err != nil || string(r.resp) != "last" {
		t.Errorf("call in flight at a graceful stop: %q, %v", r.resp, r.err)
	}
	<-stopped
}

func TestConnectionLost(t *testing.T) {
	s := startServer(t)
	c := dial(t, s.addr, Options{})
	inflight := make(chan error, 1)
	c.Go("/t/sleep", []byte("x"), 0, func(_ []byte, err error) { inflight <- err })
	for s.inFlight.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	s.srv.Stop()
	select {
	case err := <-inflight:
		if status.Code(err) != codes.Unavailable {
			t.Errorf("call in flight when the server stopped: %v, want UNAVAILABLE", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("call in flight when the server stopped never ended")
	}
	if _, err := call(c, "/t/echo", nil, time.Second); status.Code(err) != codes.Unavailable {
		t.Errorf("call on a lost connection: %v, want UNAVAILABLE", err)
	}
}

func TestCloseFailsCalls(t *testing.T) {
	s := startServer(t)
	c := dial(t, s.addr, Options{})
	inflight := make(chan error, 1)
	c.Go("/t/sleep", nil, 0, func(_ []byte, err error) { inflight <- err })
	for s.inFlight.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	c.Close()
	if err := <-inflight; status.Code(err) != codes.Unavailable {
		t.Errorf("call in flight at Close: %v, want UNAVAILABLE", err)
	}
}

func TestDialErrors(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	// A server that is not HTTP/2: it answers the preface with HTTP/1.
	go func() {
		nc, err := lis.Accept()
		if err != nil {
			return
		}
		nc.Write([]byte("HTTP/1.1 400 Bad Request\r\n\r\n"))
		nc.Close()
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := Dial(ctx, addr, Options{}); err == nil {
		t.Error("Dial to an HTTP/1 server succeeded")
	}
	lis.Close()
	if _, err := Dial(ctx, addr, Options{}); err == nil {
		t.Error("Dial to a closed port succeeded")
	}
}

func TestUnframe(t *testing.T) {
	for _, tc := range []struct {
		in   []byte
		want codes.Code
	}{
		{[]byte{0, 0, 0}, codes.Internal},
		{[]byte{1, 0, 0, 0, 0}, codes.Internal},
		{[]byte{0, 0, 0, 0, 2, 'a'}, codes.Internal},
		{[]byte{0, 0, 0, 0, 1, 'a'}, codes.OK},
	} {
		_, err := unframe(tc.in)
		if status.Code(err) != tc.want {
			t.Errorf("unframe(%v): %v, want %v", tc.in, err, tc.want)
		}
	}
}

// pingCounter is a bare HTTP/2 server that answers every call with "ok"
// and counts the PINGs its client sends, acking each.
func pingCounter(t *testing.T) (addr string, pings *atomic.Int32) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lis.Close() })
	pings = new(atomic.Int32)
	go func() {
		nc, err := lis.Accept()
		if err != nil {
			return
		}
		defer nc.Close()
		preface := make([]byte, len(http2.ClientPreface))
		if _, err := io.ReadFull(nc, preface); err != nil {
			return
		}
		fr := http2.NewFramer(nc, nc)
		var hbuf bytes.Buffer
		enc := hpack.NewEncoder(&hbuf)
		block := func(fields ...string) []byte {
			hbuf.Reset()
			for i := 0; i < len(fields); i += 2 {
				enc.WriteField(hpack.HeaderField{Name: fields[i], Value: fields[i+1]})
			}
			return hbuf.Bytes()
		}
		fr.WriteSettings()
		for {
			f, err := fr.ReadFrame()
			if err != nil {
				return
			}
			switch f := f.(type) {
			case *http2.PingFrame:
				if !f.IsAck() {
					pings.Add(1)
					fr.WritePing(true, f.Data)
				}
			case *http2.DataFrame:
				if !f.StreamEnded() {
					continue
				}
				id := f.StreamID
				fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, EndHeaders: true,
					BlockFragment: block(":status", "200", "content-type", "application/grpc")})
				fr.WriteData(id, false, []byte{0, 0, 0, 0, 2, 'o', 'k'})
				fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, EndHeaders: true, EndStream: true,
					BlockFragment: block("grpc-status", "0")})
			}
		}
	}()
	return lis.Addr().String(), pings
}

// TestBandwidthProbe: by default the client probes after response data as
// grpc-go's does (at most one PING outstanding), and not when told not to.
func TestBandwidthProbe(t *testing.T) {
	const calls = 5
	for _, off := range []bool{false, true} {
		addr, pings := pingCounter(t)
		c := dial(t, addr, Options{NoBandwidthProbe: off})
		for range calls {
			if got, err := call(c, "/t/echo", []byte("x"), 5*time.Second); err != nil || string(got) != "ok" {
				t.Fatalf("call: %q, %v", got, err)
			}
		}
		c.Close()
		n := pings.Load()
		switch {
		case off && n != 0:
			t.Errorf("NoBandwidthProbe: the server got %d PINGs", n)
		case !off && (n < 1 || n > calls):
			t.Errorf("%d PINGs for %d answers, want one per answer while none is outstanding", n, calls)
		}
	}
}
