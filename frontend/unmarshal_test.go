package frontend

import (
	"context"
	"testing"
	"unsafe"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
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

// countingPool is a mem.BufferPool that counts what it hands out and gets
// back.
type countingPool struct {
	gets, puts int
}

func (p *countingPool) Get(n int) *[]byte {
	p.gets++
	b := make([]byte, n)
	return &b
}

func (p *countingPool) Put(*[]byte) { p.puts++ }

// TestRequestCodecHoldsTheMessageForTheCall: a request the fast path
// decodes aliases its message, so the codec keeps the message (a pooled
// copy, or grpc-go's own buffer when it came in one) until the call's
// handler has returned, then gives it back exactly once; a request
// proto.Unmarshal decodes gives it back at once.
func TestRequestCodecHoldsTheMessageForTheCall(t *testing.T) {
	opts, err := Options{Model: testConfig(), Backend: newFakeBackend(), MaxBatch: testMaxBatch}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	dense, sparse := inputs(3)
	want := rawRequest(dense, sparse, 3, false)
	msg, err := proto.Marshal(want)
	if err != nil {
		t.Fatal(err)
	}
	call := func(t *testing.T, codec requestCodec, req *inference.ModelInferRequest) {
		t.Helper()
		ran := false
		handler := codec.held.releasing(func(_ any, _ context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
			if err := dec(req); err != nil {
				return nil, err
			}
			ran = true
			if !proto.Equal(req, want) {
				t.Errorf("inside the call the request is %v, want %v", req, want)
			}
			if codec.held.len() != 1 {
				t.Errorf("inside the call %d messages held, want 1", codec.held.len())
			}
			return nil, nil
		})
		_, err := handler(nil, context.Background(), func(any) error { return nil }, nil)
		if err != nil || !ran {
			t.Fatalf("handler: ran %v, %v", ran, err)
		}
	}

	t.Run("split message, pooled copy", func(t *testing.T) {
		pool := new(countingPool)
		codec := newRequestCodec(newSchema(opts))
		codec.pool = pool
		half := len(msg) / 2
		first, second := append([]byte(nil), msg[:half]...), append([]byte(nil), msg[half:]...)
		var req inference.ModelInferRequest
		if err := codec.Unmarshal(mem.BufferSlice{mem.SliceBuffer(first), mem.SliceBuffer(second)}, &req); err != nil {
			t.Fatal(err)
		}
		clear(first) // grpc-go reuses them once Unmarshal returns
		clear(second)
		if pool.gets != 1 || pool.puts != 0 || codec.held.len() != 1 {
			t.Fatalf("after decoding: %d gets, %d puts, %d held; want 1, 0, 1", pool.gets, pool.puts, codec.held.len())
		}
		call(t, codec, &req)
		if pool.puts != 1 || codec.held.len() != 0 {
			t.Fatalf("after the call: %d puts, %d held; want 1, 0", pool.puts, codec.held.len())
		}
		codec.held.release(&req) // a second release finds nothing to free
		if pool.puts != 1 {
			t.Fatalf("a second release put the buffer back again: %d puts", pool.puts)
		}
	})

	t.Run("one buffer, grpc-go's own", func(t *testing.T) {
		pool := new(countingPool)
		codec := newRequestCodec(newSchema(opts))
		codec.pool = pool
		b := append([]byte(nil), msg...)
		data := mem.BufferSlice{mem.NewBuffer(&b, pool)}
		var req inference.ModelInferRequest
		if err := codec.Unmarshal(data, &req); err != nil {
			t.Fatal(err)
		}
		data.Free() // grpc-go's reference ends when Unmarshal returns
		if pool.gets != 0 || pool.puts != 0 || codec.held.len() != 1 {
			t.Fatalf("after decoding: %d gets, %d puts, %d held; want the buffer itself kept: 0, 0, 1", pool.gets, pool.puts, codec.held.len())
		}
		call(t, codec, &req)
		if pool.puts != 1 || codec.held.len() != 0 {
			t.Fatalf("after the call: %d puts, %d held; want 1, 0", pool.puts, codec.held.len())
		}
	})

	// grpc-go's decode can fail after the codec has decoded the request:
	// it reads again to see the stream end, and the client may reset
	// then. The handler returns that error without calling anything else.
	t.Run("decode fails after decoding", func(t *testing.T) {
		pool := new(countingPool)
		codec := newRequestCodec(newSchema(opts))
		codec.pool = pool
		handler := codec.held.releasing(func(_ any, _ context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
			if err := dec(new(inference.ModelInferRequest)); err != nil {
				return nil, err
			}
			t.Error("the handler went on after its decode failed")
			return nil, nil
		})
		reset := status.Error(codes.Canceled, "stream reset")
		_, err := handler(nil, context.Background(), func(v any) error {
			if err := codec.Unmarshal(mem.BufferSlice{mem.SliceBuffer(msg[:10]), mem.SliceBuffer(msg[10:])}, v); err != nil {
				return err
			}
			if codec.held.len() != 1 {
				t.Errorf("after decoding %d messages held, want 1", codec.held.len())
			}
			return reset
		}, nil)
		if err != reset {
			t.Fatalf("handler returned %v, want the decode's error", err)
		}
		if pool.gets != 1 || pool.puts != 1 || codec.held.len() != 0 {
			t.Fatalf("after the call: %d gets, %d puts, %d held; want 1, 1, 0", pool.gets, pool.puts, codec.held.len())
		}
	})

	t.Run("typed contents, copied by proto.Unmarshal", func(t *testing.T) {
		pool := new(countingPool)
		codec := newRequestCodec(newSchema(opts))
		codec.pool = pool
		typed, err := proto.Marshal(typedRequest(dense, sparse, 3, false))
		if err != nil {
			t.Fatal(err)
		}
		half := len(typed) / 2
		var req inference.ModelInferRequest
		if err := codec.Unmarshal(mem.BufferSlice{mem.SliceBuffer(typed[:half]), mem.SliceBuffer(typed[half:])}, &req); err != nil {
			t.Fatal(err)
		}
		if pool.gets != 1 || pool.puts != 1 || codec.held.len() != 0 {
			t.Fatalf("after decoding: %d gets, %d puts, %d held; want 1, 1, 0", pool.gets, pool.puts, codec.held.len())
		}
		if !proto.Equal(&req, typedRequest(dense, sparse, 3, false)) {
			t.Fatalf("decoded %v", &req)
		}
	})
}
