package lookup

import (
	"fmt"
	"strings"

	"github.com/recmesh/recmesh/model"
)

// kernel names one implementation of the pooling loop.
type kernel int

const (
	kernelGeneric kernel = iota // plain Go: the reference
	kernelAVX2                  // ymm accumulators: 16 per fp32 row, 8 per half row when dequantizing
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

// supported lists the kernels this CPU (and build) runs for fp32 tables,
// fastest first.
func supported() []kernel { return supportedFor(model.DtypeFP32) }

// best returns the fastest kernel this CPU runs for fp32 tables.
func best() kernel { return supported()[0] }

// bestFor returns the fastest kernel this CPU runs for tables stored at d.
// supportedFor (kernel_amd64.go, kernel_noasm.go) lists them, fastest
// first: on amd64 the AVX-512 and AVX2 kernels exist at every precision
// (the fp32 ones add rows as they are, the others dequantize each row as
// model.Dtype defines, bit-identical to dequant.go), and "generic" is
// always last.
func bestFor(d model.Dtype) kernel { return supportedFor(d)[0] }

// Kernel returns the name of the kernel NewTables selects on this CPU for
// fp32 tables: "avx512", "avx2" or "generic".
func Kernel() string { return best().String() }

// Kernels lists the names of the kernels this CPU (and build) can run for
// fp32 tables, fastest first; "generic" is always last.
func Kernels() []string {
	var names []string
	for _, k := range supported() {
		names = append(names, k.String())
	}
	return names
}

// Kernel returns the name of the kernel t pools with.
func (t *Tables) Kernel() string { return t.kernel.String() }

// Kernels lists the names of the kernels this CPU (and build) can run for
// t's precision, fastest first; "generic" is always last.
func (t *Tables) Kernels() []string {
	var names []string
	for _, k := range supportedFor(t.dtype) {
		names = append(names, k.String())
	}
	return names
}

// SetKernel makes t pool with the named kernel, one of t.Kernels(). Tests
// and benchmarks use it to compare kernels on one machine.
func (t *Tables) SetKernel(name string) error {
	for _, k := range supportedFor(t.dtype) {
		if k.String() == name {
			t.kernel = k
			return nil
		}
	}
	return fmt.Errorf("lookup: kernel %q not available for %s tables on this machine (have %s)",
		name, t.dtype, strings.Join(t.Kernels(), ", "))
}
