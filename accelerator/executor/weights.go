package executor

import (
	"fmt"
	"unsafe"

	"github.com/gomlx/gopjrt/pjrt"
	"golang.org/x/sys/unix"

	"github.com/recmesh/recmesh/accelerator/dcn"
	"github.com/recmesh/recmesh/accelerator/stripdot"
	"github.com/recmesh/recmesh/model"
)

// denseSource gives a dense tensor of the model (a name of
// Config.DenseParams) as the program's weights are made from it: its
// float32 values and, at a half dense precision, its stored halves (nil at
// fp32). A bundle is one source (bundleSource), new weights another
// (SwapWeights): both give the same arguments for the same weights.
type denseSource func(name string) (values []float32, halves []uint16, err error)

// bundleSource reads the weights of an open bundle.
func bundleSource(b *model.Bundle) denseSource {
	return func(name string) ([]float32, []uint16, error) {
		v, err := b.Tensor(name)
		if err != nil {
			return nil, nil, err
		}
		return v, b.ParamBits(name), nil
	}
}

// paramValues returns the bytes of every weight argument of the program
// (specs, what dcn.Params lists for cfg) out of src: float32 arguments
// from the values, sliced and packed as the program reads them, half
// packed twins from the stored halves.
func paramValues(cfg model.Config, specs []dcn.Param, src denseSource) ([][]byte, error) {
	want := make(map[string]int64)
	for _, s := range cfg.DenseParams() {
		want[s.Name] = s.Elements()
	}
	values := make([][]byte, len(specs))
	for i, p := range specs {
		data, bits, err := src(p.Tensor)
		if err != nil {
			return nil, fmt.Errorf("executor: %w", err)
		}
		if p.Element == stripdot.Float32 {
			if int64(len(data)) != want[p.Tensor] {
				return nil, fmt.Errorf("executor: tensor %s has %d values, want %d", p.Tensor, len(data), want[p.Tensor])
			}
			var v []float32
			v, err = p.Values(data)
			values[i] = asBytes(v)
		} else {
			if int64(len(bits)) != want[p.Tensor] {
				return nil, fmt.Errorf("executor: tensor %s has %d stored halves, want %d (dense_dtype %s)",
					p.Tensor, len(bits), want[p.Tensor], cfg.DenseDtype)
			}
			var v []uint16
			v, err = p.HalfValues(bits)
			values[i] = asBytes(v)
		}
		if err != nil {
			return nil, fmt.Errorf("executor: %w", err)
		}
	}
	return values, nil
}

// placeWeights makes the weight arguments' buffers out of values (the
// bytes of e.specs): views of a new mapping when e.inPlace, else buffers
// uploaded to the device. Nothing of e changes.
func (e *Executor) placeWeights(values [][]byte) (*hostWeights, []*pjrt.Buffer, error) {
	if e.inPlace {
		return mapWeights(e.rt.Client, e.specs, values)
	}
	bufs := make([]*pjrt.Buffer, len(e.specs))
	for i, p := range e.specs {
		buf, err := e.rt.Client.BufferFromHost().FromRawData(values[i], p.DType(), p.Shape).Done()
		if err != nil {
			destroyAll(bufs[:i])
			return nil, nil, fmt.Errorf("executor: upload %s: %w", p.Name, err)
		}
		bufs[i] = buf
	}
	return nil, bufs, nil
}

// destroyAll destroys every buffer of bufs that is not nil.
func destroyAll(bufs []*pjrt.Buffer) {
	for _, b := range bufs {
		if b != nil {
			b.Destroy()
		}
	}
}

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
			destroyAll(bufs[:i])
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
