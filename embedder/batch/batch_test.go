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
	b := New(Options{Mode: None})
	if b.ShouldSeal(t0, false) {
		t.Fatal("an empty batch must not be sealed")
	}
	if row := b.Add(16, t0); row != 0 {
		t.Fatalf("first row %d, want 0", row)
	}
	if b.Fits(1) {
		t.Fatal("None mode let a second request join")
	}
	if !b.ShouldSeal(t0, false) {
		t.Fatal("None mode must seal after one request even when the device is busy")
	}
}

func TestModelSealsWhenDeviceIdle(t *testing.T) {
	b := New(Options{Mode: Model, MaxBatch: 64})
	b.Add(1, t0)
	if !b.ShouldSeal(t0, true) {
		t.Fatal("Model mode must seal at once when the device is idle")
	}
	for i := 1; i < 10; i++ {
		if !b.Fits(1) {
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
	b := New(Options{Mode: Full, MaxBatch: 64, Window: 2 * time.Millisecond})
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
	b := New(Options{Mode: Full, MaxBatch: 16, MaxEntries: 3})
	b.Add(10, t0)
	if b.Fits(7) {
		t.Fatal("10+7 rows fit in a 16-row batch")
	}
	if !b.Fits(6) {
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
	if b.Fits(1) {
		t.Fatal("a fourth entry fit with MaxEntries 3")
	}
	if !b.ShouldSeal(t0, false) {
		t.Fatal("a batch with MaxEntries entries must be sealed")
	}
	// An empty batch takes any request, even one as large as MaxBatch.
	b.Reset()
	if !b.Fits(16) {
		t.Fatal("an empty batch refused a MaxBatch request")
	}
}

func TestDefaults(t *testing.T) {
	o := New(Options{}).Options()
	if o.MaxBatch != DefaultMaxBatch || o.MaxEntries != DefaultMaxBatch || o.Window != DefaultWindow || o.Mode != None {
		t.Fatalf("defaults = %+v", o)
	}
}
