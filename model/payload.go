package model

import (
	"encoding/binary"
	"fmt"
	"math"
	"unsafe"
)

// RequestPayload is one request's payload as its arrays, laid out by
// RequestLayout: Dense [Examples, NumDense] float32, then Sparse
// [Examples, SparseWidth] int32 ids, both native-endian.
type RequestPayload struct {
	Dense  []float32
	Sparse []int32
}

// Payload views b, the payload of a request of l.Examples examples, as its
// arrays in place. The frontend fills them (its encoder) and the embedder
// reads them (its decoder) through this one function, so the two cannot
// place the arrays differently. It fails with ErrBadPayload unless b is
// exactly l.Size bytes starting on a 4-byte boundary: the bytes come from
// shared memory another process located, and a misaligned *int32 or
// *float32 is invalid in Go (checkptr rejects it) even where the CPU
// tolerates it. The views alias b; the caller copies what it must not see
// change.
//
// DecodePayload and EncodePayload are the plain Go reference of the same
// layout, byte by byte.
func (l RequestLayout) Payload(b []byte) (RequestPayload, error) {
	if err := l.check(len(b)); err != nil {
		return RequestPayload{}, err
	}
	if l.Size == 0 {
		return RequestPayload{Dense: []float32{}, Sparse: []int32{}}, nil
	}
	p := unsafe.Pointer(unsafe.SliceData(b))
	if uintptr(p)%4 != 0 {
		return RequestPayload{}, fmt.Errorf("%w: payload at address %#x is not 4-byte aligned", ErrBadPayload, uintptr(p))
	}
	dense, sparse := l.SparseOffset/4, (l.Size-l.SparseOffset)/4
	return RequestPayload{
		Dense:  unsafe.Slice((*float32)(p), dense),
		Sparse: unsafe.Slice((*int32)(unsafe.Add(p, l.SparseOffset)), sparse),
	}, nil
}

// check validates a payload of n bytes against the layout.
func (l RequestLayout) check(n int) error {
	if n != l.Size || l.SparseOffset < 0 || l.SparseOffset > l.Size || l.SparseOffset%4 != 0 || l.Size%4 != 0 {
		return fmt.Errorf("%w: %d bytes for %d examples, the layout needs %d", ErrBadPayload, n, l.Examples, l.Size)
	}
	return nil
}

// EncodePayload writes dense and sparse into b as Payload lays them out,
// without unsafe: the reference Payload's views are tested against.
func (l RequestLayout) EncodePayload(b []byte, p RequestPayload) error {
	if err := l.check(len(b)); err != nil {
		return err
	}
	if 4*len(p.Dense) != l.SparseOffset || 4*len(p.Sparse) != l.Size-l.SparseOffset {
		return fmt.Errorf("%w: %d dense values and %d ids for %d examples", ErrBadPayload, len(p.Dense), len(p.Sparse), l.Examples)
	}
	for i, v := range p.Dense {
		binary.NativeEndian.PutUint32(b[4*i:], math.Float32bits(v))
	}
	for i, v := range p.Sparse {
		binary.NativeEndian.PutUint32(b[l.SparseOffset+4*i:], uint32(v))
	}
	return nil
}

// DecodePayload is the plain Go reference of Payload: it copies the arrays
// out of b byte by byte, whatever b's alignment.
func (l RequestLayout) DecodePayload(b []byte) (RequestPayload, error) {
	if err := l.check(len(b)); err != nil {
		return RequestPayload{}, err
	}
	p := RequestPayload{Dense: make([]float32, l.SparseOffset/4), Sparse: make([]int32, (l.Size-l.SparseOffset)/4)}
	for i := range p.Dense {
		p.Dense[i] = math.Float32frombits(binary.NativeEndian.Uint32(b[4*i:]))
	}
	for i := range p.Sparse {
		p.Sparse[i] = int32(binary.NativeEndian.Uint32(b[l.SparseOffset+4*i:]))
	}
	return p, nil
}
