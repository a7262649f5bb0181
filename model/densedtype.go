package model

import (
	"fmt"
	"strings"
)

// DenseDtype is the precision the dense parameters of a bundle (every
// weight and bias Config.DenseParams lists) are stored in: config.json's
// "dense_dtype". It is independent of the tables' precision (Dtype); a
// config.json without it was written before the dense network had a
// precision and holds float32.
//
// This comment is the one statement of how a dense parameter is stored and
// what its values are; the exporter, Bundle, the reference forward pass and
// the accelerator all follow it. Every parameter keeps the shape
// Config.DenseParams gives it, its values row-major and little-endian:
//
//	fp32  IEEE binary32.                             tensor dtype F32, 4 bytes a value.
//	fp16  IEEE binary16: 5 exponent bits, 10 of      tensor dtype F16, 2 bytes a value.
//	      mantissa.
//	bf16  bfloat16: the top 16 bits of a binary32,   tensor dtype BF16, 2 bytes a value.
//	      8 exponent bits, 7 of mantissa.
//
// The value of a stored half is its exact widening to float32 (every
// binary16 and every bfloat16 is a float32), and that is the weight the
// model has: Bundle.Param and Bundle.Tensor return it, and the reference
// forward pass computes with it in float64 as it does with float32
// weights. A kernel that multiplies in half precision approximates that
// model, as a float32 kernel approximates the float64 reference.
//
// Export draws every weight in float32, exactly as at fp32, and rounds it
// to the nearest half, ties to even: fp16 by Float32ToHalf, bf16 by
// Float32ToBF16 (a NaN would stay a NaN, but the weights are finite and
// far inside both ranges). So the bundles of one seed at every dense
// precision, combined with every table precision, are one model with
// rounded weights, and NewGeneratedReference rounds the same way to match
// them bit for bit. fp16 keeps 11 significant bits and bf16 8 (bf16 keeps
// float32's range instead, which weights this small do not need); either
// halves the bytes of the dense network (Config.DenseBytes).
type DenseDtype string

// The dense precisions.
const (
	DenseFP32 DenseDtype = "fp32"
	DenseFP16 DenseDtype = "fp16"
	DenseBF16 DenseDtype = "bf16"
)

// DenseDtypes lists the dense precisions, the default (fp32) first.
func DenseDtypes() []DenseDtype { return []DenseDtype{DenseFP32, DenseFP16, DenseBF16} }

// ParseDenseDtype returns the dense precision named s, or an error listing
// the names. As with ParseDtype, an empty name is refused.
func ParseDenseDtype(s string) (DenseDtype, error) {
	d := DenseDtype(s)
	if d == "" || !d.known() {
		return "", fmt.Errorf("dense dtype %q is not one of %s", s, denseDtypeList())
	}
	return d, nil
}

func denseDtypeList() string {
	names := make([]string, 0, 3)
	for _, d := range DenseDtypes() {
		names = append(names, string(d))
	}
	return strings.Join(names, ", ")
}

// norm maps the empty precision of a config.json written before the dense
// network had one to fp32, what those bundles hold.
func (d DenseDtype) norm() DenseDtype {
	if d == "" {
		return DenseFP32
	}
	return d
}

func (d DenseDtype) known() bool {
	switch d.norm() {
	case DenseFP32, DenseFP16, DenseBF16:
		return true
	}
	return false
}

// String returns the precision's name ("fp32" for the empty DenseDtype).
func (d DenseDtype) String() string { return string(d.norm()) }

// ValueBytes is the size of one stored value: 4 at fp32, 2 at fp16 and
// bf16. It panics on an unknown precision, which Validate refuses first.
func (d DenseDtype) ValueBytes() int {
	switch d.norm() {
	case DenseFP32:
		return 4
	case DenseFP16, DenseBF16:
		return 2
	}
	panic(fmt.Sprintf("model: unknown dense dtype %q", string(d)))
}

// tensorDtype is the safetensors dtype of a dense parameter stored at d.
func (d DenseDtype) tensorDtype() string {
	switch d.norm() {
	case DenseFP16:
		return dtypeF16
	case DenseBF16:
		return dtypeBF16
	}
	return dtypeF32
}

// Round returns the weight v is stored as at d (see DenseDtype): v itself
// at fp32, else the nearest half, widened.
func (d DenseDtype) Round(v float32) float32 {
	if d.norm() == DenseFP32 {
		return v
	}
	return d.widen(d.narrow(v))
}

// narrow is the half nearest v at a half precision (fp16 or bf16).
func (d DenseDtype) narrow(v float32) uint16 {
	if d == DenseBF16 {
		return Float32ToBF16(v)
	}
	return Float32ToHalf(v)
}

// widen is the float32 value of the half h at a half precision.
func (d DenseDtype) widen(h uint16) float32 {
	if d == DenseBF16 {
		return BF16ToFloat32(h)
	}
	return HalfToFloat32(h)
}

// roundAll rounds every value of vals as Round does, in place.
func (d DenseDtype) roundAll(vals []float32) {
	if d.norm() == DenseFP32 {
		return
	}
	fillParallel(len(vals), exportChunkElems, func(lo, hi int) {
		for i, v := range vals[lo:hi] {
			vals[lo+i] = d.widen(d.narrow(v))
		}
	})
}
