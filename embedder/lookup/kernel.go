package lookup

import (
	"fmt"
	"strings"
)

// kernel names one implementation of the pooling loop.
type kernel int

const (
	kernelGeneric kernel = iota // plain Go: the reference
	kernelAVX2                  // 16 ymm accumulators per row
	kernelAVX512                // 8 zmm accumulators per row
)

func (k kernel) String() string {
	switch k {
	case kernelGeneric:
		return "generic"
	case kernelAVX2:
		return "avx2"
	case kernelAVX512:
		return "avx512"
	}
	return fmt.Sprintf("kernel(%d)", int(k))
}

// best returns the fastest kernel this CPU runs.
func best() kernel { return supported()[0] }

// Kernel returns the name of the kernel NewTables selects on this CPU:
// "avx512", "avx2" or "generic".
func Kernel() string { return best().String() }

// Kernels lists the names of the kernels this CPU (and build) can run,
// fastest first; "generic" is always last.
func Kernels() []string {
	var names []string
	for _, k := range supported() {
		names = append(names, k.String())
	}
	return names
}

// Kernel returns the name of the kernel t pools with.
func (t *Tables) Kernel() string { return t.kernel.String() }

// SetKernel makes t pool with the named kernel, one of Kernels(). Tests
// and benchmarks use it to compare kernels on one machine.
func (t *Tables) SetKernel(name string) error {
	for _, k := range supported() {
		if k.String() == name {
			t.kernel = k
			return nil
		}
	}
	return fmt.Errorf("lookup: kernel %q not available on this machine (have %s)", name, strings.Join(Kernels(), ", "))
}
