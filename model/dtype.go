package model

import (
	"encoding/binary"
	"fmt"
	"math"
	"strings"
)

// Dtype is the precision the embedding tables of a bundle are stored in
// (config.json's "table_dtype"). The dense network has its own precision
// (DenseDtype), and every precision of one seed is rounded from the same
// float32 rows and weights, so the bundles of one seed are one model.
//
// This comment is the one statement of how a row is stored and what its
// values are; docs/design.md, the exporter, the reference forward pass and
// the embedder's lookup kernels all follow it. A table of V rows of width
// D (EmbeddingDim, 128) is V stored rows back to back, row r at byte
// r·RowBytes, with no padding between rows; all numbers are little-endian.
//
//	fp32  D × IEEE binary32.                               4D bytes (512)
//	      tensor dtype F32, shape [V, D].
//	fp16  D × IEEE binary16, rounded to nearest even.      2D bytes (256)
//	      tensor dtype F16, shape [V, D]. Every half is exactly a float32.
//	int8  bytes [0, D):     q_j, uint8, element j at byte j;
//	      bytes [D, D+4):   scale, binary32;
//	      bytes [D+4, D+8): bias, binary32.                 D+8 bytes (136)
//	      tensor dtype U8, shape [V, D+8].
//	int4  bytes [0, D/2):   q_j, 4 bits: element j in byte j/2, the low
//	                        nibble for even j, the high nibble for odd j;
//	      bytes [D/2, D/2+2):   scale, binary16;
//	      bytes [D/2+2, D/2+4): bias, binary16.             D/2+4 bytes (68)
//	      tensor dtype U8, shape [V, D/2+4].
//
// The int8 and int4 rows are FBGEMM's fused row-wise layouts (8-bit rows
// with a float32 scale and bias after the values, 4-bit rows with a
// float16 scale and bias after them), so a tool that reads FBGEMM's fused
// tables reads these. Rows are not padded to cache lines: the bytes per
// row are what the precisions exist to save (136 and 68 rather than 192
// and 128). A table starts on a 64-byte line in the embedder's memory
// (embedder/lookup.LayoutTablesOf), and row strides are multiples of 8
// (int8) and 4 (int4), so every int8 row spans exactly 3 cache lines and
// every int4 row exactly 2, and the scale and bias are naturally aligned.
//
// The value of element j of a quantized row is, in float32 arithmetic with
// every operation rounded to float32 and no fused multiply-add:
//
//	v_j = float32(q_j)·scale + bias      (the product rounded, then the sum)
//
// with the int4 scale and bias first widened (exactly) to float32. A
// pooled vector is the sum of its bag's dequantized rows in float32, in bag
// order, starting from the first row. Kernels that use FMA, or that fold
// the bias out of the sum, give other bits and are wrong by this
// definition.
//
// Quantization (QuantizeRow) follows FBGEMM's row-wise asymmetric scheme:
// bias is the row's minimum and scale spreads the row's range over the
// 255 (int8) or 15 (int4) steps, each value rounded to the nearest level
// (ties to even). Unlike FBGEMM, bias is rounded down and scale up when
// they must be rounded (int8's scale to float32, int4's both to float16),
// so every element lies within [bias, bias + levels·scale], no value is
// clamped, and each element is off by at most scale/2 before the float32
// rounding of the dequantization. A row whose values are all one value has
// scale 0.
type Dtype string

// The table precisions.
const (
	DtypeFP32 Dtype = "fp32"
	DtypeFP16 Dtype = "fp16"
	DtypeInt8 Dtype = "int8"
	DtypeInt4 Dtype = "int4"
)

// Dtypes lists the table precisions, the default (fp32) first.
func Dtypes() []Dtype { return []Dtype{DtypeFP32, DtypeFP16, DtypeInt8, DtypeInt4} }

// ParseDtype returns the precision named s, or an error listing the names.
// Unlike a config.json without table_dtype, an empty name is refused: it
// is a mistake on a command line.
func ParseDtype(s string) (Dtype, error) {
	d := Dtype(s)
	if d == "" || !d.known() {
		return "", fmt.Errorf("table dtype %q is not one of %s", s, dtypeList())
	}
	return d, nil
}

func dtypeList() string {
	names := make([]string, 0, 4)
	for _, d := range Dtypes() {
		names = append(names, string(d))
	}
	return strings.Join(names, ", ")
}

// norm maps the empty precision of a config.json written before bundles
// had precisions to fp32, what those bundles hold.
func (d Dtype) norm() Dtype {
	if d == "" {
		return DtypeFP32
	}
	return d
}

func (d Dtype) known() bool {
	switch d.norm() {
	case DtypeFP32, DtypeFP16, DtypeInt8, DtypeInt4:
		return true
	}
	return false
}

// String returns the precision's name ("fp32" for the empty Dtype).
func (d Dtype) String() string { return string(d.norm()) }

// RowLayout is where the parts of one stored row lie, in bytes from the
// row's start (see Dtype).
type RowLayout struct {
	// Bytes is the size of a row: the stride between rows.
	Bytes int
	// Values is the size of the element values at the row's start.
	Values int
	// Scale and Bias are the offsets of the scale and the bias, -1 for the
	// float precisions, which have neither.
	Scale, Bias int
	// ScaleBytes is the size of the scale and of the bias: 4 (binary32) or
	// 2 (binary16); 0 when there are none.
	ScaleBytes int
}

// Layout returns the layout of a row of dim elements. dim must be even for
// int4 (Config.Validate fixes it at EmbeddingDim); Layout panics on an
// unknown precision, which Validate refuses before any row is touched.
func (d Dtype) Layout(dim int) RowLayout {
	switch d.norm() {
	case DtypeFP32:
		return RowLayout{Bytes: 4 * dim, Values: 4 * dim, Scale: -1, Bias: -1}
	case DtypeFP16:
		return RowLayout{Bytes: 2 * dim, Values: 2 * dim, Scale: -1, Bias: -1}
	case DtypeInt8:
		return RowLayout{Bytes: dim + 8, Values: dim, Scale: dim, Bias: dim + 4, ScaleBytes: 4}
	case DtypeInt4:
		return RowLayout{Bytes: dim/2 + 4, Values: dim / 2, Scale: dim / 2, Bias: dim/2 + 2, ScaleBytes: 2}
	}
	panic(fmt.Sprintf("model: unknown table dtype %q", string(d)))
}

// RowBytes is the size of one stored row of dim elements.
func (d Dtype) RowBytes(dim int) int { return d.Layout(dim).Bytes }

// tensorDtype is the safetensors dtype a table of this precision is
// stored as.
func (d Dtype) tensorDtype() string {
	switch d.norm() {
	case DtypeFP32:
		return dtypeF32
	case DtypeFP16:
		return dtypeF16
	}
	return dtypeU8
}

// tensorShape is the safetensors shape of a table of vocab rows of dim
// elements: values for the float precisions, bytes for the fused rows.
func (d Dtype) tensorShape(vocab, dim int) []int {
	switch d.norm() {
	case DtypeFP32, DtypeFP16:
		return []int{vocab, dim}
	}
	return []int{vocab, d.RowBytes(dim)}
}

// levels is the largest quantized value: 255 for int8, 15 for int4.
func (d Dtype) levels() float64 {
	if d.norm() == DtypeInt4 {
		return 15
	}
	return 255
}

// QuantizeRow stores the float32 row src into dst, which must be
// RowBytes(len(src)) bytes, as the Dtype comment describes. It refuses a
// non-finite value, and a value or range a binary16 field cannot hold.
func (d Dtype) QuantizeRow(dst []byte, src []float32) error {
	l := d.Layout(len(src))
	if len(dst) != l.Bytes {
		return fmt.Errorf("model: quantize %s row of %d values into %d bytes, want %d", d, len(src), len(dst), l.Bytes)
	}
	lo, hi := float32(math.Inf(1)), float32(math.Inf(-1))
	for j, v := range src {
		if v-v != 0 { // NaN or ±Inf
			return fmt.Errorf("model: quantize %s row: element %d is %v", d, j, v)
		}
		// min and max by hand (they are slow on floats): -0 is below +0,
		// as min and max order them; NaN was refused above.
		if v < lo || v == lo && math.Signbit(float64(v)) {
			lo = v
		}
		if v > hi || v == hi && !math.Signbit(float64(v)) {
			hi = v
		}
	}
	switch d.norm() {
	case DtypeFP32:
		for j, v := range src {
			binary.LittleEndian.PutUint32(dst[4*j:], math.Float32bits(v))
		}
		return nil
	case DtypeFP16:
		for j, v := range src {
			h := Float32ToHalf(v)
			if h&0x7fff == 0x7c00 {
				return fmt.Errorf("model: quantize fp16 row: element %d is %v, beyond float16's ±65504", j, v)
			}
			binary.LittleEndian.PutUint16(dst[2*j:], h)
		}
		return nil
	}
	scale, bias, err := d.scaleBias(lo, hi)
	if err != nil {
		return err
	}
	clear(dst[:l.Values])
	// The precision is decided once, outside the loop: a row is quantized
	// for every row of every table exported.
	is8, levels := d.norm() == DtypeInt8, d.levels()
	for j, v := range src {
		q := uint8(0)
		if scale != 0 {
			// In float64, where x - bias and the quotient are exact enough
			// that the nearest level is found; the bound keeps a rounding
			// at the top from leaving the level range.
			t := math.RoundToEven((float64(v) - float64(bias)) / float64(scale))
			if t < 0 { // plain compares: min and max would also order ±0 and NaN
				t = 0
			} else if t > levels {
				t = levels
			}
			q = uint8(t)
		}
		if is8 {
			dst[j] = q
		} else {
			dst[j/2] |= q << (4 * (j % 2))
		}
	}
	if l.ScaleBytes == 4 {
		binary.LittleEndian.PutUint32(dst[l.Scale:], math.Float32bits(scale))
		binary.LittleEndian.PutUint32(dst[l.Bias:], math.Float32bits(bias))
	} else {
		binary.LittleEndian.PutUint16(dst[l.Scale:], Float32ToHalf(scale))
		binary.LittleEndian.PutUint16(dst[l.Bias:], Float32ToHalf(bias))
	}
	return nil
}

// scaleBias returns the scale and bias of a row spanning [lo, hi], both
// representable in the precision's scale and bias fields: bias ≤ lo and
// bias + levels·scale ≥ hi.
func (d Dtype) scaleBias(lo, hi float32) (scale, bias float32, err error) {
	levels := d.levels()
	if d.norm() == DtypeInt8 {
		bias = lo
		rng := float64(hi) - float64(lo)
		scale = float32(rng / levels)
		if float64(scale)*levels < rng {
			scale = math.Nextafter32(scale, float32(math.Inf(1)))
		}
		return scale, bias, nil
	}
	bias = HalfToFloat32(halfDown(lo))
	rng := float64(hi) - float64(bias)
	scale = HalfToFloat32(halfUp(float32(rng / levels)))
	for float64(scale)*levels < rng { // float32(rng/levels) may have rounded down
		scale = HalfToFloat32(halfUp(math.Nextafter32(scale, float32(math.Inf(1)))))
	}
	if math.IsInf(float64(bias), 0) || math.IsInf(float64(scale), 0) {
		return 0, 0, fmt.Errorf("model: quantize int4 row: values span [%v, %v], beyond a float16 scale and bias", lo, hi)
	}
	return scale, bias, nil
}

// DequantizeRow sets dst (len(dst) elements) to the values of the stored
// row src, as the Dtype comment defines them. It is the reference every
// dequantizing kernel must match bit for bit.
func (d Dtype) DequantizeRow(dst []float32, src []byte) {
	l := d.Layout(len(dst))
	src = src[:l.Bytes]
	switch d.norm() {
	case DtypeFP32:
		for j := range dst {
			dst[j] = math.Float32frombits(binary.LittleEndian.Uint32(src[4*j:]))
		}
		return
	case DtypeFP16:
		for j := range dst {
			dst[j] = HalfToFloat32(binary.LittleEndian.Uint16(src[2*j:]))
		}
		return
	}
	var scale, bias float32
	if l.ScaleBytes == 4 {
		scale = math.Float32frombits(binary.LittleEndian.Uint32(src[l.Scale:]))
		bias = math.Float32frombits(binary.LittleEndian.Uint32(src[l.Bias:]))
	} else {
		scale = HalfToFloat32(binary.LittleEndian.Uint16(src[l.Scale:]))
		bias = HalfToFloat32(binary.LittleEndian.Uint16(src[l.Bias:]))
	}
	is8 := d.norm() == DtypeInt8
	for j := range dst {
		var q uint8
		if is8 {
			q = src[j]
		} else {
			q = src[j/2] >> (4 * (j % 2)) & 0xf
		}
		// The conversion rounds the product to float32 on its own, which
		// also forbids the compiler from fusing it with the add (an FMA
		// would round once and give other bits than the kernels).
		dst[j] = float32(float32(q)*scale) + bias
	}
}
