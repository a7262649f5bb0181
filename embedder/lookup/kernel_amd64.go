//go:build amd64 && gc && !noasm

package lookup

import (
	"unsafe"

	"golang.org/x/sys/cpu"
)

//go:generate sh -c "cd _generate && GOWORK=off go run . -out ../pool_amd64.s -stubs ../pool_amd64_stubs.go -pkg lookup"

// supported lists the kernels this CPU runs, fastest first.
func supported() []kernel {
	ks := make([]kernel, 0, 3)
	if cpu.X86.HasAVX512F {
		ks = append(ks, kernelAVX512)
	}
	if cpu.X86.HasAVX2 {
		ks = append(ks, kernelAVX2)
	}
	return append(ks, kernelGeneric)
}

// pool runs kernel k on n examples whose ids are already checked; out and
// ids are long enough (Tables.check).
func (k kernel) pool(t *Tables, out []float32, ids []int32, n int) {
	// bases and pos hold unsafe.Pointers; the kernels read them as
	// addresses. t keeps the tables alive for the duration of the call.
	bases := (*uintptr)(unsafe.Pointer(unsafe.SliceData(t.bases)))
	pos := (*uintptr)(unsafe.Pointer(unsafe.SliceData(t.pos)))
	switch k {
	case kernelAVX512:
		poolAVX512(unsafe.SliceData(out), unsafe.SliceData(ids), n, bases,
			unsafe.SliceData(t.hot), len(t.hot), pos, t.width, t.dist)
	case kernelAVX2:
		poolAVX2(unsafe.SliceData(out), unsafe.SliceData(ids), n, bases,
			unsafe.SliceData(t.hot), len(t.hot), pos, t.width, t.dist)
	default:
		poolGeneric(t, out, ids, n)
	}
}
