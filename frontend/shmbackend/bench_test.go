package shmbackend

import (
	"context"
	"testing"

	"github.com/recmesh/recmesh/frontend"
)

// benchBackend is a backend on a mesh that answers at once and spins
// instead of sleeping when idle: the benchmarks measure the backend's own
// per-call cost (slot bookkeeping, the completion reader's hand-off).
func benchBackend(b *testing.B) *Backend {
	dir := b.TempDir()
	m := startFakeMesh(b, dir, 0.5)
	m.spin.Store(true)
	return newBackend(b, dir)
}

// plainCall is one call's life, with no inputs written: Acquire, Submit
// (commit, completion, scores), Release.
func plainCall(t testing.TB, be *Backend) {
	ctx := context.Background()
	slot, err := be.Acquire(ctx, 4)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := slot.Submit(ctx, frontend.Call{}); err != nil {
		t.Fatal(err)
	}
	slot.Release()
}

// BenchmarkCall: one call at a time through the backend.
func BenchmarkCall(b *testing.B) {
	be := benchBackend(b)
	b.ReportAllocs()
	for b.Loop() {
		plainCall(b, be)
	}
}

// BenchmarkCallParallel: many callers at once on one lane, so the slot
// bookkeeping's locks are contended by the callers and the reader.
func BenchmarkCallParallel(b *testing.B) {
	be := benchBackend(b)
	b.ReportAllocs()
	b.SetParallelism(4)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			plainCall(b, be)
		}
	})
}
