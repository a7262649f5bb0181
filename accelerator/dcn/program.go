// Package dcn builds the DLRM-DCNv2 dense network as a StableHLO program,
// one program per batch bucket. It owns the argument order shared with the
// executor and nothing else: compiling and running belong to package
// executor.
package dcn

import (
	"fmt"
	"strings"

	"github.com/gomlx/gopjrt/dtypes"
	"github.com/gomlx/stablehlo"
	"github.com/gomlx/stablehlo/types"
	"github.com/gomlx/stablehlo/types/shapes"

	"github.com/recmesh/recmesh/accelerator/stripdot"
	"github.com/recmesh/recmesh/model"
)

// Program argument order: the two per-batch inputs first, then the dense
// parameters in Params order (uploaded once, reused by every call).
const (
	ArgDense  = 0 // [B, NumDense] f32
	ArgPooled = 1 // [B, tables, dim] f32
	ArgParams = 2 // first dense parameter
)

// Options tune how the program is built.
type Options struct {
	// Precision of every dot product. The default, "highest", keeps GPU
	// plugins from falling back to TF32, which would break the 1e-4 parity
	// with the float64 reference; the CPU plugin computes f32 either way.
	Precision types.DotGeneralPrecisionType
	// SplitFirstProduct computes the first product of the interaction
	// vector x0 = concat(bottom MLP output, pooled vectors), x0·W (the first
	// cross layer's V, or the top MLP's first kernel when there is no cross
	// layer), as bottom·W[:d] + pooled·W[d:], with W uploaded as those two
	// row blocks: the product then reads the pooled input where it lies
	// instead of a concatenated copy that XLA otherwise builds for it. When
	// false the program is the plain transcription of the model.
	//
	// It applies only to networks without cross layers. A cross layer needs
	// x0 whole for x0 ⊙ (…), so the concatenation stays, and two smaller
	// products cost more than one: on one Xeon core the split program ran
	// the MLPerf network 10–40 % slower at buckets 8 to 32, while without
	// cross layers it ran 2–3× faster from bucket 16 up.
	SplitFirstProduct bool
	// PackedWeights adds, after the weights Params lists otherwise, a twin
	// of every matrix whose columns come in whole 32-column strips, packed
	// for package stripdot (named name+Strips). Every bucket's program
	// takes the same arguments, so the twins are arguments of all of them;
	// only programs built with StripDot read them.
	PackedWeights bool
	// StripDot computes each product with a packed twin as the custom call
	// stripdot.Target instead of a dot_general: the same product, by a
	// kernel that streams each weight once. It needs PackedWeights and a
	// plugin with the handler registered (stripdot.Register).
	StripDot bool
	// PackedElement is the element type of the packed twins: Float32, or
	// the half type a bundle stores its dense weights in (model.DenseDtype),
	// so that the strip kernel streams the stored halves, half the bytes a
	// small-batch call reads, and widens them in registers. Every other
	// argument is float32 either way: the bundle's halves widened once, at
	// load, which are exactly the values the halves stand for.
	PackedElement stripdot.Element
}

// ElementOf is the element type a bundle stored at dense precision d packs
// its strips in (Options.PackedElement): its own halves, so that the
// kernel streams half the bytes.
func ElementOf(d model.DenseDtype) stripdot.Element {
	switch d {
	case model.DenseFP16:
		return stripdot.Float16
	case model.DenseBF16:
		return stripdot.BFloat16
	}
	return stripdot.Float32
}

// splits reports whether the program splits the first product of cfg.
func (o Options) splits(cfg model.Config) bool { return o.SplitFirstProduct && cfg.CrossLayers == 0 }

// DefaultOptions are the options used when serving.
func DefaultOptions() Options {
	return Options{Precision: types.DotGeneralPrecisionHighest, SplitFirstProduct: true}
}

// PlainOptions are the plain transcription of model/reference.go's math,
// the yardstick of DefaultOptions in tests.
func PlainOptions() Options {
	return Options{Precision: types.DotGeneralPrecisionHighest}
}

// Param is one weight argument of the program: rows [RowFrom, RowTo) of
// the bundle's dense tensor Tensor, row-major, shaped Shape; or, when
// Packed, those rows packed as stripdot strips (Shape is the packed shape)
// of element type Element.
type Param struct {
	Name           string
	Tensor         string
	RowFrom, RowTo int
	Shape          []int
	Packed         bool
	// Element is Float32 except for the packed twins of a program built
	// with a half Options.PackedElement.
	Element stripdot.Element
}

// Strips is the name suffix of a weight's packed twin.
const Strips = ".strips"

// Elements is the number of values of the argument.
func (p Param) Elements() int {
	n := 1
	for _, d := range p.Shape {
		n *= d
	}
	return n
}

// Bytes is the size of the argument's values.
func (p Param) Bytes() int {
	if p.Element == stripdot.Float32 {
		return 4 * p.Elements()
	}
	return 2 * p.Elements()
}

// DType is the argument's element type in the program.
func (p Param) DType() dtypes.DType { return dtypeOf(p.Element) }

func dtypeOf(e stripdot.Element) dtypes.DType {
	switch e {
	case stripdot.Float16:
		return dtypes.Float16
	case stripdot.BFloat16:
		return dtypes.BFloat16
	}
	return f32
}

// Slice returns the argument's values out of the whole tensor t, row-major
// in the bundle's shape.
func (p Param) Slice(t []float32) ([]float32, error) { return sliceRows(p, t) }

// sliceRows is Slice for tensors of any element type.
func sliceRows[T any](p Param, t []T) ([]T, error) {
	rows := p.RowTo - p.RowFrom
	if rows <= 0 || p.RowFrom < 0 || p.Elements()%rows != 0 {
		return nil, fmt.Errorf("dcn: parameter %s: bad row range [%d,%d) for shape %v", p.Name, p.RowFrom, p.RowTo, p.Shape)
	}
	cols := p.Elements() / rows
	from, to := p.RowFrom*cols, p.RowTo*cols
	if to > len(t) {
		return nil, fmt.Errorf("dcn: parameter %s: rows [%d,%d) of %d columns exceed tensor %s's %d values",
			p.Name, p.RowFrom, p.RowTo, cols, p.Tensor, len(t))
	}
	return t[from:to], nil
}

// plain returns a packed parameter's unpacked rows, as a [rows, cols]
// parameter.
func (p Param) plain() (Param, error) {
	if len(p.Shape) != 3 {
		return Param{}, fmt.Errorf("dcn: parameter %s: packed shape %v, want [strips, rows, %d]", p.Name, p.Shape, stripdot.Width)
	}
	rows, cols := p.Shape[1], p.Shape[0]*p.Shape[2]
	return Param{Name: p.Name, Tensor: p.Tensor, RowFrom: p.RowFrom, RowTo: p.RowTo, Shape: []int{rows, cols}}, nil
}

// Values returns a float32 argument's values out of the whole tensor t:
// the rows of Slice, packed into a new slice when the parameter is Packed.
func (p Param) Values(t []float32) ([]float32, error) {
	if p.Element != stripdot.Float32 {
		return nil, fmt.Errorf("dcn: parameter %s is %s: its values come from the stored halves (HalfValues)", p.Name, p.Element)
	}
	if !p.Packed {
		return p.Slice(t)
	}
	plain, err := p.plain()
	if err != nil {
		return nil, err
	}
	src, err := plain.Slice(t)
	if err != nil {
		return nil, err
	}
	out := make([]float32, len(src))
	if err := stripdot.Pack(out, src, plain.Shape[0], plain.Shape[1]); err != nil {
		return nil, fmt.Errorf("dcn: parameter %s: %w", p.Name, err)
	}
	return out, nil
}

// HalfValues returns a half packed twin's values (Element Float16 or
// BFloat16) out of the whole tensor's stored halves, bits (what
// model.Bundle.ParamBits returns), packed into a new slice.
func (p Param) HalfValues(bits []uint16) ([]uint16, error) {
	if !p.Packed || p.Element == stripdot.Float32 {
		return nil, fmt.Errorf("dcn: parameter %s is not a half packed twin", p.Name)
	}
	plain, err := p.plain()
	if err != nil {
		return nil, err
	}
	src, err := sliceRows(plain, bits)
	if err != nil {
		return nil, err
	}
	out := make([]uint16, len(src))
	if err := stripdot.Pack16(out, src, plain.Shape[0], plain.Shape[1]); err != nil {
		return nil, fmt.Errorf("dcn: parameter %s: %w", p.Name, err)
	}
	return out, nil
}

// Suffixes of the two row blocks of a split first-product weight.
const (
	SplitBottom = ".bottom"
	SplitPooled = ".pooled"
)

// firstProduct is the name of the weight that multiplies x0 first.
func firstProduct(cfg model.Config) string {
	if cfg.CrossLayers > 0 {
		return "cross.0.v"
	}
	return "top_mlp.0.kernel"
}

// Params lists the program's weight arguments in order: every tensor of
// cfg.DenseParams(), except that with SplitFirstProduct (on a network
// without cross layers) the first weight applied to x0 becomes its
// bottom-MLP rows and its pooled rows.
func Params(cfg model.Config, opts Options) []Param {
	var out []Param
	split := ""
	if opts.splits(cfg) {
		split = firstProduct(cfg)
	}
	bottom := cfg.EmbeddingDim // the bottom MLP's output width
	if n := len(cfg.BottomMLP); n > 0 {
		bottom = cfg.BottomMLP[n-1]
	}
	for _, s := range cfg.DenseParams() {
		rows := s.Shape[0]
		if s.Name == split {
			cols := s.Shape[1]
			out = append(out,
				Param{Name: s.Name + SplitBottom, Tensor: s.Name, RowFrom: 0, RowTo: bottom, Shape: []int{bottom, cols}},
				Param{Name: s.Name + SplitPooled, Tensor: s.Name, RowFrom: bottom, RowTo: rows, Shape: []int{rows - bottom, cols}})
			continue
		}
		out = append(out, Param{Name: s.Name, Tensor: s.Name, RowFrom: 0, RowTo: rows, Shape: s.Shape})
	}
	if opts.PackedWeights {
		for _, p := range out {
			if len(p.Shape) == 2 && stripdot.Eligible(p.Shape[0], p.Shape[1]) {
				twin := p
				twin.Name, twin.Packed, twin.Element = p.Name+Strips, true, opts.PackedElement
				twin.Shape = stripdot.PackedShape(p.Shape[0], p.Shape[1])
				out = append(out, twin)
			}
		}
	}
	return out
}

// WeightBytes is the size of the weights one call of the program built
// with opts reads, each weight counted once: with StripDot the packed
// twins in place of the matrices they stand for. At the batch sizes the
// strip kernel serves, a call's time is mostly the time to stream these
// bytes, so calls/s times WeightBytes is the stream's bandwidth.
func WeightBytes(cfg model.Config, opts Options) int64 {
	list := Params(cfg, opts)
	twinned := make(map[string]bool)
	for _, p := range list {
		if p.Packed {
			twinned[strings.TrimSuffix(p.Name, Strips)] = true
		}
	}
	var n int64
	for _, p := range list {
		if p.Packed == opts.StripDot || (!p.Packed && !twinned[p.Name]) {
			n += int64(p.Bytes())
		}
	}
	return n
}

// Build returns the StableHLO text of the DCNv2 forward pass for a batch of
// exactly bucket examples: inputs dense [B,13] and pooled [B,26,128], output
// score [B] (after the sigmoid).
func Build(cfg model.Config, bucket int, opts Options) ([]byte, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("dcn: %w", err)
	}
	if bucket <= 0 {
		return nil, fmt.Errorf("dcn: bucket %d must be positive", bucket)
	}
	b := &builder{opts: opts}
	prog, err := b.build(cfg, bucket)
	if err != nil {
		return nil, fmt.Errorf("dcn: build bucket %d: %w", bucket, err)
	}
	return prog, nil
}

// builder threads the first error through the chain of ops so the forward
// pass reads like the math rather than like error handling.
type builder struct {
	opts Options
	fn   *stablehlo.Function
	err  error
	// strips maps a weight to its packed twin, for StripDot.
	strips map[*stablehlo.Value]*stablehlo.Value
}

func (b *builder) keep(v *stablehlo.Value, err error) *stablehlo.Value {
	if b.err == nil && err != nil {
		b.err = err
	}
	return v
}

func (b *builder) build(cfg model.Config, bucket int) ([]byte, error) {
	hlo := stablehlo.New(fmt.Sprintf("dcnv2_b%d", bucket))
	b.fn = hlo.Main()
	tables := len(cfg.VocabSizes)
	dense := b.keep(b.fn.NamedInput("dense", shapes.Make(f32, bucket, cfg.NumDense)))
	pooled := b.keep(b.fn.NamedInput("pooled", shapes.Make(f32, bucket, tables, cfg.EmbeddingDim)))
	params := make(map[string]*stablehlo.Value)
	list := Params(cfg, b.opts)
	for _, p := range list {
		params[p.Name] = b.keep(b.fn.NamedInput(stablehlo.NormalizeIdentifier(p.Name), shapes.Make(p.DType(), p.Shape...)))
	}
	if b.err != nil {
		return nil, b.err
	}
	if b.opts.StripDot {
		if !b.opts.PackedWeights {
			return nil, fmt.Errorf("StripDot needs PackedWeights")
		}
		b.strips = make(map[*stablehlo.Value]*stablehlo.Value)
		for _, p := range list {
			if p.Packed {
				b.strips[params[strings.TrimSuffix(p.Name, Strips)]] = params[p.Name]
			}
		}
	}

	x := dense
	for l := range cfg.BottomMLP {
		x = b.relu(b.linear(x, params[fmt.Sprintf("bottom_mlp.%d.kernel", l)], params[fmt.Sprintf("bottom_mlp.%d.bias", l)]))
	}
	bottom := x
	flat := b.keep(stablehlo.Reshape(pooled, shapes.Make(f32, bucket, tables*cfg.EmbeddingDim)))
	// x0 = concat(bottom, flat) is materialised only where it is needed
	// whole: by the cross layers' x0 ⊙ (…), or by the plain program.
	var x0 *stablehlo.Value
	split := b.opts.splits(cfg)
	if !split {
		x0 = b.keep(stablehlo.Concatenate(1, bottom, flat))
	}
	// x0Times is x0·W for the weight called name, the first product of x0.
	x0Times := func(name string) *stablehlo.Value {
		if b.err != nil {
			return nil
		}
		if !split {
			return b.dot(x0, params[name])
		}
		return b.keep(stablehlo.Add(b.dot(bottom, params[name+SplitBottom]), b.dot(flat, params[name+SplitPooled])))
	}
	xl := x0
	for l := 0; l < cfg.CrossLayers; l++ {
		var low *stablehlo.Value
		if name := fmt.Sprintf("cross.%d.v", l); l == 0 {
			low = x0Times(name)
		} else {
			low = b.dot(xl, params[name])
		}
		up := b.linear(low, params[fmt.Sprintf("cross.%d.u", l)], params[fmt.Sprintf("cross.%d.bias", l)])
		if b.err != nil {
			return nil, b.err
		}
		xl = b.keep(stablehlo.Add(b.keep(stablehlo.Multiply(x0, up)), xl))
	}
	x = xl
	last := len(cfg.TopMLP) - 1
	for l := range cfg.TopMLP {
		kernel, bias := fmt.Sprintf("top_mlp.%d.kernel", l), params[fmt.Sprintf("top_mlp.%d.bias", l)]
		if l == 0 && cfg.CrossLayers == 0 {
			x = b.addBias(x0Times(kernel), bias)
		} else {
			x = b.linear(x, params[kernel], bias)
		}
		if l < last {
			x = b.relu(x)
		}
	}
	score := b.keep(stablehlo.Logistic(x))
	score = b.keep(stablehlo.Reshape(score, shapes.Make(f32, bucket)))
	if b.err != nil {
		return nil, b.err
	}
	if err := b.fn.Return(score); err != nil {
		return nil, err
	}
	return hlo.Build()
}

func (b *builder) dot(x, w *stablehlo.Value) *stablehlo.Value {
	if b.err != nil {
		return nil
	}
	if packed := b.strips[w]; packed != nil {
		return b.stripDot(x, packed, w.Shape().Dimensions[1])
	}
	return b.keep(stablehlo.DotGeneral(x, []int{1}, nil, w, []int{0}, nil).
		Precision(b.opts.Precision, b.opts.Precision).Done())
}

// stripDot computes x·W as the custom call stripdot.Target on W's packed
// twin. The custom call stands in for dot_general(x, packed) contracting
// k, which computes the same [m, strips, 32] values: the builder emits that
// dot_general for its shape inference and then turns the statement into
// the custom call (the stablehlo package has no custom-call builder).
// Half strips are a type dot_general refuses beside float32 x, so a
// convert of them to float32 stands in for them during the shape
// inference and is then taken out again: the custom call reads the halves.
func (b *builder) stripDot(x, packed *stablehlo.Value, n int) *stablehlo.Value {
	operand := packed
	half := packed.Shape().DType != f32
	if half {
		operand = b.keep(stablehlo.Convert(packed, f32))
	}
	y := b.keep(stablehlo.DotGeneral(x, []int{1}, nil, operand, []int{1}, nil).Done())
	if b.err != nil {
		return nil
	}
	last := len(b.fn.Statements) - 1
	stmt := b.fn.Statements[last]
	if len(stmt.Outputs) != 1 || stmt.Outputs[0] != y {
		b.err = fmt.Errorf("strip dot: the dot_general is not the last statement")
		return nil
	}
	if half {
		conv := b.fn.Statements[last-1]
		if len(conv.Outputs) != 1 || conv.Outputs[0] != operand {
			b.err = fmt.Errorf("strip dot: the stand-in convert does not precede the dot_general")
			return nil
		}
		stmt.Inputs[1] = packed
		b.fn.Statements = append(b.fn.Statements[:last-1], stmt)
	}
	op := stmt.OpType
	for op = 0; op.String() != "CustomCall"; op++ {
		if op > 1000 {
			b.err = fmt.Errorf("strip dot: the stablehlo package has no CustomCall op")
			return nil
		}
	}
	stmt.OpType = op
	stmt.Attributes = map[string]any{"call_target_name": stripdot.Target, "api_version": int32(4)}
	return b.keep(stablehlo.Reshape(y, shapes.Make(f32, x.Shape().Dimensions[0], n)))
}

// linear computes x·W + b with b broadcast over the batch.
func (b *builder) linear(x, w, bias *stablehlo.Value) *stablehlo.Value {
	return b.addBias(b.dot(x, w), bias)
}

// addBias adds b, broadcast over the batch, to y.
func (b *builder) addBias(y, bias *stablehlo.Value) *stablehlo.Value {
	if b.err != nil {
		return nil
	}
	bb := b.keep(stablehlo.BroadcastInDim(bias, y.Shape(), []int{1}))
	return b.keep(stablehlo.Add(y, bb))
}

func (b *builder) relu(x *stablehlo.Value) *stablehlo.Value {
	if b.err != nil {
		return nil
	}
	zero := b.keep(b.fn.ConstantFromScalar(float32(0)))
	zb := b.keep(stablehlo.BroadcastInDim(zero, x.Shape(), nil))
	return b.keep(stablehlo.Maximum(x, zb))
}

// f32 is the dtype of every tensor of the program but half strips.
const f32 = dtypes.Float32
