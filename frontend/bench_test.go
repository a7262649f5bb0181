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

// BenchmarkGRPCModelInfer measures a whole call through grpc-go on
// loopback: the client, the server's transport, the codec and the handler
// against a fake backend. Its allocs/op and B/op count both ends; the
// client's share does not change with the server's code, so a difference
// between two versions is the server's.
func BenchmarkGRPCModelInfer(b *testing.B) {
	for _, n := range []int{1, 16, 128} {
		b.Run(fmt.Sprintf("B=%d", n), func(b *testing.B) {
			f := newFakeBackend()
			f.capacity = 128
			f.record = false
			ts := startServerOn(b, TransportGRPC, f, nil)
			dense, sparse := inputs(n)
			req := rawRequest(dense, sparse, n, false)
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				if _, err := ts.api.ModelInfer(ctx, req); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N*n)/b.Elapsed().Seconds(), "examples/s")
		})
	}
}
