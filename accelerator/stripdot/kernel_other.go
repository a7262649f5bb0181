//go:build !amd64 || !cgo

package stripdot

import "errors"

// Supported reports whether this build can run the kernel: only a cgo
// build for x86-64, on a CPU with AVX-512F, can.
func Supported() bool { return false }

// ErrUnsupported is returned where the CPU lacks the kernel's instructions.
var ErrUnsupported = errors.New("stripdot: the kernel needs a cgo build for x86-64 and AVX-512F")

// Multiply is unavailable off x86-64.
func Multiply(x []float32, m, k int, packed []float32, n int, out []float32) error {
	return ErrUnsupported
}

// Register is unavailable off x86-64.
func Register(pluginPath string) error { return ErrUnsupported }
