package stripdot

import (
	"math"
	"math/rand/v2"
	"strconv"
	"testing"
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

// TestMultiplyMatchesReference runs the kernel over every row-block
// remainder and a few depths, including the DLRM-DCNv2 shapes.
func TestMultiplyMatchesReference(t *testing.T) {
	if !Supported() {
		t.Skip("CPU without AVX-512F: the kernel is never registered here")
	}
	rng := rand.New(rand.NewPCG(3, 4))
	shapes := []struct{ k, n int }{{1, 32}, {13, 512}, {100, 96}, {600, 64}, {3456, 512}, {512, 3456}}
	for _, sh := range shapes {
		for _, m := range []int{1, 2, 3, 5, 8, 11, 12, 13, 16, 25, 32} {
			if sh.k*sh.n > 1<<20 && m > 16 {
				continue
			}
			x, w := randomMatrix(rng, m*sh.k), randomMatrix(rng, sh.k*sh.n)
			packed := make([]float32, sh.k*sh.n)
			if err := Pack(packed, w, sh.k, sh.n); err != nil {
				t.Fatal(err)
			}
			want, got := make([]float32, m*sh.n), make([]float32, m*sh.n+1)
			got[m*sh.n] = 42 // the kernel must not write past the product
			if err := Reference(x, m, sh.k, packed, sh.n, want); err != nil {
				t.Fatal(err)
			}
			if err := Multiply(x, m, sh.k, packed, sh.n, got); err != nil {
				t.Fatal(err)
			}
			tol := 1e-5 * math.Sqrt(float64(sh.k)) // summation order differs
			for i := range want {
				if d := math.Abs(float64(got[i] - want[i])); d > tol {
					t.Fatalf("m=%d k=%d n=%d: out[%d] = %v, reference %v", m, sh.k, sh.n, i, got[i], want[i])
				}
			}
			if got[m*sh.n] != 42 {
				t.Fatalf("m=%d k=%d n=%d: the kernel wrote past its output", m, sh.k, sh.n)
			}
		}
	}
}

func TestMultiplyRejectsShortSlices(t *testing.T) {
	if !Supported() {
		t.Skip("CPU without AVX-512F")
	}
	if err := Multiply(make([]float32, 3), 2, 2, make([]float32, 64), 32, make([]float32, 64)); err == nil {
		t.Error("Multiply accepted an x with 3 values for a [2,2] input")
	}
	if err := Multiply(make([]float32, 4), 2, 2, make([]float32, 64), 32, make([]float32, 63)); err == nil {
		t.Error("Multiply accepted an output too small")
	}
}

// BenchmarkMultiply runs the products of one DCNv2 forward pass of the
// MLPerf network whose widths are multiples of 32 (three low-rank cross
// layers over 3456 features, then the top MLP's first layers), each with its
// own weights, at the buckets the accelerator runs.
func BenchmarkMultiply(b *testing.B) {
	if !Supported() {
		b.Skip("CPU without AVX-512F")
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
	for _, m := range []int{1, 16, 32, 64, 128} {
		b.Run("m="+strconv.Itoa(m), func(b *testing.B) {
			x, out := randomMatrix(rng, m*3456), make([]float32, m*3456)
			for b.Loop() {
				for _, l := range layers {
					if err := Multiply(x[:m*l.k], m, l.k, l.w, l.n, out[:m*l.n]); err != nil {
						b.Fatal(err)
					}
				}
			}
			b.ReportMetric(float64(b.N)*float64(m)/b.Elapsed().Seconds(), "examples/s")
		})
	}
}
