package lookup

import (
	"encoding/binary"
	"math"

	"github.com/recmesh/recmesh/model"
)

// The plain-Go dequantize-and-pool kernels of the fp16, int8 and int4
// tables: the definition the assembly kernels of those precisions are held
// to bit for bit, and the kernel of builds and CPUs without them. Each row
// is dequantized to float32 exactly as model.Dtype defines (its layouts are
// taken from model.Dtype.Layout, not restated here), then added to the
// pooled row in float32, bag order, first row copied: the order of the fp32
// kernels.

// The row layouts of the quantized precisions at width Dim.
var (
	int8Row = model.DtypeInt8.Layout(Dim)
	int4Row = model.DtypeInt4.Layout(Dim)
)

// poolDequant pools n checked examples of tables at a precision other than
// fp32.
func poolDequant(t *Tables, out []float32, ids []int32, n int) {
	var v [Dim]float32 // one dequantized row; on the stack, so pooling allocates nothing
	rb := t.rowB
	k, o := 0, 0
	for range n {
		for i, h := range t.hot {
			tab := t.raw[i]
			dst := (*[Dim]float32)(out[o : o+Dim])
			for j, id := range ids[k : k+h] {
				row := tab[int(id)*rb : int(id)*rb+rb]
				// A switch of direct calls rather than a function value:
				// the compiler then sees that &v does not escape.
				switch t.dtype {
				case model.DtypeFP16:
					dequantFP16(&v, row)
				case model.DtypeInt8:
					dequantInt8(&v, row)
				default:
					dequantInt4(&v, row)
				}
				if j == 0 {
					*dst = v
					continue
				}
				for d := range dst {
					dst[d] += v[d]
				}
			}
			k += h
			o += Dim
		}
	}
}

// dequantFP16 widens a row of Dim little-endian halves.
func dequantFP16(v *[Dim]float32, row []byte) {
	row = row[:2*Dim]
	for d := range v {
		v[d] = halfToFloat(binary.LittleEndian.Uint16(row[2*d:]))
	}
}

// dequantInt8 dequantizes an int8 row: q·scale (rounded), then + bias.
func dequantInt8(v *[Dim]float32, row []byte) {
	row = row[:int8Row.Bytes]
	scale := math.Float32frombits(binary.LittleEndian.Uint32(row[int8Row.Scale:]))
	bias := math.Float32frombits(binary.LittleEndian.Uint32(row[int8Row.Bias:]))
	for d, q := range row[:Dim] {
		// The inner conversion rounds the product and keeps the compiler
		// from fusing it with the add into an FMA, which model.Dtype forbids.
		v[d] = float32(float32(q)*scale) + bias
	}
}

// dequantInt4 dequantizes an int4 row: the low nibble of byte i is element
// 2i, the high nibble element 2i+1; the scale and bias are halves.
func dequantInt4(v *[Dim]float32, row []byte) {
	row = row[:int4Row.Bytes]
	scale := halfToFloat(binary.LittleEndian.Uint16(row[int4Row.Scale:]))
	bias := halfToFloat(binary.LittleEndian.Uint16(row[int4Row.Bias:]))
	for i, q := range row[:Dim/2] {
		v[2*i] = float32(float32(q&0xf)*scale) + bias
		v[2*i+1] = float32(float32(q>>4)*scale) + bias
	}
}

// halfToFloat widens an IEEE binary16 to float32 without branching on
// normals and subnormals: the half's exponent and mantissa placed in a
// float32's low exponent bits give the value times 2^-112, which one exact
// multiplication corrects (subnormal halves included, as float32
// subnormals). Inf and NaN, whose exponent is all ones, need the float32
// exponent set to all ones instead. It is an independent statement of
// model.HalfToFloat32, tested equal to it on every half.
func halfToFloat(h uint16) float32 {
	mag := uint32(h&0x7fff) << 13
	f := math.Float32frombits(mag) * 0x1p112
	if h&0x7c00 == 0x7c00 {
		f = math.Float32frombits(mag | 0x7f800000)
	}
	return math.Float32frombits(math.Float32bits(f) | uint32(h&0x8000)<<16)
}
