package batch

import (
	"testing"
	"time"
)

var t0 = time.Unix(1000, 0)

func TestParseMode(t *testing.T) {
	for _, s := range []string{"none", "model", "full", "FULL"} {
		m, err := ParseMode(s)
		if err != nil {
			t.Fatalf("ParseMode(%q): %v", s, err)
		}
		if got, _ := ParseMode(m.String()); got != m {
			t.Fatalf("round trip of %q gave %v", s, got)
		}
	}
	if _, err := ParseMode("sometimes"); err == nil {
		t.Fatal("ParseMode(sometimes) succeeded")
	}
}

func TestNoneSealsEveryRequest(t *testing.T) {
	b := New(Options{Mode: None}, nil)
	if b.ShouldSeal(t0, false) {
		t.Fatal("an empty batch must not be sealed")
	}
	if row := b.Add(16, t0); row != 0 {
		t.Fatalf("first row %d, want 0", row)
	}
	if b.Fits(1, t0, t0) {
		t.Fatal("None mode let a second request join")
	}
	if !b.ShouldSeal(t0, false) {
		t.Fatal("None mode must seal after one request even when the device is busy")
	}
}

func TestModelSealsWhenDeviceIdle(t *testing.T) {
	b := New(Options{Mode: Model, MaxBatch: 64}, nil)
	b.Add(1, t0)
	if !b.ShouldSeal(t0, true) {
		t.Fatal("Model mode must seal at once when the device is idle")
	}
	for i := 1; i < 10; i++ {
		if !b.Fits(1, t0, t0) {
			t.Fatalf("request %d did not fit", i)
		}
		if row := b.Add(1, t0.Add(time.Hour)); row != i {
			t.Fatalf("request %d got row %d", i, row)
		}
		if b.ShouldSeal(t0.Add(time.Hour), false) {
			t.Fatal("Model mode sealed while the device was busy and the batch not full")
		}
	}
	if _, ok := b.Deadline(); ok {
		t.Fatal("Model mode has no window timer")
	}
}

func TestFullWaitsForWindow(t *testing.T) {
	b := New(Options{Mode: Full, MaxBatch: 64, Window: 2 * time.Millisecond}, nil)
	b.Add(4, t0)
	b.Add(4, t0.Add(time.Millisecond))
	if b.ShouldSeal(t0.Add(1999*time.Microsecond), true) {
		t.Fatal("Full mode sealed before the window even with an idle device")
	}
	if d, ok := b.Deadline(); !ok || !d.Equal(t0.Add(2*time.Millisecond)) {
		t.Fatalf("Deadline = %v,%v; want first arrival + window", d, ok)
	}
	if !b.ShouldSeal(t0.Add(2*time.Millisecond), false) {
		t.Fatal("Full mode did not seal when the window closed")
	}
	b.Reset()
	if b.Rows() != 0 || b.Entries() != 0 || b.ShouldSeal(t0.Add(time.Hour), true) {
		t.Fatal("Reset left state behind")
	}
}

func TestCapacity(t *testing.T) {
	b := New(Options{Mode: Full, MaxBatch: 16, MaxEntries: 3}, nil)
	b.Add(10, t0)
	if b.Fits(7, t0, t0) {
		t.Fatal("10+7 rows fit in a 16-row batch")
	}
	if !b.Fits(6, t0, t0) {
		t.Fatal("10+6 rows did not fit in a 16-row batch")
	}
	b.Add(6, t0)
	if !b.ShouldSeal(t0, false) {
		t.Fatal("a full batch must be sealed at once")
	}
	b.Reset()
	b.Add(0, t0)
	b.Add(0, t0)
	b.Add(1, t0)
	if b.Fits(1, t0, t0) {
		t.Fatal("a fourth entry fit with MaxEntries 3")
	}
	if !b.ShouldSeal(t0, false) {
		t.Fatal("a batch with MaxEntries entries must be sealed")
	}
	// An empty batch takes any request, even one as large as MaxBatch.
	b.Reset()
	if !b.Fits(16, t0, t0) {
		t.Fatal("an empty batch refused a MaxBatch request")
	}
}

func TestDefaults(t *testing.T) {
	o := New(Options{}, nil).Options()
	if o.MaxBatch != DefaultMaxBatch || o.MaxEntries != DefaultMaxBatch || o.Window != DefaultWindow || o.Mode != None {
		t.Fatalf("defaults = %+v", o)
	}
}

// sloCosts: a bucket of b examples runs in 1 ms + b × 10 µs; lookups take
// 5 µs per example.
func sloCosts() *Costs {
	c := &Costs{}
	for b := 1; b <= 4096; b *= 2 {
		c.SetExec(b, time.Millisecond+time.Duration(b)*10*time.Microsecond)
	}
	c.SetLookup(5 * time.Microsecond)
	return c
}

func TestSLOSealsWhenTheDeviceIsIdle(t *testing.T) {
	b := New(Options{Mode: SLO, LatencyTarget: 20 * time.Millisecond, Margin: 4 * time.Millisecond}, sloCosts())
	b.Add(16, t0)
	if b.ShouldSeal(t0, false) {
		t.Fatal("SLO sealed a small batch while the device was busy")
	}
	if !b.ShouldSeal(t0, true) {
		t.Fatal("SLO did not seal when the device went idle (zero-wait)")
	}
	if _, ok := b.Deadline(); ok {
		t.Fatal("SLO mode asked for a timer: it never waits out a window")
	}
}

// TestSLOCapsTheBatchAtTheBudget: with the device busy for 10 ms, the open
// batch may grow only while its oldest request still finishes within the
// 16 ms the budget leaves (20 ms target − 4 ms margin).
func TestSLOCapsTheBatchAtTheBudget(t *testing.T) {
	c := sloCosts()
	b := New(Options{Mode: SLO, LatencyTarget: 20 * time.Millisecond, Margin: 4 * time.Millisecond}, c)
	// A batch of 896 sealed at t0 + 4.48 ms (its lookups done) → bucket
	// 1024 runs 11.24 ms: the device is busy until 15.72 ms.
	b.Add(896, t0)
	if got := b.Sealed(t0.Add(c.Lookup(896))); got != c.Exec(896) {
		t.Fatalf("Sealed predicted %v, want %v", got, c.Exec(896))
	}
	b.Reset()
	free := t0.Add(c.Lookup(896) + c.Exec(896))
	now := t0.Add(time.Millisecond)
	b.Add(1, now)
	// Oldest arrived at now: its budget ends at now + 16 ms = 17 ms; the
	// device frees at 15.72 ms, so a batch may take at most 1.28 ms:
	// bucket 16 (1.16 ms) fits, bucket 32 (1.32 ms) does not.
	if !b.Fits(15, now, now) {
		t.Fatalf("a 16-example batch starting at %v should fit the budget", free.Sub(t0))
	}
	// The same request stamped 1 ms earlier by its frontend becomes the
	// batch's oldest, whose budget then ends before bucket 16 would.
	if b.Fits(15, now.Add(-time.Millisecond), now) {
		t.Fatal("Fits ignored that the joining request arrived before the batch's first")
	}
	b.Add(15, now)
	if b.Fits(1, now, now) {
		t.Fatal("growing into bucket 32 breaks the oldest request's budget but Fits said yes")
	}
	// Model mode has no such cap.
	m := New(Options{Mode: Model}, c)
	m.Add(16, now)
	if !m.Fits(1, now, now) {
		t.Fatal("Model mode capped a batch by latency")
	}
}

func TestSLOAdmissionControl(t *testing.T) {
	c := sloCosts()
	b := New(Options{Mode: SLO, LatencyTarget: 20 * time.Millisecond, Margin: 4 * time.Millisecond}, c)
	if !b.Admit(128, t0, time.Time{}, t0) {
		t.Fatal("an idle device refused a request it can finish in 2.9 ms")
	}
	// Queue 30 ms of work on the device.
	for range 3 {
		b.Add(1024, t0)
		b.Sealed(t0)
		b.Reset()
	}
	if b.Admit(1, t0, time.Time{}, t0) {
		t.Fatal("admitted a request that cannot start for 30 ms under a 16 ms budget")
	}
	// The device went idle early: work is admitted again.
	later := t0.Add(5 * time.Millisecond)
	b.DeviceIdle(later)
	if !b.Admit(1, later, time.Time{}, later) {
		t.Fatal("refused a request after the device went idle")
	}
	// With nothing ahead, even a request that cannot make the budget on
	// an idle device is served (shedding it spares no one any waiting).
	if !b.Admit(4096, later, time.Time{}, later) {
		t.Fatal("shed a 42 ms request on an idle device")
	}
	// Behind a queued batch, its own deadline counts too: the device is
	// busy until 6.16 ms, so a 1 ms deadline cannot be met.
	b.Add(16, later)
	b.Sealed(later)
	b.Reset()
	if b.Admit(1, later, later.Add(time.Millisecond), later) {
		t.Fatal("admitted a request whose own deadline it cannot meet")
	}
	if !b.Admit(1, later, later.Add(10*time.Millisecond), later) {
		t.Fatal("refused a request whose deadline and budget it can meet")
	}
	// A request that already waited most of its budget away (stamped by
	// its frontend 14 ms ago) is shed: behind the queued batch it would
	// finish 16.17 ms after it arrived, past the 16 ms budget. One stamped
	// 13 ms ago still fits.
	if b.Admit(1, later.Add(-14*time.Millisecond), time.Time{}, later) {
		t.Fatal("admitted a request that had already used its budget")
	}
	if !b.Admit(1, later.Add(-13*time.Millisecond), time.Time{}, later) {
		t.Fatal("shed a request that can still finish within the budget")
	}
	// Other modes never shed, and nothing is shed before estimates exist.
	if !New(Options{Mode: Full}, c).Admit(1, t0.Add(-time.Hour), time.Time{}, t0) {
		t.Fatal("Full mode shed a request")
	}
	if !New(Options{Mode: SLO}, nil).Admit(4096, t0, time.Time{}, t0) {
		t.Fatal("SLO mode shed without any cost estimate")
	}
}

func TestCostsExec(t *testing.T) {
	var c Costs
	if c.Exec(16) != 0 {
		t.Fatal("unknown costs predicted time")
	}
	c.SetExec(16, 2*time.Millisecond)
	c.SetExec(3, time.Hour) // not a bucket: ignored
	for rows, want := range map[int]time.Duration{
		9:  2 * time.Millisecond, // its bucket, 16
		1:  2 * time.Millisecond, // no estimate: the next larger bucket's
		64: 8 * time.Millisecond, // only smaller known: scaled, 16 → 64
		0:  0,
	} {
		if got := c.Exec(rows); got != want {
			t.Errorf("Exec(%d) = %v, want %v", rows, got, want)
		}
	}
	c.SetLookup(3 * time.Microsecond)
	if got := c.Lookup(10); got != 30*time.Microsecond {
		t.Errorf("Lookup(10) = %v", got)
	}
}

// TestFeedbackMovesTheMargin drives the margin's control loop: it grows
// fast while more than 1% of served calls miss the target, shrinks slowly
// while fewer than 0.5% do, stays within [target/20, target/2], waits
// for a full window, and treats totals going backwards as a restart.
func TestFeedbackMovesTheMargin(t *testing.T) {
	const target = 20 * time.Millisecond
	b := New(Options{Mode: SLO, LatencyTarget: target}, sloCosts())
	if m := b.Margin(); m != target/10 {
		t.Fatalf("starting margin %v, want a tenth of the target", m)
	}
	calls, misses := uint64(1000), uint64(50)
	b.Feedback(calls, misses) // baseline
	step := func(dc, dm uint64) time.Duration {
		calls, misses = calls+dc, misses+dm
		return b.Feedback(calls, misses)
	}
	if m := step(feedbackWindow-1, 100); m != target/10 {
		t.Fatalf("margin moved to %v before a full window", m)
	}
	// The window completes with 100 misses in 200 calls: grow by half
	// plus a fiftieth of the target.
	if m := step(1, 0); m != 2*time.Millisecond+time.Millisecond+400*time.Microsecond {
		t.Fatalf("after a missing window the margin is %v, want 3.4ms", m)
	}
	for range 20 {
		step(feedbackWindow, feedbackWindow)
	}
	if m := b.Margin(); m != target/2 {
		t.Fatalf("margin grew to %v, want capped at %v", m, target/2)
	}
	// 1 miss in 200 (0.5%) holds it; none shrinks it by 200 µs a window.
	if m := step(feedbackWindow, 1); m != target/2 {
		t.Fatalf("0.5%% misses moved the margin to %v", m)
	}
	if m := step(feedbackWindow, 0); m != target/2-target/100 {
		t.Fatalf("a clean window left the margin at %v", m)
	}
	for range 200 {
		step(feedbackWindow, 0)
	}
	if m := b.Margin(); m != target/20 {
		t.Fatalf("margin shrank to %v, want floored at %v", m, target/20)
	}
	// A planning budget follows the margin.
	if got := b.budget(); got != target-target/20 {
		t.Fatalf("budget %v with margin %v", got, b.Margin())
	}
	// Counters that went backwards (a segment's lanes re-counted) are a
	// new baseline, not a huge window.
	before := b.Margin()
	if m := b.Feedback(10, 10); m != before {
		t.Fatalf("a restarted count moved the margin to %v", m)
	}
	if m := b.Feedback(10+feedbackWindow, 10); m != before {
		t.Fatalf("a clean window at the floor moved the margin to %v", m)
	}
}

// TestSLOCapsABatchAtHalfTheBudget: a batch whose execution takes more
// than half the budget would make every request arriving meanwhile miss
// (it waits for this batch, then runs its own), so it stops growing there;
// a request alone may still take longer.
func TestSLOCapsABatchAtHalfTheBudget(t *testing.T) {
	c := &Costs{}
	for b := 1; b <= 64; b *= 2 {
		c.SetExec(b, time.Duration(b)*time.Millisecond) // 1 ms per example
	}
	b := New(Options{Mode: SLO, LatencyTarget: 20 * time.Millisecond, Margin: 4 * time.Millisecond}, c)
	// Budget 16 ms: batches up to bucket 8 (8 ms) fit, bucket 16 does not.
	b.Add(4, t0)
	if !b.Fits(4, t0, t0) {
		t.Fatal("a batch of 8 (8 ms, half the 16 ms budget) did not fit")
	}
	b.Add(4, t0)
	if b.Fits(1, t0, t0) {
		t.Fatal("a batch grew into bucket 16 (16 ms), past half the budget")
	}
	b.Reset()
	if !b.Fits(32, t0, t0) {
		t.Fatal("an empty batch refused a request that alone takes 32 ms")
	}
}
