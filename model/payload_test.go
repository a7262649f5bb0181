package model

import (
	"errors"
	"slices"
	"testing"
)

// TestPayloadViewsMatchReference: what a frontend writes through the views
// is what the plain decoder reads, and the views read what the plain
// encoder wrote; wrong sizes and misaligned payloads are refused.
func TestPayloadViewsMatchReference(t *testing.T) {
	cfg := DLRMv2(DevVocabCap)
	lay := cfg.Request(3)
	buf := make([]byte, lay.Size+8) // heap blocks this size are 8-aligned
	b := buf[:lay.Size]
	p, err := lay.Payload(b)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Dense) != 3*cfg.NumDense || len(p.Sparse) != 3*cfg.SparseWidth() {
		t.Fatalf("views of %d dense values and %d ids, want %d and %d", len(p.Dense), len(p.Sparse), 3*cfg.NumDense, 3*cfg.SparseWidth())
	}
	for i := range p.Dense {
		p.Dense[i] = float32(i) / 7
	}
	for i := range p.Sparse {
		p.Sparse[i] = int32(i*31 - 5)
	}
	ref, err := lay.DecodePayload(b)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(ref.Dense, p.Dense) || !slices.Equal(ref.Sparse, p.Sparse) {
		t.Fatal("the plain decoder reads something else than the views wrote")
	}
	ref.Dense[1], ref.Sparse[2] = -1, 12345
	clear(b)
	if err := lay.EncodePayload(b, ref); err != nil {
		t.Fatal(err)
	}
	if p.Dense[1] != -1 || p.Sparse[2] != 12345 || p.Dense[2] != 2.0/7 {
		t.Fatal("the views read something else than the plain encoder wrote")
	}

	for name, bad := range map[string][]byte{
		"short":      buf[:lay.Size-4],
		"long":       buf[:lay.Size+4],
		"misaligned": buf[1 : lay.Size+1],
	} {
		if _, err := lay.Payload(bad); !errors.Is(err, ErrBadPayload) {
			t.Errorf("%s payload: %v, want ErrBadPayload", name, err)
		}
	}
	if _, err := lay.DecodePayload(buf[1 : lay.Size+1]); err != nil {
		t.Errorf("the plain decoder refused a misaligned payload: %v", err)
	}
	if err := lay.EncodePayload(b, RequestPayload{Dense: ref.Dense[1:], Sparse: ref.Sparse}); !errors.Is(err, ErrBadPayload) {
		t.Errorf("EncodePayload with a short dense array: %v", err)
	}
}
