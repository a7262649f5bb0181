// Package dcn builds the DLRM-DCNv2 dense network as a StableHLO program,
// one program per batch bucket. It owns the argument order shared with the
// executor and nothing else: compiling and running belong to package
// executor.
package dcn

import (
	"fmt"

	"github.com/gomlx/gopjrt/dtypes"
	"github.com/gomlx/stablehlo"
	"github.com/gomlx/stablehlo/types"
	"github.com/gomlx/stablehlo/types/shapes"

	"github.com/recmesh/recmesh/model"
)

// Program argument order: the two per-batch inputs first, then every dense
// parameter in cfg.DenseParams() order (uploaded once, reused by every call).
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
}

// DefaultOptions are the options used when serving.
func DefaultOptions() Options {
	return Options{Precision: types.DotGeneralPrecisionHighest}
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
	f32 := dtypes.Float32
	tables := len(cfg.VocabSizes)
	dense := b.keep(b.fn.NamedInput("dense", shapes.Make(f32, bucket, cfg.NumDense)))
	pooled := b.keep(b.fn.NamedInput("pooled", shapes.Make(f32, bucket, tables, cfg.EmbeddingDim)))
	params := make(map[string]*stablehlo.Value)
	for _, p := range cfg.DenseParams() {
		params[p.Name] = b.keep(b.fn.NamedInput(stablehlo.NormalizeIdentifier(p.Name), shapes.Make(f32, p.Shape...)))
	}
	if b.err != nil {
		return nil, b.err
	}

	x := dense
	for l := range cfg.BottomMLP {
		x = b.relu(b.linear(x, params[fmt.Sprintf("bottom_mlp.%d.kernel", l)], params[fmt.Sprintf("bottom_mlp.%d.bias", l)]))
	}
	flat := b.keep(stablehlo.Reshape(pooled, shapes.Make(f32, bucket, tables*cfg.EmbeddingDim)))
	x0 := b.keep(stablehlo.Concatenate(1, x, flat))
	xl := x0
	for l := 0; l < cfg.CrossLayers; l++ {
		low := b.dot(xl, params[fmt.Sprintf("cross.%d.v", l)])
		up := b.linear(low, params[fmt.Sprintf("cross.%d.u", l)], params[fmt.Sprintf("cross.%d.bias", l)])
		xl = b.keep(stablehlo.Add(b.keep(stablehlo.Multiply(x0, up)), xl))
	}
	x = xl
	last := len(cfg.TopMLP) - 1
	for l := range cfg.TopMLP {
		x = b.linear(x, params[fmt.Sprintf("top_mlp.%d.kernel", l)], params[fmt.Sprintf("top_mlp.%d.bias", l)])
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
	return b.keep(stablehlo.DotGeneral(x, []int{1}, nil, w, []int{0}, nil).
		Precision(b.opts.Precision, b.opts.Precision).Done())
}

// linear computes x·W + b with b broadcast over the batch.
func (b *builder) linear(x, w, bias *stablehlo.Value) *stablehlo.Value {
	y := b.dot(x, w)
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
