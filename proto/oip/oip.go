// Package oip is the client side of the Open Inference Protocol v2 (KServe
// v2 / Triton GRPCInferenceService) for the DLRM model, shared by the load
// generator and the parity check: it builds ModelInfer requests, reads the
// scores out of responses, dials a fixed pool of connections and waits for
// a server to become ready. It works against any OIP v2 server that serves
// the model as recmesh does:
//
//	input  dense   FP32           [B, 13]
//	input  sparse  INT32 | INT64  [B, 214]  the 26 bags concatenated in table order
//	output score   FP32           [B, 1]
package oip

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/recmesh/recmesh/model"
	pb "github.com/recmesh/recmesh/proto/inference"
)

// Tensor names and datatypes of the DLRM model.
const (
	InputDense  = "dense"
	InputSparse = "sparse"
	OutputScore = "score"

	TypeFP32  = "FP32"
	TypeINT32 = "INT32"
	TypeINT64 = "INT64"
)

// DefaultModelName is the name recmesh and the bench servers serve the
// model under.
const DefaultModelName = "dlrm"

// BuildRequest returns a ModelInfer request for n examples laid out as
// model.RandomInputs makes them (dense [n·NumDense], sparse [n·SparseWidth]),
// the tensors in raw_input_contents (little-endian, as the protocol
// specifies) and the sparse ids sent as sparseType (INT32 or INT64).
func BuildRequest(modelName string, cfg model.Config, dense []float32, sparse []int32, n int, sparseType string) (*pb.ModelInferRequest, error) {
	width := cfg.SparseWidth()
	if n <= 0 || len(dense) != n*cfg.NumDense || len(sparse) != n*width {
		return nil, fmt.Errorf("oip: build request: %d examples need %d dense and %d sparse values, got %d and %d",
			n, n*cfg.NumDense, n*width, len(dense), len(sparse))
	}
	denseRaw := make([]byte, 4*len(dense))
	for i, v := range dense {
		binary.LittleEndian.PutUint32(denseRaw[4*i:], math.Float32bits(v))
	}
	var sparseRaw []byte
	switch sparseType {
	case TypeINT32:
		sparseRaw = make([]byte, 4*len(sparse))
		for i, v := range sparse {
			binary.LittleEndian.PutUint32(sparseRaw[4*i:], uint32(v))
		}
	case TypeINT64:
		sparseRaw = make([]byte, 8*len(sparse))
		for i, v := range sparse {
			binary.LittleEndian.PutUint64(sparseRaw[8*i:], uint64(int64(v)))
		}
	default:
		return nil, fmt.Errorf("oip: build request: sparse datatype %q, want %s or %s", sparseType, TypeINT32, TypeINT64)
	}
	return &pb.ModelInferRequest{
		ModelName: modelName,
		Inputs: []*pb.ModelInferRequest_InferInputTensor{
			{Name: InputDense, Datatype: TypeFP32, Shape: []int64{int64(n), int64(cfg.NumDense)}},
			{Name: InputSparse, Datatype: sparseType, Shape: []int64{int64(n), int64(width)}},
		},
		RawInputContents: [][]byte{denseRaw, sparseRaw},
	}, nil
}

// Scores returns the n scores of a response: output "score", FP32, shape
// [n, 1] (or [n]), from raw_output_contents when the server used them, else
// from fp32_contents. Anything else is an error, so a server that answers
// with the wrong number of scores is caught even under load.
func Scores(resp *pb.ModelInferResponse, n int) ([]float32, error) {
	raw, out, err := scoreTensor(resp)
	if err != nil {
		return nil, err
	}
	if err := checkShape(out.GetShape(), n); err != nil {
		return nil, err
	}
	if raw != nil {
		if len(raw) != 4*n {
			return nil, fmt.Errorf("oip: output %q: raw contents hold %d bytes, want %d for %d scores", OutputScore, len(raw), 4*n, n)
		}
		scores := make([]float32, n)
		for i := range scores {
			scores[i] = math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:]))
		}
		return scores, nil
	}
	c := out.GetContents().GetFp32Contents()
	if len(c) != n {
		return nil, fmt.Errorf("oip: output %q: fp32_contents holds %d values, want %d", OutputScore, len(c), n)
	}
	return c, nil
}

// CheckScores is Scores without the copy: it only validates that resp
// carries n scores. The load generator calls it on every response.
func CheckScores(resp *pb.ModelInferResponse, n int) error {
	raw, out, err := scoreTensor(resp)
	if err != nil {
		return err
	}
	if err := checkShape(out.GetShape(), n); err != nil {
		return err
	}
	if raw != nil {
		if len(raw) != 4*n {
			return fmt.Errorf("oip: output %q: raw contents hold %d bytes, want %d", OutputScore, len(raw), 4*n)
		}
		return nil
	}
	if got := len(out.GetContents().GetFp32Contents()); got != n {
		return fmt.Errorf("oip: output %q: fp32_contents holds %d values, want %d", OutputScore, got, n)
	}
	return nil
}

// scoreTensor finds the score output and, when the response uses
// raw_output_contents, its bytes (raw is nil otherwise).
func scoreTensor(resp *pb.ModelInferResponse) (raw []byte, out *pb.ModelInferResponse_InferOutputTensor, err error) {
	outs := resp.GetOutputs()
	for i, o := range outs {
		if o.GetName() != OutputScore {
			continue
		}
		if o.GetDatatype() != TypeFP32 {
			return nil, nil, fmt.Errorf("oip: output %q has datatype %q, want %s", OutputScore, o.GetDatatype(), TypeFP32)
		}
		if rc := resp.GetRawOutputContents(); len(rc) > 0 {
			// The protocol pairs raw_output_contents with outputs by index.
			if len(rc) != len(outs) {
				return nil, nil, fmt.Errorf("oip: response has %d outputs but %d raw_output_contents", len(outs), len(rc))
			}
			if rc[i] == nil {
				return []byte{}, o, nil
			}
			return rc[i], o, nil
		}
		return nil, o, nil
	}
	return nil, nil, fmt.Errorf("oip: response has no output %q", OutputScore)
}

func checkShape(shape []int64, n int) error {
	switch {
	case len(shape) == 2 && shape[0] == int64(n) && shape[1] == 1:
	case len(shape) == 1 && shape[0] == int64(n):
	default:
		return fmt.Errorf("oip: output %q has shape %v, want [%d 1]", OutputScore, shape, n)
	}
	return nil
}
