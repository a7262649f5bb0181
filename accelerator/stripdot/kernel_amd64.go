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

// Supported reports whether this CPU can run the kernel (AVX-512F).
func Supported() bool { return cpu.X86.HasAVX512F }

// ErrUnsupported is returned where the CPU lacks the kernel's instructions.
var ErrUnsupported = errors.New("stripdot: the kernel needs AVX-512F")

// Multiply computes the same product as Reference with the AVX-512 kernel,
// the code the custom call runs.
func Multiply(x []float32, m, k int, packed []float32, n int, out []float32) error {
	if !Supported() {
		return ErrUnsupported
	}
	if err := checkShapes(x, m, k, packed, n, out); err != nil {
		return err
	}
	C.stripdot_multiply((*C.float)(unsafe.Pointer(&x[0])), C.int64_t(m), C.int64_t(k),
		(*C.float)(unsafe.Pointer(&packed[0])), C.int64_t(n), (*C.float)(unsafe.Pointer(&out[0])))
	return nil
}

// Register registers the handler as Target for the "Host" platform with the
// PJRT plugin loaded from pluginPath (it must be loaded already: Register
// finds the plugin's API through the loaded library). Programs compiled
// afterwards may call Target.
//
// The registration arguments are those of xla-cpu-pjrt 0.0.1 (PJRT C API
// 0.81); callers check the plugin's version first, since a plugin with a
// different layout would read the handler from the wrong field.
func Register(pluginPath string) error {
	if !Supported() {
		return ErrUnsupported
	}
	cpath, ctarget := C.CString(pluginPath), C.CString(Target)
	defer C.free(unsafe.Pointer(cpath))
	defer C.free(unsafe.Pointer(ctarget))
	if msg := C.stripdot_register(cpath, ctarget); msg != nil {
		defer C.free(unsafe.Pointer(msg))
		return fmt.Errorf("stripdot: %s", C.GoString(msg))
	}
	return nil
}
