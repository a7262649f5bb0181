package model

import (
	"math"
	"strings"
	"testing"
)

func TestParseDenseDtype(t *testing.T) {
	for _, d := range DenseDtypes() {
		if got, err := ParseDenseDtype(string(d)); got != d || err != nil {
			t.Errorf("ParseDenseDtype(%q) = %q, %v", d, got, err)
		}
	}
	for _, s := range []string{"", "FP16", "bfloat16", "int8", "f16"} {
		_, err := ParseDenseDtype(s)
		if err == nil || !strings.Contains(err.Error(), `dense dtype "`+s+`" is not one of fp32, fp16, bf16`) {
			t.Errorf("ParseDenseDtype(%q) = %v", s, err)
		}
	}
	if got := DenseDtype("").String(); got != "fp32" {
		t.Errorf(`DenseDtype("").String() = %q, want fp32`, got)
	}
	for _, tc := range []struct {
		d      DenseDtype
		bytes  int
		tensor string
	}{{"", 4, "F32"}, {DenseFP32, 4, "F32"}, {DenseFP16, 2, "F16"}, {DenseBF16, 2, "BF16"}} {
		if got := tc.d.ValueBytes(); got != tc.bytes {
			t.Errorf("%q.ValueBytes() = %d, want %d", tc.d, got, tc.bytes)
		}
		if got := tc.d.tensorDtype(); got != tc.tensor {
			t.Errorf("%q.tensorDtype() = %s, want %s", tc.d, got, tc.tensor)
		}
	}
}

// nearestBF16 is Float32ToBF16's definition for a finite f, computed
// another way: of the two bfloat16 values around f, the nearer in
// float64, the even one on a tie, and ±Inf past the largest finite value
// plus half an ulp (IEEE's overflow rule).
func nearestBF16(f float32) uint16 {
	b := math.Float32bits(f)
	lo := uint16(b >> 16) // f truncated towards zero
	hi := lo + 1          // the next bfloat16 away from zero
	dlo := math.Abs(float64(f) - float64(BF16ToFloat32(lo)))
	var dhi float64
	if hi&0x7fff == 0x7f80 { // beyond the largest finite: where 2^128 would be
		dhi = math.Abs(math.Abs(float64(f)) - math.Ldexp(1, 128))
	} else {
		dhi = math.Abs(float64(f) - float64(BF16ToFloat32(hi)))
	}
	switch {
	case dlo < dhi, dlo == dhi && lo&1 == 0:
		return lo
	}
	return hi
}

func TestBF16(t *testing.T) {
	// Every bfloat16 survives the trip through float32, NaN as NaN.
	for h := range 1 << 16 {
		f := BF16ToFloat32(uint16(h))
		back := Float32ToBF16(f)
		if f != f {
			if w := BF16ToFloat32(back); w == w {
				t.Fatalf("NaN %#04x came back as %#04x, not a NaN", h, back)
			}
			continue
		}
		if back != uint16(h) {
			t.Fatalf("bfloat16 %#04x (%v) came back as %#04x", h, f, back)
		}
	}
	// A spread of float32 bit patterns, both signs, subnormals to the
	// largest, against the nearest bfloat16 found by comparing distances.
	for b := uint64(0); b < 1<<32; b += 7919 {
		f := math.Float32frombits(uint32(b))
		if f-f != 0 {
			continue
		}
		if got, want := Float32ToBF16(f), nearestBF16(f); got != want {
			t.Fatalf("Float32ToBF16(%v = %#08x) = %#04x, want %#04x", f, b, got, want)
		}
	}
	for _, tc := range []struct {
		f    float32
		want uint16
	}{
		{1 + 1.0/256, 0x3f80},             // a tie between 1 and 1+2^-7: the even one, 1
		{1 + 3.0/256, 0x3f82},             // a tie between 1+2^-7 and 1+2^-6: the even one, up
		{1 + 1.0/256 + 1.0/65536, 0x3f81}, // just above the tie
		{-(1 + 3.0/256), 0xbf82},          // ties are symmetric
		{math.MaxFloat32, 0x7f80},         // past the largest finite bfloat16 and a half ulp
		{-math.MaxFloat32, 0xff80},
		{float32(math.Copysign(0, -1)), 0x8000},
		{math.Float32frombits(0x00008000), 0x0000}, // a subnormal tie to even: zero
		{math.Float32frombits(0x00018000), 0x0002}, // and up to even
		{float32(math.Inf(1)), 0x7f80},
	} {
		if got := Float32ToBF16(tc.f); got != tc.want {
			t.Errorf("Float32ToBF16(%v) = %#04x, want %#04x", tc.f, got, tc.want)
		}
	}
	// A NaN whose payload lies only in the low bits must not round into
	// Inf.
	for _, nan := range []uint32{0x7f800001, 0xff800001, 0x7fc00000, 0x7fffffff} {
		if h := Float32ToBF16(math.Float32frombits(nan)); BF16ToFloat32(h) == BF16ToFloat32(h) {
			t.Errorf("Float32ToBF16(NaN %#08x) = %#04x, not a NaN", nan, h)
		}
	}
}

// TestDenseDtypeRound checks Round and roundAll against the conversions
// DenseDtype names.
func TestDenseDtypeRound(t *testing.T) {
	vals := []float32{0, 1, -0.3, 0.1, 1e-6, 3.14159, -65504, 1e-9, 0.049999997}
	for _, d := range append(DenseDtypes(), "") {
		all := append([]float32(nil), vals...)
		d.roundAll(all)
		for i, v := range vals {
			var want float32
			switch d {
			case DenseFP16:
				want = HalfToFloat32(Float32ToHalf(v))
			case DenseBF16:
				want = BF16ToFloat32(Float32ToBF16(v))
			default:
				want = v
			}
			if got := d.Round(v); math.Float32bits(got) != math.Float32bits(want) {
				t.Errorf("%q.Round(%v) = %v, want %v", d, v, got, want)
			}
			if math.Float32bits(all[i]) != math.Float32bits(want) {
				t.Errorf("%q.roundAll: %v became %v, want %v", d, v, all[i], want)
			}
		}
	}
	if DenseFP16.Round(0.1) == 0.1 || DenseBF16.Round(0.1) == 0.1 || DenseFP16.Round(0.1) == DenseBF16.Round(0.1) {
		t.Error("fp16 and bf16 should round 0.1 differently, and away from float32's 0.1")
	}
}

// TestEncodeChunkRefusesHalfOverflow: a weight beyond fp16's range would be
// stored as Inf, which Open then refuses; Export refuses it first, naming
// the element. (Drawn weights are far inside the range.)
func TestEncodeChunkRefusesHalfOverflow(t *testing.T) {
	buf := make([]byte, 16)
	p := placed{spec: ParamSpec{Name: "top_mlp.0.kernel", Shape: []int{4, 4}}, dense: DenseFP16}
	_, _, err := encodeChunk(buf, []float32{1, 70000}, p, 10, EmbeddingDim)
	if err == nil || !strings.Contains(err.Error(), `tensor "top_mlp.0.kernel" element 11 is 70000, which fp16 stores as +Inf`) {
		t.Errorf("encodeChunk of 70000 at fp16 = %v", err)
	}
	p.dense = DenseBF16
	got, at, err := encodeChunk(buf, []float32{1, 70000}, p, 10, EmbeddingDim)
	if err != nil || at != 20 || len(got) != 4 || got[2] != 0x89 || got[3] != 0x47 {
		t.Errorf("encodeChunk of 70000 at bf16 = % x at %d, %v; want 80 3f 89 47 at 20", got, at, err)
	}
}
