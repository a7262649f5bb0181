package lookup

import (
	"fmt"
	"unsafe"
)

// rowAlign is the alignment LayoutTables gives every table: a cache line,
// so each 512-byte row spans exactly 8 lines instead of 9.
const rowAlign = 64

// TableBytes returns the bytes LayoutTables needs for tables of these
// vocabulary sizes: every row is Dim float32, and rows are a whole number
// of cache lines, so tables laid end to end stay aligned.
func TableBytes(vocab []int) int {
	n := 0
	for _, v := range vocab {
		n += v * Dim * 4
	}
	return n
}

// LayoutTables carves buf into one float32 table per vocabulary size, laid
// end to end in order: table i holds vocab[i]*Dim floats. buf must start on
// a cache line (a huge page region does) and hold TableBytes(vocab) bytes.
// The tables alias buf; they are as valid as it is.
func LayoutTables(buf []byte, vocab []int) ([][]float32, error) {
	need := TableBytes(vocab)
	if len(buf) < need {
		return nil, fmt.Errorf("lookup: layout needs %d bytes, buffer has %d", need, len(buf))
	}
	if len(buf) > 0 && uintptr(unsafe.Pointer(unsafe.SliceData(buf)))%rowAlign != 0 {
		return nil, fmt.Errorf("lookup: layout buffer is not %d-byte aligned", rowAlign)
	}
	tables := make([][]float32, len(vocab))
	off := 0
	for i, v := range vocab {
		if v <= 0 {
			return nil, fmt.Errorf("lookup: table %d has vocabulary %d", i, v)
		}
		n := v * Dim
		tables[i] = unsafe.Slice((*float32)(unsafe.Pointer(&buf[off])), n)
		off += n * 4
	}
	return tables, nil
}
