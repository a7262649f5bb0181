package frontend

import (
	"encoding/binary"
	"fmt"
	"math"
	"strings"
	"unsafe"

	"github.com/recmesh/recmesh/model"
	"github.com/recmesh/recmesh/proto/inference"
)

// The model's tensors as clients see them:
//
//	input  dense   FP32            [B, 13]   dense features, finite
//	input  sparse  INT32 or INT64  [B, 214]  26 multi-hot bags of fixed hotness,
//	                                         concatenated in table order
//	output score   FP32            [B, 1]    click probability
//
// with 1 ≤ B ≤ Options.MaxBatch.
const (
	inputDense  = "dense"
	inputSparse = "sparse"
	outputScore = "score"

	typeFP32  = "FP32"
	typeINT32 = "INT32"
	typeINT64 = "INT64"

	// paramBinaryData is the requested-output parameter that picks the
	// encoding of the reply (see inferInput.rawOutput).
	paramBinaryData = "binary_data"
)

// schema is what the frontend knows of the model to validate requests: its
// name and version, the batch bound, and the vocabulary of the table behind
// every sparse column. It is built once by newSchema and read-only after.
type schema struct {
	name     string
	version  string
	maxBatch int
	// width is the number of sparse ids per example (214).
	width int
	// vocab[c] is the vocabulary size of the table that sparse column c
	// belongs to; table[c] is that table's index.
	vocab []uint32
	table []int
}

func newSchema(o Options) *schema {
	s := &schema{
		name:     o.ModelName,
		version:  o.ModelVersion,
		maxBatch: o.MaxBatch,
		width:    o.Model.SparseWidth(),
	}
	for t, h := range o.Model.Hotness {
		for range h {
			s.vocab = append(s.vocab, uint32(o.Model.VocabSizes[t]))
			s.table = append(s.table, t)
		}
	}
	return s
}

// checkModel answers NOT_FOUND unless name and version address the served
// model; an empty version means the latest, which is the only one.
func (s *schema) checkModel(name, version string) error {
	if name != s.name {
		return notFound("unknown model '%s'; this server serves '%s'", name, s.name)
	}
	if version != "" && version != s.version {
		return notFound("model '%s' has no version '%s'; available: '%s'", name, version, s.version)
	}
	return nil
}

// inferInput is a validated ModelInferRequest: the batch size and where each
// input's elements are. It points into the request and copies nothing, so
// validating costs no allocation.
type inferInput struct {
	n      int
	dense  tensorData
	sparse tensorData
	// rawOutput picks the reply's encoding. The rule: the reply uses
	// raw_output_contents when the request sent raw_input_contents, and typed
	// contents (fp32_contents) when it sent typed contents, so a client gets
	// back the encoding it speaks; a bool parameter "binary_data" on the
	// requested output "score" overrides either way (the KServe/Triton
	// convention for asking for, or declining, binary output).
	rawOutput bool
}

// tensorData holds one input's elements: exactly one field is set.
type tensorData struct {
	raw []byte    // little-endian elements from raw_input_contents
	f32 []float32 // contents.fp32_contents
	i32 []int32   // contents.int_contents
	i64 []int64   // contents.int64_contents
	// elem64 says raw holds 8-byte (INT64) elements.
	elem64 bool
}

// parse validates req completely, in the order a client would fix it —
// model, tensor names, datatypes, shapes and batch size, encodings and
// lengths, values, requested outputs — and fills in. Every failure is
// NOT_FOUND (model) or INVALID_ARGUMENT with a message that names the
// tensor and, for values, the row and column.
func (s *schema) parse(req *inference.ModelInferRequest, in *inferInput) error {
	if err := s.checkModel(req.ModelName, req.ModelVersion); err != nil {
		return err
	}
	var dense, sparse *inference.ModelInferRequest_InferInputTensor
	denseIdx, sparseIdx := -1, -1
	for i, t := range req.Inputs {
		switch t.Name {
		case inputDense:
			if dense != nil {
				return invalidArgument("input '%s' appears twice", t.Name)
			}
			dense, denseIdx = t, i
		case inputSparse:
			if sparse != nil {
				return invalidArgument("input '%s' appears twice", t.Name)
			}
			sparse, sparseIdx = t, i
		default:
			return invalidArgument("unexpected input '%s'; model '%s' takes only '%s' and '%s'", t.Name, s.name, inputDense, inputSparse)
		}
	}
	if dense == nil {
		return invalidArgument("missing input '%s' (%s %s)", inputDense, typeFP32, s.shapeWant(inputDense))
	}
	if sparse == nil {
		return invalidArgument("missing input '%s' (%s or %s %s)", inputSparse, typeINT32, typeINT64, s.shapeWant(inputSparse))
	}

	if dense.Datatype != typeFP32 {
		return invalidArgument("input '%s' has datatype '%s', want %s", inputDense, dense.Datatype, typeFP32)
	}
	switch sparse.Datatype {
	case typeINT32:
	case typeINT64:
		in.sparse.elem64 = true
	default:
		return invalidArgument("input '%s' has datatype '%s', want %s or %s", inputSparse, sparse.Datatype, typeINT32, typeINT64)
	}

	n, err := s.batchDim(dense, model.NumDense)
	if err != nil {
		return err
	}
	m, err := s.batchDim(sparse, s.width)
	if err != nil {
		return err
	}
	if n != m {
		return invalidArgument("inputs '%s' and '%s' disagree on the batch size: %d and %d", inputDense, inputSparse, n, m)
	}
	if n == 0 {
		return invalidArgument("batch size is 0; a request must carry at least one example")
	}
	if n > int64(s.maxBatch) {
		return invalidArgument("batch size %d exceeds this server's maximum of %d; split the request", n, s.maxBatch)
	}
	in.n = int(n)

	raw := req.RawInputContents
	if len(raw) > 0 && len(raw) != len(req.Inputs) {
		return invalidArgument("raw_input_contents has %d entries for %d inputs; send one per input, in the order of inputs", len(raw), len(req.Inputs))
	}
	if err := s.data(dense, raw, denseIdx, in.n*model.NumDense, 4, &in.dense); err != nil {
		return err
	}
	size := 4
	if in.sparse.elem64 {
		size = 8
	}
	if err := s.data(sparse, raw, sparseIdx, in.n*s.width, size, &in.sparse); err != nil {
		return err
	}

	if err := s.checkDense(&in.dense); err != nil {
		return err
	}
	if err := s.checkSparse(&in.sparse, in.n); err != nil {
		return err
	}

	in.rawOutput = len(raw) > 0
	seen := false
	for _, o := range req.Outputs {
		if o.Name != outputScore {
			return invalidArgument("unknown output '%s' requested; model '%s' has one output, '%s'", o.Name, s.name, outputScore)
		}
		if seen {
			return invalidArgument("output '%s' is requested twice", o.Name)
		}
		seen = true
		if p, ok := o.Parameters[paramBinaryData]; ok {
			b, ok := p.GetParameterChoice().(*inference.InferParameter_BoolParam)
			if !ok {
				return invalidArgument("output '%s': parameter '%s' must be a bool", o.Name, paramBinaryData)
			}
			in.rawOutput = b.BoolParam
		}
	}
	return nil
}

// shapeWant is the shape of an input as messages print it.
func (s *schema) shapeWant(name string) string {
	if name == inputDense {
		return fmt.Sprintf("[B, %d]", model.NumDense)
	}
	return fmt.Sprintf("[B, %d]", s.width)
}

// batchDim checks t's shape is [B, width] and returns B.
func (s *schema) batchDim(t *inference.ModelInferRequest_InferInputTensor, width int) (int64, error) {
	sh := t.Shape
	if len(sh) != 2 || sh[1] != int64(width) || sh[0] < 0 {
		what := ""
		if t.Name == inputSparse {
			what = fmt.Sprintf(" (the %d tables' bags of fixed hotness, concatenated in table order)", model.NumTables)
		}
		return 0, invalidArgument("input '%s' has shape %s, want %s%s", t.Name, formatShape(sh), s.shapeWant(t.Name), what)
	}
	return sh[0], nil
}

func formatShape(sh []int64) string {
	var b strings.Builder
	b.WriteByte('[')
	for i, d := range sh {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprint(&b, d)
	}
	b.WriteByte(']')
	return b.String()
}

// data finds t's count elements of size bytes each: in raw[idx] when the
// request sent raw contents, else in the one typed field that matches t's
// datatype.
func (s *schema) data(t *inference.ModelInferRequest_InferInputTensor, raw [][]byte, idx, count, size int, out *tensorData) error {
	if len(raw) > 0 {
		if t.Contents != nil {
			return invalidArgument("input '%s' sets contents as well as raw_input_contents; use one or the other for all inputs", t.Name)
		}
		if got, want := len(raw[idx]), count*size; got != want {
			return invalidArgument("input '%s': raw_input_contents[%d] holds %d bytes, want %d (%d %s elements)", t.Name, idx, got, want, count, t.Datatype)
		}
		out.raw = raw[idx]
		return nil
	}
	c := t.Contents
	if c == nil {
		return invalidArgument("input '%s' carries no data; set contents or raw_input_contents", t.Name)
	}
	var field string
	var got int
	switch t.Datatype {
	case typeFP32:
		field, got, out.f32 = "fp32_contents", len(c.Fp32Contents), c.Fp32Contents
	case typeINT32:
		field, got, out.i32 = "int_contents", len(c.IntContents), c.IntContents
	case typeINT64:
		field, got, out.i64 = "int64_contents", len(c.Int64Contents), c.Int64Contents
	}
	if other := otherContents(c, field); other != "" {
		return invalidArgument("input '%s' is %s but sets contents.%s; use contents.%s", t.Name, t.Datatype, other, field)
	}
	if got != count {
		return invalidArgument("input '%s': contents.%s holds %d values, want %d", t.Name, field, got, count)
	}
	return nil
}

// otherContents names a typed field of c, other than want, that holds data.
func otherContents(c *inference.InferTensorContents, want string) string {
	fields := [...]struct {
		name string
		n    int
	}{
		{"bool_contents", len(c.BoolContents)},
		{"int_contents", len(c.IntContents)},
		{"int64_contents", len(c.Int64Contents)},
		{"uint_contents", len(c.UintContents)},
		{"uint64_contents", len(c.Uint64Contents)},
		{"fp32_contents", len(c.Fp32Contents)},
		{"fp64_contents", len(c.Fp64Contents)},
		{"bytes_contents", len(c.BytesContents)},
	}
	for _, f := range fields {
		if f.n > 0 && f.name != want {
			return f.name
		}
	}
	return ""
}

// expMask selects the exponent bits of a float32: all ones means NaN or ±Inf.
const expMask = 0x7f800000

// viewLE returns b's little-endian elements as a []T sharing b's memory,
// when the host is little-endian and b is aligned for T (protobuf-go copies
// every bytes field into a fresh, aligned allocation, so in practice it
// is); otherwise ok is false and the caller decodes byte by byte. It lets
// the raw path run the same loops as the typed one.
func viewLE[T int32 | int64 | uint32](b []byte) (v []T, ok bool) {
	var zero T
	size, align := int(unsafe.Sizeof(zero)), uintptr(unsafe.Alignof(zero))
	p := unsafe.SliceData(b)
	if !hostLittleEndian || len(b) == 0 || uintptr(unsafe.Pointer(p))%align != 0 {
		return nil, false
	}
	return unsafe.Slice((*T)(unsafe.Pointer(p)), len(b)/size), true
}

// checkDense rejects NaN and ±Inf: the model has no meaning for them and
// one would poison every score of the batch it lands in.
func (s *schema) checkDense(d *tensorData) error {
	if d.raw == nil {
		for i, v := range d.f32 {
			if math.Float32bits(v)&expMask == expMask {
				return nonFinite(i, v)
			}
		}
		return nil
	}
	if bits, ok := viewLE[uint32](d.raw); ok {
		for i, b := range bits {
			if b&expMask == expMask {
				return nonFinite(i, math.Float32frombits(b))
			}
		}
		return nil
	}
	for i := 0; i+4 <= len(d.raw); i += 4 {
		if b := binary.LittleEndian.Uint32(d.raw[i:]); b&expMask == expMask {
			return nonFinite(i/4, math.Float32frombits(b))
		}
	}
	return nil
}

func nonFinite(i int, v float32) error {
	return invalidArgument("input '%s': row %d, column %d is %v; dense features must be finite", inputDense, i/model.NumDense, i%model.NumDense, v)
}

// checkSparse rejects any id outside its table's vocabulary [0, vocab),
// negative ids included (they compare as huge unsigned values), before
// anything reaches the backend. INT64 ids pass only if they fit a table, so
// narrowing them to int32 afterwards is exact.
func (s *schema) checkSparse(d *tensorData, n int) error {
	switch {
	case d.i32 != nil:
		return s.checkIDs32(d.i32, n)
	case d.i64 != nil:
		return s.checkIDs64(d.i64, n)
	case !d.elem64:
		if ids, ok := viewLE[int32](d.raw); ok {
			return s.checkIDs32(ids, n)
		}
		w := s.width
		for r := range n {
			row := d.raw[r*w*4 : (r+1)*w*4]
			for c, v := range s.vocab {
				if id := binary.LittleEndian.Uint32(row[4*c:]); id >= v {
					return s.badID(r, c, int64(int32(id)))
				}
			}
		}
	default:
		if ids, ok := viewLE[int64](d.raw); ok {
			return s.checkIDs64(ids, n)
		}
		w := s.width
		for r := range n {
			row := d.raw[r*w*8 : (r+1)*w*8]
			for c, v := range s.vocab {
				if id := binary.LittleEndian.Uint64(row[8*c:]); id >= uint64(v) {
					return s.badID(r, c, int64(id))
				}
			}
		}
	}
	return nil
}

func (s *schema) checkIDs32(ids []int32, n int) error {
	w := s.width
	for r := range n {
		row := ids[r*w : (r+1)*w]
		for c, v := range s.vocab {
			if uint32(row[c]) >= v {
				return s.badID(r, c, int64(row[c]))
			}
		}
	}
	return nil
}

func (s *schema) checkIDs64(ids []int64, n int) error {
	w := s.width
	for r := range n {
		row := ids[r*w : (r+1)*w]
		for c, v := range s.vocab {
			if uint64(row[c]) >= uint64(v) {
				return s.badID(r, c, row[c])
			}
		}
	}
	return nil
}

func (s *schema) badID(row, col int, id int64) error {
	t := s.table[col]
	return invalidArgument("input '%s': row %d, column %d (table %d): id %d is outside the table's vocabulary [0, %d)", inputSparse, row, col, t, id, s.vocab[col])
}

// copyDense writes the validated dense input into dst (len n×13).
func (d *tensorData) copyDense(dst []float32) {
	if d.raw == nil {
		copy(dst, d.f32)
		return
	}
	if hostLittleEndian {
		copy(unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(dst))), 4*len(dst)), d.raw)
		return
	}
	for i := range dst {
		dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(d.raw[4*i:]))
	}
}

// copySparse writes the validated ids into dst (len n×214), narrowing INT64
// ids, which checkSparse proved fit.
func (d *tensorData) copySparse(dst []int32) {
	switch {
	case d.i32 != nil:
		copy(dst, d.i32)
	case d.i64 != nil:
		narrow(dst, d.i64)
	case !d.elem64:
		if hostLittleEndian {
			copy(unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(dst))), 4*len(dst)), d.raw)
			return
		}
		for i := range dst {
			dst[i] = int32(binary.LittleEndian.Uint32(d.raw[4*i:]))
		}
	default:
		if ids, ok := viewLE[int64](d.raw); ok {
			narrow(dst, ids)
			return
		}
		raw := d.raw[:8*len(dst)]
		for i := range dst {
			dst[i] = int32(binary.LittleEndian.Uint64(raw[8*i:]))
		}
	}
}

func narrow(dst []int32, src []int64) {
	src = src[:len(dst)]
	for i, id := range src {
		dst[i] = int32(id)
	}
}
