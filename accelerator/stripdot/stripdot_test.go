package stripdot

import (
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/cpu"
)

func randomMatrix(rng *rand.Rand, n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = rng.Float32()*2 - 1
	}
	return v
}

func TestPackLaysOutStrips(t *testing.T) {
	k, n := 3, 64
	w := make([]float32, k*n)
	for i := range w {
		w[i] = float32(i)
	}
	dst := make([]float32, k*n)
	if err := Pack(dst, w, k, n); err != nil {
		t.Fatal(err)
	}
	for s := 0; s < n/Width; s++ {
		for i := 0; i < k; i++ {
			for j := 0; j < Width; j++ {
				if got, want := dst[(s*k+i)*Width+j], w[i*n+s*Width+j]; got != want {
					t.Fatalf("packed[%d][%d][%d] = %v, want w[%d][%d] = %v", s, i, j, got, i, s*Width+j, want)
				}
			}
		}
	}
}

func TestPackRejectsBadShapes(t *testing.T) {
	if err := Pack(make([]float32, 30), make([]float32, 30), 1, 30); err == nil {
		t.Error("Pack accepted 30 columns, not a multiple of 32")
	}
	if err := Pack(make([]float32, 64), make([]float32, 63), 2, 32); err == nil {
		t.Error("Pack accepted a weight with too few values")
	}
}

// TestReferenceIsTheProduct checks the reference against the textbook
// product over the unpacked weight.
func TestReferenceIsTheProduct(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	m, k, n := 3, 17, 64
	x, w := randomMatrix(rng, m*k), randomMatrix(rng, k*n)
	packed := make([]float32, k*n)
	if err := Pack(packed, w, k, n); err != nil {
		t.Fatal(err)
	}
	out := make([]float32, m*n)
	if err := Reference(x, m, k, packed, n, out); err != nil {
		t.Fatal(err)
	}
	for r := 0; r < m; r++ {
		for c := 0; c < n; c++ {
			var want float64
			for i := 0; i < k; i++ {
				want += float64(x[r*k+i]) * float64(w[i*n+c])
			}
			if d := math.Abs(float64(out[r*n+c]) - want); d > 1e-5 {
				t.Fatalf("out[%d][%d] = %v, want %v", r, c, out[r*n+c], want)
			}
		}
	}
}

// fma32 returns a·b+c rounded once to float32, as VFMADD does. The
// product is exact in float64 (24+24 bits); the float64 sum is rounded to
// odd (its last bit set when the sum was inexact, from TwoSum's error), and
// a float64 rounded to odd rounds to float32 as the exact value would,
// where plain rounding to float64 first could land on a float32 tie.
func fma32(a, b, c float32) float32 {
	p, q := float64(a)*float64(b), float64(c)
	s := p + q
	v := s - p
	e := (p - (s - v)) + (q - v)
	if e != 0 && math.Float64bits(s)&1 == 0 {
		s = math.Nextafter(s, math.Copysign(math.Inf(1), e))
	}
	return float32(s)
}

func TestFMA32RoundsOnce(t *testing.T) {
	// (1+2⁻¹²)·(1-4095·2⁻²⁴)·2⁻²⁴ = 2⁻²⁴+2⁻⁶⁰: added to 1 it lies just
	// past the tie between 1 and 1+2⁻²³, where float64 cannot tell.
	a, b := float32(1+0x1p-12), float32((1-4095*0x1p-24)*0x1p-24)
	if got, want := fma32(a, b, 1), float32(1+0x1p-23); got != want {
		t.Errorf("fma32 = %v, want %v", got, want)
	}
	if twice := float32(float64(a)*float64(b) + 1); twice != 1 {
		t.Errorf("rounding through float64 = %v; the case no longer tests double rounding", twice)
	}
	for _, c := range [][3]float32{{2, 3, 4}, {-1.5, 2, 3}, {0.1, 0.2, -0.02}, {0, -1, 0}, {1e-30, 1e-30, 0}} {
		if got, want := fma32(c[0], c[1], c[2]), float32(math.FMA(float64(c[0]), float64(c[1]), float64(c[2]))); got != want {
			t.Errorf("fma32(%v) = %v, want %v", c, got, want)
		}
	}
}

// fusedReference is Reference with each multiply-add fused: the kernels'
// arithmetic, in Reference's order.
func fusedReference(x []float32, m, k int, packed []float32, n int, out []float32) {
	for r := 0; r < m; r++ {
		for s := 0; s < n/Width; s++ {
			strip := packed[s*k*Width : (s+1)*k*Width]
			var acc [Width]float32
			for i := 0; i < k; i++ {
				a := x[r*k+i]
				for j, w := range strip[i*Width : (i+1)*Width] {
					acc[j] = fma32(a, w, acc[j])
				}
			}
			copy(out[r*n+s*Width:], acc[:])
		}
	}
}

// TestKernelsListBoth checks that a CPU with AVX-512 tests the AVX2 kernel
// too: CI has no AVX2-only host.
func TestKernelsListBoth(t *testing.T) {
	t.Logf("kernels: %v, Multiply and Register use %s", kernels(), Kernel())
	if Supported() && cpu.X86.HasAVX512F && !slices.Equal(kernels(), []kernel{kernelAVX512, kernelAVX2}) {
		t.Errorf("kernels on an AVX-512 CPU = %v, want [avx512 avx2]", kernels())
	}
	if Supported() != (Kernel() != "none") {
		t.Errorf("Supported() = %v with kernel %s", Supported(), Kernel())
	}
}

// TestKernelsMatchReference runs every kernel this CPU runs over every
// row-block remainder of both (blocks of 12 and of 6 rows), depths that
// are not multiples of a vector, and the DLRM-DCNv2 shapes.
func TestKernelsMatchReference(t *testing.T) {
	if !Supported() {
		t.Skip(ErrUnsupported)
	}
	rng := rand.New(rand.NewPCG(3, 4))
	small := []struct{ k, n int }{{1, 32}, {3, 64}, {7, 32}, {13, 512}, {17, 96}, {100, 96}, {600, 64}}
	// The MLPerf network's products whose widths are multiples of 32: the
	// bottom MLP, the low-rank cross layers and the top MLP.
	dcn := []struct{ k, n int }{{13, 512}, {512, 256}, {256, 128}, {3456, 512}, {512, 3456}, {3456, 1024}, {1024, 1024},
		{1024, 512}, {512, 256}}
	rows := func(big bool) []int {
		if big { // the Go references would take a minute over every m
			return []int{1, 7, 13, 17}
		}
		ms := []int{24, 32}
		for m := 1; m <= 17; m++ {
			ms = append(ms, m)
		}
		return ms
	}
	for _, sh := range append(small, dcn...) {
		for _, m := range rows(sh.k*sh.n > 1<<17) {
			x, w := randomMatrix(rng, m*sh.k), randomMatrix(rng, sh.k*sh.n)
			packed := make([]float32, sh.k*sh.n)
			if err := Pack(packed, w, sh.k, sh.n); err != nil {
				t.Fatal(err)
			}
			want, fused := make([]float32, m*sh.n), make([]float32, m*sh.n)
			if err := Reference(x, m, sh.k, packed, sh.n, want); err != nil {
				t.Fatal(err)
			}
			fusedReference(x, m, sh.k, packed, sh.n, fused)
			// Reference rounds each product before adding it, the kernels
			// fuse the two: they differ by roundings that grow like √k
			// over products of random sign and magnitude below 1.
			tol := 1e-5 * math.Sqrt(float64(sh.k))
			for _, kn := range kernels() {
				got := make([]float32, m*sh.n+1)
				got[m*sh.n] = 42 // the kernel must not write past the product
				if err := multiplyWith(kn, x, m, sh.k, packed, sh.n, got); err != nil {
					t.Fatal(err)
				}
				for i := range want {
					if got[i] != fused[i] {
						t.Fatalf("%s m=%d k=%d n=%d: out[%d] = %v, fused reference %v", kn, m, sh.k, sh.n, i, got[i], fused[i])
					}
					if d := math.Abs(float64(got[i] - want[i])); d > tol {
						t.Fatalf("%s m=%d k=%d n=%d: out[%d] = %v, reference %v", kn, m, sh.k, sh.n, i, got[i], want[i])
					}
				}
				if got[m*sh.n] != 42 {
					t.Fatalf("%s m=%d k=%d n=%d: the kernel wrote past its output", kn, m, sh.k, sh.n)
				}
			}
		}
	}
}

func TestMultiplyRejectsShortSlices(t *testing.T) {
	if !Supported() {
		if err := Multiply(make([]float32, 4), 2, 2, make([]float32, 64), 32, make([]float32, 64)); err != ErrUnsupported {
			t.Errorf("Multiply without a kernel: err = %v, want ErrUnsupported", err)
		}
		t.Skip(ErrUnsupported)
	}
	for _, kn := range kernels() {
		if err := multiplyWith(kn, make([]float32, 3), 2, 2, make([]float32, 64), 32, make([]float32, 64)); err == nil {
			t.Errorf("%s accepted an x with 3 values for a [2,2] input", kn)
		}
		if err := multiplyWith(kn, make([]float32, 4), 2, 2, make([]float32, 64), 32, make([]float32, 63)); err == nil {
			t.Errorf("%s accepted an output too small", kn)
		}
	}
}

func TestMultiplyWithRefusesKernelsTheCPULacks(t *testing.T) {
	for _, kn := range []kernel{kernelNone, kernelAVX2, kernelAVX512} {
		err := multiplyWith(kn, make([]float32, 4), 2, 2, make([]float32, 64), 32, make([]float32, 64))
		if runs := slices.Contains(kernels(), kn); runs != (err == nil) {
			t.Errorf("%s: err = %v, and this CPU runs it: %v", kn, err, runs)
		}
	}
}

// BenchmarkMultiply runs the products of one DCNv2 forward pass of the
// MLPerf network whose widths are multiples of 32 (three low-rank cross
// layers over 3456 features, then the top MLP's first layers), each with its
// own weights, at the buckets the accelerator runs, with each kernel this
// CPU runs.
func BenchmarkMultiply(b *testing.B) {
	if !Supported() {
		b.Skip(ErrUnsupported)
	}
	rng := rand.New(rand.NewPCG(5, 6))
	type layer struct {
		k, n int
		w    []float32
	}
	var layers []layer
	for _, kn := range [][2]int{{3456, 512}, {512, 3456}, {3456, 512}, {512, 3456}, {3456, 512}, {512, 3456},
		{3456, 1024}, {1024, 1024}, {1024, 512}} {
		layers = append(layers, layer{kn[0], kn[1], randomMatrix(rng, kn[0]*kn[1])})
	}
	for _, kn := range kernels() {
		for _, m := range []int{1, 16, 32, 64, 128} {
			b.Run(kn.String()+"/m="+strconv.Itoa(m), func(b *testing.B) {
				x, out := randomMatrix(rng, m*3456), make([]float32, m*3456)
				for b.Loop() {
					for _, l := range layers {
						if err := multiplyWith(kn, x[:m*l.k], m, l.k, l.w, l.n, out[:m*l.n]); err != nil {
							b.Fatal(err)
						}
					}
				}
				b.ReportMetric(float64(b.N)*float64(m)/b.Elapsed().Seconds(), "examples/s")
			})
		}
	}
}

// randomHalves returns n random weights of type elem below 1 in magnitude,
// spread over many binades, with zeros and subnormals too if subnormal
// (the benchmarks leave them out: FMA on subnormals is slow on some CPUs).
func randomHalves(rng *rand.Rand, n int, elem Element, subnormal bool) []uint16 {
	v := make([]uint16, n)
	for i := range v {
		sign := uint16(rng.IntN(2)) << 15
		switch {
		case elem == Float16 && subnormal && rng.IntN(16) == 0:
			v[i] = sign | uint16(rng.IntN(1<<10))
		case elem == Float16:
			v[i] = sign | uint16(1+rng.IntN(14))<<10 | uint16(rng.IntN(1<<10))
		case subnormal && rng.IntN(16) == 0:
			v[i] = sign | uint16(rng.IntN(1<<7))
		default:
			v[i] = sign | uint16(112+rng.IntN(15))<<7 | uint16(rng.IntN(1<<7))
		}
	}
	return v
}

var halves = []Element{Float16, BFloat16}

func TestElementString(t *testing.T) {
	for e, want := range map[Element]string{Float32: "f32", Float16: "f16", BFloat16: "bf16", 7: "Element(7)"} {
		if got := e.String(); got != want {
			t.Errorf("Element(%d).String() = %q, want %q", int(e), got, want)
		}
	}
}

func TestPack16LaysOutStrips(t *testing.T) {
	k, n := 3, 64
	w := make([]uint16, k*n)
	for i := range w {
		w[i] = uint16(i)
	}
	dst := make([]uint16, k*n)
	if err := Pack16(dst, w, k, n); err != nil {
		t.Fatal(err)
	}
	for s := 0; s < n/Width; s++ {
		for i := 0; i < k; i++ {
			for j := 0; j < Width; j++ {
				if got, want := dst[(s*k+i)*Width+j], w[i*n+s*Width+j]; got != want {
					t.Fatalf("packed[%d][%d][%d] = %v, want w[%d][%d] = %v", s, i, j, got, i, s*Width+j, want)
				}
			}
		}
	}
	if err := Pack16(make([]uint16, 30), make([]uint16, 30), 1, 30); err == nil {
		t.Error("Pack16 accepted 30 columns, not a multiple of 32")
	}
}

// TestWidenIsExact checks every fp16 and bf16 value against its value
// computed from the definition of the format in float64.
func TestWidenIsExact(t *testing.T) {
	src := make([]uint16, 1<<16)
	for i := range src {
		src[i] = uint16(i)
	}
	dst := make([]float32, len(src))
	for _, elem := range halves {
		if err := Widen(dst, src, elem); err != nil {
			t.Fatal(err)
		}
		for i, h := range src {
			sign, exp, mant, bits, bias := float64(1), 0, 0, 0, 0
			if h&0x8000 != 0 {
				sign = -1
			}
			if elem == Float16 {
				exp, mant, bits, bias = int(h>>10&0x1f), int(h&0x3ff), 10, 15
			} else {
				exp, mant, bits, bias = int(h>>7&0xff), int(h&0x7f), 7, 127
			}
			var want float64
			switch {
			case exp == 1<<(15-bits)-1 && mant != 0:
				want = math.NaN()
			case exp == 1<<(15-bits)-1:
				want = math.Inf(int(sign))
			case exp == 0:
				want = sign * math.Ldexp(float64(mant), 1-bias-bits)
			default:
				want = sign * math.Ldexp(float64(mant|1<<bits), exp-bias-bits)
			}
			got := dst[i]
			if math.IsNaN(want) != (got != got) || !math.IsNaN(want) && (float64(got) != want || math.Signbit(float64(got)) != (sign < 0)) {
				t.Fatalf("%v %#04x widens to %v (%#08x), want %v", elem, h, got, math.Float32bits(got), want)
			}
		}
	}
	if err := Widen(dst, src, Float32); err == nil {
		t.Error("Widen accepted f32 values")
	}
	if err := Widen(dst[:3], src[:4], Float16); err == nil {
		t.Error("Widen accepted a short destination")
	}
}

// TestKernelsWidenAsWiden multiplies every half value by 1 with each
// kernel: the kernels' widening (F16C's, or a shift) must give Widen's
// values, subnormals and infinities included. (1·w+0 turns -0 into +0 and
// quiets NaNs, which the comparison allows.)
func TestKernelsWidenAsWiden(t *testing.T) {
	if !Supported() {
		t.Skip(ErrUnsupported)
	}
	n := 1 << 16
	w := make([]uint16, n)
	for i := range w {
		w[i] = uint16(i)
	}
	packed, want := make([]uint16, n), make([]float32, n)
	if err := Pack16(packed, w, 1, n); err != nil {
		t.Fatal(err)
	}
	for _, elem := range halves {
		if err := Widen(want, w, elem); err != nil {
			t.Fatal(err)
		}
		for _, kn := range kernels() {
			got := make([]float32, n)
			if err := multiplyHalfWith(kn, []float32{1}, 1, 1, packed, elem, n, got); err != nil {
				t.Fatal(err)
			}
			for i := range want {
				if got[i] != want[i] && (got[i] == got[i] || want[i] == want[i]) {
					t.Fatalf("%s %v: 1·%#04x = %v, want %v", kn, elem, w[i], got[i], want[i])
				}
			}
		}
	}
}

// TestHalfKernelsMatchFloat32Kernels runs every kernel over fp16 and bf16
// strips in TestKernelsMatchReference's shapes: each must give the bits its
// float32 kernel gives over the widened strips, and so, on the small
// shapes, those of the fused reference (TestKernelsMatchReference checks
// the float32 kernels on the large ones), and stay near ReferenceHalf.
func TestHalfKernelsMatchFloat32Kernels(t *testing.T) {
	if !Supported() {
		t.Skip(ErrUnsupported)
	}
	rng := rand.New(rand.NewPCG(7, 8))
	shapes := []struct{ k, n int }{{1, 32}, {3, 64}, {7, 32}, {13, 512}, {17, 96}, {100, 96}, {600, 64},
		{512, 256}, {3456, 512}, {512, 3456}, {1024, 1024}}
	for _, sh := range shapes {
		ms, small := []int{1, 7, 13, 17}, sh.k*sh.n <= 1<<17
		if small {
			ms = []int{24, 32}
			for m := 1; m <= 17; m++ {
				ms = append(ms, m)
			}
		}
		for _, elem := range halves {
			w := randomHalves(rng, sh.k*sh.n, elem, true)
			packed, wide := make([]uint16, sh.k*sh.n), make([]float32, sh.k*sh.n)
			if err := Pack16(packed, w, sh.k, sh.n); err != nil {
				t.Fatal(err)
			}
			if err := Widen(wide, packed, elem); err != nil {
				t.Fatal(err)
			}
			for _, m := range ms {
				x := randomMatrix(rng, m*sh.k)
				want, fused := make([]float32, m*sh.n), make([]float32, m*sh.n)
				if err := ReferenceHalf(x, m, sh.k, packed, elem, sh.n, want); err != nil {
					t.Fatal(err)
				}
				if small {
					fusedReference(x, m, sh.k, wide, sh.n, fused)
				}
				tol := 1e-5 * math.Sqrt(float64(sh.k))
				for _, kn := range kernels() {
					wideOut := make([]float32, m*sh.n)
					if err := multiplyWith(kn, x, m, sh.k, wide, sh.n, wideOut); err != nil {
						t.Fatal(err)
					}
					got := make([]float32, m*sh.n+1)
					got[m*sh.n] = 42 // the kernel must not write past the product
					if err := multiplyHalfWith(kn, x, m, sh.k, packed, elem, sh.n, got); err != nil {
						t.Fatal(err)
					}
					for i := range want {
						if math.Float32bits(got[i]) != math.Float32bits(wideOut[i]) {
							t.Fatalf("%s %v m=%d k=%d n=%d: out[%d] = %v, float32 kernel over the widened weights %v", kn, elem, m, sh.k, sh.n, i, got[i], wideOut[i])
						}
						if small && got[i] != fused[i] {
							t.Fatalf("%s %v m=%d k=%d n=%d: out[%d] = %v, fused reference %v", kn, elem, m, sh.k, sh.n, i, got[i], fused[i])
						}
						if d := math.Abs(float64(got[i] - want[i])); d > tol {
							t.Fatalf("%s %v m=%d k=%d n=%d: out[%d] = %v, reference %v", kn, elem, m, sh.k, sh.n, i, got[i], want[i])
						}
					}
					if got[m*sh.n] != 42 {
						t.Fatalf("%s %v m=%d k=%d n=%d: the kernel wrote past its output", kn, elem, m, sh.k, sh.n)
					}
				}
			}
		}
	}
}

func TestMultiplyHalfRejectsBadArguments(t *testing.T) {
	x, w, out := make([]float32, 4), make([]uint16, 64), make([]float32, 64)
	for _, elem := range []Element{Float32, 3} {
		if err := ReferenceHalf(x, 2, 2, w, elem, 32, out); err == nil {
			t.Errorf("ReferenceHalf accepted weights of type %v", elem)
		}
	}
	if !Supported() {
		if err := MultiplyHalf(x, 2, 2, w, Float16, 32, out); err != ErrUnsupported {
			t.Errorf("MultiplyHalf without a kernel: err = %v, want ErrUnsupported", err)
		}
		t.Skip(ErrUnsupported)
	}
	for _, kn := range kernels() {
		for _, elem := range []Element{Float32, 3} {
			if err := multiplyHalfWith(kn, x, 2, 2, w, elem, 32, out); err == nil {
				t.Errorf("%s accepted half weights of type %v", kn, elem)
			}
		}
		if err := multiplyHalfWith(kn, x, 2, 2, w[:63], Float16, 32, out); err == nil {
			t.Errorf("%s accepted weights too few", kn)
		}
		if err := multiplyHalfWith(kn, x, 2, 2, w, BFloat16, 32, out[:63]); err == nil {
			t.Errorf("%s accepted an output too small", kn)
		}
	}
	for _, kn := range []kernel{kernelNone, kernelAVX2, kernelAVX512} {
		err := multiplyHalfWith(kn, x, 2, 2, w, Float16, 32, out)
		if runs := slices.Contains(kernels(), kn); runs != (err == nil) {
			t.Errorf("%s: err = %v, and this CPU runs it: %v", kn, err, runs)
		}
	}
}

// BenchmarkMultiplyHalf is BenchmarkMultiply over fp16 and bf16 weights,
// which stream half the bytes.
func BenchmarkMultiplyHalf(b *testing.B) {
	if !Supported() {
		b.Skip(ErrUnsupported)
	}
	rng := rand.New(rand.NewPCG(5, 6))
	type layer struct {
		k, n int
		w    []uint16
	}
	for _, elem := range halves {
		var layers []layer
		for _, kn := range [][2]int{{3456, 512}, {512, 3456}, {3456, 512}, {512, 3456}, {3456, 512}, {512, 3456},
			{3456, 1024}, {1024, 1024}, {1024, 512}} {
			layers = append(layers, layer{kn[0], kn[1], randomHalves(rng, kn[0]*kn[1], elem, false)})
		}
		for _, kn := range kernels() {
			for _, m := range []int{1, 16, 32, 64, 128} {
				b.Run(kn.String()+"/"+elem.String()+"/m="+strconv.Itoa(m), func(b *testing.B) {
					x, out := randomMatrix(rng, m*3456), make([]float32, m*3456)
					for b.Loop() {
						for _, l := range layers {
							if err := multiplyHalfWith(kn, x[:m*l.k], m, l.k, l.w, elem, l.n, out[:m*l.n]); err != nil {
								b.Fatal(err)
							}
						}
					}
					b.ReportMetric(float64(b.N)*float64(m)/b.Elapsed().Seconds(), "examples/s")
				})
			}
		}
	}
}

// TestPrefetch checks the AVX-512 kernel's prefetch distance: the CPU's
// default (8 KiB on AMD's, as /proc/cpuinfo names the vendor), what
// SetPrefetch refuses, and that no distance changes a bit of the product.
func TestPrefetch(t *testing.T) {
	if !Supported() {
		if err := SetPrefetch(4096); err != nil {
			t.Errorf("SetPrefetch without kernels: %v", err)
		}
		t.Skip(ErrUnsupported)
	}
	def := DefaultPrefetch()
	if Prefetch() != def {
		t.Fatalf("the kernel starts at %d bytes, its CPU's default is %d", Prefetch(), def)
	}
	t.Cleanup(func() {
		if err := SetPrefetch(0); err != nil {
			t.Error(err)
		}
	})
	if info, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		want := 2048
		if strings.Contains(string(info), "AuthenticAMD") {
			want = 8192
		}
		if def != want {
			t.Errorf("DefaultPrefetch() = %d on this CPU, want %d", def, want)
		}
	}
	for _, bad := range []int{-64, 63, 100, MaxPrefetch + 64} {
		if err := SetPrefetch(bad); err == nil || !strings.Contains(err.Error(), strconv.Itoa(bad)) {
			t.Errorf("SetPrefetch(%d): err = %v, want one naming the value", bad, err)
		}
		if Prefetch() != def {
			t.Fatalf("SetPrefetch(%d) was refused but moved the distance to %d", bad, Prefetch())
		}
	}
	if !slices.Contains(kernels(), kernelAVX512) {
		t.Skip("no AVX-512F: the distance is the AVX-512 kernel's")
	}
	rng := rand.New(rand.NewPCG(9, 10))
	const k, n = 3456, 512
	packed, half := make([]float32, k*n), make([]uint16, k*n)
	if err := Pack(packed, randomMatrix(rng, k*n), k, n); err != nil {
		t.Fatal(err)
	}
	if err := Pack16(half, randomHalves(rng, k*n, Float16, true), k, n); err != nil {
		t.Fatal(err)
	}
	for _, m := range []int{1, 13} {
		x := randomMatrix(rng, m*k)
		product := func(bytes int) (wide, narrow []float32) {
			if err := SetPrefetch(bytes); err != nil {
				t.Fatal(err)
			}
			wide, narrow = make([]float32, m*n), make([]float32, m*n)
			if err := multiplyWith(kernelAVX512, x, m, k, packed, n, wide); err != nil {
				t.Fatal(err)
			}
			if err := multiplyHalfWith(kernelAVX512, x, m, k, half, Float16, n, narrow); err != nil {
				t.Fatal(err)
			}
			return wide, narrow
		}
		wantWide, wantNarrow := product(0)
		if Prefetch() != def {
			t.Fatalf("SetPrefetch(0) left %d bytes, want the default %d", Prefetch(), def)
		}
		for _, bytes := range []int{64, 2048, MaxPrefetch} {
			wide, narrow := product(bytes)
			if Prefetch() != bytes {
				t.Fatalf("SetPrefetch(%d) left %d bytes", bytes, Prefetch())
			}
			for i := range wide {
				if math.Float32bits(wide[i]) != math.Float32bits(wantWide[i]) || math.Float32bits(narrow[i]) != math.Float32bits(wantNarrow[i]) {
					t.Fatalf("m=%d prefetching %d bytes: out[%d] = %v, %v (fp16), at the default %v, %v", m, bytes, i, wide[i], narrow[i], wantWide[i], wantNarrow[i])
				}
			}
		}
	}
}
