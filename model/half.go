package model

import "math"

// IEEE binary16 ("half") conversions for fp16 tables, the int4 rows'
// scale and bias and fp16 dense weights, and bfloat16 conversions for bf16
// dense weights. Written out rather than taken from a library so that the
// rounding is exactly the one Dtype and DenseDtype document, on every
// platform.

// Float32ToHalf returns the binary16 nearest to f, ties to even, as F16C's
// VCVTPS2PH with rounding mode 0 does: values beyond ±65504 (after
// rounding) become ±Inf, values below half the smallest subnormal ±0, and a
// NaN stays a (quiet) NaN.
func Float32ToHalf(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int(b>>23) & 0xff
	mant := b & 0x7fffff
	if exp == 0xff {
		if mant != 0 {
			return sign | 0x7e00 | uint16(mant>>13)
		}
		return sign | 0x7c00
	}
	e := exp - 127 + 15 // the half's biased exponent
	if e >= 31 {
		return sign | 0x7c00
	}
	if e <= 0 {
		// A half subnormal (or zero): its mantissa counts units of 2^-24,
		// and f is m·2^(exp-150) with the implicit bit in m.
		if e < -10 {
			return sign // below 2^-25: rounds to zero
		}
		m := mant | 0x800000
		shift := uint(14 - e)
		return sign | uint16(roundShift(m, shift))
	}
	// A carry out of the mantissa moves into the exponent, which is the
	// right answer up to and including rounding into Inf.
	return sign | uint16(roundShift(uint32(e)<<23|mant, 13))
}

// roundShift returns v >> shift rounded to nearest, ties to even.
func roundShift(v uint32, shift uint) uint32 {
	h := v >> shift
	rem := v & (1<<shift - 1)
	half := uint32(1) << (shift - 1)
	if rem > half || (rem == half && h&1 == 1) {
		h++
	}
	return h
}

// HalfToFloat32 returns the value of the binary16 h as a float32, which
// holds every half exactly.
func HalfToFloat32(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1f
	mant := uint32(h & 0x3ff)
	switch {
	case exp == 0x1f:
		return math.Float32frombits(sign | 0x7f800000 | mant<<13)
	case exp != 0:
		return math.Float32frombits(sign | (exp+127-15)<<23 | mant<<13)
	}
	v := float32(mant) * (1.0 / (1 << 24)) // subnormal or zero: exact
	return math.Float32frombits(math.Float32bits(v) | sign)
}

// halfDown returns the largest half ≤ f (f finite).
func halfDown(f float32) uint16 {
	h := Float32ToHalf(f)
	if HalfToFloat32(h) <= f {
		return h
	}
	return halfStep(h, -1)
}

// halfUp returns the smallest half ≥ f (f finite).
func halfUp(f float32) uint16 {
	h := Float32ToHalf(f)
	if HalfToFloat32(h) >= f {
		return h
	}
	return halfStep(h, +1)
}

// halfStep returns the half next to the finite h towards -Inf (dir < 0)
// or +Inf (dir > 0). Halves are sign-magnitude, so a step away from zero
// adds one to the magnitude and a step towards it subtracts one.
func halfStep(h uint16, dir int) uint16 {
	neg := h&0x8000 != 0
	mag := h & 0x7fff
	switch {
	case mag == 0: // ±0: the smallest subnormal of the direction's sign
		if dir < 0 {
			return 0x8001
		}
		return 0x0001
	case neg == (dir < 0):
		return h + 1
	}
	return h - 1
}

// Float32ToBF16 returns the bfloat16 nearest to f, ties to even: f's top 16
// bits after rounding away the low 16. Values beyond bfloat16's largest
// finite value (after rounding) become ±Inf, and a NaN stays a (quiet)
// NaN, which plain rounding could carry into Inf.
func Float32ToBF16(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 {
		return uint16(b>>16) | 0x40
	}
	// Adding just under half an ulp, plus the kept lsb, rounds ties to
	// even; a carry moves into the exponent, which is the right answer up
	// to and including rounding into Inf.
	return uint16((b + 0x7fff + (b>>16)&1) >> 16)
}

// BF16ToFloat32 returns the value of the bfloat16 h as a float32, which
// holds every bfloat16 exactly.
func BF16ToFloat32(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }
