package shm

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// slotEvent is one of the things that end a committed slot's life.
type slotEvent int

const (
	evComplete slotEvent = iota // its completion arrives and is consumed
	evAbandon                   // the holder stops waiting
	evRelease                   // the holder frees the slot
	evLost                      // the lane is lost: DropInFlight
	numSlotEvents
)

var slotEventNames = [...]string{"complete", "abandon", "release", "lost"}

// slotEventOrders is every order of every non-empty subset of the events.
func slotEventOrders() [][]slotEvent {
	var out [][]slotEvent
	var walk func(seq []slotEvent, used int)
	walk = func(seq []slotEvent, used int) {
		if len(seq) > 0 {
			out = append(out, append([]slotEvent(nil), seq...))
		}
		for e := range numSlotEvents {
			if used&(1<<e) == 0 {
				walk(append(seq, e), used|1<<e)
			}
		}
	}
	walk(nil, 0)
	return out
}

// TestSlotStateEveryOrder drives one committed slot through every order of
// its completion, the holder abandoning it, the holder freeing it and the
// lane being lost. The room is freed exactly once, reported to exactly one
// party, and only once both the holder has let go and the flight ended
// (the completion was consumed or the lane lost); a completion is
// delivered only to a holder still waiting for it.
func TestSlotStateEveryOrder(t *testing.T) {
	g := fuzzGeometry()
	orders := slotEventOrders()
	if len(orders) != 64 {
		t.Fatalf("%d orders, want 64", len(orders))
	}
	for _, seq := range orders {
		name := ""
		for _, e := range seq {
			name += "/" + slotEventNames[e]
		}
		t.Run(name[1:], func(t *testing.T) {
			s := memSegment(t, g)
			l, err := s.ClaimLane(os.Getpid())
			if err != nil {
				t.Fatal(err)
			}
			cw, _ := s.CompletionWriter(l.Index())
			full := l.FreePages()
			slot, _, err := l.Claim(2, 8)
			if err != nil {
				t.Fatal(err)
			}
			if err := l.Commit(slot, RequestMeta{ID: 1}); err != nil {
				t.Fatal(err)
			}
			held, inFlight, abandoned := true, true, false
			frees := 0
			for _, e := range seq {
				switch e {
				case evComplete:
					if err := cw.Complete(Completion{Slot: slot, Epoch: l.Epoch(), Examples: 2}); err != nil {
						t.Fatal(err)
					}
					c, ok, err := l.Poll()
					if !inFlight {
						// A duplicate, or one after the loss: refused.
						if ok || !errors.Is(err, ErrCorrupt) {
							t.Fatalf("completion of a slot not in flight: %+v, %v, %v", c, ok, err)
						}
						break
					}
					wantDeliver := held && !abandoned
					if !ok || err != nil || c.Slot != slot || c.Abandoned == wantDeliver || c.Freed != !held {
						t.Fatalf("Poll = %+v, %v, %v; want delivered %v, freed %v", c, ok, err, wantDeliver, !held)
					}
					if _, err := l.Scores(slot); (err == nil) != wantDeliver {
						t.Fatalf("Scores after the completion: %v, want readable %v", err, wantDeliver)
					}
					inFlight = false
					if c.Freed {
						frees++
					}
				case evAbandon:
					want := held && inFlight
					if got := l.Abandon(slot); got != want {
						t.Fatalf("Abandon = %v, want %v", got, want)
					}
					if want {
						abandoned = true
						if atomic.LoadUint32(slotCancelWord(l.ctl.slot(slot))) == 0 {
							t.Fatal("Abandon left the cancel flag down")
						}
					}
				case evRelease:
					freed, err := l.Free(slot)
					if err != nil || freed != !inFlight {
						t.Fatalf("Free = %v, %v; want freed %v", freed, err, !inFlight)
					}
					held = false
					if freed {
						frees++
					}
				case evLost:
					n := l.DropInFlight()
					if want := btoi(inFlight && !held); n != want {
						t.Fatalf("DropInFlight freed %d, want %d", n, want)
					}
					inFlight = false
					frees += n
				}
				done := !held && !inFlight
				if (l.FreePages() == full) != done || frees != btoi(done) {
					t.Fatalf("after %s: free pages %d of %d, %d frees reported; held %v, in flight %v",
						slotEventNames[e], l.FreePages(), full, frees, held, inFlight)
				}
				if l.InFlight() != btoi(inFlight) {
					t.Fatalf("after %s: InFlight %d, want %d", slotEventNames[e], l.InFlight(), btoi(inFlight))
				}
			}
			if held {
				// The holder's second thought changes nothing once done.
				if _, err := l.Free(slot); err != nil {
					t.Fatal(err)
				}
				if _, err := l.Free(slot); !errors.Is(err, ErrState) {
					t.Fatalf("second Free = %v, want ErrState", err)
				}
			}
		})
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// TestSlotStateRaces runs the state machine's parties on their own
// goroutines, as a frontend does: callers that claim, commit and either
// wait for their answer or give up at a random moment, one reader that
// consumes completions and hands them over, and a serving side answering
// in batches. Every slot and page comes back, each freed once: a double
// free would hand the same room to two callers, which the payload check
// catches, or leave the counts off at the end.
func TestSlotStateRaces(t *testing.T) {
	g := testGeometry()
	_, l, sv := servedLane(t, g)
	full := l.FreePages()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	var wg sync.WaitGroup
	var failed atomic.Pointer[error] // the first failure
	fail := func(err error) { failed.CompareAndSwap(nil, &err) }
	wg.Add(1)
	go func() { // the serving side: echoes each payload's first word as the score
		defer wg.Done()
		for ctx.Err() == nil {
			req, ok, err := sv.rr.Next()
			if err != nil {
				fail(err)
				return
			}
			if ok {
				if sc, err := sv.cw.Scores(req.Slot, req.Epoch); err == nil {
					copy(sc, req.Payload[:4])
				}
				sv.cw.Add(Completion{Slot: req.Slot, Epoch: req.Epoch, Examples: req.Examples})
			}
			if !ok || rand.IntN(4) == 0 {
				sv.cw.Flush()
			}
		}
	}()

	answers := make([]chan struct{}, g.SlotsPerLane)
	for i := range answers {
		answers[i] = make(chan struct{}, 1)
	}
	var readerFrees atomic.Int64
	readerDone := make(chan struct{})
	go func() { // the one reader
		defer close(readerDone)
		for {
			c, err := l.WaitCompletion(ctx)
			if err != nil {
				if ctx.Err() == nil {
					fail(err)
				}
				return
			}
			switch {
			case c.Freed:
				readerFrees.Add(1)
			case !c.Abandoned:
				answers[c.Slot] <- struct{}{}
			}
		}
	}()

	var callerFrees atomic.Int64
	const callers, perCaller = 8, 300
	var cw sync.WaitGroup
	for w := range callers {
		cw.Add(1)
		go func() {
			defer cw.Done()
			for i := range perCaller {
				id := uint32(w<<16 | i)
				slot, p, err := l.Claim(1, 8)
				if errors.Is(err, ErrFull) {
					continue
				}
				if err != nil {
					fail(err)
					return
				}
				put32(p, 0, id)
				if err := l.Commit(slot, RequestMeta{ID: uint64(id)}); err != nil {
					if _, err := l.Free(slot); err != nil {
						fail(err)
					}
					continue // the request ring is full
				}
				// A caller that gives up in time gets no answer: the
				// reader drops it. One too late waits for it.
				if gaveUp := rand.IntN(2) == 0 && l.Abandon(slot); !gaveUp {
					select {
					case <-answers[slot]:
					case <-time.After(10 * time.Second):
						// Another caller took the answer: it was handed the
						// same slot, freed twice.
						fail(fmt.Errorf("slot %d: no answer", slot))
						return
					}
					sc, err := l.Scores(slot)
					if err != nil || get32(sc, 0) != id {
						fail(fmt.Errorf("slot %d: scores %v, %v; want the caller's own %d", slot, sc, err, id))
						return
					}
				}
				freed, err := l.Free(slot)
				if err != nil {
					fail(err)
					return
				}
				if freed {
					callerFrees.Add(1)
				}
			}
		}()
	}
	cw.Wait()
	if failed.Load() == nil {
		waitFor(t, 10*time.Second, "every answer consumed", func() bool { return l.InFlight() == 0 })
	}
	cancel()
	<-readerDone
	wg.Wait()
	if err := failed.Load(); err != nil {
		t.Fatal(*err)
	}
	if l.FreePages() != full || len(l.free) != g.SlotsPerLane {
		t.Fatalf("after the races: %d of %d pages and %d of %d slots free", l.FreePages(), full, len(l.free), g.SlotsPerLane)
	}
	t.Logf("freed by callers %d, by the reader %d", callerFrees.Load(), readerFrees.Load())
}
