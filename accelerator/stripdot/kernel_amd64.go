package stripdot

// #include <stdlib.h>
// #include "stripdot.h"
import "C"

import (
	"errors"
	"fmt"
	"unsafe"

	"golang.org/x/sys/cpu"
)

// ErrUnsupported is returned where the CPU lacks the kernels' instructions.
var ErrUnsupported = errors.New("stripdot: the kernel needs AVX-512F, or AVX2, FMA and F16C")

// available lists the kernels this CPU runs, fastest first. The CPU's
// features do not change while the process runs.
var available = func() []kernel {
	var ks []kernel
	if cpu.X86.HasAVX512F {
		ks = append(ks, kernelAVX512)
	}
	// Every AVX2 CPU made so far has FMA and F16C too, but a hypervisor may
	// hide them. AVX-512F has its own VCVTPH2PS; the AVX2 kernel needs F16C's
	// for fp16 strips.
	if cpu.X86.HasAVX2 && cpu.X86.HasFMA && cpu.X86.HasF16C {
		ks = append(ks, kernelAVX2)
	}
	return ks
}()

func kernels() []kernel { return available }

// multiply runs kn, which check accepted, on arguments checkShapes accepted.
func multiply(kn kernel, x []float32, m, k int, packed []float32, n int, out []float32) {
	xp, pp, op := (*C.float)(unsafe.Pointer(&x[0])), (*C.float)(unsafe.Pointer(&packed[0])), (*C.float)(unsafe.Pointer(&out[0]))
	switch kn {
	case kernelAVX512:
		C.stripdot_multiply_avx512(xp, C.int64_t(m), C.int64_t(k), pp, C.int64_t(n), op)
	case kernelAVX2:
		C.stripdot_multiply_avx2(xp, C.int64_t(m), C.int64_t(k), pp, C.int64_t(n), op)
	default:
		panic("stripdot: multiply with " + kn.String())
	}
}

// multiplyHalf runs kn over half weights of type elem, which checkHalf
// accepted, on arguments checkShapes accepted.
func multiplyHalf(kn kernel, x []float32, m, k int, packed []uint16, elem Element, n int, out []float32) {
	xp, pp, op := (*C.float)(unsafe.Pointer(&x[0])), (*C.uint16_t)(unsafe.Pointer(&packed[0])), (*C.float)(unsafe.Pointer(&out[0]))
	switch {
	case kn == kernelAVX512 && elem == Float16:
		C.stripdot_multiply_avx512_f16(xp, C.int64_t(m), C.int64_t(k), pp, C.int64_t(n), op)
	case kn == kernelAVX512 && elem == BFloat16:
		C.stripdot_multiply_avx512_bf16(xp, C.int64_t(m), C.int64_t(k), pp, C.int64_t(n), op)
	case kn == kernelAVX2 && elem == Float16:
		C.stripdot_multiply_avx2_f16(xp, C.int64_t(m), C.int64_t(k), pp, C.int64_t(n), op)
	case kn == kernelAVX2 && elem == BFloat16:
		C.stripdot_multiply_avx2_bf16(xp, C.int64_t(m), C.int64_t(k), pp, C.int64_t(n), op)
	default:
		panic("stripdot: multiply " + elem.String() + " with " + kn.String())
	}
}

// register registers the handler running kn, which check accepted.
func register(pluginPath, target string, kn kernel) error {
	var ck C.int
	switch kn {
	case kernelAVX512:
		ck = C.STRIPDOT_AVX512
	case kernelAVX2:
		ck = C.STRIPDOT_AVX2
	default:
		panic("stripdot: register " + kn.String())
	}
	cpath, ctarget := C.CString(pluginPath), C.CString(target)
	defer C.free(unsafe.Pointer(cpath))
	defer C.free(unsafe.Pointer(ctarget))
	if msg := C.stripdot_register(cpath, ctarget, ck); msg != nil {
		defer C.free(unsafe.Pointer(msg))
		return fmt.Errorf("stripdot: register the %s kernel as %s: %s", kn, target, C.GoString(msg))
	}
	return nil
}

// setPrefetch sets the AVX-512 kernel's prefetch distance in bytes.
func setPrefetch(bytes int) { C.stripdot_set_prefetch(C.int64_t(bytes)) }

// prefetch returns the AVX-512 kernel's prefetch distance in bytes.
func prefetch() int { return int(C.stripdot_prefetch()) }

// defaultPrefetch is the prefetch distance this CPU gets (see the C side).
func defaultPrefetch() int { return int(C.stripdot_default_prefetch()) }

// The kernel starts with its CPU's distance.
func init() { setPrefetch(defaultPrefetch()) }
