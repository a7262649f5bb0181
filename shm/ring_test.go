package shm

import (
	"errors"
	"math/rand/v2"
	"sync/atomic"
	"testing"
)

// TestRingMatchesReferenceModel drives a producer and a consumer side of one
// ring with random operations (single and batched claims, partial reads)
// and compares every outcome with a plain Go slice queue.
func TestRingMatchesReferenceModel(t *testing.T) {
	for _, capacity := range []int{2, 8, 64} {
		g := testGeometry()
		g.RingCapacity, g.SlotsPerLane = capacity, min(capacity, g.SlotsPerLane)
		s := memSegment(t, g)
		c := s.lane(0)
		prod, cons := s.requestRing(c).producer(), s.requestRing(c).consumer()
		rng := rand.New(rand.NewPCG(1, uint64(capacity)))
		var model []uint64
		next := uint64(1)
		for op := 0; op < 200000; op++ {
			switch rng.IntN(3) {
			case 0, 1: // produce k entries with one commit
				k := uint64(1 + rng.IntN(capacity))
				pos, err := prod.claim(k)
				if uint64(len(model))+k > uint64(capacity) {
					if !errors.Is(err, ErrFull) {
						t.Fatalf("cap %d: claim(%d) with %d queued = %v, want ErrFull", capacity, k, len(model), err)
					}
					continue
				}
				if err != nil {
					t.Fatalf("cap %d: claim(%d) with %d queued: %v", capacity, k, len(model), err)
				}
				for i := uint64(0); i < k; i++ {
					put64(prod.entry(pos+i), 0, next)
					model = append(model, next)
					next++
				}
				prod.commit(pos + k)
			case 2: // consume up to k entries
				k := uint64(1 + rng.IntN(capacity))
				h, n, err := cons.peek()
				if err != nil {
					t.Fatal(err)
				}
				if n != uint64(len(model)) {
					// peek may serve from its cached tail only when that
					// is non-empty; it must never over-report.
					if n > uint64(len(model)) || n == 0 {
						t.Fatalf("cap %d: peek = %d, model holds %d", capacity, n, len(model))
					}
				}
				k = min(k, n)
				for i := uint64(0); i < k; i++ {
					if got := get64(cons.entry(h+i), 0); got != model[i] {
						t.Fatalf("cap %d: entry %d = %d, want %d", capacity, h+i, got, model[i])
					}
				}
				cons.release(h + k)
				model = model[k:]
			}
			if pending := prod.pending(); pending != (len(model) > 0) {
				t.Fatalf("pending = %v with %d queued", pending, len(model))
			}
		}
	}
}

func TestRingDetectsCorruptCounters(t *testing.T) {
	g := testGeometry()
	s := memSegment(t, g)
	c := s.lane(0)
	r := s.requestRing(c)
	capacity := uint64(g.RingCapacity)
	for _, tc := range []struct{ head, tail uint64 }{
		{0, capacity + 1},
		{10, 5},         // head beyond tail
		{0, ^uint64(0)}, // tail "behind" head by one: more than capacity ahead
	} {
		atomic.StoreUint64(r.head, tc.head)
		atomic.StoreUint64(r.tail, tc.tail)
		cons, prod := s.requestRing(c).consumer(), s.requestRing(c).producer()
		if _, _, err := cons.peek(); !errors.Is(err, ErrCorrupt) {
			t.Errorf("peek head=%d tail=%d: %v, want ErrCorrupt", tc.head, tc.tail, err)
		}
		if _, err := prod.claim(1); !errors.Is(err, ErrCorrupt) {
			t.Errorf("claim head=%d tail=%d: %v, want ErrCorrupt", tc.head, tc.tail, err)
		}
	}
	// Counters near the top of the u64 range still work: positions are
	// masked and differences wrap correctly.
	top := ^uint64(0) - 2
	atomic.StoreUint64(r.head, top)
	atomic.StoreUint64(r.tail, top)
	prod, cons := s.requestRing(c).producer(), s.requestRing(c).consumer()
	for i := uint64(0); i < 10; i++ {
		pos, err := prod.claim(1)
		if err != nil {
			t.Fatal(err)
		}
		put64(prod.entry(pos), 0, i)
		prod.commit(pos + 1)
		h, n, err := cons.peek()
		if err != nil || n != 1 || get64(cons.entry(h), 0) != i {
			t.Fatalf("at the wrap: peek %d %v entry %d", n, err, get64(cons.entry(h), 0))
		}
		cons.release(h + 1)
	}
}
