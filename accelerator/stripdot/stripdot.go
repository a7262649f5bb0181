// Package stripdot owns the matrix product the accelerator runs for small
// batches on the CPU plugin: x[m,k]·W[k,n] with W stored as 32-column
// strips, so that each strip is one contiguous run of memory streamed once
// per block of rows (up to 12 with AVX-512, 6 with AVX2). At the batch
// sizes a serving mesh sees under a latency budget (1 to a few dozen
// examples) the dense network is bound by reading its weights, and XLA's
// matrix-matrix kernel reads [k,n] weights through a blocked copy that
// costs about twice the stream.
//
// The weights may be float32 or, to halve that stream, IEEE binary16 (fp16)
// or bfloat16 (bf16) in the same strips. A half weight's value is its exact
// widening to float32 (Widen): the kernels widen each strip row in
// registers as they load it and compute in float32, so a product over half
// strips has the bits of the float32 product over the widened strips. x and
// the result stay float32.
//
// The package has the packing and a plain Go reference (this file), two
// kernels (one for AVX-512F, one for AVX2 with FMA and F16C, for the CPUs
// without AVX-512: each process registers the fastest its CPU runs), and
// the XLA FFI handler with its registration through the PJRT plugin's FFI
// extension (kernel.go, kernel_amd64.go, stripdot_amd64.c). A program calls
// the handler as
//
//	stablehlo.custom_call @recmesh_strip_dot(x, packed) {api_version = 4}
//	  : (tensor<m×k×f32>, tensor<s×k×32×T>) -> tensor<m×s×32×f32>
//
// with T one of f32, f16 and bf16, which computes exactly what
// dot_general(x, convert(packed)) contracting k computes.
package stripdot

import (
	"fmt"
	"math"

	"github.com/recmesh/recmesh/model"
)

// Width is the number of columns of a strip.
const Width = 32

// Target is the custom-call target name the handler is registered under.
const Target = "recmesh_strip_dot"

// Eligible reports whether a [k,n] weight can be packed: n must be a
// multiple of Width.
func Eligible(k, n int) bool { return k > 0 && n > 0 && n%Width == 0 }

// PackedShape is the shape of the packed form of a [k,n] weight.
func PackedShape(k, n int) []int { return []int{n / Width, k, Width} }

// Element is the element type of packed weights.
type Element int

const (
	Float32  Element = iota
	Float16          // IEEE binary16
	BFloat16         // bfloat16: the high 16 bits of a float32
)

func (e Element) String() string {
	switch e {
	case Float32:
		return "f32"
	case Float16:
		return "f16"
	case BFloat16:
		return "bf16"
	}
	return fmt.Sprintf("Element(%d)", int(e))
}

// Pack writes w (k rows of n, row-major) into dst as strips:
// dst[s][i][j] = w[i][s*Width+j].
func Pack(dst, w []float32, k, n int) error { return pack(dst, w, k, n) }

// Pack16 is Pack for 16-bit weights (the bits of fp16 or bf16 values):
// their strips have the same layout at half the bytes.
func Pack16(dst, w []uint16, k, n int) error { return pack(dst, w, k, n) }

func pack[T float32 | uint16](dst, w []T, k, n int) error {
	if !Eligible(k, n) {
		return fmt.Errorf("stripdot: cannot pack a [%d,%d] weight: columns must be a positive multiple of %d", k, n, Width)
	}
	if len(w) != k*n || len(dst) != k*n {
		return fmt.Errorf("stripdot: pack [%d,%d]: weight has %d values and destination %d, want %d", k, n, len(w), len(dst), k*n)
	}
	for s := 0; s < n/Width; s++ {
		strip := dst[s*k*Width : (s+1)*k*Width]
		for i := 0; i < k; i++ {
			copy(strip[i*Width:(i+1)*Width], w[i*n+s*Width:i*n+(s+1)*Width])
		}
	}
	return nil
}

// checkShapes validates the arguments of a product.
func checkShapes[T float32 | uint16](x []float32, m, k int, packed []T, n int, out []float32) error {
	switch {
	case m <= 0 || !Eligible(k, n):
		return fmt.Errorf("stripdot: bad product shape m=%d k=%d n=%d (n a multiple of %d)", m, k, n, Width)
	case len(x) < m*k:
		return fmt.Errorf("stripdot: x has %d values, want %d", len(x), m*k)
	case len(packed) < k*n:
		return fmt.Errorf("stripdot: packed weights have %d values, want %d", len(packed), k*n)
	case len(out) < m*n:
		return fmt.Errorf("stripdot: out has room for %d values, want %d", len(out), m*n)
	}
	return nil
}

// Reference computes out[r][c] = Σ_i x[r][i]·W[i][c] from the packed
// weights in plain Go: the yardstick of the kernels in tests.
func Reference(x []float32, m, k int, packed []float32, n int, out []float32) error {
	if err := checkShapes(x, m, k, packed, n, out); err != nil {
		return err
	}
	for r := 0; r < m; r++ {
		for s := 0; s < n/Width; s++ {
			strip := packed[s*k*Width : (s+1)*k*Width]
			var acc [Width]float32
			for i := 0; i < k; i++ {
				a := x[r*k+i]
				for j, w := range strip[i*Width : (i+1)*Width] {
					acc[j] += a * w
				}
			}
			copy(out[r*n+s*Width:], acc[:])
		}
	}
	return nil
}

// checkHalf validates the element type of a product over half weights.
func checkHalf(elem Element) error {
	if elem != Float16 && elem != BFloat16 {
		return fmt.Errorf("stripdot: weights of type %v are not half precision (f16 or bf16)", elem)
	}
	return nil
}

// ReferenceHalf is Reference for half weights of type elem (Float16 or
// BFloat16), each widened to its exact float32 value.
func ReferenceHalf(x []float32, m, k int, packed []uint16, elem Element, n int, out []float32) error {
	if err := checkHalf(elem); err != nil {
		return err
	}
	if err := checkShapes(x, m, k, packed, n, out); err != nil {
		return err
	}
	wide := make([]float32, k*n)
	if err := Widen(wide, packed[:k*n], elem); err != nil {
		return err
	}
	return Reference(x, m, k, wide, n, out)
}

// Widen writes the float32 values of the half values src (elem Float16 or
// BFloat16) into dst, which must be as long. Every half value is a float32
// value, so the widening is exact; a NaN keeps its sign and payload and
// comes out quiet for fp16, as F16C's VCVTPH2PS does, which the kernels
// use.
func Widen(dst []float32, src []uint16, elem Element) error {
	if err := checkHalf(elem); err != nil {
		return err
	}
	if len(dst) != len(src) {
		return fmt.Errorf("stripdot: widen %d values into %d", len(src), len(dst))
	}
	for i, h := range src {
		if elem == BFloat16 {
			dst[i] = model.BF16ToFloat32(h)
			continue
		}
		v := model.HalfToFloat32(h)
		if v != v {
			// VCVTPH2PS sets a NaN's quiet bit; model keeps the half's.
			v = math.Float32frombits(math.Float32bits(v) | 1<<22)
		}
		dst[i] = v
	}
	return nil
}
