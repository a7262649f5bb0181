package oip

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	pb "github.com/recmesh/recmesh/proto/inference"
)

// MaxMessageBytes bounds a message either way: a 4096-example INT64 request
// is 7.2 MB, past gRPC's 4 MB default.
const MaxMessageBytes = 64 << 20

// Pool is a fixed set of persistent gRPC connections to one server. Each
// is its own ClientConn, hence its own TCP connection and HTTP/2 session,
// so a server that spreads connections over processes or threads (for
// example N processes sharing a port with SO_REUSEPORT) sees them all.
type Pool struct {
	Target string
	conns  []*grpc.ClientConn
	// Clients wraps each connection in the generated client.
	clients []pb.GRPCInferenceServiceClient
}

// Dial opens n connections to target (host:port) and waits until every
// one is connected or ctx is done.
func Dial(ctx context.Context, target string, n int) (*Pool, error) {
	if n <= 0 {
		return nil, fmt.Errorf("oip: dial %s: %d connections, want at least 1", target, n)
	}
	p := &Pool{Target: target}
	for i := range n {
		cc, err := grpc.NewClient(target,
			grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithUserAgent("recmesh-bench"),
			grpc.WithDefaultCallOptions(
				grpc.MaxCallRecvMsgSize(MaxMessageBytes),
				grpc.MaxCallSendMsgSize(MaxMessageBytes)),
		)
		if err != nil {
			p.Close()
			return nil, fmt.Errorf("oip: dial %s: connection %d: %w", target, i, err)
		}
		p.conns = append(p.conns, cc)
		p.clients = append(p.clients, pb.NewGRPCInferenceServiceClient(cc))
	}
	for i, cc := range p.conns {
		if err := waitConnected(ctx, cc); err != nil {
			p.Close()
			return nil, fmt.Errorf("oip: dial %s: connection %d: %w", target, i, err)
		}
	}
	return p, nil
}

// waitConnected leaves idle mode and waits for the connection to be Ready,
// so no measured request pays for a TCP handshake.
func waitConnected(ctx context.Context, cc *grpc.ClientConn) error {
	cc.Connect()
	for {
		s := cc.GetState()
		if s == connectivity.Ready {
			return nil
		}
		if s == connectivity.Idle {
			cc.Connect()
		}
		if !cc.WaitForStateChange(ctx, s) {
			return fmt.Errorf("not connected (state %v): %w", s, context.Cause(ctx))
		}
	}
}

// Len is the number of connections.
func (p *Pool) Len() int { return len(p.conns) }

// Conn returns connection i mod Len.
func (p *Pool) Conn(i int) *grpc.ClientConn { return p.conns[i%len(p.conns)] }

// Client returns the generated client over connection i mod Len.
func (p *Pool) Client(i int) pb.GRPCInferenceServiceClient { return p.clients[i%len(p.clients)] }

// Close closes every connection.
func (p *Pool) Close() error {
	var errs []error
	for _, cc := range p.conns {
		errs = append(errs, cc.Close())
	}
	p.conns, p.clients = nil, nil
	return errors.Join(errs...)
}

// WaitReady polls ServerReady and ModelReady(modelName) on every connection
// until all say ready or ctx is done. Asking on every connection matters
// when several server processes share a port: each connection landed on
// one of them, and every one must have finished its warm-up.
func (p *Pool) WaitReady(ctx context.Context, modelName string) error {
	const poll = 100 * time.Millisecond
	for i, c := range p.clients {
		for {
			ready, err := isReady(ctx, c, modelName)
			if ready {
				break
			}
			select {
			case <-ctx.Done():
				if err == nil {
					err = errors.New("server or model not ready")
				}
				return fmt.Errorf("oip: %s: connection %d: %w (%w)", p.Target, i, err, context.Cause(ctx))
			case <-time.After(poll):
			}
		}
	}
	return nil
}

func isReady(ctx context.Context, c pb.GRPCInferenceServiceClient, modelName string) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	sr, err := c.ServerReady(ctx, &pb.ServerReadyRequest{})
	if err != nil {
		return false, fmt.Errorf("ServerReady: %w", err)
	}
	if !sr.GetReady() {
		return false, nil
	}
	mr, err := c.ModelReady(ctx, &pb.ModelReadyRequest{Name: modelName})
	if err != nil {
		return false, fmt.Errorf("ModelReady(%s): %w", modelName, err)
	}
	return mr.GetReady(), nil
}

// PreEncoded is a request message serialised once, ahead of the run: the
// load generator sends the same bytes many times and should spend its CPU
// on sending, not on re-marshalling 100 KB of ids per request.
type PreEncoded struct {
	// Bytes is the wire encoding of a ModelInferRequest. It is shared by
	// concurrent calls and must not change.
	Bytes []byte
	// Examples is the request's batch size.
	Examples int
}

// Encode serialises req as a PreEncoded message.
func Encode(req *pb.ModelInferRequest) (*PreEncoded, error) {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("oip: encode request: %w", err)
	}
	n := 0
	if in := req.GetInputs(); len(in) > 0 && len(in[0].GetShape()) > 0 {
		n = int(in[0].GetShape()[0])
	}
	return &PreEncoded{Bytes: b, Examples: n}, nil
}

// codec sends a *PreEncoded as its bytes and everything else (the
// responses, other calls) through the standard protobuf codec. Its name is
// "proto", so the wire content-type is the usual application/grpc+proto.
type codec struct{ std encoding.CodecV2 }

// Codec returns the call option that makes Invoke accept a *PreEncoded as
// the request.
func Codec() grpc.CallOption {
	return grpc.ForceCodecV2(codec{std: encoding.GetCodecV2("proto")})
}

func (c codec) Marshal(v any) (mem.BufferSlice, error) {
	if p, ok := v.(*PreEncoded); ok {
		// SliceBuffer never recycles its bytes, so sharing them is safe.
		return mem.BufferSlice{mem.SliceBuffer(p.Bytes)}, nil
	}
	return c.std.Marshal(v)
}

func (c codec) Unmarshal(data mem.BufferSlice, v any) error { return c.std.Unmarshal(data, v) }

func (c codec) Name() string { return "proto" }

// InferMethod is the full gRPC method name of ModelInfer, for Invoke.
const InferMethod = pb.GRPCInferenceService_ModelInfer_FullMethodName

// CodeName is the canonical upper-case name of a gRPC status code
// (UNAVAILABLE, DEADLINE_EXCEEDED, …), as the protocol documents spell them
// and as error counts are keyed in the JSON.
func CodeName(c codes.Code) string {
	names := [...]string{
		codes.OK:                 "OK",
		codes.Canceled:           "CANCELLED",
		codes.Unknown:            "UNKNOWN",
		codes.InvalidArgument:    "INVALID_ARGUMENT",
		codes.DeadlineExceeded:   "DEADLINE_EXCEEDED",
		codes.NotFound:           "NOT_FOUND",
		codes.AlreadyExists:      "ALREADY_EXISTS",
		codes.PermissionDenied:   "PERMISSION_DENIED",
		codes.ResourceExhausted:  "RESOURCE_EXHAUSTED",
		codes.FailedPrecondition: "FAILED_PRECONDITION",
		codes.Aborted:            "ABORTED",
		codes.OutOfRange:         "OUT_OF_RANGE",
		codes.Unimplemented:      "UNIMPLEMENTED",
		codes.Internal:           "INTERNAL",
		codes.Unavailable:        "UNAVAILABLE",
		codes.DataLoss:           "DATA_LOSS",
		codes.Unauthenticated:    "UNAUTHENTICATED",
	}
	if int(c) < len(names) {
		return names[c]
	}
	return fmt.Sprintf("CODE_%d", uint32(c))
}
