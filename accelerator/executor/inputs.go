package executor

import (
	"fmt"
	"unsafe"

	"github.com/gomlx/gopjrt/pjrt"
	"golang.org/x/sys/unix"

	"github.com/recmesh/recmesh/model"
)

// Inputs is a host memory region laid out by model.Config.Staging: the
// embedder writes a batch there and Run reads it. The memory must live
// outside the Go heap (a shared-memory staging buffer or an anonymous
// mapping), because on the CPU plugin the executables keep reading it
// through views created once per bucket.
type Inputs struct {
	mem    []byte
	layout model.StagingLayout
	rows   int
	dense  []float32
	pooled []float32
	views  [][2]*pjrt.Buffer
	unmap  bool
}

// NewInputs wraps mem (at least cfg.Staging(rows).Size bytes, 64-byte
// aligned, not Go-heap memory) as the input region of up to rows examples.
func (e *Executor) NewInputs(mem []byte, rows int) (*Inputs, error) {
	if rows <= 0 {
		return nil, fmt.Errorf("executor: input region of %d rows", rows)
	}
	layout := e.cfg.Staging(rows)
	if len(mem) < layout.Size {
		return nil, fmt.Errorf("executor: input region has %d bytes, %d rows need %d", len(mem), rows, layout.Size)
	}
	if uintptr(unsafe.Pointer(&mem[0]))%pjrt.BufferAlignment != 0 {
		return nil, fmt.Errorf("executor: input region is not %d-byte aligned", pjrt.BufferAlignment)
	}
	in := &Inputs{mem: mem, layout: layout, rows: rows}
	in.pooled = unsafe.Slice((*float32)(unsafe.Pointer(&mem[layout.PooledOffset])), rows*len(e.cfg.VocabSizes)*e.cfg.EmbeddingDim)
	in.dense = unsafe.Slice((*float32)(unsafe.Pointer(&mem[layout.DenseOffset])), rows*e.cfg.NumDense)
	if e.zeroCopy {
		for _, b := range e.buckets {
			if b > rows {
				break
			}
			d, err := e.rt.Client.CreateViewOfDeviceBuffer(unsafe.Pointer(&in.dense[0]), f32, []int{b, e.cfg.NumDense})
			if err != nil {
				in.Close()
				return nil, fmt.Errorf("executor: view dense rows of bucket %d: %w", b, err)
			}
			p, err := e.rt.Client.CreateViewOfDeviceBuffer(unsafe.Pointer(&in.pooled[0]), f32, []int{b, len(e.cfg.VocabSizes), e.cfg.EmbeddingDim})
			if err != nil {
				d.Destroy()
				in.Close()
				return nil, fmt.Errorf("executor: view pooled rows of bucket %d: %w", b, err)
			}
			in.views = append(in.views, [2]*pjrt.Buffer{d, p})
		}
	}
	return in, nil
}

// NewHostInputs allocates a private input region (an anonymous mapping).
func (e *Executor) NewHostInputs(rows int) (*Inputs, error) {
	size := e.cfg.Staging(rows).Size
	mem, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, fmt.Errorf("executor: map %d-byte input region: %w", size, err)
	}
	in, err := e.NewInputs(mem, rows)
	if err != nil {
		_ = unix.Munmap(mem)
		return nil, err
	}
	in.unmap = true
	return in, nil
}

// Rows is the capacity of the region in examples.
func (in *Inputs) Rows() int { return in.rows }

// Dense is the [Rows, NumDense] array.
func (in *Inputs) Dense() []float32 { return in.dense }

// Pooled is the [Rows, tables, dim] array.
func (in *Inputs) Pooled() []float32 { return in.pooled }

// copyToDevice transfers the first bucket rows, for plugins that cannot read
// host memory in place.
func (in *Inputs) copyToDevice(c *pjrt.Client, cfg model.Config, bucket int) (dense, pooled *pjrt.Buffer, err error) {
	if bucket > in.rows {
		return nil, nil, fmt.Errorf("executor: bucket %d exceeds the input region's %d rows", bucket, in.rows)
	}
	db := in.mem[in.layout.DenseOffset : in.layout.DenseOffset+bucket*cfg.NumDense*4]
	dense, err = c.BufferFromHost().FromRawData(db, f32, []int{bucket, cfg.NumDense}).Done()
	if err != nil {
		return nil, nil, fmt.Errorf("executor: copy dense rows: %w", err)
	}
	pb := in.mem[in.layout.PooledOffset : in.layout.PooledOffset+bucket*len(cfg.VocabSizes)*cfg.EmbeddingDim*4]
	pooled, err = c.BufferFromHost().FromRawData(pb, f32, []int{bucket, len(cfg.VocabSizes), cfg.EmbeddingDim}).Done()
	if err != nil {
		dense.Destroy()
		return nil, nil, fmt.Errorf("executor: copy pooled rows: %w", err)
	}
	return dense, pooled, nil
}

// Close destroys the views and, for a private region, unmaps it. The
// caller must not Run with it afterwards.
func (in *Inputs) Close() {
	for _, v := range in.views {
		v[0].Destroy()
		v[1].Destroy()
	}
	in.views = nil
	if in.unmap && in.mem != nil {
		_ = unix.Munmap(in.mem)
	}
	in.mem = nil
}

// CopyRows copies the first n examples' dense and pooled rows from src, a
// region laid out as in's (a staging buffer of the same rows), into in. The
// accelerator runs batches from a private copy so the device never reads
// memory another process can pull away: XLA's threads are not Go's, and a
// fault there (the segment file truncated under the mapping) would kill
// the process. Run the copy under shm.GuardFaults.
func (in *Inputs) CopyRows(src []byte, n int) error {
	if n < 0 || n > in.rows {
		return fmt.Errorf("executor: copy %d rows into a region of %d", n, in.rows)
	}
	if len(src) < in.layout.Size {
		return fmt.Errorf("executor: source region has %d bytes, the layout needs %d", len(src), in.layout.Size)
	}
	denseBytes := n * len(in.dense) / in.rows * 4
	pooledBytes := n * len(in.pooled) / in.rows * 4
	copy(in.mem[in.layout.DenseOffset:in.layout.DenseOffset+denseBytes], src[in.layout.DenseOffset:in.layout.DenseOffset+denseBytes])
	copy(in.mem[in.layout.PooledOffset:in.layout.PooledOffset+pooledBytes], src[in.layout.PooledOffset:in.layout.PooledOffset+pooledBytes])
	return nil
}
