package lookup

import (
	"fmt"
	"unsafe"

	"github.com/recmesh/recmesh/model"
)

// rowAlign is the alignment LayoutTablesOf gives every table: a cache
// line, so each 512-byte fp32 row spans exactly 8 lines instead of 9, and
// the rows of the other precisions as few lines as model.Dtype says.
const rowAlign = 64

// TableBytes returns the bytes LayoutTables needs for fp32 tables of these
// vocabulary sizes: every row is Dim float32, and rows are a whole number
// of cache lines, so tables laid end to end stay aligned.
func TableBytes(vocab []int) int { return TableBytesOf(model.DtypeFP32, vocab) }

// TableBytesOf returns the bytes LayoutTablesOf needs for tables of these
// vocabulary sizes stored at dtype: each table's rows, rounded up to a
// whole cache line so the next table starts on one (fp32 and fp16 tables
// already are; an int8 or int4 table gains under 64 bytes).
func TableBytesOf(dtype model.Dtype, vocab []int) int {
	rb, n := dtype.RowBytes(Dim), 0
	for _, v := range vocab {
		n += alignUp(v * rb)
	}
	return n
}

func alignUp(n int) int { return (n + rowAlign - 1) &^ (rowAlign - 1) }

// LayoutTables carves buf into one float32 table per vocabulary size, laid
// end to end in order: table i holds vocab[i]*Dim floats. buf must start on
// a cache line (a huge page region does) and hold TableBytes(vocab) bytes.
// The tables alias buf; they are as valid as it is.
func LayoutTables(buf []byte, vocab []int) ([][]float32, error) {
	raw, err := LayoutTablesOf(model.DtypeFP32, buf, vocab)
	if err != nil {
		return nil, err
	}
	tables := make([][]float32, len(raw))
	for i, r := range raw {
		tables[i] = unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(r))), len(r)/4)
	}
	return tables, nil
}

// LayoutTablesOf carves buf into one table per vocabulary size stored at
// dtype, in order, each starting on a cache line: table i is vocab[i] rows
// of dtype.RowBytes(Dim) bytes, ready for NewTablesOf once filled. buf must
// start on a cache line (a huge page region does) and hold
// TableBytesOf(dtype, vocab) bytes. The tables alias buf; they are as
// valid as it is.
func LayoutTablesOf(dtype model.Dtype, buf []byte, vocab []int) ([][]byte, error) {
	need := TableBytesOf(dtype, vocab)
	if len(buf) < need {
		return nil, fmt.Errorf("lookup: layout of %s tables needs %d bytes, buffer has %d", dtype, need, len(buf))
	}
	if len(buf) > 0 && uintptr(unsafe.Pointer(unsafe.SliceData(buf)))%rowAlign != 0 {
		return nil, fmt.Errorf("lookup: layout buffer is not %d-byte aligned", rowAlign)
	}
	rb := dtype.RowBytes(Dim)
	tables := make([][]byte, len(vocab))
	off := 0
	for i, v := range vocab {
		if v <= 0 {
			return nil, fmt.Errorf("lookup: table %d has vocabulary %d", i, v)
		}
		n := v * rb
		tables[i] = buf[off : off+n : off+n]
		off += alignUp(n)
	}
	return tables, nil
}
