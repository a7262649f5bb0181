package loadgen

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/recmesh/recmesh/bench/h2client"
	pb "github.com/recmesh/recmesh/proto/inference"
	"github.com/recmesh/recmesh/proto/oip"
)

// Client kinds: which gRPC client sends the calls.
const (
	// ClientLean is h2client: one hand-off per call, so a load generator
	// on one core adds little of its own to the latencies it measures.
	ClientLean = "lean"
	// ClientGRPC is grpc-go's client, the reference the lean one is
	// checked against.
	ClientGRPC = "grpc"
)

// Client is the connections a run sends its ModelInfer calls on.
type Client interface {
	// Kind is ClientLean or ClientGRPC.
	Kind() string
	// Len is the number of connections.
	Len() int
	// Infer sends req on connection i (modulo Len) with a deadline of
	// timeout and decodes the answer into resp. done receives nil or a
	// gRPC status error, exactly once, possibly before Infer returns and
	// possibly on another goroutine; it must not block. resp is the
	// client's until done runs.
	Infer(i int, req *oip.PreEncoded, resp *pb.ModelInferResponse, timeout time.Duration, done func(error))
	// Close closes the connections; calls in flight fail.
	Close() error
}

// Dial opens n connections of kind to target and waits, within ctx, until
// the server and modelName are ready (asked over grpc-go, whichever the
// kind).
func Dial(ctx context.Context, kind, target, modelName string, n int) (Client, error) {
	if kind != ClientLean && kind != ClientGRPC {
		return nil, fmt.Errorf("loadgen: client %q: want %s or %s", kind, ClientLean, ClientGRPC)
	}
	probes := n
	if kind == ClientLean {
		probes = 1
	}
	pool, err := DialReady(ctx, target, modelName, probes)
	if err != nil {
		return nil, err
	}
	if kind == ClientGRPC {
		return grpcClient{pool}, nil
	}
	pool.Close()
	c := &leanClient{}
	for i := range n {
		conn, err := h2client.Dial(ctx, target, h2client.Options{UserAgent: "recmesh-bench", MaxRecvMsgSize: oip.MaxMessageBytes})
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("loadgen: connection %d: %w", i, err)
		}
		c.conns = append(c.conns, conn)
	}
	return c, nil
}

// NewGRPCClient sends calls over pool's connections.
func NewGRPCClient(pool *oip.Pool) Client { return grpcClient{pool} }

type grpcClient struct{ pool *oip.Pool }

func (g grpcClient) Kind() string { return ClientGRPC }
func (g grpcClient) Len() int     { return g.pool.Len() }
func (g grpcClient) Close() error { return g.pool.Close() }

// Infer runs the blocking Invoke on a goroutine of its own: grpc-go has no
// asynchronous unary call.
func (g grpcClient) Infer(i int, req *oip.PreEncoded, resp *pb.ModelInferResponse, timeout time.Duration, done func(error)) {
	cc := g.pool.Conn(i)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		err := cc.Invoke(ctx, oip.InferMethod, req, resp, oip.Codec())
		cancel()
		done(err)
	}()
}

type leanClient struct{ conns []*h2client.Conn }

func (l *leanClient) Kind() string { return ClientLean }
func (l *leanClient) Len() int     { return len(l.conns) }

func (l *leanClient) Close() error {
	for _, c := range l.conns {
		c.Close()
	}
	return nil
}

func (l *leanClient) Infer(i int, req *oip.PreEncoded, resp *pb.ModelInferResponse, timeout time.Duration, done func(error)) {
	l.conns[i%len(l.conns)].Go(oip.InferMethod, req.Bytes, timeout, func(b []byte, err error) {
		if err == nil {
			if uerr := proto.Unmarshal(b, resp); uerr != nil {
				err = fmt.Errorf("loadgen: decode response: %w", uerr)
			}
		}
		done(err)
	})
}
