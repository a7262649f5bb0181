package executor

import (
	"fmt"
	"unsafe"

	"github.com/gomlx/gopjrt/pjrt"
	"golang.org/x/sys/unix"

	"github.com/recmesh/recmesh/accelerator/dcn"
)

// hugePage is the size of a transparent huge page on x86-64 and arm64
// (4 KiB base pages).
const hugePage = 2 << 20

// hostWeights holds the dense weights in one anonymous mapping that the CPU
// plugin reads in place through views: the mapping is advised to use
// transparent huge pages, so the ~64 MB a small batch streams through per
// call cost a few dozen TLB entries instead of ~16k. (Weights uploaded with
// BufferFromHost live in the plugin's own allocations, which get huge pages
// only when the system's THP mode is "always".)
type hostWeights struct {
	mem []byte
}

// layoutWeights returns the offset of every parameter in the mapping and
// its size: each starts on a 4 KiB boundary (the views need 64 bytes).
func layoutWeights(params []dcn.Param) (offsets []int, size int) {
	offsets = make([]int, len(params))
	for i, p := range params {
		offsets[i] = size
		size += (p.Bytes() + 4095) &^ 4095
	}
	return offsets, size
}

// mapWeights copies the parameters (values[i], the bytes of params[i])
// into a new mapping and returns views of it.
func mapWeights(c *pjrt.Client, params []dcn.Param, values [][]byte) (*hostWeights, []*pjrt.Buffer, error) {
	for i, p := range params {
		if len(values[i]) != p.Bytes() {
			return nil, nil, fmt.Errorf("executor: %s has %d bytes, want %d", p.Name, len(values[i]), p.Bytes())
		}
	}
	offsets, size := layoutWeights(params)
	// Round up so the huge-page hint can cover the whole mapping.
	size = (size + hugePage - 1) &^ (hugePage - 1)
	mem, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, nil, fmt.Errorf("executor: map %d bytes of weights: %w", size, err)
	}
	w := &hostWeights{mem: mem}
	_ = unix.Madvise(mem, unix.MADV_HUGEPAGE) // a hint: refused (THP off) is fine
	bufs := make([]*pjrt.Buffer, len(params))
	for i, p := range params {
		dst := mem[offsets[i] : offsets[i]+p.Bytes()]
		copy(dst, values[i])
		bufs[i], err = c.CreateViewOfDeviceBuffer(unsafe.Pointer(&dst[0]), p.DType(), p.Shape)
		if err != nil {
			for _, b := range bufs[:i] {
				b.Destroy()
			}
			w.unmap()
			return nil, nil, fmt.Errorf("executor: view of %s: %w", p.Name, err)
		}
	}
	return w, bufs, nil
}

// asBytes is the memory of v, for copying into the mapping or uploading.
func asBytes[T float32 | uint16](v []T) []byte {
	if len(v) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&v[0])), len(v)*int(unsafe.Sizeof(v[0])))
}

// unmap releases the mapping; every view of it must be destroyed first.
func (w *hostWeights) unmap() {
	if w != nil && w.mem != nil {
		_ = unix.Munmap(w.mem)
		w.mem = nil
	}
}
