package model

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

// TestHalfRoundTrip: every half widens to a float32 that narrows back to
// it (NaNs stay NaNs), and the widening is the textbook value.
func TestHalfRoundTrip(t *testing.T) {
	for i := range 1 << 16 {
		h := uint16(i)
		f := HalfToFloat32(h)
		exp, mant := int(h>>10)&0x1f, float64(h&0x3ff)
		var want float64
		switch exp {
		case 0x1f:
			if mant != 0 {
				if !math.IsNaN(float64(f)) {
					t.Fatalf("half %#04x (NaN) widens to %v", h, f)
				}
				if back := Float32ToHalf(f); back&0x7c00 != 0x7c00 || back&0x3ff == 0 {
					t.Fatalf("half %#04x (NaN) narrows back to %#04x", h, back)
				}
				continue
			}
			want = math.Inf(1)
		case 0:
			want = mant * 0x1p-24
		default:
			want = (1 + mant/1024) * math.Exp2(float64(exp-15))
		}
		if h&0x8000 != 0 {
			want = -want
		}
		if float64(f) != want || math.Signbit(float64(f)) != (h&0x8000 != 0) {
			t.Fatalf("half %#04x widens to %v, want %v", h, f, want)
		}
		if back := Float32ToHalf(f); back != h {
			t.Fatalf("half %#04x → %v → %#04x", h, f, back)
		}
	}
}

// TestHalfRoundsToNearestEven checks the narrowing of values between
// halves: random values go to a nearest neighbour, midpoints to the even
// one, and the ends of the range to ±0 and ±Inf.
func TestHalfRoundsToNearestEven(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for range 200000 {
		f := float32(rng.NormFloat64() * math.Exp2(float64(rng.IntN(40)-25)))
		h := Float32ToHalf(f)
		v := float64(HalfToFloat32(h))
		if math.IsInf(v, 0) {
			continue // |f| beyond 65520: checked below
		}
		for _, dir := range []int{-1, 1} {
			n := float64(HalfToFloat32(halfStep(h, dir)))
			if math.Abs(float64(f)-n) < math.Abs(float64(f)-v) {
				t.Fatalf("%v narrows to %v, but %v is nearer", f, v, n)
			}
		}
	}
	// Midway between two halves: ties to the even mantissa.
	for _, h := range []uint16{0x0000, 0x0001, 0x03ff, 0x3c00, 0x3c01, 0x7bfe, 0x8001, 0xbc00} {
		lo, hi := float64(HalfToFloat32(h)), float64(HalfToFloat32(halfStep(h, +1)))
		if h&0x8000 != 0 {
			hi = float64(HalfToFloat32(halfStep(h, -1)))
		}
		mid := float32((lo + hi) / 2)
		want := h
		if h&1 == 1 {
			want = halfStep(h, +1)
			if h&0x8000 != 0 {
				want = halfStep(h, -1)
			}
		}
		if got := Float32ToHalf(mid); got != want {
			t.Errorf("midpoint %v after half %#04x narrows to %#04x, want %#04x", mid, h, got, want)
		}
	}
	for _, tc := range []struct {
		f    float32
		want uint16
	}{
		{65504, 0x7bff}, {65519.99, 0x7bff}, {65520, 0x7c00}, {-65520, 0xfc00},
		{float32(math.Inf(1)), 0x7c00}, {0x1p-25, 0}, {-0x1p-25, 0x8000},
		{math.Nextafter32(0x1p-25, 1), 1}, {0x1p-14, 0x0400}, {-0x1p-24, 0x8001},
	} {
		if got := Float32ToHalf(tc.f); got != tc.want {
			t.Errorf("Float32ToHalf(%v) = %#04x, want %#04x", tc.f, got, tc.want)
		}
	}
}

// TestRowLayout pins the byte offsets the Dtype comment documents, and
// checks them in rows quantized from values whose levels are exact.
func TestRowLayout(t *testing.T) {
	for _, tc := range []struct {
		d                          Dtype
		bytes, values, scale, bias int
		scaleBytes                 int
		safetensors                string
		shape0, shape1             int // of a 7-row table
	}{
		{DtypeFP32, 512, 512, -1, -1, 0, "F32", 7, 128},
		{DtypeFP16, 256, 256, -1, -1, 0, "F16", 7, 128},
		{DtypeInt8, 136, 128, 128, 132, 4, "U8", 7, 136},
		{DtypeInt4, 68, 64, 64, 66, 2, "U8", 7, 68},
	} {
		l := tc.d.Layout(EmbeddingDim)
		if l != (RowLayout{tc.bytes, tc.values, tc.scale, tc.bias, tc.scaleBytes}) {
			t.Errorf("%s: layout %+v", tc.d, l)
		}
		if got := tc.d.tensorDtype(); got != tc.safetensors {
			t.Errorf("%s: safetensors dtype %s, want %s", tc.d, got, tc.safetensors)
		}
		if got := tc.d.tensorShape(7, EmbeddingDim); got[0] != tc.shape0 || got[1] != tc.shape1 {
			t.Errorf("%s: safetensors shape %v, want [%d %d]", tc.d, got, tc.shape0, tc.shape1)
		}
	}
	if Dtype("").Layout(EmbeddingDim) != DtypeFP32.Layout(EmbeddingDim) {
		t.Error("the empty dtype is not laid out as fp32")
	}

	// int8: values 0..127 and 255 give bias 0, scale exactly 1, q = value.
	row := make([]float32, EmbeddingDim)
	for j := range row {
		row[j] = float32(j)
	}
	row[5] = 255
	buf := make([]byte, DtypeInt8.RowBytes(EmbeddingDim))
	if err := DtypeInt8.QuantizeRow(buf, row); err != nil {
		t.Fatal(err)
	}
	for j, v := range row {
		if buf[j] != uint8(v) {
			t.Fatalf("int8 byte %d = %d, want %v", j, buf[j], v)
		}
	}
	if s, b := binary.LittleEndian.Uint32(buf[128:]), binary.LittleEndian.Uint32(buf[132:]); s != math.Float32bits(1) || b != 0 {
		t.Errorf("int8 scale, bias bits = %#x, %#x, want %#x, 0", s, b, math.Float32bits(1))
	}

	// int4: element j is j%16 - 8, so bias -8 and scale 1; the low nibble
	// of byte k holds element 2k.
	for j := range row {
		row[j] = float32(j%16 - 8)
	}
	buf = make([]byte, DtypeInt4.RowBytes(EmbeddingDim))
	if err := DtypeInt4.QuantizeRow(buf, row); err != nil {
		t.Fatal(err)
	}
	for k, b := range buf[:64] {
		if want := byte((2*k)%16 | ((2*k+1)%16)<<4); b != want {
			t.Fatalf("int4 byte %d = %#02x, want %#02x (low nibble = even element)", k, b, want)
		}
	}
	if s, b := binary.LittleEndian.Uint16(buf[64:]), binary.LittleEndian.Uint16(buf[66:]); s != 0x3c00 || b != 0xc800 {
		t.Errorf("int4 scale, bias halves = %#04x, %#04x, want 0x3c00 (1), 0xc800 (-8)", s, b)
	}
	got := make([]float32, EmbeddingDim)
	DtypeInt4.DequantizeRow(got, buf)
	for j := range got {
		if got[j] != row[j] {
			t.Fatalf("int4 element %d dequantizes to %v, want %v", j, got[j], row[j])
		}
	}
}

// testRows returns rows of uniform values of many magnitudes and offsets,
// a constant row and a row of one spike, so quantization meets every
// kind of range.
func testRows(rng *rand.Rand, n int) [][]float32 {
	rows := make([][]float32, 0, n+2)
	for range n {
		scale := math.Exp2(float64(rng.IntN(24) - 16))
		off := (rng.Float64() - 0.5) * scale * float64(rng.IntN(3))
		row := make([]float32, EmbeddingDim)
		for j := range row {
			row[j] = float32(off + (rng.Float64()-0.5)*scale)
		}
		rows = append(rows, row)
	}
	flat, spike := make([]float32, EmbeddingDim), make([]float32, EmbeddingDim)
	for j := range flat {
		flat[j] = 0.0123
	}
	spike[17] = -0.04
	return append(rows, flat, spike)
}

// ulp32 is the gap above |x| between float32s.
func ulp32(x float64) float64 {
	a := float32(math.Abs(x))
	return float64(math.Nextafter32(a, float32(math.Inf(1))) - a)
}

// TestQuantizeRoundTrip bounds each precision's error per element: fp32
// exact; fp16 the nearest half; int8 and int4 the nearest level, so at
// most scale/2 from it in exact arithmetic, plus the float32 rounding of
// the dequantization (an ulp of the row's largest value).
func TestQuantizeRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	rows := testRows(rng, 400)
	got := make([]float32, EmbeddingDim)
	for _, d := range Dtypes() {
		l := d.Layout(EmbeddingDim)
		buf := make([]byte, l.Bytes)
		worst := 0.0 // the largest error, in units of the row's scale
		for r, row := range rows {
			if err := d.QuantizeRow(buf, row); err != nil {
				t.Fatalf("%s row %d: %v", d, r, err)
			}
			d.DequantizeRow(got, buf)
			scale, bias := scaleBiasOf(d, buf, l)
			for j, x := range row {
				v, err := float64(got[j]), math.Abs(float64(got[j])-float64(x))
				switch d {
				case DtypeFP32:
					if v != float64(x) {
						t.Fatalf("fp32 row %d element %d: %v → %v", r, j, x, v)
					}
				case DtypeFP16:
					if err > 0x1p-11*math.Abs(float64(x))+0x1p-25 {
						t.Fatalf("fp16 row %d element %d: %v → %v, off by %g", r, j, x, v, err)
					}
				default:
					q := math.Round((v - bias) / max(scale, 1e-300))
					exact := math.Abs(bias + q*scale - float64(x)) // the level, unrounded
					slack := 2 * ulp32(math.Abs(bias)+d.levels()*scale)
					if exact > scale/2*(1+1e-9) || err > scale/2+slack {
						t.Fatalf("%s row %d element %d: %v → %v (level off by %g, value by %g; scale %g)", d, r, j, x, v, exact, err, scale)
					}
					if scale > 0 {
						worst = max(worst, exact/scale)
					}
				}
			}
		}
		if d == DtypeInt8 || d == DtypeInt4 {
			t.Logf("%s: worst level error %.4f scale", d, worst)
		}
	}
}

// scaleBiasOf reads a quantized row's scale and bias.
func scaleBiasOf(d Dtype, row []byte, l RowLayout) (float64, float64) {
	switch l.ScaleBytes {
	case 4:
		return float64(math.Float32frombits(binary.LittleEndian.Uint32(row[l.Scale:]))),
			float64(math.Float32frombits(binary.LittleEndian.Uint32(row[l.Bias:])))
	case 2:
		return float64(HalfToFloat32(binary.LittleEndian.Uint16(row[l.Scale:]))),
			float64(HalfToFloat32(binary.LittleEndian.Uint16(row[l.Bias:])))
	}
	return 0, 0
}

func TestQuantizeRefuses(t *testing.T) {
	row := func(vals ...float32) []float32 {
		r := make([]float32, EmbeddingDim)
		copy(r, vals)
		return r
	}
	for _, tc := range []struct {
		d    Dtype
		row  []float32
		size int // 0: the right size
		msg  string
	}{
		{DtypeInt8, row(float32(math.NaN())), 0, "element 0 is NaN"},
		{DtypeFP16, row(0, float32(math.Inf(-1))), 0, "element 1 is -Inf"},
		{DtypeFP16, row(0, 0, 70000), 0, "element 2 is 70000, beyond float16"},
		{DtypeInt4, row(-1e6, 1e6), 0, "beyond a float16 scale and bias"},
		{DtypeInt8, row(), 135, "into 135 bytes, want 136"},
	} {
		size := tc.size
		if size == 0 {
			size = tc.d.RowBytes(EmbeddingDim)
		}
		err := tc.d.QuantizeRow(make([]byte, size), tc.row)
		if err == nil || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%s: QuantizeRow = %v, want %q", tc.d, err, tc.msg)
		}
	}
}

func TestParseDtype(t *testing.T) {
	for _, d := range Dtypes() {
		if got, err := ParseDtype(string(d)); got != d || err != nil {
			t.Errorf("ParseDtype(%q) = %q, %v", d, got, err)
		}
	}
	for _, s := range []string{"", "FP16", "int2", "bf16"} {
		if _, err := ParseDtype(s); err == nil || !strings.Contains(err.Error(), "fp32, fp16, int8, int4") {
			t.Errorf("ParseDtype(%q) = %v", s, err)
		}
	}
}
