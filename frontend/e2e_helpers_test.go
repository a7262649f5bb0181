package frontend_test

import (
	"context"
	"encoding/binary"
	"math"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/recmesh/recmesh/model"
	"github.com/recmesh/recmesh/proto/inference"
)

// bundle is a small exported model with its reference forward pass.
type bundle struct {
	dir string
	cfg model.Config
	b   *model.Bundle
	ref *model.Reference
}

// exportBundle exports the cap-1000 model (seed 1, about 60 MB) into a
// temporary directory and opens it.
func exportBundle(t *testing.T) *bundle {
	t.Helper()
	dir := t.TempDir()
	cfg := model.DLRMv2(model.DevVocabCap)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := model.Export(ctx, dir, cfg, 1, nil); err != nil {
		t.Fatal(err)
	}
	b, err := model.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	ref, err := model.NewReference(b)
	if err != nil {
		t.Fatal(err)
	}
	return &bundle{dir: dir, cfg: b.Config, b: b, ref: ref}
}

func dialT(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// inferRequest is a raw-contents request for the given examples.
func inferRequest(cfg model.Config, dense []float32, sparse []int32, n int) *inference.ModelInferRequest {
	db := make([]byte, 4*len(dense))
	for i, v := range dense {
		binary.LittleEndian.PutUint32(db[4*i:], math.Float32bits(v))
	}
	sb := make([]byte, 4*len(sparse))
	for i, v := range sparse {
		binary.LittleEndian.PutUint32(sb[4*i:], uint32(v))
	}
	return &inference.ModelInferRequest{
		ModelName: "dlrm",
		Inputs: []*inference.ModelInferRequest_InferInputTensor{
			{Name: "dense", Datatype: "FP32", Shape: []int64{int64(n), int64(cfg.NumDense)}},
			{Name: "sparse", Datatype: "INT32", Shape: []int64{int64(n), int64(cfg.SparseWidth())}},
		},
		RawInputContents: [][]byte{db, sb},
	}
}

// rawScores decodes the raw score output of a response.
func rawScores(resp *inference.ModelInferResponse) []float32 {
	if len(resp.RawOutputContents) != 1 {
		return nil
	}
	b := resp.RawOutputContents[0]
	out := make([]float32, len(b)/4)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return out
}

// waitUntil polls cond until it holds or timeout passes.
func waitUntil(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func maxAbsDiff(a, b []float32) float64 {
	if len(a) != len(b) {
		return math.Inf(1)
	}
	var d float64
	for i := range a {
		d = math.Max(d, math.Abs(float64(a[i])-float64(b[i])))
	}
	return d
}
