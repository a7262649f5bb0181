// Package model owns the contract every recmesh process agrees on: the
// DLRM-DCNv2 configuration, the names and shapes of every parameter, the
// weights bundle on disk (config.json + model.safetensors), the seeded
// exporter and a plain-Go reference forward pass used for parity.
package model

import (
	"errors"
	"fmt"
	"time"
)

// The input layout every recmesh process is written for: the MLPerf DLRMv2
// (DCNv2) tables, hotness and feature widths. The dense network behind it
// (bottom_mlp, top_mlp, cross_layers, cross_rank) is read from each
// bundle's config.json; NumCrossLayers, CrossRank, BottomMLP and TopMLP
// below are the MLPerf values, the "mlperf" preset.
const (
	// NumDense is the number of dense float32 features per example.
	NumDense = 13
	// NumTables is the number of categorical features (embedding tables).
	NumTables = 26
	// EmbeddingDim is the width of every embedding row.
	EmbeddingDim = 128
	// NumCrossLayers is the number of low-rank DCNv2 cross layers of the
	// MLPerf model.
	NumCrossLayers = 3
	// CrossRank is the rank of each cross layer's U·V factorisation in the
	// MLPerf model.
	CrossRank = 512
	// DevVocabCap is the max_vocab_size of the small default bundle used by
	// `make run` and the tests.
	DevVocabCap = 1000
	// BenchVocabCap gives the 3.2 GB bundle of the headline benchmark.
	BenchVocabCap = 850000
	// MaxBatchLimit bounds every process's --max-batch: the largest request
	// then stays far below gRPC's 2 GiB message limit, and the largest
	// batch bucket within what a staging buffer is sized for.
	MaxBatchLimit = 1 << 16
	// DefaultMaxBatch is every process's default --max-batch: the most
	// examples one request or batch carries, the largest batch bucket.
	DefaultMaxBatch = 4096
	// DefaultDevBundle is where `make run` exports the DevVocabCap bundle,
	// and every command's default --bundle.
	DefaultDevBundle = "data/dlrm-cap1000"
)

// DefaultLatencyTarget is the mesh's end-to-end budget per call: SLO
// batching sizes batches and sheds load for it, frontends count misses of
// it (MLPerf's server scenario for DLRMv2 allows 60 ms at p99; the
// published benchmark this mesh is measured against used 20 ms).
const DefaultLatencyTarget = 20 * time.Millisecond

// Bounds Validate puts on the dense network, so a mistyped config.json is
// refused rather than allocating gigabytes.
const (
	// MaxLayerWidth bounds every MLP width and the cross rank.
	MaxLayerWidth = 65536
	// MaxMLPLayers bounds the number of layers of each MLP.
	MaxMLPLayers = 64
	// MaxCrossLayers bounds cross_layers.
	MaxCrossLayers = 64
	// MaxDenseParams bounds the number of values of all dense parameters
	// together (4 GiB in float32); the MLPerf network has about 16 million.
	MaxDenseParams = 1 << 30
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

// BottomMLP and TopMLP are the output widths of each dense layer of the
// MLPerf model.
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
	// TableDtype is the precision the embedding tables are stored in (see
	// Dtype for the row layouts). A config.json without it was written
	// before bundles had precisions and holds fp32 tables.
	TableDtype Dtype `json:"table_dtype"`
	// DenseDtype is the precision every dense parameter is stored in:
	// fp32, or fp16 or bf16, whose values are those halves widened
	// exactly to float32 (see DenseDtype). A config.json without it was
	// written before the dense network had a precision and holds fp32.
	DenseDtype DenseDtype `json:"dense_dtype"`
	// UpdatesSeq is the last sequence of the row-update stream (see
	// proto/updates) whose rows the tables already hold: a snapshot's, so
	// an embedder serving it replays only what came after. 0 for an
	// export.
	UpdatesSeq uint64 `json:"updates_seq,omitempty"`
}

// DLRMv2 returns the MLPerf DLRMv2 configuration (the "mlperf" preset) with
// every vocabulary capped at maxVocab (0 or negative means uncapped).
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
		TableDtype:   DtypeFP32,
		DenseDtype:   DenseFP32,
	}
}

// ErrInvalidConfig is wrapped by every Validate failure.
var ErrInvalidConfig = errors.New("invalid model config")

// A FieldError is a Validate failure: the config.json field at fault and
// what is wrong with it. It wraps ErrInvalidConfig.
type FieldError struct {
	// Field is the JSON name of the field ("bottom_mlp", "cross_rank", …);
	// FieldDense when the dense network is too big as a whole.
	Field string
	// Msg says what is wrong, naming the field.
	Msg string
}

// FieldDense is the FieldError.Field of a dense network whose widths are
// each acceptable but which has too many parameters in all.
const FieldDense = "dense network"

func (e *FieldError) Error() string { return ErrInvalidConfig.Error() + ": " + e.Msg }

// Unwrap makes errors.Is(err, ErrInvalidConfig) hold.
func (e *FieldError) Unwrap() error { return ErrInvalidConfig }

// Validate checks that the configuration is one recmesh can serve. The
// serving paths are written for the DLRMv2 input layout, so num_dense,
// embedding_dim, the table count and the hotness must match it; vocabulary
// sizes may be capped. The dense network may take any consistent shape:
//
//   - bottom_mlp: 1..MaxMLPLayers widths, each 1..MaxLayerWidth, the last
//     equal to embedding_dim (its output is concatenated with the pooled
//     embeddings);
//   - top_mlp: 1..MaxMLPLayers widths, each 1..MaxLayerWidth, the last 1
//     (the logit);
//   - cross_layers: 0..MaxCrossLayers (0 feeds x0 straight to the top MLP);
//   - cross_rank: 1..MaxLayerWidth when cross_layers > 0; with no cross
//     layers it is unused and may be 0..MaxLayerWidth;
//   - all dense parameters together at most MaxDenseParams values;
//   - table_dtype: one of Dtypes (empty reads as fp32);
//   - dense_dtype: one of DenseDtypes (empty reads as fp32).
//
// Every refusal is a *FieldError, wraps ErrInvalidConfig and names the
// config.json field.
func (c Config) Validate() error {
	bad := func(field, format string, args ...any) error {
		return &FieldError{Field: field, Msg: fmt.Sprintf(format, args...)}
	}
	if c.NumDense != NumDense {
		return bad("num_dense", "num_dense is %d, want %d", c.NumDense, NumDense)
	}
	if c.EmbeddingDim != EmbeddingDim {
		return bad("embedding_dim", "embedding_dim is %d, want %d", c.EmbeddingDim, EmbeddingDim)
	}
	if len(c.VocabSizes) != NumTables {
		return bad("vocab_sizes", "vocab_sizes has %d tables, want %d", len(c.VocabSizes), NumTables)
	}
	if len(c.Hotness) != NumTables {
		return bad("hotness", "hotness has %d tables, want %d", len(c.Hotness), NumTables)
	}
	for i, v := range c.VocabSizes {
		if v <= 0 || v > FullVocabSizes[i] {
			return bad("vocab_sizes", "vocab_sizes[%d] is %d, want 1..%d", i, v, FullVocabSizes[i])
		}
		if c.Hotness[i] != Hotness[i] {
			return bad("hotness", "hotness[%d] is %d, want %d", i, c.Hotness[i], Hotness[i])
		}
	}
	if err := checkMLP("bottom_mlp", c.BottomMLP, c.EmbeddingDim, "embedding_dim"); err != nil {
		return err
	}
	if err := checkMLP("top_mlp", c.TopMLP, 1, "the single logit"); err != nil {
		return err
	}
	if c.CrossLayers < 0 || c.CrossLayers > MaxCrossLayers {
		return bad("cross_layers", "cross_layers is %d, want 0..%d", c.CrossLayers, MaxCrossLayers)
	}
	switch {
	case c.CrossLayers > 0 && (c.CrossRank < 1 || c.CrossRank > MaxLayerWidth):
		return bad("cross_rank", "cross_rank is %d, want 1..%d with %d cross layers", c.CrossRank, MaxLayerWidth, c.CrossLayers)
	case c.CrossLayers == 0 && (c.CrossRank < 0 || c.CrossRank > MaxLayerWidth):
		return bad("cross_rank", "cross_rank is %d, want 0..%d (unused: cross_layers is 0)", c.CrossRank, MaxLayerWidth)
	}
	if n := c.DenseParamCount(); n > MaxDenseParams {
		return bad(FieldDense, "bottom_mlp, cross_layers, cross_rank and top_mlp give %d dense parameters, want at most %d", n, MaxDenseParams)
	}
	if !c.TableDtype.known() {
		return bad("table_dtype", "table_dtype is %q, want one of %s", string(c.TableDtype), dtypeList())
	}
	if !c.DenseDtype.known() {
		return bad("dense_dtype", "dense_dtype is %q, want one of %s", string(c.DenseDtype), denseDtypeList())
	}
	return nil
}

// checkMLP validates one MLP's widths: 1..MaxMLPLayers layers, each width
// 1..MaxLayerWidth, the last equal to last (described by lastWhat).
func checkMLP(field string, widths []int, last int, lastWhat string) error {
	if len(widths) == 0 || len(widths) > MaxMLPLayers {
		return &FieldError{field, fmt.Sprintf("%s has %d layers, want 1..%d", field, len(widths), MaxMLPLayers)}
	}
	for i, w := range widths {
		if w < 1 || w > MaxLayerWidth {
			return &FieldError{field, fmt.Sprintf("%s[%d] is %d, want 1..%d", field, i, w, MaxLayerWidth)}
		}
	}
	if n := len(widths); widths[n-1] != last {
		return &FieldError{field, fmt.Sprintf("%s ends at width %d (%s[%d]), want %d (%s)", field, widths[n-1], field, n-1, last, lastWhat)}
	}
	return nil
}

// DenseParamCount is the number of values of every dense parameter (the
// MLPs and the cross layers), computed without overflow for any config
// whose widths Validate's per-field bounds accept.
func (c Config) DenseParamCount() int64 {
	var n int64
	in := int64(c.NumDense)
	for _, out := range c.BottomMLP {
		n += in*int64(out) + int64(out)
		in = int64(out)
	}
	d := int64(c.InteractionDim())
	n += int64(max(c.CrossLayers, 0)) * (2*d*int64(max(c.CrossRank, 0)) + d)
	in = d
	for _, out := range c.TopMLP {
		n += in*int64(out) + int64(out)
		in = int64(out)
	}
	return n
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

// TableBytes is the size of all embedding tables stored at TableDtype.
func (c Config) TableBytes() int64 {
	return c.TotalRows() * int64(c.TableDtype.RowBytes(c.EmbeddingDim))
}

// DenseBytes is the size of all dense parameters stored at DenseDtype.
func (c Config) DenseBytes() int64 {
	return c.DenseParamCount() * int64(c.DenseDtype.ValueBytes())
}

// ParamSpec names one tensor of the bundle and its shape.
type ParamSpec struct {
	Name  string
	Shape []int
}

// Elements is the number of values in the tensor (dense values at any
// dense precision, or embedding elements of a table at any precision).
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
