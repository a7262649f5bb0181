package shm

import (
	"context"
	"errors"
	"os"
	"sync/atomic"
	"testing"
	"time"
)

func TestBatchFlow(t *testing.T) {
	g := testGeometry()
	s := newTestSegment(t, g)
	acc := attachTest(t, s)
	if err := acc.SetAccelerator(os.Getpid()); err != nil {
		t.Fatal(err)
	}
	bw, br := s.BatchWriter(), acc.BatchReader()
	// Double buffering: both buffers can be in flight, a third waits.
	var held []*Staging
	for i := 0; i < g.StagingCount; i++ {
		st, ok := bw.TryAcquire()
		if !ok {
			t.Fatalf("staging %d not free", i)
		}
		if len(st.Data()) != g.StagingBytes || !aligned(st.Data(), PageSize) {
			t.Fatalf("staging data %d bytes, aligned %v", len(st.Data()), aligned(st.Data(), PageSize))
		}
		held = append(held, st)
	}
	if _, ok := bw.TryAcquire(); ok {
		t.Fatal("acquired more staging buffers than exist")
	}
	tc := TraceContext{TraceID: [16]byte{1}, SpanID: [8]byte{2}, Flags: 1}
	for i, st := range held {
		st.Data()[0] = byte(10 + i)
		if err := st.SetEntry(0, BatchEntry{Lane: 1, Slot: 2, Epoch: 3, FirstRow: 0, Rows: 4, Status: StatusOK}); err != nil {
			t.Fatal(err)
		}
		if err := st.SetEntry(1, BatchEntry{Lane: 0, Slot: 5, Epoch: 3, FirstRow: 4, Rows: 0, Status: StatusExpired}); err != nil {
			t.Fatal(err)
		}
		seq, err := bw.Publish(st, BatchDesc{Examples: 4, Entries: 2, Trace: tc})
		if err != nil || seq != uint64(i+1) {
			t.Fatalf("Publish = %d, %v", seq, err)
		}
	}
	if err := held[0].SetEntry(0, BatchEntry{}); !errors.Is(err, ErrState) {
		t.Fatalf("SetEntry after publish = %v, want ErrState", err)
	}
	if s.PublishedSeq() != 2 {
		t.Fatalf("published seq %d", s.PublishedSeq())
	}
	var got []Batch
	for i := 0; i < 2; i++ {
		b, err := br.Wait(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if b.Seq != uint64(i+1) || b.Examples != 4 || b.Entries != 2 || b.Trace != tc || b.Data[0] != byte(10+i) {
			t.Fatalf("batch %+v", b.BatchDesc)
		}
		e, err := br.Entry(b, 1)
		if err != nil || e != (BatchEntry{Lane: 0, Slot: 5, Epoch: 3, FirstRow: 4, Rows: 0, Status: StatusExpired}) {
			t.Fatalf("entry %+v, %v", e, err)
		}
		if _, err := br.Entry(b, 2); err == nil {
			t.Fatal("entry beyond the batch accepted")
		}
		got = append(got, b)
	}
	// Executed runs ahead of Done: the device is free before the
	// completions are written. It never moves backwards.
	br.Executed(got[0])
	if s.ExecutedSeq() != 1 || s.CompletedSeq() != 0 {
		t.Fatalf("after executing batch 1: executed %d, completed %d", s.ExecutedSeq(), s.CompletedSeq())
	}
	br.Executed(got[1])
	br.Executed(got[0])
	if s.ExecutedSeq() != 2 {
		t.Fatalf("executed %d after batches 2 then 1, want 2", s.ExecutedSeq())
	}
	// Out-of-order completion: seq 2 first; the completed seq waits for 1.
	if err := br.Done(got[1]); err != nil {
		t.Fatal(err)
	}
	if s.CompletedSeq() != 0 {
		t.Fatalf("completed %d before batch 1 finished", s.CompletedSeq())
	}
	if err := br.Done(got[1]); !errors.Is(err, ErrState) {
		t.Fatalf("second Done = %v, want ErrState", err)
	}
	if err := br.Done(got[0]); err != nil {
		t.Fatal(err)
	}
	if s.CompletedSeq() != 2 {
		t.Fatalf("completed %d, want 2", s.CompletedSeq())
	}
	// Freed buffers can be acquired again; Acquire does not wait.
	st, err := bw.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := bw.Abort(st); err != nil {
		t.Fatal(err)
	}
	if err := bw.Abort(st); !errors.Is(err, ErrState) {
		t.Fatalf("second Abort = %v", err)
	}
}

func TestBatchAcquireWaitsForRelease(t *testing.T) {
	s := newTestSegment(t, testGeometry())
	acc := attachTest(t, s)
	acc.SetAccelerator(os.Getpid())
	bw, br := s.BatchWriter(), acc.BatchReader()
	for i := 0; i < s.Geometry().StagingCount; i++ {
		st, _ := bw.TryAcquire()
		bw.Publish(st, BatchDesc{})
	}
	got := make(chan error, 1)
	go func() {
		st, err := bw.Acquire(context.Background())
		if err == nil {
			err = bw.Abort(st)
		}
		got <- err
	}()
	b, err := br.Wait(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := br.Done(b); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Acquire did not wake after a buffer was freed")
	}
	// With every buffer held and the accelerator gone, Acquire fails.
	st, _ := bw.TryAcquire()
	bw.Publish(st, BatchDesc{})
	acc.DetachAccelerator()
	if _, err := bw.Acquire(context.Background()); !errors.Is(err, ErrAcceleratorDead) {
		t.Fatalf("Acquire with the accelerator gone = %v, want ErrAcceleratorDead", err)
	}
}

func TestBatchReaderRejectsHostileDescriptors(t *testing.T) {
	g := testGeometry()
	s := newTestSegment(t, g)
	br := s.BatchReader()
	ring := newRing(s.mem, s.lay.batchRing, s.lay.batchRing+batchEntriesOff, s.lay.batchRingCap, batchEntryBytes).producer()
	push := func(seqDelta int64, staging, entries uint32, ready bool) {
		pos, err := ring.claim(1)
		if err != nil {
			t.Fatal(err)
		}
		e := ring.entry(pos)
		put64(e, batchSeq, uint64(int64(pos+1)+seqDelta))
		put32(e, batchStaging, staging)
		put32(e, batchEntries, entries)
		put32(e, batchExamples, 1)
		if ready && staging < uint32(g.StagingCount) {
			atomic.StoreUint32(s.staging[staging].state, stagingReady)
		}
		ring.commit(pos + 1)
	}
	for _, tc := range []struct {
		name           string
		seqDelta       int64
		staging, count uint32
		ready          bool
	}{
		{"seq", 5, 0, 1, true},
		{"staging index", 0, uint32(g.StagingCount), 1, true},
		{"entries", 0, 0, uint32(g.MaxBatchEntries) + 1, true},
		{"not ready", 0, 1, 1, false},
	} {
		atomic.StoreUint32(s.staging[0].state, stagingFree)
		atomic.StoreUint32(s.staging[1].state, stagingFree)
		push(tc.seqDelta, tc.staging, tc.count, tc.ready)
		if _, ok, err := br.Poll(); ok || !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: Poll = %v, %v; want ErrCorrupt", tc.name, ok, err)
		}
	}
	// Entries pointing outside the segment or the batch are refused.
	push(0, 0, 3, true)
	b, ok, err := br.Poll()
	if !ok || err != nil {
		t.Fatal(ok, err)
	}
	p := s.staging[0].entries
	put32(p, stLane, uint32(g.Lanes))
	put32(p[stagingEntryBytes:], stSlot, uint32(g.SlotsPerLane))
	put32(p[2*stagingEntryBytes:], stFirstRow, ^uint32(0))
	put32(p[2*stagingEntryBytes:], stRows, 2)
	for i := 0; i < 3; i++ {
		if _, err := br.Entry(b, i); !errors.Is(err, ErrCorrupt) {
			t.Errorf("entry %d: %v, want ErrCorrupt", i, err)
		}
	}
	if _, err := br.Entry(Batch{BatchDesc: BatchDesc{Staging: 99, Entries: 1}}, 0); err == nil {
		t.Error("entry of a made-up staging index accepted")
	}
}

// TestBatchReaderWait: Wait sleeps on the batch doorbell while the ring is
// empty, leaves it when ctx ends, and a published batch wakes it.
func TestBatchReaderWait(t *testing.T) {
	s := newTestSegment(t, testGeometry())
	acc := attachTest(t, s)
	if err := acc.SetAccelerator(os.Getpid()); err != nil {
		t.Fatal(err)
	}
	br := acc.BatchReader()
	sleeping := func() bool { return atomic.LoadUint32(s.batchBell.waiters) != 0 }
	ctx, cancel := context.WithCancel(context.Background())
	got := make(chan error, 1)
	go func() {
		_, err := br.Wait(ctx)
		got <- err
	}()
	waitFor(t, 5*time.Second, "the reader to sleep", sleeping)
	cancel()
	if err := <-got; !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait = %v, want context.Canceled", err)
	}
	if sleeping() {
		t.Fatal("still a waiter after Wait returned")
	}
	// A batch wakes a sleeping reader.
	go func() {
		b, err := br.Wait(context.Background())
		if err == nil && b.Seq != 1 {
			err = errors.New("wrong batch")
		}
		got <- err
	}()
	waitFor(t, 5*time.Second, "the reader to sleep", sleeping)
	bw := s.BatchWriter()
	st, _ := bw.TryAcquire()
	if _, err := bw.Publish(st, BatchDesc{}); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
}
