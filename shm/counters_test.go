package shm

import (
	"math"
	"os"
	"testing"
	"time"
)

// TestCounterRecords: each counters block's descriptor matches the place
// layout.go keeps for it, and names each word once with the kind its
// writer and readers use.
func TestCounterRecords(t *testing.T) {
	for _, c := range []struct {
		rec       *counterRecord
		off, end  int // where the block may lie, in its page
		words     int
		kind      counterKind
		blockName string
	}{
		{&laneCounterRecord, laneCounters, laneBell, laneCounterWords, counterCount, "lane header"},
		{&execCounterRecord, hdrExecTable, hdrUsed, ExecTableBuckets, counterEstimate, "accelerator page"},
	} {
		r := c.rec
		if len(r.counters) != c.words || r.bytes() != c.words*counterWordBytes {
			t.Errorf("%s: %d words (%d bytes), the layout keeps %d", r.name, len(r.counters), r.bytes(), c.words)
		}
		if c.off%counterWordBytes != 0 || c.off+r.bytes() > c.end {
			t.Errorf("%s: [%d, %d) does not fit [%d, %d) of the %s", r.name, c.off, c.off+r.bytes(), c.off, c.end, c.blockName)
		}
		seen := map[string]bool{}
		for i, d := range r.counters {
			if d.name == "" || seen[d.name] {
				t.Errorf("%s: word %d named %q, empty or twice", r.name, i, d.name)
			}
			seen[d.name] = true
			if d.kind != c.kind {
				t.Errorf("%s: word %d (%s) is of kind %d, want %d", r.name, i, d.name, d.kind, c.kind)
			}
		}
	}
	if laneCounterRecord.counters[counterServed].name != "served" || laneCounterRecord.counters[counterMissed].name != "missed" {
		t.Errorf("lane counter indexes name %+v", laneCounterRecord.counters)
	}
}

// TestCounterBlockEncoding: the view's words are the record's bytes (word i
// at 8i, native-endian), it touches nothing outside the block, and the
// estimate decoder refuses what is no duration.
func TestCounterBlockEncoding(t *testing.T) {
	const off = 24
	buf := make([]byte, off+laneCounterRecord.bytes()+16)
	for i := range buf {
		buf[i] = 0xa5
	}
	pristine := append([]byte(nil), buf...)
	c := newCounterBlock(buf, off, &laneCounterRecord)
	c.Store(counterServed, 0)
	c.Store(counterMissed, 0)
	c.Add(counterServed, 5)
	c.Add(counterMissed, 2)
	c.Add(counterServed, 1)
	if got := get64(buf, off+counterWordBytes*counterServed); got != 6 || c.Load(counterServed) != 6 {
		t.Errorf("served word %d, view %d; want 6", got, c.Load(counterServed))
	}
	put64(buf, off+counterWordBytes*counterMissed, 9)
	if got := c.Load(counterMissed); got != 9 {
		t.Errorf("view reads missed %d after the record's bytes were set to 9", got)
	}
	end := off + laneCounterRecord.bytes()
	for i := range buf {
		if (i < off || i >= end) && buf[i] != pristine[i] {
			t.Fatalf("byte %d outside the block [%d, %d) changed", i, off, end)
		}
	}
	mustPanic(t, "an index past the record", func() { c.Load(laneCounterWords) })
	mustPanic(t, "a block past the buffer", func() { newCounterBlock(buf, len(buf)-8, &laneCounterRecord) })

	e := newCounterBlock(make([]byte, execCounterRecord.bytes()), 0, &execCounterRecord)
	for _, tc := range []struct {
		in, want time.Duration
	}{{3 * time.Millisecond, 3 * time.Millisecond}, {-time.Second, 0}, {math.MaxInt64, math.MaxInt64}} {
		writeEstimate(e, 4, tc.in)
		if got := readEstimate(e, 4); got != tc.want {
			t.Errorf("estimate %v reads %v, want %v", tc.in, got, tc.want)
		}
	}
	e.Store(4, math.MaxInt64+1) // not a duration: a hostile or torn word
	if got := readEstimate(e, 4); got != 0 {
		t.Errorf("a word above MaxInt64 reads %v, want 0 (unknown)", got)
	}
}

func mustPanic(t *testing.T, what string, f func()) {
	t.Helper()
	defer func() {
		if recover() == nil {
			t.Errorf("%s did not panic", what)
		}
	}()
	f()
}

// TestCountersStayInTheirBlock: counting a served call changes the image
// only inside the lane's own counters block, and an execution estimate
// only inside the accelerator page's block: no other lane, page or word.
func TestCountersStayInTheirBlock(t *testing.T) {
	s := memSegment(t, testGeometry())
	a := claimLanes(t, s, 2)[0]
	only := func(what string, from, to int, change func()) {
		t.Helper()
		before := append([]byte(nil), s.mem...)
		change()
		changed := false
		for i := range s.mem {
			if s.mem[i] == before[i] {
				continue
			}
			if i < from || i >= to {
				t.Fatalf("%s changed byte %d, outside its block [%d, %d)", what, i, from, to)
			}
			changed = true
		}
		if !changed {
			t.Fatalf("%s changed nothing", what)
		}
	}
	la := s.lay.laneBase(a.Index()) + laneCounters
	only("CountServed", la, la+laneCounterRecord.bytes(), func() { a.CountServed(true) })
	ex := s.lay.accel + hdrExecTable
	only("SetExecTime", ex, ex+execCounterRecord.bytes(), func() { s.SetExecTime(1<<(ExecTableBuckets-1), time.Millisecond) })
	if got := s.ExecTime(1 << (ExecTableBuckets - 1)); got != time.Millisecond {
		t.Errorf("ExecTime of the last bucket %v", got)
	}
}

// TestServedCallsBackwards: a frontend can rewrite its own lane's counts,
// so the sums can move backwards or wrap; the other lanes' counts are
// untouched, and a reader that differences the sums as counters.go says
// (a reading below the last is a restart) never sees a negative count.
func TestServedCallsBackwards(t *testing.T) {
	s := newTestSegment(t, testGeometry())
	l := claimLanes(t, s, 2)
	honest, hostile := l[0], l[1]
	var r countReader
	step := func(want uint64, restart bool) {
		t.Helper()
		calls, _ := s.ServedCalls()
		if d, re := r.read(calls); d != want || re != restart {
			t.Fatalf("served sum %d: delta %d restart %v, want %d %v", calls, d, re, want, restart)
		}
	}
	step(0, true) // the first reading is a baseline
	for range 3 {
		honest.CountServed(false)
	}
	hostile.CountServed(false)
	step(4, false)
	hostile.ctl.counters.Store(counterServed, 0) // backwards
	step(0, true)
	hostile.ctl.counters.Store(counterServed, math.MaxUint64) // the sum wraps
	step(0, true)
	honest.CountServed(true)
	step(1, false)
	if got := s.lane(honest.Index()).counters.Load(counterServed); got != 4 {
		t.Errorf("the honest lane's count is %d, want 4", got)
	}
	if _, misses := s.ServedCalls(); misses != 1 {
		t.Errorf("misses %d, want 1", misses)
	}
}

// claimLanes claims n lanes of s for this process.
func claimLanes(t *testing.T, s *Segment, n int) []*Lane {
	t.Helper()
	l := make([]*Lane, n)
	for i := range l {
		var err error
		if l[i], err = s.ClaimLane(os.Getpid()); err != nil {
			t.Fatal(err)
		}
	}
	return l
}

// countReader decodes a count as counters.go documents (the embedder's
// SLO feedback does the same): the advance since the last reading, or a
// restart when the count went backwards.
type countReader struct {
	started bool
	last    uint64
}

func (r *countReader) read(v uint64) (delta uint64, restart bool) {
	if !r.started || v < r.last {
		r.started, r.last = true, v
		return 0, true
	}
	delta, r.last = v-r.last, v
	return delta, false
}
