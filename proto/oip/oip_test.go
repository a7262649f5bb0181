package oip

import (
	"encoding/binary"
	"math"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/recmesh/recmesh/model"
	pb "github.com/recmesh/recmesh/proto/inference"
)

func TestBuildRequestAndEncode(t *testing.T) {
	cfg := model.DLRMv2(model.DevVocabCap)
	dense, sparse := model.RandomInputs(cfg, 1, 3)
	req, err := BuildRequest("dlrm", cfg, dense, sparse, 3, TypeINT64)
	if err != nil {
		t.Fatal(err)
	}
	if got := req.Inputs[1].Shape; got[0] != 3 || got[1] != 214 {
		t.Errorf("sparse shape %v", got)
	}
	if len(req.RawInputContents[0]) != 3*13*4 || len(req.RawInputContents[1]) != 3*214*8 {
		t.Errorf("raw sizes %d, %d", len(req.RawInputContents[0]), len(req.RawInputContents[1]))
	}
	if v := int64(binary.LittleEndian.Uint64(req.RawInputContents[1][8*7:])); v != int64(sparse[7]) {
		t.Errorf("id 7 encoded as %d, want %d", v, sparse[7])
	}
	if v := math.Float32frombits(binary.LittleEndian.Uint32(req.RawInputContents[0][4*5:])); v != dense[5] {
		t.Errorf("dense 5 encoded as %v, want %v", v, dense[5])
	}
	enc, err := Encode(req)
	if err != nil {
		t.Fatal(err)
	}
	var back pb.ModelInferRequest
	if err := proto.Unmarshal(enc.Bytes, &back); err != nil || !proto.Equal(&back, req) || enc.Examples != 3 {
		t.Errorf("pre-encoded request does not decode to the original (%v, %d examples)", err, enc.Examples)
	}
	if _, err := BuildRequest("dlrm", cfg, dense, sparse, 2, TypeINT32); err == nil {
		t.Error("mismatched example count accepted")
	}
	if _, err := BuildRequest("dlrm", cfg, dense, sparse, 3, "UINT8"); err == nil {
		t.Error("sparse type UINT8 accepted")
	}
}

func TestScores(t *testing.T) {
	raw := make([]byte, 8)
	binary.LittleEndian.PutUint32(raw, math.Float32bits(0.25))
	binary.LittleEndian.PutUint32(raw[4:], math.Float32bits(0.75))
	out := func(dt string, shape ...int64) []*pb.ModelInferResponse_InferOutputTensor {
		return []*pb.ModelInferResponse_InferOutputTensor{{Name: "score", Datatype: dt, Shape: shape}}
	}
	ok := &pb.ModelInferResponse{Outputs: out("FP32", 2, 1), RawOutputContents: [][]byte{raw}}
	if s, err := Scores(ok, 2); err != nil || s[0] != 0.25 || s[1] != 0.75 || CheckScores(ok, 2) != nil {
		t.Errorf("raw scores %v, %v", s, err)
	}
	typed := &pb.ModelInferResponse{Outputs: out("FP32", 2)}
	typed.Outputs[0].Contents = &pb.InferTensorContents{Fp32Contents: []float32{1, 2}}
	if s, err := Scores(typed, 2); err != nil || s[1] != 2 || CheckScores(typed, 2) != nil {
		t.Errorf("typed scores %v, %v", s, err)
	}
	for name, bad := range map[string]*pb.ModelInferResponse{
		"no output":     {},
		"wrong type":    {Outputs: out("FP16", 2, 1), RawOutputContents: [][]byte{raw}},
		"wrong shape":   {Outputs: out("FP32", 3, 1), RawOutputContents: [][]byte{raw}},
		"short raw":     {Outputs: out("FP32", 2, 1), RawOutputContents: [][]byte{raw[:4]}},
		"raw mismatch":  {Outputs: append(out("FP32", 2, 1), out("FP32", 2, 1)...), RawOutputContents: [][]byte{raw}},
		"typed missing": {Outputs: out("FP32", 2, 1)},
	} {
		if _, err := Scores(bad, 2); err == nil {
			t.Errorf("%s: Scores succeeded", name)
		}
		if CheckScores(bad, 2) == nil {
			t.Errorf("%s: CheckScores succeeded", name)
		}
	}
}

func TestCodeName(t *testing.T) {
	for c, want := range map[codes.Code]string{
		codes.Unavailable: "UNAVAILABLE", codes.DeadlineExceeded: "DEADLINE_EXCEEDED",
		codes.ResourceExhausted: "RESOURCE_EXHAUSTED", codes.Canceled: "CANCELLED", 42: "CODE_42",
	} {
		if got := CodeName(c); got != want {
			t.Errorf("CodeName(%d) = %s, want %s", c, got, want)
		}
	}
}
