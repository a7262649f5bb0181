package frontend

import (
	"testing"
	"unsafe"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/recmesh/recmesh/proto/inference"
)

func testDecoder(t testing.TB) *requestDecoder {
	t.Helper()
	opts, err := Options{Model: testConfig(), Backend: newFakeBackend(), MaxBatch: testMaxBatch}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	return newRequestDecoder(newSchema(opts))
}

// oddRequests are valid and invalid messages off the fast path, or at its
// edges: each must decode exactly as proto.Unmarshal decodes it.
func oddRequests(t testing.TB) [][]byte {
	t.Helper()
	dense, sparse := inputs(2)
	marshal := func(m *inference.ModelInferRequest) []byte {
		b, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	withParams := rawRequest(dense, sparse, 2, false)
	withParams.Parameters = map[string]*inference.InferParameter{"priority": {ParameterChoice: &inference.InferParameter_Int64Param{Int64Param: 1}}}
	withOutputs := rawRequest(dense, sparse, 2, false)
	withOutputs.Outputs = []*inference.ModelInferRequest_InferRequestedOutputTensor{{Name: "score"}}
	threeInputs := rawRequest(dense, sparse, 2, false)
	threeInputs.Inputs = append(threeInputs.Inputs, &tensor{Name: "extra", Datatype: "FP32", Shape: []int64{2, 1, 1}})
	threeInputs.RawInputContents = append(threeInputs.RawInputContents, []byte{})
	odd := rawRequest(dense, sparse, 2, true)
	odd.ModelName, odd.ModelVersion, odd.Id = "another-model", "7", "ünïcode-id"
	odd.Inputs[0].Shape = []int64{-1, 1 << 40}
	noShape := rawRequest(dense, sparse, 2, false)
	noShape.Inputs[1].Shape = nil

	ok := marshal(rawRequest(dense, sparse, 2, false))
	unpacked := protowire.AppendTag(nil, 5, protowire.BytesType)
	var tensorMsg []byte
	tensorMsg = protowire.AppendTag(tensorMsg, 1, protowire.BytesType)
	tensorMsg = protowire.AppendString(tensorMsg, "dense")
	for _, d := range []uint64{2, 13} {
		tensorMsg = protowire.AppendTag(tensorMsg, 3, protowire.VarintType)
		tensorMsg = protowire.AppendVarint(tensorMsg, d)
	}
	unpacked = protowire.AppendBytes(unpacked, tensorMsg)
	unknown := protowire.AppendTag(append([]byte(nil), ok...), 99, protowire.VarintType)
	unknown = protowire.AppendVarint(unknown, 5)
	badUTF8 := protowire.AppendTag(append([]byte(nil), ok...), 3, protowire.BytesType)
	badUTF8 = protowire.AppendBytes(badUTF8, []byte{0xff, 0xfe})
	wrongType := protowire.AppendTag(append([]byte(nil), ok...), 1, protowire.VarintType)
	wrongType = protowire.AppendVarint(wrongType, 1)

	return [][]byte{
		marshal(typedRequest(dense, sparse, 2, false)),
		marshal(withParams), marshal(withOutputs), marshal(threeInputs), marshal(odd), marshal(noShape),
		append(append([]byte(nil), ok...), ok...), // fields repeated: names last wins, lists append
		unpacked, unknown, badUTF8, wrongType,
		ok[:len(ok)-3], // truncated
		{},
	}
}

// TestRequestDecoderMatchesProto checks the fast path and every fallback
// against proto.Unmarshal, on requests real callers send and on the odd
// ones.
func TestRequestDecoderMatchesProto(t *testing.T) {
	dec := testDecoder(t)
	var msgs [][]byte
	for _, n := range []int{1, 16} {
		dense, sparse := inputs(n)
		for _, int64ids := range []bool{false, true} {
			for _, m := range []*inference.ModelInferRequest{rawRequest(dense, sparse, n, int64ids), typedRequest(dense, sparse, n, int64ids)} {
				b, err := proto.Marshal(m)
				if err != nil {
					t.Fatal(err)
				}
				msgs = append(msgs, b)
			}
		}
	}
	msgs = append(msgs, oddRequests(t)...)
	for i, b := range msgs {
		var ref, got inference.ModelInferRequest
		refErr := proto.Unmarshal(b, &ref)
		err := dec.Unmarshal(b, &got)
		if (err == nil) != (refErr == nil) {
			t.Errorf("message %d: error %v, proto.Unmarshal's %v", i, err, refErr)
			continue
		}
		if err == nil && !proto.Equal(&got, &ref) {
			t.Errorf("message %d: decoded %v, proto.Unmarshal %v", i, &got, &ref)
		}
	}
}

// TestRequestDecoderFastPath checks what the fast path is for: a raw
// request costs the request and one block, and its contents are the
// received bytes, not a copy.
func TestRequestDecoderFastPath(t *testing.T) {
	dec := testDecoder(t)
	dense, sparse := inputs(16)
	b, err := proto.Marshal(rawRequest(dense, sparse, 16, false))
	if err != nil {
		t.Fatal(err)
	}
	var req *inference.ModelInferRequest
	allocs := testing.AllocsPerRun(100, func() {
		req = new(inference.ModelInferRequest)
		if err := dec.Unmarshal(b, req); err != nil {
			t.Fatal(err)
		}
	})
	// "req-1", the id, is the only string not known to the schema.
	if allocs > 3 {
		t.Errorf("decoding a raw request made %v allocations, want at most 3 (request, block, id)", allocs)
	}
	raw := req.RawInputContents[1]
	start := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	if p := uintptr(unsafe.Pointer(unsafe.SliceData(raw))); p < start || p >= start+uintptr(len(b)) {
		t.Error("raw contents were copied, not aliased to the message")
	}
	if cap(raw) != len(raw) {
		t.Errorf("raw contents have capacity %d past their %d bytes: an append would overwrite the message", cap(raw), len(raw))
	}
	if req.Inputs[0].Name != inputDense || req.Inputs[1].Datatype != typeINT32 || req.ModelName != DefaultModelName {
		t.Errorf("decoded %v", req)
	}
}

// TestRequestCodec: the grpc transport's codec decodes requests that
// arrive split over several buffers, keeps nothing of them (grpc-go
// reuses them), and leaves other messages to grpc-go's own codec.
func TestRequestCodec(t *testing.T) {
	opts, err := Options{Model: testConfig(), Backend: newFakeBackend(), MaxBatch: testMaxBatch}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	codec := newRequestCodec(newSchema(opts))
	dense, sparse := inputs(3)
	want := rawRequest(dense, sparse, 3, false)
	data, err := codec.Marshal(want)
	if err != nil {
		t.Fatal(err)
	}
	b := data.Materialize()
	data.Free()
	half := len(b) / 2
	first, second := append([]byte(nil), b[:half]...), append([]byte(nil), b[half:]...)
	var got inference.ModelInferRequest
	if err := codec.Unmarshal(mem.BufferSlice{mem.SliceBuffer(first), mem.SliceBuffer(second)}, &got); err != nil {
		t.Fatal(err)
	}
	clear(first) // as grpc-go's pool would reuse them
	clear(second)
	if !proto.Equal(&got, want) {
		t.Fatalf("decoded %v, want %v", &got, want)
	}
	var ready inference.ServerReadyResponse
	rb, err := codec.Marshal(&inference.ServerReadyResponse{Ready: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := codec.Unmarshal(rb, &ready); err != nil || !ready.Ready {
		t.Fatalf("ServerReadyResponse through the codec: %v, %v", &ready, err)
	}
	if codec.Name() != "proto" {
		t.Errorf("codec named %q, want proto", codec.Name())
	}
}
