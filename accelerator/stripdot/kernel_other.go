//go:build !amd64 || !cgo

package stripdot

import "errors"

// ErrUnsupported is returned where the build or the CPU cannot run the
// kernels.
var ErrUnsupported = errors.New("stripdot: the kernel needs a cgo build for x86-64 and AVX-512F, or AVX2, FMA and F16C")

// kernels lists none: the kernels are C for x86-64, called through cgo.
func kernels() []kernel { return nil }

func multiply(kn kernel, x []float32, m, k int, packed []float32, n int, out []float32) {
	panic("stripdot: multiply with " + kn.String() + " in a build without kernels")
}

func multiplyHalf(kn kernel, x []float32, m, k int, packed []uint16, elem Element, n int, out []float32) {
	panic("stripdot: multiply " + elem.String() + " with " + kn.String() + " in a build without kernels")
}

func register(pluginPath, target string, kn kernel) error {
	panic("stripdot: register " + kn.String() + " in a build without kernels")
}

// Without kernels there is no prefetch to set: SetPrefetch only checks.
func setPrefetch(bytes int) {}

func prefetch() int { return 0 }

func defaultPrefetch() int { return 0 }
