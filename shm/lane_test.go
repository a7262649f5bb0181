package shm

import (
	"context"
	"errors"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// serving is the embedder and accelerator side of one lane, in-process.
type serving struct {
	rr *RequestReader
	cw *CompletionWriter
}

// servedLane claims, in this process, a lane of a new test segment of
// geometry g, and returns it with the lane's serving side.
func servedLane(t testing.TB, g Geometry) (*Segment, *Lane, serving) {
	t.Helper()
	s := newTestSegment(t, g)
	l, err := s.ClaimLane(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	return s, l, newServing(t, s, l.Index())
}

func newServing(t testing.TB, s *Segment, lane int) serving {
	t.Helper()
	rr, err := s.RequestReader(lane)
	if err != nil {
		t.Fatal(err)
	}
	cw, err := s.CompletionWriter(lane)
	if err != nil {
		t.Fatal(err)
	}
	return serving{rr, cw}
}

func TestLaneRoundTrip(t *testing.T) {
	s := newTestSegment(t, testGeometry())
	fe := attachTest(t, s)
	l, err := fe.ClaimLane(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if l.Epoch() == 0 {
		t.Fatal("claim did not bump the epoch")
	}
	sv := newServing(t, s, l.Index())
	// Enough trips to wrap both rings many times.
	for id := uint64(1); id <= 1000; id++ {
		roundTrip(t, l, sv.rr, sv.cw, id)
	}
	if l.InFlight() != 0 || l.FreePages() != s.Geometry().ArenaBytes/PageSize {
		t.Fatalf("after the trips: in flight %d, free pages %d", l.InFlight(), l.FreePages())
	}
}

func TestLaneCarriesHeaderFields(t *testing.T) {
	_, l, sv := servedLane(t, testGeometry())
	tc := TraceContext{Flags: 1}
	for i := range tc.TraceID {
		tc.TraceID[i] = byte(i + 1)
	}
	for i := range tc.SpanID {
		tc.SpanID[i] = byte(0xa0 + i)
	}
	slot, _, err := l.Claim(3, 100)
	if err != nil {
		t.Fatal(err)
	}
	dl := time.Now().Add(time.Second).UnixNano()
	arrived := time.Now().Add(-3 * time.Millisecond)
	if err := l.Commit(slot, RequestMeta{ID: 77, Deadline: dl, Trace: tc, Arrival: arrived}); err != nil {
		t.Fatal(err)
	}
	req, ok, err := sv.rr.Next()
	if !ok || err != nil {
		t.Fatal(ok, err)
	}
	if req.RequestID != 77 || req.Deadline != dl || req.Trace != tc || req.Examples != 3 || len(req.Payload) != 100 {
		t.Fatalf("request %+v", req)
	}
	if at, ok := ArrivalTime(req.Arrival, time.Now()); !ok || at.Sub(arrived).Abs() > time.Microsecond {
		t.Fatalf("arrival read back as %v (%v), committed %v", at, ok, arrived)
	}
	if req.ScoresOffset%4 != 0 || req.ScoresOffset < req.PayloadOffset+100 {
		t.Fatalf("scores at %d overlap the payload at %d", req.ScoresOffset, req.PayloadOffset)
	}
	if sv.rr.Canceled(slot) {
		t.Fatal("fresh slot reads cancelled")
	}
	if got, err := sv.cw.Trace(slot, req.Epoch); err != nil || got != tc {
		t.Fatalf("accelerator reads trace %+v, %v; want %+v", got, err, tc)
	}
	if _, err := sv.cw.Trace(slot, req.Epoch+1); !errors.Is(err, ErrStaleEpoch) {
		t.Fatalf("trace of a stale epoch: %v, want ErrStaleEpoch", err)
	}
	if err := l.Cancel(slot); err != nil {
		t.Fatal(err)
	}
	if !sv.rr.Canceled(slot) {
		t.Fatal("cancel flag not visible to the embedder")
	}
	if err := sv.cw.Complete(Completion{Slot: slot, Epoch: req.Epoch, Status: StatusCanceled}); err != nil {
		t.Fatal(err)
	}
	c, err := l.WaitCompletion(context.Background())
	if err != nil || c.Status != StatusCanceled {
		t.Fatalf("completion %+v, %v", c, err)
	}
	if got := Status(get32(l.ctl.slot(slot), slotStatus)); got != StatusCanceled {
		t.Fatalf("slot status %d, want the completion's", got)
	}
	// A completed slot can be sent again with the same room.
	if err := l.Commit(slot, RequestMeta{ID: 78}); err != nil {
		t.Fatal(err)
	}
	if req, ok, _ := sv.rr.Next(); !ok || req.RequestID != 78 || sv.rr.Canceled(slot) {
		t.Fatalf("recommitted request %+v (cancel must be cleared)", req)
	}
}

func TestLaneSlotBookkeeping(t *testing.T) {
	g := testGeometry()
	s := newTestSegment(t, g)
	l, err := s.ClaimLane(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	var slots []int
	for {
		slot, _, err := l.Claim(1, 10)
		if errors.Is(err, ErrFull) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		slots = append(slots, slot)
	}
	if len(slots) != g.SlotsPerLane {
		t.Fatalf("claimed %d slots, want %d", len(slots), g.SlotsPerLane)
	}
	if freed, err := l.Free(slots[0]); err != nil || !freed {
		t.Fatalf("Free of a claimed slot = %v, %v; want it freed", freed, err)
	}
	if _, err := l.Free(slots[0]); !errors.Is(err, ErrState) {
		t.Fatalf("double Free = %v, want ErrState", err)
	}
	if err := l.Commit(slots[0], RequestMeta{}); !errors.Is(err, ErrState) {
		t.Fatalf("Commit of an idle slot = %v, want ErrState", err)
	}
	if err := l.Commit(slots[1], RequestMeta{}); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Scores(slots[1]); !errors.Is(err, ErrState) {
		t.Fatalf("Scores before completion = %v, want ErrState", err)
	}
	// Freeing a committed slot gives up the request, not its room: that
	// is the serving side's until the completion comes.
	pages := l.FreePages()
	if freed, err := l.Free(slots[1]); err != nil || freed || l.FreePages() != pages {
		t.Fatalf("Free of a committed slot = %v, %v (free pages %d, were %d); want the room kept", freed, err, l.FreePages(), pages)
	}
	if err := l.Commit(slots[1], RequestMeta{}); !errors.Is(err, ErrState) {
		t.Fatalf("Commit of a freed slot in flight = %v, want ErrState", err)
	}
	if _, _, err := l.Claim(0, 10); err == nil {
		t.Fatal("Claim of 0 examples succeeded")
	}
	if _, _, err := l.Claim(g.MaxExamples+1, 10); err == nil {
		t.Fatal("Claim above MaxExamples succeeded")
	}
	for _, slot := range slots[2:] {
		l.Free(slot)
	}
	// Room runs out before slots do with large payloads.
	n := 0
	for {
		_, _, err := l.Claim(1, 64<<10)
		if err != nil {
			if !errors.Is(err, ErrFull) {
				t.Fatal(err)
			}
			break
		}
		n++
	}
	if n != 3 { // 256 KiB arena, 68 KiB per request (payload page run + scores page)
		t.Fatalf("fit %d large requests, want 3", n)
	}
}

func TestClaimLaneExclusive(t *testing.T) {
	g := testGeometry()
	s := newTestSegment(t, g)
	var wg sync.WaitGroup
	var mu sync.Mutex
	won := map[int]int{}
	var full atomic.Int32
	for i := 0; i < 4*g.Lanes; i++ {
		wg.Add(1)
		go func(pid int) {
			defer wg.Done()
			l, err := s.ClaimLane(pid)
			if errors.Is(err, ErrNoFreeLane) {
				full.Add(1)
				return
			}
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			won[l.Index()]++
			mu.Unlock()
		}(1000 + i)
	}
	wg.Wait()
	if len(won) != g.Lanes || int(full.Load()) != 3*g.Lanes {
		t.Fatalf("lanes won %v, %d refused", won, full.Load())
	}
	for i, n := range won {
		if n != 1 {
			t.Fatalf("lane %d claimed %d times", i, n)
		}
	}
}

func TestStaleEpochIsDropped(t *testing.T) {
	_, l, sv := servedLane(t, testGeometry())
	slot, _, _ := l.Claim(1, 8)
	if err := l.Commit(slot, RequestMeta{ID: 1}); err != nil {
		t.Fatal(err)
	}
	req, ok, err := sv.rr.Next()
	if !ok || err != nil {
		t.Fatal(ok, err)
	}
	slot2, _, _ := l.Claim(1, 8)
	l.Commit(slot2, RequestMeta{ID: 2})
	// The lane changes hands under the request (as a reclaim would).
	atomic.AddUint32(l.ctl.epoch, 1)
	if _, _, err := sv.rr.Next(); !errors.Is(err, ErrStaleEpoch) {
		t.Fatalf("Next with an old epoch = %v, want ErrStaleEpoch", err)
	}
	if _, err := sv.cw.Scores(req.Slot, req.Epoch); !errors.Is(err, ErrStaleEpoch) {
		t.Fatalf("Scores with an old epoch = %v, want ErrStaleEpoch", err)
	}
	if err := sv.cw.Complete(Completion{Slot: req.Slot, Epoch: req.Epoch}); !errors.Is(err, ErrStaleEpoch) {
		t.Fatalf("Complete with an old epoch = %v, want ErrStaleEpoch", err)
	}
	if _, _, err := l.Claim(1, 8); !errors.Is(err, ErrLaneLost) {
		t.Fatalf("Claim on a lost lane = %v, want ErrLaneLost", err)
	}
	if err := l.Beat(); !errors.Is(err, ErrLaneLost) {
		t.Fatalf("Beat on a lost lane = %v, want ErrLaneLost", err)
	}
}

func TestReclaimDeadFrontend(t *testing.T) {
	s := newTestSegment(t, testGeometry())
	fe := attachTest(t, s)
	// A lane of a frontend that died: claimed in the owner's process,
	// where any pid may be named (the broker takes the peer's own).
	l, err := s.ClaimLane(deadPid)
	if err != nil {
		t.Fatal(err)
	}
	idx, epoch := l.Index(), l.Epoch()
	for i := 0; i < 3; i++ {
		slot, _, _ := l.Claim(1, 8)
		if err := l.Commit(slot, RequestMeta{ID: uint64(i)}); err != nil {
			t.Fatal(err)
		}
	}
	if q := s.Lanes()[idx].Queued; q != 3 {
		t.Fatalf("queued %d, want 3", q)
	}
	st, err := s.ReclaimLanes(0)
	if err != nil {
		t.Fatal(err)
	}
	if st.Draining != 1 || st.Freed != 1 {
		t.Fatalf("reclaim stats %+v, want one lane drained and freed", st)
	}
	info := s.Lanes()[idx]
	if info.Owner != 0 || info.State != "free" || info.Queued != 0 || info.Epoch == epoch {
		t.Fatalf("reclaimed lane %+v", info)
	}
	if _, _, err := l.Claim(1, 8); !errors.Is(err, ErrLaneLost) {
		t.Fatalf("dead handle Claim = %v, want ErrLaneLost", err)
	}
	// The lane is reusable and carries no leftovers.
	l2, err := fe.ClaimLane(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	sv := newServing(t, s, l2.Index())
	if _, ok, err := sv.rr.Next(); ok || err != nil {
		t.Fatalf("fresh lane has a request: %v %v", ok, err)
	}
	roundTrip(t, l2, sv.rr, sv.cw, 9)
	if _, err := attachTest(t, s).ReclaimLanes(0); !errors.Is(err, ErrNotOwner) {
		t.Fatalf("ReclaimLanes by a non-owner = %v, want ErrNotOwner", err)
	}
}

func TestReclaimStaleHeartbeat(t *testing.T) {
	s := newTestSegment(t, testGeometry())
	l, err := s.ClaimLane(os.Getpid()) // a live pid that never beats
	if err != nil {
		t.Fatal(err)
	}
	st, _ := s.ReclaimLanes(time.Hour)
	if st.Owned != 1 || st.Freed != 0 {
		t.Fatalf("fresh lane reclaimed: %+v", st)
	}
	waitFor(t, 5*time.Second, "stale lane reclaimed", func() bool {
		st, err := s.ReclaimLanes(30 * time.Millisecond)
		return err == nil && st.Freed == 1
	})
	if err := l.Beat(); !errors.Is(err, ErrLaneLost) {
		t.Fatalf("Beat after reclaim = %v, want ErrLaneLost", err)
	}
	// A beating lane is left alone.
	l2, err := s.ClaimLane(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l2.Heartbeat(ctx, 5*time.Millisecond) }()
	deadline := time.Now().Add(150 * time.Millisecond)
	for time.Now().Before(deadline) {
		if st, _ := s.ReclaimLanes(100 * time.Millisecond); st.Freed != 0 {
			t.Fatal("a beating lane was reclaimed")
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Heartbeat = %v", err)
	}
}

// A lane whose requests may sit in a batch is freed only once the
// accelerator finished that batch.
func TestReclaimWaitsForInFlightBatches(t *testing.T) {
	s := newTestSegment(t, testGeometry())
	l, err := s.ClaimLane(deadPid)
	if err != nil {
		t.Fatal(err)
	}
	sv := newServing(t, s, l.Index())
	slot, _, _ := l.Claim(1, 8)
	l.Commit(slot, RequestMeta{ID: 1})
	req, ok, err := sv.rr.Next()
	if !ok || err != nil {
		t.Fatal(ok, err)
	}
	bw, br := s.BatchWriter(), s.BatchReader()
	st, ok := bw.TryAcquire()
	if !ok {
		t.Fatal("no staging buffer")
	}
	st.SetEntry(0, BatchEntry{Lane: req.Lane, Slot: req.Slot, Epoch: req.Epoch, Rows: 1})
	// Reclaim while the batch is being filled: it must wait for it.
	if rs, _ := s.ReclaimLanes(0); rs.Draining != 1 || rs.Freed != 0 {
		t.Fatalf("reclaim during filling: %+v", rs)
	}
	if _, err := bw.Publish(st, BatchDesc{Examples: 1, Entries: 1}); err != nil {
		t.Fatal(err)
	}
	if rs, _ := s.ReclaimLanes(0); rs.Freed != 0 {
		t.Fatalf("lane freed with its batch still in flight: %+v", rs)
	}
	b, ok, err := br.Poll()
	if !ok || err != nil {
		t.Fatal(ok, err)
	}
	e, err := br.Entry(b, 0)
	if err != nil {
		t.Fatal(err)
	}
	// The accelerator may still complete it: the epoch is unchanged while draining.
	if err := sv.cw.Complete(Completion{Slot: e.Slot, Epoch: e.Epoch, Examples: 1}); err != nil {
		t.Fatal(err)
	}
	if err := br.Done(b); err != nil {
		t.Fatal(err)
	}
	if rs, _ := s.ReclaimLanes(0); rs.Freed != 1 {
		t.Fatalf("lane not freed after its batch completed: %+v", rs)
	}
}

func TestRelease(t *testing.T) {
	s, l, sv := servedLane(t, testGeometry())
	roundTrip(t, l, sv.rr, sv.cw, 1)
	idx := l.Index()
	if err := l.Release(); err != nil {
		t.Fatal(err)
	}
	if info := s.Lanes()[idx]; info.Owner != 0 || info.State != "free" {
		t.Fatalf("idle release left %+v", info)
	}
	if err := l.Release(); !errors.Is(err, ErrLaneLost) {
		t.Fatalf("second Release = %v, want ErrLaneLost", err)
	}

	// released releases l, which the embedder must finish, as it does.
	released := func(why string) {
		t.Helper()
		if err := l.Release(); err != nil {
			t.Fatal(err)
		}
		if info := s.Lanes()[l.Index()]; info.State != "releasing" {
			t.Fatalf("release %s left %+v", why, info)
		}
		if rs, _ := s.ReclaimLanes(0); rs.Freed != 1 {
			t.Fatalf("releasing lane not freed: %+v", rs)
		}
	}

	// With work in flight the embedder finishes the release.
	l, _ = s.ClaimLane(os.Getpid())
	slot, _, _ := l.Claim(1, 8)
	l.Commit(slot, RequestMeta{ID: 2})
	released("with work in flight")

	// An unread completion with nothing in flight (a spurious one) is not
	// the releasing frontend's to drop, its consumer may be reading it:
	// the embedder empties the ring when it frees the lane.
	l, _ = s.ClaimLane(os.Getpid())
	cw, _ := s.CompletionWriter(l.Index())
	if err := cw.Complete(Completion{Slot: 0, Epoch: l.Epoch(), Examples: 1}); err != nil {
		t.Fatal(err)
	}
	released("with an unread completion")
	l, _ = s.ClaimLane(os.Getpid())
	if _, ok, err := l.Poll(); ok || err != nil {
		t.Fatalf("the next owner reads a completion: %v, %v", ok, err)
	}
}

func TestRequestReaderRejectsHostileEntries(t *testing.T) {
	g := testGeometry()
	s, l, sv := servedLane(t, g)
	c := s.lane(l.Index())
	push := func(slot, epoch uint32) {
		r := s.requestRing(c)
		pos, err := r.claim(1)
		if err != nil {
			t.Fatal(err)
		}
		put32(r.entry(pos), reqSlot, slot)
		put32(r.entry(pos), reqEpoch, epoch)
		r.commit(pos + 1)
	}
	hdr := func(slot int, h SlotHeader) { writeSlotHeader(c.slot(slot), &h) }
	good := SlotHeader{Examples: 1, PayloadOffset: 0, PayloadLength: 8, ScoresOffset: 8}

	cases := []struct {
		name  string
		setup func()
		want  error
	}{
		{"slot out of range", func() { push(uint32(g.SlotsPerLane), l.Epoch()) }, ErrCorrupt},
		{"slot huge", func() { push(^uint32(0), l.Epoch()) }, ErrCorrupt},
		{"epoch", func() { hdr(0, good); push(0, l.Epoch()+5) }, ErrStaleEpoch},
		{"zero examples", func() { h := good; h.Examples = 0; hdr(1, h); push(1, l.Epoch()) }, ErrCorrupt},
		{"payload beyond arena", func() {
			h := good
			h.PayloadOffset = g.ArenaBytes - 4
			hdr(2, h)
			push(2, l.Epoch())
		}, ErrCorrupt},
		{"payload length wraps", func() {
			h := good
			h.PayloadOffset, h.PayloadLength = 4096, int(^uint32(0))
			hdr(3, h)
			push(3, l.Epoch())
		}, ErrCorrupt},
		{"scores misaligned", func() { h := good; h.ScoresOffset = 9; hdr(4, h); push(4, l.Epoch()) }, ErrCorrupt},
		{"scores beyond arena", func() {
			h := good
			h.ScoresOffset = g.ArenaBytes
			hdr(5, h)
			push(5, l.Epoch())
		}, ErrCorrupt},
	}
	for _, tc := range cases {
		tc.setup()
		if _, ok, err := sv.rr.Next(); ok || !errors.Is(err, tc.want) {
			t.Errorf("%s: Next = %v, %v; want %v", tc.name, ok, err, tc.want)
		}
	}
	// A good entry after the bad ones still flows.
	hdr(6, good)
	push(6, l.Epoch())
	if req, ok, err := sv.rr.Next(); !ok || err != nil || req.Slot != 6 {
		t.Fatalf("good entry after bad ones: %+v %v %v", req, ok, err)
	}
	// Corrupt counters stop the reader without consuming; eviction frees the lane.
	r := s.requestRing(c)
	atomic.StoreUint64(r.tail, atomic.LoadUint64(r.head)+uint64(g.RingCapacity)+1)
	if _, _, err := sv.rr.Next(); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("Next with corrupt counters = %v, want ErrCorrupt", err)
	}
	if s.RequestsPending() != true {
		t.Fatal("RequestsPending should report the (corrupt) backlog")
	}
	if err := s.EvictLane(l.Index()); err != nil {
		t.Fatal(err)
	}
	if rs, _ := s.ReclaimLanes(0); rs.Freed != 1 {
		t.Fatalf("evicted lane not freed: %+v", rs)
	}
	if s.RequestsPending() {
		t.Fatal("backlog survived the eviction")
	}
}

func TestLanePollRejectsHostileCompletions(t *testing.T) {
	s, l, sv := servedLane(t, testGeometry())
	slot, _, _ := l.Claim(2, 8)
	l.Commit(slot, RequestMeta{ID: 1})
	for _, c := range []Completion{
		{Slot: slot + 1, Epoch: l.Epoch()},                // never committed
		{Slot: slot, Epoch: l.Epoch() + 1},                // another epoch (refused by the writer)
		{Slot: slot, Epoch: l.Epoch(), Examples: 3},       // wrong count
		{Slot: 1 << 20, Epoch: l.Epoch(), Examples: 1},    // out of range (refused by the writer)
		{Slot: slot, Epoch: l.Epoch(), Examples: 1 << 30}, // refused by the writer
	} {
		// Bypass the writer's checks: write the raw entry as a hostile
		// producer would.
		r := s.completionRing(s.lane(l.Index()))
		pos, _ := r.claim(1)
		e := r.entry(pos)
		put32(e, complSlot, uint32(c.Slot))
		put32(e, complEpoch, c.Epoch)
		put32(e, complExamples, uint32(c.Examples))
		r.commit(pos + 1)
		if _, ok, err := l.Poll(); ok || err == nil {
			t.Errorf("Poll accepted %+v", c)
		}
	}
	if err := sv.cw.Complete(Completion{Slot: slot, Epoch: l.Epoch(), Examples: 2}); err != nil {
		t.Fatal(err)
	}
	if c, ok, err := l.Poll(); !ok || err != nil || c.Slot != slot {
		t.Fatalf("good completion after bad ones: %+v %v %v", c, ok, err)
	}
	// A duplicate of a completion already taken is refused.
	sv.cw.Complete(Completion{Slot: slot, Epoch: l.Epoch(), Examples: 2})
	if _, ok, err := l.Poll(); ok || !errors.Is(err, ErrCorrupt) {
		t.Fatalf("duplicate completion: %v %v", ok, err)
	}
}

func TestWaitCompletionFailsWhenPeersGo(t *testing.T) {
	s := newQuietSegment(t, testGeometry())
	s.Beat()
	fe := attachTest(t, s)
	l, err := fe.ClaimLane(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	s.Beat()
	if _, err := l.WaitCompletion(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitCompletion with nothing in flight = %v, want the ctx deadline", err)
	}
	// The owner stops beating. A waiter in another pid namespace whose
	// connection to the owner is open knows the owner exists, so gives up
	// only after DefaultHungAfter, as one that sees the pid alive does...
	for _, ns := range []uint64{s.pidNS + 1, s.pidNS} {
		put64(s.mem, hdrOwnerPidNS, ns)
		s.Beat()
		start := time.Now()
		_, err = l.WaitCompletion(context.Background())
		if !errors.Is(err, ErrOwnerDead) || time.Since(start) < DefaultHungAfter/2 {
			t.Fatalf("namespace %d: WaitCompletion = %v after %v, want ErrOwnerDead after about %v", ns, err, time.Since(start), DefaultHungAfter)
		}
	}
	// ...and once that connection hangs up, the short threshold is all
	// there is.
	put64(s.mem, hdrOwnerPidNS, s.pidNS+1)
	fe.cl.c.close()
	s.Beat()
	start := time.Now()
	_, err = l.WaitCompletion(context.Background())
	if !errors.Is(err, ErrOwnerDead) {
		t.Fatalf("WaitCompletion = %v, want ErrOwnerDead", err)
	}
	if el := time.Since(start); el > DefaultHungAfter/2 {
		t.Fatalf("took %v to notice", el)
	}
	// A clean close is noticed too.
	s.Beat()
	s.Close()
	if _, err := l.WaitCompletion(context.Background()); !errors.Is(err, ErrClosed) {
		t.Fatalf("WaitCompletion after owner Close = %v, want ErrClosed", err)
	}
}

// TestArrivalStamp checks the 32-bit arrival stamp across its wrap, and
// that unknown, future and implausibly old stamps decode as unknown.
func TestArrivalStamp(t *testing.T) {
	wrap := time.UnixMicro(1 << 32) // the stamp wraps to 0 here
	for _, tc := range []struct {
		arrived time.Time
		age     time.Duration
	}{
		{time.UnixMicro(5_000_000), 7 * time.Millisecond},
		{wrap.Add(-2 * time.Millisecond), 5 * time.Millisecond}, // stamped before the wrap, read after
		{wrap, time.Millisecond},                                // stamped as 1, not 0 (unknown)
		{time.Now(), 59 * time.Second},
	} {
		stamp := ArrivalStamp(tc.arrived)
		if stamp == 0 {
			t.Fatalf("ArrivalStamp(%v) = 0, the unknown stamp", tc.arrived)
		}
		got, ok := ArrivalTime(stamp, tc.arrived.Add(tc.age))
		if !ok || got.Sub(tc.arrived).Abs() > time.Microsecond {
			t.Errorf("stamp of %v read %v later: %v, %v", tc.arrived, tc.age, got, ok)
		}
	}
	now := time.Now()
	if _, ok := ArrivalTime(0, now); ok {
		t.Error("stamp 0 decoded as known")
	}
	if _, ok := ArrivalTime(ArrivalStamp(now.Add(-2*time.Minute)), now); ok {
		t.Error("a two-minute-old stamp decoded as known")
	}
	if _, ok := ArrivalTime(ArrivalStamp(now.Add(time.Second)), now); ok {
		t.Error("a stamp from the future decoded as known")
	}
}

// TestServedCalls counts served calls on two lanes and reads the sums.
func TestServedCalls(t *testing.T) {
	s := newTestSegment(t, testGeometry())
	a, err := s.ClaimLane(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.ClaimLane(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		a.CountServed(i == 0)
	}
	b.CountServed(true)
	b.CountServed(false)
	if calls, misses := s.ServedCalls(); calls != 7 || misses != 2 {
		t.Fatalf("ServedCalls = %d, %d; want 7, 2", calls, misses)
	}
}
