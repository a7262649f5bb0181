//go:build amd64 && gc && !noasm

package lookup

import (
	"unsafe"

	"golang.org/x/sys/cpu"

	"github.com/recmesh/recmesh/model"
)

//go:generate sh -c "cd _generate && GOWORK=off go run . -out ../pool_amd64.s -stubs ../pool_amd64_stubs.go -pkg lookup"

// supportedFor lists the kernels this CPU runs for tables stored at d,
// fastest first. The fp32 kernels need AVX-512F or AVX2 alone; the
// dequantizing ones also widen halves (F16C: the fp16 rows and the int4
// scale and bias) and the AVX-512 ones use AVX2's word broadcast, which
// every AVX-512 CPU has.
func supportedFor(d model.Dtype) []kernel {
	x := &cpu.X86
	avx512, avx2 := x.HasAVX512F, x.HasAVX2
	if d.String() != string(model.DtypeFP32) {
		avx512 = avx512 && x.HasAVX2 && x.HasF16C
		avx2 = avx2 && x.HasF16C
	}
	ks := make([]kernel, 0, 3)
	if avx512 {
		ks = append(ks, kernelAVX512)
	}
	if avx2 {
		ks = append(ks, kernelAVX2)
	}
	return append(ks, kernelGeneric)
}

// pool runs kernel k on n examples whose ids are already checked; out and
// ids are long enough (Tables.check), and k runs t's precision
// (supportedFor).
func (k kernel) pool(t *Tables, out []float32, ids []int32, n int) {
	// bases and pos hold unsafe.Pointers; the kernels read them as
	// addresses. t keeps the tables alive for the duration of the call.
	bases := (*uintptr)(unsafe.Pointer(unsafe.SliceData(t.bases)))
	pos := (*uintptr)(unsafe.Pointer(unsafe.SliceData(t.pos)))
	dist := t.PrefetchRows()
	switch k {
	case kernelAVX512:
		poolAVX512(unsafe.SliceData(out), unsafe.SliceData(ids), n, bases,
			unsafe.SliceData(t.hot), len(t.hot), pos, t.width, dist, t.prec)
	case kernelAVX2:
		poolAVX2(unsafe.SliceData(out), unsafe.SliceData(ids), n, bases,
			unsafe.SliceData(t.hot), len(t.hot), pos, t.width, dist, t.prec)
	default:
		poolGeneric(t, out, ids, n)
	}
}
