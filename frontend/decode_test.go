package frontend

import (
	"context"
	"fmt"
	"math"
	"slices"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/recmesh/recmesh/model"
	"github.com/recmesh/recmesh/proto/inference"
)

// Sparse columns used below (cap-1000 model): table 5 starts at column 14
// and has 3 rows; table 0 has 1000.
const (
	colTable5   = 14
	vocabTable5 = 3
)

func TestInvalidRequests(t *testing.T) {
	const n = 2
	width := testConfig().SparseWidth()
	dense, sparse := inputs(n)
	raw := func() *inference.ModelInferRequest { return rawRequest(dense, sparse, n, false) }
	raw64 := func() *inference.ModelInferRequest { return rawRequest(dense, sparse, n, true) }
	typed := func() *inference.ModelInferRequest { return typedRequest(dense, sparse, n, false) }
	typed64 := func() *inference.ModelInferRequest { return typedRequest(dense, sparse, n, true) }
	withSparse := func(row, col int, id int32) []int32 {
		s := slices.Clone(sparse)
		s[row*width+col] = id
		return s
	}
	withDense := func(row, col int, v float32) []float32 {
		d := slices.Clone(dense)
		d[row*model.NumDense+col] = v
		return d
	}
	bool_ := func(b bool) *inference.InferParameter {
		return &inference.InferParameter{ParameterChoice: &inference.InferParameter_BoolParam{BoolParam: b}}
	}

	for _, tc := range []struct {
		name string
		req  func() *inference.ModelInferRequest
		code codes.Code
		msg  string
	}{
		{"unknown model", func() *inference.ModelInferRequest { r := raw(); r.ModelName = "foo"; return r },
			codes.NotFound, "unknown model 'foo'; this server serves 'dlrm'"},
		{"empty model name", func() *inference.ModelInferRequest { r := raw(); r.ModelName = ""; return r },
			codes.NotFound, "unknown model ''; this server serves 'dlrm'"},
		{"unknown version", func() *inference.ModelInferRequest { r := raw(); r.ModelVersion = "2"; return r },
			codes.NotFound, "model 'dlrm' has no version '2'; available: '1'"},
		{"missing dense", func() *inference.ModelInferRequest {
			r := raw()
			r.Inputs, r.RawInputContents = r.Inputs[1:], r.RawInputContents[1:]
			return r
		}, codes.InvalidArgument, "missing input 'dense' (FP32 [B, 13])"},
		{"missing sparse", func() *inference.ModelInferRequest {
			r := raw()
			r.Inputs, r.RawInputContents = r.Inputs[:1], r.RawInputContents[:1]
			return r
		}, codes.InvalidArgument, "missing input 'sparse' (INT32 or INT64 [B, 214])"},
		{"no inputs", func() *inference.ModelInferRequest {
			r := raw()
			r.Inputs, r.RawInputContents = nil, nil
			return r
		}, codes.InvalidArgument, "missing input 'dense' (FP32 [B, 13])"},
		{"extra tensor", func() *inference.ModelInferRequest {
			r := raw()
			r.Inputs = append(r.Inputs, &tensor{Name: "extra", Datatype: "FP32", Shape: []int64{n, 1}})
			r.RawInputContents = append(r.RawInputContents, make([]byte, 8))
			return r
		}, codes.InvalidArgument, "unexpected input 'extra'; model 'dlrm' takes only 'dense' and 'sparse'"},
		{"duplicate tensor", func() *inference.ModelInferRequest {
			r := raw()
			r.Inputs = append(r.Inputs, r.Inputs[0])
			r.RawInputContents = append(r.RawInputContents, r.RawInputContents[0])
			return r
		}, codes.InvalidArgument, "input 'dense' appears twice"},
		{"dense datatype", func() *inference.ModelInferRequest { r := raw(); r.Inputs[0].Datatype = "INT32"; return r },
			codes.InvalidArgument, "input 'dense' has datatype 'INT32', want FP32"},
		{"dense datatype FP64", func() *inference.ModelInferRequest { r := raw(); r.Inputs[0].Datatype = "FP64"; return r },
			codes.InvalidArgument, "input 'dense' has datatype 'FP64', want FP32"},
		{"sparse datatype", func() *inference.ModelInferRequest { r := raw(); r.Inputs[1].Datatype = "FP32"; return r },
			codes.InvalidArgument, "input 'sparse' has datatype 'FP32', want INT32 or INT64"},
		{"sparse datatype UINT32", func() *inference.ModelInferRequest { r := raw(); r.Inputs[1].Datatype = "UINT32"; return r },
			codes.InvalidArgument, "input 'sparse' has datatype 'UINT32', want INT32 or INT64"},
		{"dense rank 1", func() *inference.ModelInferRequest { r := raw(); r.Inputs[0].Shape = []int64{n * 13}; return r },
			codes.InvalidArgument, "input 'dense' has shape [26], want [B, 13]"},
		{"dense rank 3", func() *inference.ModelInferRequest { r := raw(); r.Inputs[0].Shape = []int64{n, 13, 1}; return r },
			codes.InvalidArgument, "input 'dense' has shape [2, 13, 1], want [B, 13]"},
		{"dense rank 0", func() *inference.ModelInferRequest { r := raw(); r.Inputs[0].Shape = nil; return r },
			codes.InvalidArgument, "input 'dense' has shape [], want [B, 13]"},
		{"dense second dim", func() *inference.ModelInferRequest { r := raw(); r.Inputs[0].Shape = []int64{n, 12}; return r },
			codes.InvalidArgument, "input 'dense' has shape [2, 12], want [B, 13]"},
		{"sparse second dim", func() *inference.ModelInferRequest { r := raw(); r.Inputs[1].Shape = []int64{n, 26}; return r },
			codes.InvalidArgument, "input 'sparse' has shape [2, 26], want [B, 214] (the 26 tables' bags of fixed hotness, concatenated in table order)"},
		{"negative batch", func() *inference.ModelInferRequest { r := raw(); r.Inputs[0].Shape = []int64{-1, 13}; return r },
			codes.InvalidArgument, "input 'dense' has shape [-1, 13], want [B, 13]"},
		{"batch mismatch", func() *inference.ModelInferRequest { r := raw(); r.Inputs[1].Shape = []int64{3, 214}; return r },
			codes.InvalidArgument, "inputs 'dense' and 'sparse' disagree on the batch size: 2 and 3"},
		{"batch zero", func() *inference.ModelInferRequest {
			r := raw()
			r.Inputs[0].Shape, r.Inputs[1].Shape = []int64{0, 13}, []int64{0, 214}
			r.RawInputContents = [][]byte{{}, {}}
			return r
		}, codes.InvalidArgument, "batch size is 0; a request must carry at least one example"},
		{"batch above max", func() *inference.ModelInferRequest {
			r := raw()
			r.Inputs[0].Shape, r.Inputs[1].Shape = []int64{testMaxBatch + 1, 13}, []int64{testMaxBatch + 1, 214}
			return r
		}, codes.InvalidArgument, "batch size 9 exceeds this server's maximum of 8; split the request"},
		{"batch huge", func() *inference.ModelInferRequest {
			r := raw()
			r.Inputs[0].Shape, r.Inputs[1].Shape = []int64{math.MaxInt64, 13}, []int64{math.MaxInt64, 214}
			return r
		}, codes.InvalidArgument, "batch size 9223372036854775807 exceeds this server's maximum of 8; split the request"},
		{"raw entry missing", func() *inference.ModelInferRequest { r := raw(); r.RawInputContents = r.RawInputContents[:1]; return r },
			codes.InvalidArgument, "raw_input_contents has 1 entries for 2 inputs; send one per input, in the order of inputs"},
		{"raw dense short", func() *inference.ModelInferRequest {
			r := raw()
			r.RawInputContents[0] = r.RawInputContents[0][:100]
			return r
		},
			codes.InvalidArgument, "input 'dense': raw_input_contents[0] holds 100 bytes, want 104 (26 FP32 elements)"},
		{"raw dense long", func() *inference.ModelInferRequest {
			r := raw()
			r.RawInputContents[0] = append(r.RawInputContents[0], 0, 0, 0, 0)
			return r
		}, codes.InvalidArgument, "input 'dense': raw_input_contents[0] holds 108 bytes, want 104 (26 FP32 elements)"},
		{"raw sparse INT32 bytes declared INT64", func() *inference.ModelInferRequest { r := raw(); r.Inputs[1].Datatype = "INT64"; return r },
			codes.InvalidArgument, "input 'sparse': raw_input_contents[1] holds 1712 bytes, want 3424 (428 INT64 elements)"},
		{"raw sparse INT64 bytes declared INT32", func() *inference.ModelInferRequest { r := raw64(); r.Inputs[1].Datatype = "INT32"; return r },
			codes.InvalidArgument, "input 'sparse': raw_input_contents[1] holds 3424 bytes, want 1712 (428 INT32 elements)"},
		{"raw mixed with typed", func() *inference.ModelInferRequest {
			r := raw()
			r.Inputs[1].Contents = &inference.InferTensorContents{IntContents: sparse}
			return r
		}, codes.InvalidArgument, "input 'sparse' sets contents as well as raw_input_contents; use one or the other for all inputs"},
		{"raw mixed with empty typed", func() *inference.ModelInferRequest {
			r := raw()
			r.Inputs[0].Contents = &inference.InferTensorContents{}
			return r
		}, codes.InvalidArgument, "input 'dense' sets contents as well as raw_input_contents; use one or the other for all inputs"},
		{"typed without data", func() *inference.ModelInferRequest { r := typed(); r.Inputs[0].Contents = nil; return r },
			codes.InvalidArgument, "input 'dense' carries no data; set contents or raw_input_contents"},
		{"typed dense wrong field", func() *inference.ModelInferRequest {
			r := typed()
			r.Inputs[0].Contents = &inference.InferTensorContents{Fp64Contents: make([]float64, n*13)}
			return r
		}, codes.InvalidArgument, "input 'dense' is FP32 but sets contents.fp64_contents; use contents.fp32_contents"},
		{"typed sparse INT64 in int_contents", func() *inference.ModelInferRequest {
			r := typed()
			r.Inputs[1].Datatype = "INT64"
			return r
		}, codes.InvalidArgument, "input 'sparse' is INT64 but sets contents.int_contents; use contents.int64_contents"},
		{"typed sparse extra field", func() *inference.ModelInferRequest {
			r := typed()
			r.Inputs[1].Contents.BytesContents = [][]byte{{1}}
			return r
		}, codes.InvalidArgument, "input 'sparse' is INT32 but sets contents.bytes_contents; use contents.int_contents"},
		{"typed dense short", func() *inference.ModelInferRequest {
			r := typed()
			r.Inputs[0].Contents.Fp32Contents = r.Inputs[0].Contents.Fp32Contents[:25]
			return r
		}, codes.InvalidArgument, "input 'dense': contents.fp32_contents holds 25 values, want 26"},
		{"typed sparse INT64 long", func() *inference.ModelInferRequest {
			r := typed64()
			r.Inputs[1].Contents.Int64Contents = append(r.Inputs[1].Contents.Int64Contents, 0)
			return r
		}, codes.InvalidArgument, "input 'sparse': contents.int64_contents holds 429 values, want 428"},
		{"raw id above vocab", func() *inference.ModelInferRequest {
			return rawRequest(dense, withSparse(1, colTable5, vocabTable5), n, false)
		},
			codes.InvalidArgument, "input 'sparse': row 1, column 14 (table 5): id 3 is outside the table's vocabulary [0, 3)"},
		{"raw id negative", func() *inference.ModelInferRequest { return rawRequest(dense, withSparse(0, 0, -1), n, false) },
			codes.InvalidArgument, "input 'sparse': row 0, column 0 (table 0): id -1 is outside the table's vocabulary [0, 1000)"},
		{"raw id last column", func() *inference.ModelInferRequest { return rawRequest(dense, withSparse(1, 213, 36), n, false) },
			codes.InvalidArgument, "input 'sparse': row 1, column 213 (table 25): id 36 is outside the table's vocabulary [0, 36)"},
		{"raw INT64 id above vocab", func() *inference.ModelInferRequest { return rawRequest(dense, withSparse(1, colTable5, 7), n, true) },
			codes.InvalidArgument, "input 'sparse': row 1, column 14 (table 5): id 7 is outside the table's vocabulary [0, 3)"},
		{"raw INT64 id beyond int32", func() *inference.ModelInferRequest {
			r := raw64()
			ids := widen(sparse)
			ids[width+3] = 1<<32 + 5 // would alias id 5 if narrowed unchecked
			r.RawInputContents[1] = i64Bytes(ids)
			return r
		}, codes.InvalidArgument, "input 'sparse': row 1, column 3 (table 1): id 4294967301 is outside the table's vocabulary [0, 1000)"},
		{"raw INT64 id negative", func() *inference.ModelInferRequest { return rawRequest(dense, withSparse(0, 5, -9), n, true) },
			codes.InvalidArgument, "input 'sparse': row 0, column 5 (table 2): id -9 is outside the table's vocabulary [0, 1000)"},
		{"typed id above vocab", func() *inference.ModelInferRequest { return typedRequest(dense, withSparse(1, colTable5, 4), n, false) },
			codes.InvalidArgument, "input 'sparse': row 1, column 14 (table 5): id 4 is outside the table's vocabulary [0, 3)"},
		{"typed INT64 id above vocab", func() *inference.ModelInferRequest {
			r := typed64()
			r.Inputs[1].Contents.Int64Contents[width+colTable5] = math.MaxInt64
			return r
		}, codes.InvalidArgument, "input 'sparse': row 1, column 14 (table 5): id 9223372036854775807 is outside the table's vocabulary [0, 3)"},
		{"raw dense NaN", func() *inference.ModelInferRequest {
			return rawRequest(withDense(1, 7, float32(math.NaN())), sparse, n, false)
		},
			codes.InvalidArgument, "input 'dense': row 1, column 7 is NaN; dense features must be finite"},
		{"raw dense +Inf", func() *inference.ModelInferRequest {
			return rawRequest(withDense(0, 12, float32(math.Inf(1))), sparse, n, false)
		},
			codes.InvalidArgument, "input 'dense': row 0, column 12 is +Inf; dense features must be finite"},
		{"typed dense -Inf", func() *inference.ModelInferRequest {
			return typedRequest(withDense(1, 0, float32(math.Inf(-1))), sparse, n, false)
		},
			codes.InvalidArgument, "input 'dense': row 1, column 0 is -Inf; dense features must be finite"},
		{"typed dense NaN", func() *inference.ModelInferRequest {
			return typedRequest(withDense(0, 3, float32(math.NaN())), sparse, n, true)
		},
			codes.InvalidArgument, "input 'dense': row 0, column 3 is NaN; dense features must be finite"},
		{"unknown output", func() *inference.ModelInferRequest {
			r := raw()
			r.Outputs = []*inference.ModelInferRequest_InferRequestedOutputTensor{{Name: "score"}, {Name: "logit"}}
			return r
		}, codes.InvalidArgument, "unknown output 'logit' requested; model 'dlrm' has one output, 'score'"},
		{"duplicate output", func() *inference.ModelInferRequest {
			r := raw()
			r.Outputs = []*inference.ModelInferRequest_InferRequestedOutputTensor{{Name: "score"}, {Name: "score"}}
			return r
		}, codes.InvalidArgument, "output 'score' is requested twice"},
		{"binary_data not a bool", func() *inference.ModelInferRequest {
			r := raw()
			r.Outputs = []*inference.ModelInferRequest_InferRequestedOutputTensor{{Name: "score", Parameters: map[string]*inference.InferParameter{
				"binary_data": {ParameterChoice: &inference.InferParameter_StringParam{StringParam: "false"}},
			}}}
			return r
		}, codes.InvalidArgument, "output 'score': parameter 'binary_data' must be a bool"},
		{"binary_data ok but id bad", func() *inference.ModelInferRequest {
			r := rawRequest(dense, withSparse(0, colTable5, 3), n, false)
			r.Outputs = []*inference.ModelInferRequest_InferRequestedOutputTensor{{Name: "score", Parameters: map[string]*inference.InferParameter{"binary_data": bool_(false)}}}
			return r
		}, codes.InvalidArgument, "input 'sparse': row 0, column 14 (table 5): id 3 is outside the table's vocabulary [0, 3)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeBackend()
			s := newTestService(t, f)
			resp, err := s.ModelInfer(context.Background(), tc.req())
			if resp != nil {
				t.Errorf("got a response with the error")
			}
			st, ok := status.FromError(err)
			if !ok {
				t.Fatalf("error %v is not a status", err)
			}
			if st.Code() != tc.code || st.Message() != tc.msg {
				t.Errorf("got  %v %q\nwant %v %q", st.Code(), st.Message(), tc.code, tc.msg)
			}
			if a := f.acquires.Load(); a != 0 {
				t.Errorf("a bad request reached the backend (%d Acquire calls)", a)
			}
		})
	}
}

func TestValidRequests(t *testing.T) {
	width := testConfig().SparseWidth()
	output := func(binary *bool) []*inference.ModelInferRequest_InferRequestedOutputTensor {
		o := &inference.ModelInferRequest_InferRequestedOutputTensor{Name: "score"}
		if binary != nil {
			o.Parameters = map[string]*inference.InferParameter{
				"binary_data": {ParameterChoice: &inference.InferParameter_BoolParam{BoolParam: *binary}}}
		}
		return []*inference.ModelInferRequest_InferRequestedOutputTensor{o}
	}
	yes, no := true, false
	for _, tc := range []struct {
		name    string
		n       int
		build   func(d []float32, s []int32, n int, int64ids bool) *inference.ModelInferRequest
		int64   bool
		edit    func(r *inference.ModelInferRequest)
		wantRaw bool
	}{
		{name: "raw INT32", n: 3, build: rawRequest, wantRaw: true},
		{name: "raw INT64", n: 3, build: rawRequest, int64: true, wantRaw: true},
		{name: "typed INT32", n: 3, build: typedRequest},
		{name: "typed INT64", n: 3, build: typedRequest, int64: true},
		{name: "one example", n: 1, build: rawRequest, wantRaw: true},
		{name: "max batch", n: testMaxBatch, build: rawRequest, int64: true, wantRaw: true},
		{name: "explicit version", n: 2, build: rawRequest, wantRaw: true,
			edit: func(r *inference.ModelInferRequest) { r.ModelVersion = "1" }},
		{name: "inputs in reverse order", n: 2, build: rawRequest, wantRaw: true, edit: func(r *inference.ModelInferRequest) {
			slices.Reverse(r.Inputs)
			slices.Reverse(r.RawInputContents)
		}},
		{name: "typed inputs in reverse order", n: 2, build: typedRequest, int64: true,
			edit: func(r *inference.ModelInferRequest) { slices.Reverse(r.Inputs) }},
		{name: "score requested", n: 2, build: rawRequest, wantRaw: true,
			edit: func(r *inference.ModelInferRequest) { r.Outputs = output(nil) }},
		{name: "raw in, binary_data false", n: 2, build: rawRequest,
			edit: func(r *inference.ModelInferRequest) { r.Outputs = output(&no) }},
		{name: "typed in, binary_data true", n: 2, build: typedRequest, wantRaw: true,
			edit: func(r *inference.ModelInferRequest) { r.Outputs = output(&yes) }},
		{name: "unknown parameters ignored", n: 2, build: rawRequest, wantRaw: true, edit: func(r *inference.ModelInferRequest) {
			r.Parameters = map[string]*inference.InferParameter{"priority": {ParameterChoice: &inference.InferParameter_Int64Param{Int64Param: 1}}}
			r.Inputs[0].Parameters = map[string]*inference.InferParameter{"x": {}}
		}},
		{name: "edge ids and dense values", n: 2, build: rawRequest, wantRaw: true, edit: func(r *inference.ModelInferRequest) {
			// The largest valid id of every table in row 0, zero in row 1,
			// and dense values at the edges of finite float32.
			cfg := testConfig()
			ids := make([]int32, 2*width)
			for c, off := 0, 0; c < len(cfg.Hotness); c++ {
				for range cfg.Hotness[c] {
					ids[off] = int32(cfg.VocabSizes[c] - 1)
					off++
				}
			}
			d := make([]float32, 2*model.NumDense)
			d[0], d[1], d[2] = math.MaxFloat32, -math.MaxFloat32, math.SmallestNonzeroFloat32
			r.RawInputContents = [][]byte{f32Bytes(d), i32Bytes(ids)}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeBackend()
			s := newTestService(t, f)
			dense, sparse := inputs(tc.n)
			req := tc.build(dense, sparse, tc.n, tc.int64)
			if tc.edit != nil {
				tc.edit(req)
			}
			// What the slot must receive, read back from the request.
			wantDense, wantSparse := requestInputs(t, req)
			resp, err := s.ModelInfer(context.Background(), req)
			if err != nil {
				t.Fatal(err)
			}
			if resp.ModelName != "dlrm" || resp.ModelVersion != "1" || resp.Id != req.Id {
				t.Errorf("response names %q %q %q, want dlrm 1 %q", resp.ModelName, resp.ModelVersion, resp.Id, req.Id)
			}
			scores, raw := responseScores(t, resp)
			if raw != tc.wantRaw {
				t.Errorf("raw reply = %v, want %v", raw, tc.wantRaw)
			}
			if !slices.Equal(f.lastDense, wantDense) {
				t.Errorf("slot dense = %v, want %v", f.lastDense, wantDense)
			}
			if !slices.Equal(f.lastSparse, wantSparse) {
				t.Errorf("slot sparse differs from the request's ids")
			}
			if want := expectedScores(wantDense, wantSparse, tc.n, width); !slices.Equal(scores, want) {
				t.Errorf("scores = %v, want %v", scores, want)
			}
			if a, r := f.acquires.Load(), f.releases.Load(); a != 1 || r != 1 {
				t.Errorf("%d Acquire and %d Release calls, want 1 and 1", a, r)
			}
		})
	}
}

// requestInputs decodes a valid request independently of decode.go.
func requestInputs(t *testing.T, req *inference.ModelInferRequest) ([]float32, []int32) {
	t.Helper()
	var dense []float32
	var sparse []int32
	for i, in := range req.Inputs {
		switch {
		case len(req.RawInputContents) > 0:
			b := req.RawInputContents[i]
			switch in.Datatype {
			case "FP32":
				for j := 0; j < len(b); j += 4 {
					dense = append(dense, math.Float32frombits(uint32(b[j])|uint32(b[j+1])<<8|uint32(b[j+2])<<16|uint32(b[j+3])<<24))
				}
			case "INT32":
				for j := 0; j < len(b); j += 4 {
					sparse = append(sparse, int32(uint32(b[j])|uint32(b[j+1])<<8|uint32(b[j+2])<<16|uint32(b[j+3])<<24))
				}
			case "INT64":
				for j := 0; j < len(b); j += 8 {
					sparse = append(sparse, int32(uint32(b[j])|uint32(b[j+1])<<8|uint32(b[j+2])<<16|uint32(b[j+3])<<24))
				}
			}
		case in.Datatype == "FP32":
			dense = in.Contents.Fp32Contents
		case in.Datatype == "INT32":
			sparse = in.Contents.IntContents
		default:
			for _, id := range in.Contents.Int64Contents {
				sparse = append(sparse, int32(id))
			}
		}
	}
	return dense, sparse
}

// TestUnalignedRawInputs covers the byte-by-byte decoders, used when a raw
// buffer is not aligned for its element type (protobuf-go's buffers always
// are, but a caller building requests by hand may slice into one).
func TestUnalignedRawInputs(t *testing.T) {
	const n = 3
	width := testConfig().SparseWidth()
	misalign := func(b []byte) []byte {
		out := make([]byte, len(b)+1)[1:]
		copy(out, b)
		return out
	}
	dense, sparse := inputs(n)
	for _, int64ids := range []bool{false, true} {
		t.Run(fmt.Sprintf("valid/int64=%v", int64ids), func(t *testing.T) {
			f := newFakeBackend()
			req := rawRequest(dense, sparse, n, int64ids)
			for i := range req.RawInputContents {
				req.RawInputContents[i] = misalign(req.RawInputContents[i])
			}
			resp, err := newTestService(t, f).ModelInfer(context.Background(), req)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(f.lastDense, dense) || !slices.Equal(f.lastSparse, sparse) {
				t.Error("slot contents differ from the request")
			}
			if scores, _ := responseScores(t, resp); !slices.Equal(scores, expectedScores(dense, sparse, n, width)) {
				t.Errorf("scores %v", scores)
			}
		})
		t.Run(fmt.Sprintf("bad id/int64=%v", int64ids), func(t *testing.T) {
			bad := slices.Clone(sparse)
			bad[2*width+colTable5] = -3
			req := rawRequest(dense, bad, n, int64ids)
			req.RawInputContents[1] = misalign(req.RawInputContents[1])
			_, err := newTestService(t, newFakeBackend()).ModelInfer(context.Background(), req)
			want := "input 'sparse': row 2, column 14 (table 5): id -3 is outside the table's vocabulary [0, 3)"
			if st := status.Convert(err); st.Code() != codes.InvalidArgument || st.Message() != want {
				t.Errorf("got %v, want %q", err, want)
			}
		})
	}
	t.Run("NaN", func(t *testing.T) {
		d := slices.Clone(dense)
		d[2*model.NumDense+4] = float32(math.NaN())
		req := rawRequest(d, sparse, n, false)
		req.RawInputContents[0] = misalign(req.RawInputContents[0])
		_, err := newTestService(t, newFakeBackend()).ModelInfer(context.Background(), req)
		want := "input 'dense': row 2, column 4 is NaN; dense features must be finite"
		if st := status.Convert(err); st.Code() != codes.InvalidArgument || st.Message() != want {
			t.Errorf("got %v, want %q", err, want)
		}
	})
}
