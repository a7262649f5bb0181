package frontend

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"unicode/utf8"

	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/recmesh/recmesh/proto/inference"
)

// requestDecoder unmarshals ModelInfer requests with two allocations where
// proto.Unmarshal makes a dozen: the request's tensors, shapes and slice
// headers come from one block, the raw contents alias the received
// message (the transport hands every call a buffer of its own and never
// reuses it), and the names and datatypes the model serves are the
// schema's own strings. It takes the shape real callers send: model name,
// version, id, inputs with name, datatype and shape, raw contents. Any
// other request (typed contents, parameters, requested outputs, unknown
// fields, anything malformed) goes to proto.Unmarshal, the reference this
// decoder is fuzzed against, so errors and corner cases are protobuf's own.
type requestDecoder struct {
	known []string // strings returned without allocating when they match
}

func newRequestDecoder(s *schema) *requestDecoder {
	return &requestDecoder{known: []string{s.name, s.version, inputDense, inputSparse, typeFP32, typeINT32, typeINT64}}
}

// requestBlock holds what a two-input request needs besides the request.
type requestBlock struct {
	tensors [2]inference.ModelInferRequest_InferInputTensor
	inputs  [2]*inference.ModelInferRequest_InferInputTensor
	shapes  [2][2]int64
	raw     [2][]byte
}

// Unmarshal decodes msg into v, which must be a *inference.ModelInferRequest
// for the fast path; any other message goes to proto.Unmarshal. The
// transport's codec hook (h2unary.Options.Unmarshal) calls it.
func (d *requestDecoder) Unmarshal(msg []byte, v any) error {
	_, err := d.unmarshal(msg, v)
	return err
}

// unmarshal is Unmarshal that also says whether v aliases msg (the fast
// path) or holds copies of its own (proto.Unmarshal).
func (d *requestDecoder) unmarshal(msg []byte, v any) (aliased bool, err error) {
	if req, ok := v.(*inference.ModelInferRequest); ok && d.decode(msg, req) {
		return true, nil
	}
	pm, ok := v.(proto.Message)
	if !ok {
		return false, fmt.Errorf("frontend: %T is not a protobuf message", v)
	}
	proto.Reset(pm) // the fast path may have set fields before giving up
	return false, proto.Unmarshal(msg, pm)
}

// decode is the fast path; false means: use proto.Unmarshal.
func (d *requestDecoder) decode(b []byte, req *inference.ModelInferRequest) bool {
	var blk *requestBlock
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 || typ != protowire.BytesType {
			return false
		}
		v, m := protowire.ConsumeBytes(b[n:])
		if m < 0 {
			return false
		}
		b = b[n+m:]
		var ok bool
		switch num {
		case 1:
			req.ModelName, ok = d.str(v)
		case 2:
			req.ModelVersion, ok = d.str(v)
		case 3:
			req.Id, ok = d.str(v)
		case 5:
			if blk == nil {
				blk = new(requestBlock)
			}
			i := len(req.Inputs)
			var t *inference.ModelInferRequest_InferInputTensor
			if i < len(blk.tensors) {
				t = &blk.tensors[i]
				t.Shape = blk.shapes[i][:0:len(blk.shapes[i])]
				if req.Inputs == nil {
					req.Inputs = blk.inputs[:0]
				}
			} else {
				t = new(inference.ModelInferRequest_InferInputTensor)
			}
			ok = d.tensor(v, t)
			if len(t.Shape) == 0 {
				t.Shape = nil // as proto.Unmarshal leaves it
			}
			req.Inputs = append(req.Inputs, t)
		case 7:
			if req.RawInputContents == nil {
				if blk == nil {
					blk = new(requestBlock)
				}
				req.RawInputContents = blk.raw[:0]
			}
			req.RawInputContents = append(req.RawInputContents, v[:len(v):len(v)])
			ok = true
		}
		if !ok {
			return false
		}
	}
	return true
}

// tensor decodes one input tensor's name, datatype and shape.
func (d *requestDecoder) tensor(b []byte, t *inference.ModelInferRequest_InferInputTensor) bool {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return false
		}
		b = b[n:]
		switch {
		case num == 3 && typ == protowire.VarintType:
			x, m := protowire.ConsumeVarint(b)
			if m < 0 {
				return false
			}
			t.Shape = append(t.Shape, int64(x))
			b = b[m:]
		case typ == protowire.BytesType && (num == 1 || num == 2 || num == 3):
			v, m := protowire.ConsumeBytes(b)
			if m < 0 {
				return false
			}
			b = b[m:]
			var ok bool
			switch num {
			case 1:
				t.Name, ok = d.str(v)
			case 2:
				t.Datatype, ok = d.str(v)
			case 3:
				ok = packedInt64s(v, &t.Shape)
			}
			if !ok {
				return false
			}
		default:
			return false
		}
	}
	return true
}

// packedInt64s appends a packed run of varints to dst.
func packedInt64s(b []byte, dst *[]int64) bool {
	for len(b) > 0 {
		x, n := protowire.ConsumeVarint(b)
		if n < 0 {
			return false
		}
		*dst = append(*dst, int64(x))
		b = b[n:]
	}
	return true
}

// str returns b as a string: a known one without allocating, else a copy;
// false for invalid UTF-8, which proto3 strings may not hold.
func (d *requestDecoder) str(b []byte) (string, bool) {
	if len(b) == 0 {
		return "", true
	}
	for _, k := range d.known {
		if string(b) == k {
			return k, true
		}
	}
	if !utf8.Valid(b) {
		return "", false
	}
	return string(b), true
}

// requestCodec is grpc-go's protobuf codec with requestDecoder for
// ModelInfer requests: the grpc transport's share of what the decoder
// saves.
type requestCodec struct {
	dec  *requestDecoder
	base encoding.CodecV2 // grpc-go's "proto"
	pool mem.BufferPool
	held *heldMessages
}

func newRequestCodec(s *schema) requestCodec {
	return requestCodec{
		dec:  newRequestDecoder(s),
		base: encoding.GetCodecV2(grpcproto.Name),
		pool: mem.DefaultBufferPool(),
		held: &heldMessages{bufs: make(map[*inference.ModelInferRequest]mem.Buffer)},
	}
}

func (c requestCodec) Marshal(v any) (mem.BufferSlice, error) { return c.base.Marshal(v) }

// Unmarshal decodes a ModelInfer request from a pooled copy of its message
// (grpc-go's own buffer when it arrived in one), which the decoded request
// aliases and keeps until its call's handler returns (inferenceService):
// a fresh copy per call was three quarters of a frontend's allocated bytes
// at B_req 16, and so of its collections and heap. Any other message, and
// a request proto.Unmarshal decodes (it copies), hands the buffer back at
// once.
func (c requestCodec) Unmarshal(data mem.BufferSlice, v any) error {
	req, ok := v.(*inference.ModelInferRequest)
	if !ok {
		return c.base.Unmarshal(data, v)
	}
	buf := data.MaterializeToBuffer(c.pool)
	aliased, err := c.dec.unmarshal(buf.ReadOnlyData(), req)
	if !aliased {
		buf.Free()
		c.held.release(req) // a message decoded into req before, if any
		return err
	}
	c.held.put(req, buf)
	return nil
}

func (requestCodec) Name() string { return grpcproto.Name }

// inferenceService is the GRPCInferenceService description with
// ModelInfer's handler wrapped so that the message its request aliases
// goes back to the pool when the handler returns, however the call ends.
// An interceptor cannot do it: grpc-go reads once more after decoding a
// unary request (to see the stream end), and when the client resets or
// its deadline passes right then, the handler returns that error without
// calling any interceptor, after the codec has decoded the request.
func (c requestCodec) inferenceService() *grpc.ServiceDesc {
	desc := inference.GRPCInferenceService_ServiceDesc
	desc.Methods = slices.Clone(desc.Methods)
	for i := range desc.Methods {
		if desc.Methods[i].MethodName == "ModelInfer" {
			desc.Methods[i].Handler = c.held.releasing(desc.Methods[i].Handler)
		}
	}
	return &desc
}

// heldMessages maps each decoded request that aliases its received
// message to that message's buffer, from decoding to the end of its call.
// grpc-go calls the codec with no context, so the request itself is the
// key.
type heldMessages struct {
	mu   sync.Mutex
	bufs map[*inference.ModelInferRequest]mem.Buffer
}

// put records that req aliases buf. A second message decoded into the
// same request (a client that breaks unary cardinality) replaces the
// first, which nothing aliases any more.
func (h *heldMessages) put(req *inference.ModelInferRequest, buf mem.Buffer) {
	h.mu.Lock()
	old, ok := h.bufs[req]
	h.bufs[req] = buf
	h.mu.Unlock()
	if ok {
		old.Free()
	}
}

// release frees req's message, if it holds one.
func (h *heldMessages) release(req *inference.ModelInferRequest) {
	h.mu.Lock()
	buf, ok := h.bufs[req]
	delete(h.bufs, req)
	h.mu.Unlock()
	if ok {
		buf.Free()
	}
}

// releasing wraps a generated unary handler: whatever request its decode
// fills is released when the handler returns, after the interceptors and
// the service (the reply copies what it needs from the request).
func (h *heldMessages) releasing(handler grpc.MethodHandler) grpc.MethodHandler {
	return func(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
		var req *inference.ModelInferRequest
		defer func() {
			if req != nil {
				h.release(req)
			}
		}()
		return handler(srv, ctx, func(v any) error {
			req, _ = v.(*inference.ModelInferRequest)
			return dec(v)
		}, interceptor)
	}
}

// len is the number of messages held: calls decoded and not yet over.
func (h *heldMessages) len() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.bufs)
}
