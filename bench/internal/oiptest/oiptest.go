// Package oiptest is a fake Open Inference Protocol v2 server for the
// bench tests: it serves the DLRM model's tensors on a loopback port with a
// controlled service time, injected errors, a readiness switch and
// pluggable scores, and counts what it saw.
package oiptest

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/recmesh/recmesh/model"
	pb "github.com/recmesh/recmesh/proto/inference"
	"github.com/recmesh/recmesh/proto/oip"
)

// Options shape the fake's behaviour; every field is optional.
type Options struct {
	// Service returns how long request k (counting from 0 in arrival
	// order) sleeps before answering.
	Service func(k int64) time.Duration
	// Fail returns the error code for request k, or codes.OK to answer.
	Fail func(k int64) codes.Code
	// Scores computes the answer; by default every score is 0.5.
	Scores func(dense []float32, sparse []int32, n int) ([]float32, error)
	// Ready reports readiness (default always ready).
	Ready func() bool
	// ShortBy makes every answer carry that many scores too few.
	ShortBy int
	// Typed answers in fp32_contents instead of raw_output_contents.
	Typed bool
	// Serial makes the server answer one request at a time.
	Serial bool
}

// Server is a running fake.
type Server struct {
	pb.UnimplementedGRPCInferenceServiceServer
	// Addr is the host:port it listens on.
	Addr string

	opts     Options
	cfg      model.Config
	serial   chan struct{}
	received atomic.Int64
	inFlight atomic.Int64
	peak     atomic.Int64
}

// Start serves cfg's model on 127.0.0.1 until the test ends.
func Start(t testing.TB, cfg model.Config, opts Options) *Server {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("oiptest: listen: %v", err)
	}
	s := &Server{Addr: lis.Addr().String(), opts: opts, cfg: cfg, serial: make(chan struct{}, 1)}
	gs := grpc.NewServer(grpc.MaxRecvMsgSize(oip.MaxMessageBytes))
	pb.RegisterGRPCInferenceServiceServer(gs, s)
	go gs.Serve(lis)
	t.Cleanup(gs.Stop)
	return s
}

// Received is the number of ModelInfer calls so far.
func (s *Server) Received() int64 { return s.received.Load() }

// PeakInFlight is the most ModelInfer calls that ran at once.
func (s *Server) PeakInFlight() int64 { return s.peak.Load() }

func (s *Server) ready() bool { return s.opts.Ready == nil || s.opts.Ready() }

func (s *Server) ServerLive(context.Context, *pb.ServerLiveRequest) (*pb.ServerLiveResponse, error) {
	return &pb.ServerLiveResponse{Live: true}, nil
}

func (s *Server) ServerReady(context.Context, *pb.ServerReadyRequest) (*pb.ServerReadyResponse, error) {
	return &pb.ServerReadyResponse{Ready: s.ready()}, nil
}

func (s *Server) ModelReady(_ context.Context, r *pb.ModelReadyRequest) (*pb.ModelReadyResponse, error) {
	return &pb.ModelReadyResponse{Ready: s.ready() && r.GetName() == oip.DefaultModelName}, nil
}

func (s *Server) ModelInfer(ctx context.Context, r *pb.ModelInferRequest) (*pb.ModelInferResponse, error) {
	k := s.received.Add(1) - 1
	n := s.inFlight.Add(1)
	defer s.inFlight.Add(-1)
	for {
		p := s.peak.Load()
		if n <= p || s.peak.CompareAndSwap(p, n) {
			break
		}
	}
	if s.opts.Serial {
		s.serial <- struct{}{}
		defer func() { <-s.serial }()
	}
	if r.GetModelName() != oip.DefaultModelName {
		return nil, status.Errorf(codes.NotFound, "no model %q", r.GetModelName())
	}
	dense, sparse, b, err := decode(s.cfg, r)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	if s.opts.Service != nil {
		if d := s.opts.Service(k); d > 0 {
			select {
			case <-time.After(d):
			case <-ctx.Done():
				return nil, status.FromContextError(ctx.Err()).Err()
			}
		}
	}
	if s.opts.Fail != nil {
		if c := s.opts.Fail(k); c != codes.OK {
			return nil, status.Errorf(c, "injected failure of request %d", k)
		}
	}
	scores := make([]float32, b)
	for i := range scores {
		scores[i] = 0.5
	}
	if s.opts.Scores != nil {
		if scores, err = s.opts.Scores(dense, sparse, b); err != nil {
			return nil, status.Error(codes.Internal, err.Error())
		}
	}
	scores = scores[:max(len(scores)-s.opts.ShortBy, 0)]
	out := &pb.ModelInferResponse_InferOutputTensor{Name: oip.OutputScore, Datatype: oip.TypeFP32, Shape: []int64{int64(len(scores)), 1}}
	resp := &pb.ModelInferResponse{ModelName: oip.DefaultModelName, Outputs: []*pb.ModelInferResponse_InferOutputTensor{out}}
	if s.opts.Typed {
		out.Contents = &pb.InferTensorContents{Fp32Contents: scores}
		return resp, nil
	}
	raw := make([]byte, 4*len(scores))
	for i, v := range scores {
		binary.LittleEndian.PutUint32(raw[4*i:], math.Float32bits(v))
	}
	resp.RawOutputContents = [][]byte{raw}
	return resp, nil
}

// decode reads the raw dense and sparse inputs (INT32 or INT64 ids).
func decode(cfg model.Config, r *pb.ModelInferRequest) ([]float32, []int32, int, error) {
	in, raw := r.GetInputs(), r.GetRawInputContents()
	if len(in) != 2 || len(raw) != 2 || in[0].GetName() != oip.InputDense || in[1].GetName() != oip.InputSparse {
		return nil, nil, 0, fmt.Errorf("want raw inputs dense, sparse; got %d inputs, %d raw", len(in), len(raw))
	}
	sh := in[0].GetShape()
	if len(sh) != 2 || sh[0] <= 0 || sh[1] != int64(cfg.NumDense) {
		return nil, nil, 0, fmt.Errorf("dense shape %v", sh)
	}
	b := int(sh[0])
	width := cfg.SparseWidth()
	if got := in[1].GetShape(); len(got) != 2 || got[0] != sh[0] || got[1] != int64(width) {
		return nil, nil, 0, fmt.Errorf("sparse shape %v", got)
	}
	if len(raw[0]) != 4*b*cfg.NumDense {
		return nil, nil, 0, fmt.Errorf("dense raw %d bytes", len(raw[0]))
	}
	dense := make([]float32, b*cfg.NumDense)
	for i := range dense {
		dense[i] = math.Float32frombits(binary.LittleEndian.Uint32(raw[0][4*i:]))
	}
	sparse := make([]int32, b*width)
	switch in[1].GetDatatype() {
	case oip.TypeINT32:
		if len(raw[1]) != 4*len(sparse) {
			return nil, nil, 0, fmt.Errorf("sparse raw %d bytes", len(raw[1]))
		}
		for i := range sparse {
			sparse[i] = int32(binary.LittleEndian.Uint32(raw[1][4*i:]))
		}
	case oip.TypeINT64:
		if len(raw[1]) != 8*len(sparse) {
			return nil, nil, 0, fmt.Errorf("sparse raw %d bytes", len(raw[1]))
		}
		for i := range sparse {
			sparse[i] = int32(int64(binary.LittleEndian.Uint64(raw[1][8*i:])))
		}
	default:
		return nil, nil, 0, fmt.Errorf("sparse datatype %q", in[1].GetDatatype())
	}
	return dense, sparse, b, nil
}
