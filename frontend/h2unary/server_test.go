package h2unary

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"math/big"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/recmesh/recmesh/proto/inference"
)

// testService echoes ModelInfer's raw inputs back as raw outputs, so that
// sizes both ways are the test's to choose, and lets a test hold calls.
type testService struct {
	inference.UnimplementedGRPCInferenceServiceServer
	// hold, when set, is waited on (or the call's context) before answering.
	hold    chan struct{}
	started chan struct{} // receives once per held call that started
	// seen records the last call's context facts.
	mu       sync.Mutex
	deadline time.Time
	md       metadata.MD
	ctxErr   error
}

// failMessage is the status message of a failing call: '%', non-ASCII
// and control characters, which the server percent-encodes
// (grpcwire.EncodeMessage) and grpc-go's client must read back whole. The
// wire rules themselves are tested in proto/grpcwire.
const failMessage = "bad input: 100% wrong, ünïcode ✓\tand\r\nsecond line\x00\x7f %41"

func (t *testService) ServerReady(context.Context, *inference.ServerReadyRequest) (*inference.ServerReadyResponse, error) {
	return &inference.ServerReadyResponse{Ready: true}, nil
}

func (t *testService) ModelInfer(ctx context.Context, req *inference.ModelInferRequest) (*inference.ModelInferResponse, error) {
	dl, _ := ctx.Deadline()
	md, _ := metadata.FromIncomingContext(ctx)
	t.mu.Lock()
	t.deadline, t.md = dl, md
	t.mu.Unlock()
	if req.Id == "fail" {
		return nil, status.Error(codes.InvalidArgument, failMessage)
	}
	if t.hold != nil {
		if t.started != nil {
			t.started <- struct{}{}
		}
		select {
		case <-t.hold:
		case <-ctx.Done():
			t.mu.Lock()
			t.ctxErr = ctx.Err()
			t.mu.Unlock()
			return nil, status.FromContextError(ctx.Err()).Err()
		}
	}
	return &inference.ModelInferResponse{ModelName: req.ModelName, Id: req.Id, RawOutputContents: req.RawInputContents}, nil
}

func start(t *testing.T, opts Options, svc *testService) (*Server, string) {
	t.Helper()
	s := NewServer(opts)
	s.RegisterService(&inference.GRPCInferenceService_ServiceDesc, svc)
	s.RegisterService(&healthpb.Health_ServiceDesc, health.NewServer())
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- s.Serve(lis) }()
	t.Cleanup(func() {
		s.Stop()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return s, lis.Addr().String()
}

func dial(t *testing.T, addr string, opts ...grpc.DialOption) inference.GRPCInferenceServiceClient {
	t.Helper()
	if len(opts) == 0 {
		opts = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	}
	cc, err := grpc.NewClient(addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return inference.NewGRPCInferenceServiceClient(cc)
}

func echo(n int) *inference.ModelInferRequest {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i * 7)
	}
	return &inference.ModelInferRequest{ModelName: "m", Id: "x", RawInputContents: [][]byte{b}}
}

// TestRoundTrips: calls of every size a client may send, answered in
// full, over one connection and concurrently: requests past the stream
// window need this server's window updates, answers past the client's
// need its flow control.
func TestRoundTrips(t *testing.T) {
	// Up to 32 MB of requests at once on the one connection.
	_, addr := start(t, Options{MaxRecvMsgSize: 8 << 20, StreamWindow: 256 << 10, ConnWindow: 512 << 10, MaxConcurrentStreams: 8,
		MaxConnBufferedBytes: 48 << 20, MaxBufferedBytes: 48 << 20}, &testService{})
	c := dial(t, addr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(16<<20)))
	ctx := context.Background()
	if r, err := c.ServerReady(ctx, &inference.ServerReadyRequest{}); err != nil || !r.Ready {
		t.Fatalf("ServerReady = %v, %v", r, err)
	}
	var wg sync.WaitGroup
	for i, n := range []int{0, 1, 1000, 70_000, 300_000, 3 << 20, 100, 5 << 20} {
		for range 4 {
			wg.Go(func() {
				req := echo(n)
				req.Id = string(rune('a' + i))
				r, err := c.ModelInfer(ctx, req)
				if err != nil {
					t.Errorf("%d bytes: %v", n, err)
					return
				}
				if r.Id != req.Id || len(r.RawOutputContents) != 1 || !bytes.Equal(r.RawOutputContents[0], req.RawInputContents[0]) {
					t.Errorf("%d bytes: answer id %q with %d outputs, or different bytes", n, r.Id, len(r.RawOutputContents))
				}
			})
		}
	}
	wg.Wait()
}

func TestErrorsAndLimits(t *testing.T) {
	refuse := errors.New("never")
	svc := &testService{}
	_, addr := start(t, Options{MaxRecvMsgSize: 1 << 20, Admit: func(m string) error {
		if m == inference.GRPCInferenceService_ModelMetadata_FullMethodName {
			return status.Error(codes.ResourceExhausted, refuse.Error())
		}
		return nil
	}}, svc)
	c := dial(t, addr)
	ctx := context.Background()

	fail := echo(10)
	fail.Id = "fail"
	_, err := c.ModelInfer(ctx, fail)
	if st := status.Convert(err); st.Code() != codes.InvalidArgument || st.Message() != failMessage {
		t.Errorf("handler error arrived as %v", err)
	}
	_, err = c.ModelInfer(ctx, echo(2<<20))
	if st := status.Convert(err); st.Code() != codes.ResourceExhausted || !strings.Contains(st.Message(), "larger than the limit of 1048576") {
		t.Errorf("oversized request: %v", err)
	}
	if _, err := c.ModelMetadata(ctx, &inference.ModelMetadataRequest{}); status.Code(err) != codes.ResourceExhausted || status.Convert(err).Message() != "never" {
		t.Errorf("refused by Admit: %v", err)
	}
	if _, err := c.ServerLive(ctx, &inference.ServerLiveRequest{}); status.Code(err) != codes.Unimplemented {
		t.Errorf("method the service leaves unimplemented: %v", err)
	}
	cc, _ := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	defer cc.Close()
	if err := cc.Invoke(ctx, "/no.Such/Method", &inference.ServerLiveRequest{}, &inference.ServerLiveResponse{}); status.Code(err) != codes.Unimplemented ||
		!strings.Contains(status.Convert(err).Message(), "unknown method /no.Such/Method") {
		t.Errorf("unknown method: %v", err)
	}
	w, err := healthpb.NewHealthClient(cc).Watch(ctx, &healthpb.HealthCheckRequest{})
	if err == nil {
		_, err = w.Recv()
	}
	if status.Code(err) != codes.Unimplemented || !strings.Contains(status.Convert(err).Message(), "unary calls only") {
		t.Errorf("streaming method: %v", err)
	}
	if r, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil || r.Status != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("health Check = %v, %v", r, err)
	}
	// After all that the connection still serves.
	if _, err := c.ModelInfer(ctx, echo(10)); err != nil {
		t.Errorf("after the errors: %v", err)
	}
}

// TestDeadlineCancelAndMetadata: the client's deadline and metadata reach
// the handler's context, and a cancelled call ends the handler's.
func TestDeadlineCancelAndMetadata(t *testing.T) {
	svc := &testService{hold: make(chan struct{}), started: make(chan struct{}, 1)}
	_, addr := start(t, Options{}, svc)
	c := dial(t, addr)

	ctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(context.Background(), "traceparent", "00-abc-def-01", "k-bin", "\x00\x01"), 200*time.Millisecond)
	defer cancel()
	want, _ := ctx.Deadline()
	_, err := c.ModelInfer(ctx, echo(8))
	<-svc.started
	if status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("held call past its deadline: %v", err)
	}
	svc.mu.Lock()
	dl, md := svc.deadline, svc.md
	svc.mu.Unlock()
	if d := dl.Sub(want); d < -50*time.Millisecond || d > 50*time.Millisecond {
		t.Errorf("handler's deadline %v, client's %v", dl, want)
	}
	if got := md.Get("traceparent"); len(got) != 1 || got[0] != "00-abc-def-01" {
		t.Errorf("metadata traceparent = %q", got)
	}
	if got := md.Get("k-bin"); len(got) != 1 || got[0] != "\x00\x01" {
		t.Errorf("binary metadata = %q", got)
	}
	waitFor(t, func() bool { svc.mu.Lock(); defer svc.mu.Unlock(); return svc.ctxErr != nil })

	svc.mu.Lock()
	svc.ctxErr = nil
	svc.mu.Unlock()
	ctx2, cancel2 := context.WithCancel(context.Background())
	go func() { <-svc.started; cancel2() }()
	if _, err := c.ModelInfer(ctx2, echo(8)); status.Code(err) != codes.Canceled {
		t.Fatalf("cancelled call: %v", err)
	}
	waitFor(t, func() bool { svc.mu.Lock(); defer svc.mu.Unlock(); return errors.Is(svc.ctxErr, context.Canceled) })
}

// TestGracefulStop: calls in flight are answered, new ones refused, and
// GracefulStop returns once they are.
func TestGracefulStop(t *testing.T) {
	svc := &testService{hold: make(chan struct{}), started: make(chan struct{}, 4)}
	s, addr := start(t, Options{}, svc)
	c := dial(t, addr)
	errs := make(chan error, 4)
	for range 4 {
		go func() { _, err := c.ModelInfer(context.Background(), echo(100)); errs <- err }()
	}
	for range 4 {
		<-svc.started
	}
	stopped := make(chan struct{})
	go func() { s.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
		t.Fatal("GracefulStop returned with calls in flight")
	case <-time.After(100 * time.Millisecond):
	}
	close(svc.hold)
	for range 4 {
		if err := <-errs; err != nil {
			t.Errorf("call in flight at GracefulStop: %v", err)
		}
	}
	select {
	case <-stopped:
	case <-time.After(5 * time.Second):
		t.Fatal("GracefulStop did not return after the calls were answered")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if _, err := c.ModelInfer(ctx, echo(1)); status.Code(err) != codes.Unavailable && status.Code(err) != codes.DeadlineExceeded {
		t.Errorf("call after GracefulStop: %v", err)
	}
}

// TestStopCancelsCalls: Stop ends the handlers' contexts and returns.
func TestStopCancelsCalls(t *testing.T) {
	svc := &testService{hold: make(chan struct{}), started: make(chan struct{}, 1)}
	s, addr := start(t, Options{}, svc)
	c := dial(t, addr)
	errc := make(chan error, 1)
	go func() { _, err := c.ModelInfer(context.Background(), echo(1)); errc <- err }()
	<-svc.started
	s.Stop()
	if err := <-errc; status.Code(err) != codes.Unavailable && status.Code(err) != codes.Canceled {
		t.Errorf("call in flight at Stop: %v", err)
	}
	svc.mu.Lock()
	defer svc.mu.Unlock()
	if !errors.Is(svc.ctxErr, context.Canceled) {
		t.Errorf("handler's context after Stop: %v", svc.ctxErr)
	}
}

func TestTLS(t *testing.T) {
	cert, pool := selfSigned(t)
	_, addr := start(t, Options{TLS: &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"h2"}, MinVersion: tls.VersionTLS12}}, &testService{})
	c := dial(t, addr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: pool, ServerName: "localhost"})))
	if r, err := c.ModelInfer(context.Background(), echo(5000)); err != nil || len(r.RawOutputContents[0]) != 5000 {
		t.Fatalf("over TLS: %v, %v", r, err)
	}
	// A plaintext client gets nowhere, and the server goes on.
	plain := dial(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if _, err := plain.ServerReady(ctx, &inference.ServerReadyRequest{}); err == nil {
		t.Error("plaintext call to a TLS server succeeded")
	}
	if _, err := c.ServerReady(context.Background(), &inference.ServerReadyRequest{}); err != nil {
		t.Errorf("TLS call after a plaintext one: %v", err)
	}
}

// rawConn is a hand-driven HTTP/2 client, for what real clients never do.
type rawConn struct {
	nc net.Conn
	fr *http2.Framer
	bw *bufio.Writer
}

func rawDial(t *testing.T, addr string) *rawConn {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	bw := bufio.NewWriter(nc)
	bw.WriteString(http2.ClientPreface)
	fr := http2.NewFramer(bw, nc)
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	fr.WriteSettings()
	bw.Flush()
	_ = nc.SetDeadline(time.Now().Add(10 * time.Second))
	return &rawConn{nc: nc, fr: fr, bw: bw}
}

// goAway reads frames until a GOAWAY and returns its code.
func (r *rawConn) goAway(t *testing.T) http2.ErrCode {
	t.Helper()
	for {
		f, err := r.fr.ReadFrame()
		if err != nil {
			t.Fatalf("no GOAWAY before %v", err)
		}
		if g, ok := f.(*http2.GoAwayFrame); ok {
			return g.ErrCode
		}
	}
}

func TestPingFloodEndsTheConnection(t *testing.T) {
	_, addr := start(t, Options{KeepaliveMinTime: time.Minute}, &testService{})
	r := rawDial(t, addr)
	for i := range 5 {
		r.fr.WritePing(false, [8]byte{byte(i)})
	}
	r.bw.Flush()
	if code := r.goAway(t); code != http2.ErrCodeEnhanceYourCalm {
		t.Fatalf("GOAWAY %v, want ENHANCE_YOUR_CALM", code)
	}
}

func TestProtocolErrors(t *testing.T) {
	_, addr := start(t, Options{}, &testService{})
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for _, f := range [][2]string{{":method", "POST"}, {":path", "/inference.GRPCInferenceService/ServerReady"}, {"content-type", "application/grpc"}} {
		enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	r := rawDial(t, addr)
	r.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 2, BlockFragment: hb.Bytes(), EndHeaders: true})
	r.bw.Flush()
	if code := r.goAway(t); code != http2.ErrCodeProtocol {
		t.Fatalf("even stream id: GOAWAY %v, want PROTOCOL_ERROR", code)
	}
	r = rawDial(t, addr)
	r.fr.WriteData(9, true, []byte("junk"))
	r.bw.Flush()
	if code := r.goAway(t); code != http2.ErrCodeProtocol {
		t.Fatalf("DATA on a stream never opened: GOAWAY %v, want PROTOCOL_ERROR", code)
	}
}

// TestConcurrentStreamsBound: calls beyond MaxConcurrentStreams wait at
// the client (which honours the setting) rather than run.
func TestConcurrentStreamsBound(t *testing.T) {
	var running, peak atomic.Int32
	svc := &boundService{running: &running, peak: &peak}
	s := NewServer(Options{MaxConcurrentStreams: 3})
	s.RegisterService(&inference.GRPCInferenceService_ServiceDesc, svc)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(lis)
	defer s.Stop()
	c := dial(t, lis.Addr().String())
	var wg sync.WaitGroup
	for range 30 {
		wg.Go(func() {
			if _, err := c.ServerReady(context.Background(), &inference.ServerReadyRequest{}); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if p := peak.Load(); p > 3 || p < 1 {
		t.Errorf("peak %d concurrent calls on one connection, want 1..3", p)
	}
}

type boundService struct {
	inference.UnimplementedGRPCInferenceServiceServer
	running, peak *atomic.Int32
}

func (b *boundService) ServerReady(context.Context, *inference.ServerReadyRequest) (*inference.ServerReadyResponse, error) {
	n := b.running.Add(1)
	for {
		p := b.peak.Load()
		if n <= p || b.peak.CompareAndSwap(p, n) {
			break
		}
	}
	time.Sleep(5 * time.Millisecond)
	b.running.Add(-1)
	return &inference.ServerReadyResponse{Ready: true}, nil
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatal("condition not met within 5 s")
}

func selfSigned(t *testing.T) (tls.Certificate, *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "localhost"}, DNSNames: []string{"localhost"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(leaf)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, pool
}

// TestMaxCallTime: the server's bound ends a call whose client set no
// deadline, and a sooner client deadline still wins.
func TestMaxCallTime(t *testing.T) {
	svc := &testService{hold: make(chan struct{}), started: make(chan struct{}, 2)}
	_, addr := start(t, Options{MaxCallTime: 150 * time.Millisecond}, svc)
	c := dial(t, addr)
	begin := time.Now()
	if _, err := c.ModelInfer(context.Background(), echo(1)); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("call without a deadline past MaxCallTime: %v", err)
	}
	<-svc.started
	if took := time.Since(begin); took > 3*time.Second {
		t.Errorf("bounded call took %v", took)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	want, _ := ctx.Deadline()
	if _, err := c.ModelInfer(ctx, echo(1)); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("call with a sooner deadline: %v", err)
	}
	<-svc.started
	svc.mu.Lock()
	defer svc.mu.Unlock()
	if d := svc.deadline.Sub(want); d < -30*time.Millisecond || d > 30*time.Millisecond {
		t.Errorf("handler's deadline %v, client's %v: the sooner should win", svc.deadline, want)
	}
}

// TestUnmarshalHook: a server with its own unmarshaller decodes requests
// with it, and its error fails the call with INTERNAL, as grpc-go fails
// one its codec cannot read.
func TestUnmarshalHook(t *testing.T) {
	var calls atomic.Int32
	unmarshal := func(msg []byte, v any) error {
		calls.Add(1)
		req, ok := v.(*inference.ModelInferRequest)
		if !ok {
			return proto.Unmarshal(msg, v.(proto.Message))
		}
		if err := proto.Unmarshal(msg, req); err != nil {
			return err
		}
		if req.Id == "undecodable" {
			return errors.New("no decoder for this one")
		}
		req.Id += "+hook"
		return nil
	}
	_, addr := start(t, Options{Unmarshal: unmarshal}, &testService{})
	c := dial(t, addr)
	r, err := c.ModelInfer(context.Background(), echo(100))
	if err != nil || r.Id != "x+hook" {
		t.Fatalf("ModelInfer = %v, %v; want the id the hook decoded, x+hook", r, err)
	}
	req := echo(10)
	req.Id = "undecodable"
	_, err = c.ModelInfer(context.Background(), req)
	if st := status.Convert(err); st.Code() != codes.Internal || !strings.Contains(st.Message(), "no decoder for this one") {
		t.Fatalf("undecodable request: %v, want INTERNAL naming the decoder's error", err)
	}
	if calls.Load() != 2 {
		t.Errorf("hook called %d times, want 2", calls.Load())
	}
}

// TestPingAck: a PING is acknowledged with its data whether or not an
// answer follows to carry the ack out (the ack waits at most pingAckDelay
// in the write buffer for one).
func TestPingAck(t *testing.T) {
	_, addr := start(t, Options{}, &testService{})
	r := rawDial(t, addr)
	r.fr.WritePing(false, [8]byte{'a', 'l', 'o', 'n', 'e'})
	r.bw.Flush()
	for {
		f, err := r.fr.ReadFrame()
		if err != nil {
			t.Fatalf("no PING ack before %v", err)
		}
		if p, ok := f.(*http2.PingFrame); ok {
			if !p.IsAck() || string(p.Data[:5]) != "alone" {
				t.Fatalf("PING %+v, want the ack of ours", p)
			}
			break
		}
	}
	// A probe, then a call, as gRPC clients send them: the ack and the
	// answer both arrive.
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", "/inference.GRPCInferenceService/ServerReady"}, {"content-type", "application/grpc"}} {
		enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	r.fr.WritePing(false, [8]byte{'p', 'r', 'o', 'b', 'e'})
	r.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: hb.Bytes(), EndHeaders: true})
	r.fr.WriteData(1, true, []byte{0, 0, 0, 0, 0}) // an empty ServerReadyRequest
	r.bw.Flush()
	var acked, answered bool
	for !acked || !answered {
		f, err := r.fr.ReadFrame()
		if err != nil {
			t.Fatalf("acked %v, answered %v before %v", acked, answered, err)
		}
		switch f := f.(type) {
		case *http2.PingFrame:
			acked = acked || f.IsAck() && string(f.Data[:5]) == "probe"
		case *http2.MetaHeadersFrame:
			if f.StreamEnded() {
				answered = true
				if st := headerValue(f, "grpc-status"); st != "0" {
					t.Fatalf("answer trailers grpc-status %q, want 0", st)
				}
			}
		}
	}
}

// TestPingAckWaitsForCallInFlight: while a call is in flight, a PING's
// ack waits for its answer to carry it out, but no longer than
// pingAckMaxDelay. Frames are timed as they arrive, and only lower bounds
// are asserted: an ack that arrives before the answer is released must be
// at least pingAckMaxDelay after the PING was sent, however slow the
// machine.
func TestPingAckWaitsForCallInFlight(t *testing.T) {
	svc := &testService{hold: make(chan struct{}), started: make(chan struct{}, 2)}
	_, addr := start(t, Options{}, svc)
	r := rawDial(t, addr)
	type arrival struct {
		ack    bool // a PING ack, else the end of a call
		at     time.Time
		stream uint32
	}
	arrivals := make(chan arrival, 16)
	go func() {
		defer close(arrivals)
		for {
			f, err := r.fr.ReadFrame()
			if err != nil {
				return
			}
			switch f := f.(type) {
			case *http2.PingFrame:
				if f.IsAck() {
					arrivals <- arrival{ack: true, at: time.Now()}
				}
			case *http2.MetaHeadersFrame:
				if f.StreamEnded() {
					arrivals <- arrival{at: time.Now(), stream: f.StreamID}
				}
			}
		}
	}()
	next := func() arrival {
		t.Helper()
		a, ok := <-arrivals
		if !ok {
			t.Fatal("connection ended")
		}
		return a
	}
	call := func(id uint32) {
		t.Helper()
		msg, err := proto.Marshal(echo(1))
		if err != nil {
			t.Fatal(err)
		}
		var hb bytes.Buffer
		enc := hpack.NewEncoder(&hb)
		for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", "/inference.GRPCInferenceService/ModelInfer"}, {"content-type", "application/grpc"}} {
			enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
		}
		r.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: hb.Bytes(), EndHeaders: true})
		r.fr.WriteData(id, true, append([]byte{0, 0, 0, 0, byte(len(msg))}, msg...))
		r.bw.Flush()
		<-svc.started
	}

	// The answer comes after pingAckDelay: the ack rides out with it.
	call(1)
	sent := time.Now()
	r.fr.WritePing(false, [8]byte{1})
	r.bw.Flush()
	time.Sleep(2 * pingAckDelay)
	released := time.Now()
	svc.hold <- struct{}{}
	got := []arrival{next(), next()}
	for _, a := range got {
		if a.ack && a.at.Before(released) && a.at.Sub(sent) < pingAckMaxDelay {
			t.Fatalf("ack %v after the PING, before the answer of the call in flight was released (want it with the answer, or after %v)", a.at.Sub(sent), pingAckMaxDelay)
		}
	}
	if got[0].ack == got[1].ack || (!got[0].ack && got[0].stream != 1) || (!got[1].ack && got[1].stream != 1) {
		t.Fatalf("arrivals %+v, want an ack and the end of call 1", got)
	}

	// The answer does not come: the ack goes out alone, after
	// pingAckMaxDelay.
	call(3)
	sent = time.Now()
	r.fr.WritePing(false, [8]byte{2})
	r.bw.Flush()
	a := next()
	if !a.ack {
		t.Fatalf("%+v before the ack: the call was held", a)
	}
	if waited := a.at.Sub(sent); waited < pingAckMaxDelay {
		t.Fatalf("ack %v after the PING with a call in flight, want at least %v", waited, pingAckMaxDelay)
	}
	svc.hold <- struct{}{}
	if a := next(); a.ack || a.stream != 3 {
		t.Fatalf("%+v, want the end of call 3", a)
	}
}

func headerValue(f *http2.MetaHeadersFrame, name string) string {
	for _, hf := range f.RegularFields() {
		if hf.Name == name {
			return hf.Value
		}
	}
	return ""
}
