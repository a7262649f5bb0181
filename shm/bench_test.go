package shm

import (
	"context"
	"os"
	"sync/atomic"
	"testing"
	"time"
)

// benchLane sets up a frontend lane on its own mapping and the serving side
// on the owner's, and claims one slot to send again and again.
func benchLane(b *testing.B) (*Lane, *RequestReader, *CompletionWriter, int) {
	g := testGeometry()
	g.Lanes = 1
	s := newTestSegment(b, g)
	fe := attachTest(b, s)
	l, err := fe.ClaimLane(os.Getpid())
	if err != nil {
		b.Fatal(err)
	}
	rr, _ := s.RequestReader(0)
	cw, _ := s.CompletionWriter(0)
	slot, _, err := l.Claim(1, 64)
	if err != nil {
		b.Fatal(err)
	}
	return l, rr, cw, slot
}

// BenchmarkRoundTrip: one request/response at a time between two spinning
// goroutines on two cores (two mappings of one segment): Commit, embedder
// read, Complete, WaitCompletion. ns/op is the round trip; allocs/op must
// be 0.
func BenchmarkRoundTrip(b *testing.B) {
	l, rr, cw, slot := benchLane(b)
	l.Bell().SetSpin(time.Hour) // both sides awake
	var stop atomic.Bool
	done := make(chan struct{})
	go func() {
		defer close(done)
		for !stop.Load() {
			req, ok, err := rr.Next()
			if err != nil {
				panic(err)
			}
			if ok {
				cw.Complete(Completion{Slot: req.Slot, Epoch: req.Epoch, Examples: req.Examples})
			}
		}
	}()
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := l.Commit(slot, RequestMeta{ID: uint64(i)}); err != nil {
			b.Fatal(err)
		}
		if _, err := l.WaitCompletion(ctx); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	stop.Store(true)
	<-done
}

// BenchmarkMessage is the CPU cost of one message through both rings in
// one goroutine, with no cross-core traffic: Commit, Next, Complete, Poll.
func BenchmarkMessage(b *testing.B) {
	l, rr, cw, slot := benchLane(b)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		message(b, l, rr, cw, slot, uint64(i))
	}
}

// message sends slot through both rings: Commit, Next, Complete, Poll.
func message(b *testing.B, l *Lane, rr *RequestReader, cw *CompletionWriter, slot int, id uint64) {
	if err := l.Commit(slot, RequestMeta{ID: id}); err != nil {
		b.Fatal(err)
	}
	req, ok, err := rr.Next()
	if !ok || err != nil {
		b.Fatal(ok, err)
	}
	if err := cw.Complete(Completion{Slot: req.Slot, Epoch: req.Epoch, Examples: req.Examples}); err != nil {
		b.Fatal(err)
	}
	if _, ok, err := l.Poll(); !ok || err != nil {
		b.Fatal(ok, err)
	}
}

// BenchmarkStream: the frontend keeps every slot in flight while a
// spinning goroutine serves them with batched completions. ns/op is per
// request/response pair.
func BenchmarkStream(b *testing.B) {
	g := testGeometry()
	g.Lanes, g.SlotsPerLane, g.RingCapacity, g.ArenaBytes = 1, 256, 256, 1<<20
	s := newTestSegment(b, g)
	fe := attachTest(b, s)
	l, err := fe.ClaimLane(os.Getpid())
	if err != nil {
		b.Fatal(err)
	}
	rr, _ := s.RequestReader(0)
	cw, _ := s.CompletionWriter(0)
	var stop atomic.Bool
	done := make(chan struct{})
	go func() {
		defer close(done)
		for !stop.Load() {
			for {
				req, ok, err := rr.Next()
				if err != nil {
					panic(err)
				}
				if !ok {
					break
				}
				cw.Add(Completion{Slot: req.Slot, Epoch: req.Epoch, Examples: req.Examples})
			}
			cw.Flush()
		}
	}()
	slots := make([]int, g.SlotsPerLane)
	for i := range slots {
		if slots[i], _, err = l.Claim(1, 8); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	sent, got := 0, 0
	for _, slot := range slots[:min(len(slots), b.N)] {
		if err := l.Commit(slot, RequestMeta{ID: uint64(sent)}); err != nil {
			b.Fatal(err)
		}
		sent++
	}
	for got < b.N {
		c, ok, err := l.Poll()
		if err != nil {
			b.Fatal(err)
		}
		if !ok {
			continue
		}
		got++
		if sent < b.N {
			if err := l.Commit(c.Slot, RequestMeta{ID: uint64(sent)}); err != nil {
				b.Fatal(err)
			}
			sent++
		}
	}
	b.StopTimer()
	stop.Store(true)
	<-done
}

func BenchmarkDoorbellRingNoWaiter(b *testing.B) {
	s := memSegment(b, testGeometry())
	d := s.EmbedderBell()
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		d.Ring()
	}
}

// BenchmarkSlotCycle is one request's whole life through a lane in one
// goroutine, no cross-core traffic: Claim, Commit, Next, Complete, Poll,
// Scores, Free. It is the frontend's bookkeeping cost per request.
func BenchmarkSlotCycle(b *testing.B) {
	l, rr, cw, slot := benchLane(b)
	if _, err := l.Free(slot); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		slot, _, err := l.Claim(1, 64)
		if err != nil {
			b.Fatal(err)
		}
		message(b, l, rr, cw, slot, uint64(i))
		if _, err := l.Scores(slot); err != nil {
			b.Fatal(err)
		}
		if _, err := l.Free(slot); err != nil {
			b.Fatal(err)
		}
	}
}
