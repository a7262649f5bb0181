// Package model owns the contract every recmesh process agrees on: the
// DLRM-DCNv2 configuration, the names and shapes of every parameter, the
// weights bundle on disk (config.json + model.safetensors), the seeded
// exporter and a plain-Go reference forward pass used for parity.
package model

import (
	"errors"
	"fmt"
)

// The MLPerf DLRMv2 (DCNv2) architecture.
const (
	// NumDense is the number of dense float32 features per example.
	NumDense = 13
	// NumTables is the number of categorical features (embedding tables).
	NumTables = 26
	// EmbeddingDim is the width of every embedding row.
	EmbeddingDim = 128
	// NumCrossLayers is the number of low-rank DCNv2 cross layers.
	NumCrossLayers = 3
	// CrossRank is the rank of each cross layer's U·V factorisation.
	CrossRank = 512
	// DevVocabCap is the max_vocab_size of the small default bundle used by
	// `make run` and the tests.
	DevVocabCap = 1000
	// BenchVocabCap gives the 3.2 GB bundle of the headline benchmark.
	BenchVocabCap = 850000
)

// FullVocabSizes are the uncapped MLPerf DLRMv2 vocabulary sizes.
var FullVocabSizes = [NumTables]int{
	40000000, 39060, 17295, 7424, 20265, 3, 7122, 1543, 63, 40000000,
	3067956, 405282, 10, 2209, 11938, 155, 4, 976, 14, 40000000,
	40000000, 40000000, 590152, 12973, 108, 36,
}

// Hotness is the fixed multi-hot bag size of every table (214 ids per example).
var Hotness = [NumTables]int{
	3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1,
}

// BottomMLP and TopMLP are the output widths of each dense layer.
var (
	BottomMLP = []int{512, 256, 128}
	TopMLP    = []int{1024, 1024, 512, 256, 1}
)

// Config describes one model. It is written as config.json beside the
// weights, so a bundle is self-describing.
type Config struct {
	// Name is a free-form model identifier (for example "dlrm-dcnv2").
	Name string `json:"name"`
	// NumDense, EmbeddingDim, VocabSizes and Hotness describe the inputs.
	NumDense     int   `json:"num_dense"`
	EmbeddingDim int   `json:"embedding_dim"`
	VocabSizes   []int `json:"vocab_sizes"`
	Hotness      []int `json:"hotness"`
	// BottomMLP and TopMLP list each dense layer's output width.
	BottomMLP []int `json:"bottom_mlp"`
	TopMLP    []int `json:"top_mlp"`
	// CrossLayers and CrossRank shape the DCNv2 interaction.
	CrossLayers int `json:"cross_layers"`
	CrossRank   int `json:"cross_rank"`
	// MaxVocabSize is the cap applied to FullVocabSizes (0 = uncapped).
	MaxVocabSize int `json:"max_vocab_size"`
	// Seed is the exporter seed the weights were generated from (0 when the
	// bundle came from elsewhere).
	Seed uint64 `json:"seed"`
}

// DLRMv2 returns the MLPerf DLRMv2 configuration with every vocabulary
// capped at maxVocab (0 or negative means uncapped).
func DLRMv2(maxVocab int) Config {
	vocab := make([]int, NumTables)
	for i, v := range FullVocabSizes {
		if maxVocab > 0 && v > maxVocab {
			v = maxVocab
		}
		vocab[i] = v
	}
	if maxVocab < 0 {
		maxVocab = 0
	}
	return Config{
		Name:         "dlrm-dcnv2",
		NumDense:     NumDense,
		EmbeddingDim: EmbeddingDim,
		VocabSizes:   vocab,
		Hotness:      append([]int(nil), Hotness[:]...),
		BottomMLP:    append([]int(nil), BottomMLP...),
		TopMLP:       append([]int(nil), TopMLP...),
		CrossLayers:  NumCrossLayers,
		CrossRank:    CrossRank,
		MaxVocabSize: maxVocab,
	}
}

// ErrInvalidConfig is wrapped by every Validate failure.
var ErrInvalidConfig = errors.New("invalid model config")

// Validate checks that the configuration is one recmesh can serve: the
// serving paths are written for the DLRMv2 input layout, so the table count,
// hotness and widths must match it; vocabulary sizes and the seed may vary.
func (c Config) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalidConfig, fmt.Sprintf(format, args...))
	}
	if c.NumDense != NumDense {
		return bad("num_dense is %d, want %d", c.NumDense, NumDense)
	}
	if c.EmbeddingDim != EmbeddingDim {
		return bad("embedding_dim is %d, want %d", c.EmbeddingDim, EmbeddingDim)
	}
	if len(c.VocabSizes) != NumTables {
		return bad("vocab_sizes has %d tables, want %d", len(c.VocabSizes), NumTables)
	}
	if len(c.Hotness) != NumTables {
		return bad("hotness has %d tables, want %d", len(c.Hotness), NumTables)
	}
	for i, v := range c.VocabSizes {
		if v <= 0 || v > FullVocabSizes[i] {
			return bad("vocab_sizes[%d] is %d, want 1..%d", i, v, FullVocabSizes[i])
		}
		if c.Hotness[i] != Hotness[i] {
			return bad("hotness[%d] is %d, want %d", i, c.Hotness[i], Hotness[i])
		}
	}
	if !equalInts(c.BottomMLP, BottomMLP) {
		return bad("bottom_mlp is %v, want %v", c.BottomMLP, BottomMLP)
	}
	if !equalInts(c.TopMLP, TopMLP) {
		return bad("top_mlp is %v, want %v", c.TopMLP, TopMLP)
	}
	if c.CrossLayers != NumCrossLayers || c.CrossRank != CrossRank {
		return bad("cross layers %d rank %d, want %d rank %d", c.CrossLayers, c.CrossRank, NumCrossLayers, CrossRank)
	}
	return nil
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// SparseWidth is the number of ids per example: the sum of the hotness.
func (c Config) SparseWidth() int {
	n := 0
	for _, h := range c.Hotness {
		n += h
	}
	return n
}

// HotnessOffsets returns, for each table, where its bag starts within an
// example's SparseWidth ids (the bags are concatenated in table order).
func (c Config) HotnessOffsets() []int {
	off := make([]int, len(c.Hotness))
	n := 0
	for i, h := range c.Hotness {
		off[i] = n
		n += h
	}
	return off
}

// InteractionDim is the width of the cross-layer input: the bottom MLP
// output concatenated with the pooled vector of every table.
func (c Config) InteractionDim() int {
	return (len(c.VocabSizes) + 1) * c.EmbeddingDim
}

// TotalRows is the number of embedding rows over all tables.
func (c Config) TotalRows() int64 {
	var n int64
	for _, v := range c.VocabSizes {
		n += int64(v)
	}
	return n
}

// TableBytes is the size of all embedding tables in float32.
func (c Config) TableBytes() int64 {
	return c.TotalRows() * int64(c.EmbeddingDim) * 4
}

// ParamSpec names one tensor of the bundle and its shape.
type ParamSpec struct {
	Name  string
	Shape []int
}

// Elements is the number of float32 values in the tensor.
func (p ParamSpec) Elements() int64 {
	n := int64(1)
	for _, d := range p.Shape {
		n *= int64(d)
	}
	return n
}

// TableName is the tensor name of embedding table i ([vocab_i, dim]).
func TableName(i int) string { return fmt.Sprintf("embedding.%d.weight", i) }

// Tables lists the embedding tables in table order.
func (c Config) Tables() []ParamSpec {
	specs := make([]ParamSpec, len(c.VocabSizes))
	for i, v := range c.VocabSizes {
		specs[i] = ParamSpec{Name: TableName(i), Shape: []int{v, c.EmbeddingDim}}
	}
	return specs
}

// DenseParams lists every dense parameter in execution order. Every bottom
// layer is followed by ReLU; every top layer but the last is followed by
// ReLU, and the last (width 1) by a sigmoid, which gives the score. Weight
// matrices are stored [in, out] (the JAX/Flax "kernel" convention), so a
// layer computes x·W + b on row vectors. A cross layer l stores V_l
// ([D, rank]), U_l ([rank, D]) and b_l ([D]) and computes
// x_{l+1} = x0 ⊙ ((x_l·V_l)·U_l + b_l) + x_l.
func (c Config) DenseParams() []ParamSpec {
	var specs []ParamSpec
	in := c.NumDense
	for l, out := range c.BottomMLP {
		specs = append(specs,
			ParamSpec{Name: fmt.Sprintf("bottom_mlp.%d.kernel", l), Shape: []int{in, out}},
			ParamSpec{Name: fmt.Sprintf("bottom_mlp.%d.bias", l), Shape: []int{out}})
		in = out
	}
	d := c.InteractionDim()
	for l := 0; l < c.CrossLayers; l++ {
		specs = append(specs,
			ParamSpec{Name: fmt.Sprintf("cross.%d.v", l), Shape: []int{d, c.CrossRank}},
			ParamSpec{Name: fmt.Sprintf("cross.%d.u", l), Shape: []int{c.CrossRank, d}},
			ParamSpec{Name: fmt.Sprintf("cross.%d.bias", l), Shape: []int{d}})
	}
	in = d
	for l, out := range c.TopMLP {
		specs = append(specs,
			ParamSpec{Name: fmt.Sprintf("top_mlp.%d.kernel", l), Shape: []int{in, out}},
			ParamSpec{Name: fmt.Sprintf("top_mlp.%d.bias", l), Shape: []int{out}})
		in = out
	}
	return specs
}
