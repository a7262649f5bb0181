package frontend

import (
	"context"
	"fmt"
	"testing"
)

// BenchmarkModelInfer measures the handler alone, called directly as grpc-go
// would after unmarshalling: validation, decoding into the slot, the
// backend round trip (a fake that scores in place) and the reply. Run with
// -benchmem; allocs/op is the frontend's own per-call garbage.
func BenchmarkModelInfer(b *testing.B) {
	for _, bc := range []struct {
		n     int
		int64 bool
		typed bool
	}{
		{n: 1}, {n: 64}, {n: 64, int64: true}, {n: 64, typed: true}, {n: 512}, {n: 4096}, {n: 4096, int64: true},
	} {
		enc := "raw"
		if bc.typed {
			enc = "typed"
		}
		ids := "INT32"
		if bc.int64 {
			ids = "INT64"
		}
		b.Run(fmt.Sprintf("B=%d/%s/%s", bc.n, enc, ids), func(b *testing.B) {
			f := newFakeBackend()
			f.capacity = bc.n
			f.record = false
			s := newTestService(b, f)
			dense, sparse := inputs(bc.n)
			req := rawRequest(dense, sparse, bc.n, bc.int64)
			if bc.typed {
				req = typedRequest(dense, sparse, bc.n, bc.int64)
			}
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				if _, err := s.ModelInfer(ctx, req); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N*bc.n)/b.Elapsed().Seconds(), "examples/s")
		})
	}
}
