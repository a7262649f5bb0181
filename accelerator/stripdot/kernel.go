package stripdot

import (
	"fmt"
	"slices"
)

// kernel names one implementation of the product.
type kernel int

const (
	kernelNone   kernel = iota // none runs here: Supported is false
	kernelAVX2                 // 16-column half strips, two ymm registers a row (AVX2 and FMA)
	kernelAVX512               // whole strips, two zmm registers a row (AVX-512F)
)

func (k kernel) String() string {
	switch k {
	case kernelNone:
		return "none"
	case kernelAVX2:
		return "avx2"
	case kernelAVX512:
		return "avx512"
	}
	return fmt.Sprintf("kernel(%d)", int(k))
}

// best returns the kernel Multiply and Register use. kernels
// (kernel_amd64.go, kernel_other.go) lists those this build and CPU run,
// fastest first.
func best() kernel {
	if ks := kernels(); len(ks) > 0 {
		return ks[0]
	}
	return kernelNone
}

// Supported reports whether this build and CPU run a kernel: a cgo build
// for x86-64 does, on a CPU with AVX-512F or with AVX2, FMA and F16C.
func Supported() bool { return best() != kernelNone }

// Kernel returns the name of the kernel Multiply and Register use on this
// CPU: "avx512", "avx2", or "none" where Supported is false.
func Kernel() string { return best().String() }

// check says why kn cannot run here, if it cannot.
func check(kn kernel) error {
	switch {
	case kn == kernelNone:
		return ErrUnsupported
	case !slices.Contains(kernels(), kn):
		// Only tests name a kernel other than best's.
		return fmt.Errorf("stripdot: this CPU cannot run the %s kernel", kn)
	}
	return nil
}

// Multiply computes the same product as Reference with the kernel the
// custom call runs (Kernel). Every kernel computes each output as one
// chain of fused multiply-adds in Reference's order, so they agree with
// each other bit for bit, and with Reference up to the rounding of the
// products that Reference rounds and the kernels fuse.
func Multiply(x []float32, m, k int, packed []float32, n int, out []float32) error {
	return multiplyWith(best(), x, m, k, packed, n, out)
}

// multiplyWith is Multiply with kernel kn, which tests choose.
func multiplyWith(kn kernel, x []float32, m, k int, packed []float32, n int, out []float32) error {
	if err := check(kn); err != nil {
		return err
	}
	if err := checkShapes(x, m, k, packed, n, out); err != nil {
		return err
	}
	multiply(kn, x, m, k, packed, n, out)
	return nil
}

// MultiplyHalf is Multiply for half weights of type elem (Float16 or
// BFloat16): it computes the bits Multiply computes over the weights
// widened by Widen, while reading half the bytes.
func MultiplyHalf(x []float32, m, k int, packed []uint16, elem Element, n int, out []float32) error {
	return multiplyHalfWith(best(), x, m, k, packed, elem, n, out)
}

// multiplyHalfWith is MultiplyHalf with kernel kn, which tests choose.
func multiplyHalfWith(kn kernel, x []float32, m, k int, packed []uint16, elem Element, n int, out []float32) error {
	if err := check(kn); err != nil {
		return err
	}
	if err := checkHalf(elem); err != nil {
		return err
	}
	if err := checkShapes(x, m, k, packed, n, out); err != nil {
		return err
	}
	multiplyHalf(kn, x, m, k, packed, elem, n, out)
	return nil
}

// Register registers the handler as Target for the "Host" platform with the
// PJRT plugin loaded from pluginPath (it must be loaded already: Register
// finds the plugin's API through the loaded library). Programs compiled
// afterwards may call Target, which runs the kernel Kernel names.
//
// The registration arguments are those of xla-cpu-pjrt 0.0.1 (PJRT C API
// 0.81); callers check the plugin's version first, since a plugin with a
// different layout would read the handler from the wrong field.
func Register(pluginPath string) error { return registerAs(pluginPath, Target, best()) }

// registerAs is Register with kernel kn under the name target, which tests
// choose.
func registerAs(pluginPath, target string, kn kernel) error {
	if err := check(kn); err != nil {
		return err
	}
	return register(pluginPath, target, kn)
}

// MaxPrefetch is the largest distance SetPrefetch accepts: far beyond any
// measured optimum, and small against a strip of the networks served.
const MaxPrefetch = 64 << 10

// SetPrefetch sets how many bytes of a strip the AVX-512 kernel fetches
// ahead of use, a multiple of 64 up to MaxPrefetch; 0 restores this CPU's
// default (DefaultPrefetch). The distance is the process's, like the
// kernel registered with the plugin, so it is set at start-up, before any
// product or program runs: changing it while one does is a data race. It
// changes no result, only speed.
func SetPrefetch(bytes int) error {
	if bytes < 0 || bytes > MaxPrefetch || bytes%64 != 0 {
		return fmt.Errorf("stripdot: prefetch distance %d bytes: want 0 (this CPU's default) or a multiple of 64 up to %d", bytes, MaxPrefetch)
	}
	if bytes == 0 {
		bytes = defaultPrefetch()
	}
	setPrefetch(bytes)
	return nil
}

// Prefetch returns the AVX-512 kernel's prefetch distance in bytes (0 in a
// build without kernels).
func Prefetch() int { return prefetch() }

// DefaultPrefetch returns the distance the AVX-512 kernel starts with on
// this CPU: 8 KiB on AMD's, 2 KiB on others (the C side says what was
// measured).
func DefaultPrefetch() int { return defaultPrefetch() }
