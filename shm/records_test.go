package shm

import (
	"errors"
	"testing"
)

// recordGeometry is the geometry the record tests validate against.
func recordGeometry() Geometry { return testGeometry() }

// TestRecordsRoundTrip: every record reads back what its writer stored, and
// a value that breaks the record's rules is refused by its reader.
func TestRecordsRoundTrip(t *testing.T) {
	g := recordGeometry()
	tc := TraceContext{TraceID: [16]byte{1, 2, 3}, SpanID: [8]byte{9, 8}, Flags: 1}

	e := make([]byte, reqEntryBytes)
	writeReqEntry(e, g.SlotsPerLane-1, 7)
	if slot, epoch, err := readReqEntry(e, g); err != nil || slot != g.SlotsPerLane-1 || epoch != 7 {
		t.Errorf("request entry: %d %d %v", slot, epoch, err)
	}
	writeReqEntry(e, g.SlotsPerLane, 7)
	if slot, epoch, err := readReqEntry(e, g); !errors.Is(err, ErrCorrupt) || slot != -1 || epoch != 7 {
		t.Errorf("request entry with slot out of range: %d %d %v", slot, epoch, err)
	}

	e = make([]byte, complEntryBytes)
	c := Completion{Slot: 3, Epoch: 5, Status: StatusExpired, Examples: 2}
	writeCompletion(e, c)
	if got, err := readCompletion(e, 5, g); err != nil || got != c {
		t.Errorf("completion: %+v %v", got, err)
	}
	if _, err := readCompletion(e, 6, g); !errors.Is(err, ErrStaleEpoch) {
		t.Errorf("completion for another epoch: %v", err)
	}
	writeCompletion(e, Completion{Slot: g.SlotsPerLane, Epoch: 5})
	if _, err := readCompletion(e, 5, g); !errors.Is(err, ErrCorrupt) {
		t.Errorf("completion with slot out of range: %v", err)
	}

	slot := make([]byte, SlotBytes)
	*slotCancelWord(slot), *slotStatusWord(slot) = 1, 4
	h := SlotHeader{RequestID: 1 << 40, Deadline: -5, Examples: 3, PayloadOffset: 4096, PayloadLength: 100,
		ScoresOffset: 4196, Trace: tc, Arrival: 77}
	writeSlotHeader(slot, &h)
	if got, err := readSlotHeader(slot, g); err != nil || got != h {
		t.Errorf("slot header: %+v %v", got, err)
	}
	if *slotCancelWord(slot) != 0 || *slotStatusWord(slot) != 0 {
		t.Error("writeSlotHeader left cancel or status set")
	}
	if got := readSlotTrace(slot); got != tc {
		t.Errorf("slot trace %+v", got)
	}
	h.ScoresOffset++
	writeSlotHeader(slot, &h)
	if _, err := readSlotHeader(slot, g); !errors.Is(err, ErrCorrupt) {
		t.Errorf("slot header with misaligned scores: %v", err)
	}

	e = make([]byte, batchEntryBytes)
	d := BatchDesc{Seq: 9, Staging: g.StagingCount - 1, Examples: 40, Entries: g.MaxBatchEntries, Trace: tc}
	writeBatchDesc(e, d)
	if got, err := readBatchDesc(e, 8, g); err != nil || got != d {
		t.Errorf("batch descriptor: %+v %v", got, err)
	}
	for name, bad := range map[string]BatchDesc{
		"seq":     {Seq: 10},
		"staging": {Seq: 9, Staging: g.StagingCount},
		"entries": {Seq: 9, Entries: g.MaxBatchEntries + 1},
	} {
		writeBatchDesc(e, bad)
		if got, err := readBatchDesc(e, 8, g); !errors.Is(err, ErrCorrupt) || got.Staging != 0 || got.Entries != 0 {
			t.Errorf("batch descriptor with bad %s: %+v %v", name, got, err)
		}
	}

	e = make([]byte, stagingEntryBytes)
	be := BatchEntry{Lane: g.Lanes - 1, Slot: g.SlotsPerLane - 1, Epoch: 3, FirstRow: 4, Rows: 6, Status: StatusOK}
	writeStagingEntry(e, be)
	if got, err := readStagingEntry(e, g, 10); err != nil || got != be {
		t.Errorf("staging entry: %+v %v", got, err)
	}
	if _, err := readStagingEntry(e, g, 9); !errors.Is(err, ErrCorrupt) {
		t.Errorf("staging entry with rows beyond the batch: %v", err)
	}
	writeStagingEntry(e, BatchEntry{Lane: g.Lanes, Status: StatusCanceled, Epoch: 2})
	if got, err := readStagingEntry(e, g, 10); !errors.Is(err, ErrCorrupt) || got.Status != StatusCanceled || got.Epoch != 2 {
		t.Errorf("staging entry with lane out of range: %+v %v", got, err)
	}
}

// FuzzRecords decodes arbitrary bytes as every record. A decoder either
// refuses them or returns a value inside the geometry; writing an accepted
// value back and reading it again gives the same value (the fields are at
// the same offsets on both sides).
//
//	go test -run=NONE -fuzz='^FuzzRecords$' -fuzztime=10s ./shm/
func FuzzRecords(f *testing.F) {
	g := recordGeometry()
	f.Add([]byte{}, uint64(0), 0)
	seed := make([]byte, SlotBytes)
	writeSlotHeader(seed, &SlotHeader{Examples: 2, PayloadOffset: 8, PayloadLength: 8, ScoresOffset: 16})
	f.Add(seed, uint64(0), 2)
	seed = make([]byte, batchEntryBytes)
	writeBatchDesc(seed, BatchDesc{Seq: 4, Staging: 1, Examples: 3, Entries: 2})
	f.Add(seed, uint64(3), 3)
	seed = make([]byte, stagingEntryBytes)
	writeStagingEntry(seed, BatchEntry{Lane: 1, Slot: 2, FirstRow: 1, Rows: 2})
	f.Add(seed, uint64(0), 3)
	f.Fuzz(func(t *testing.T, data []byte, pos uint64, examples int) {
		// Every record reads from a buffer of exactly its size, as the
		// rings and tables hand them out.
		rec := func(n int) []byte { b := make([]byte, n); copy(b, data); return b }

		if slot, epoch, err := readReqEntry(rec(reqEntryBytes), g); err == nil {
			if slot < 0 || slot >= g.SlotsPerLane {
				t.Fatalf("request entry accepted slot %d", slot)
			}
			e := rec(reqEntryBytes)
			writeReqEntry(e, slot, epoch)
			if s2, e2, err := readReqEntry(e, g); err != nil || s2 != slot || e2 != epoch {
				t.Fatalf("request entry round trip: %d %d %v", s2, e2, err)
			}
		}

		epoch := uint32(pos)
		if c, err := readCompletion(rec(complEntryBytes), epoch, g); err == nil {
			if c.Slot < 0 || c.Slot >= g.SlotsPerLane || c.Epoch != epoch {
				t.Fatalf("completion accepted %+v", c)
			}
			e := make([]byte, complEntryBytes)
			writeCompletion(e, c)
			if c2, err := readCompletion(e, epoch, g); err != nil || c2 != c {
				t.Fatalf("completion round trip: %+v %v", c2, err)
			}
		}

		if h, err := readSlotHeader(rec(SlotBytes), g); err == nil {
			if h.Examples < 1 || h.Examples > g.MaxExamples || !inArena(h.PayloadOffset, h.PayloadLength, g.ArenaBytes) ||
				h.ScoresOffset%4 != 0 || !inArena(h.ScoresOffset, 4*h.Examples, g.ArenaBytes) {
				t.Fatalf("slot header accepted %+v", h)
			}
			e := make([]byte, SlotBytes)
			writeSlotHeader(e, &h)
			if h2, err := readSlotHeader(e, g); err != nil || h2 != h {
				t.Fatalf("slot header round trip: %+v %v", h2, err)
			}
		}

		if d, err := readBatchDesc(rec(batchEntryBytes), pos, g); err == nil {
			if d.Seq != pos+1 || d.Staging < 0 || d.Staging >= g.StagingCount || d.Entries < 0 || d.Entries > g.MaxBatchEntries {
				t.Fatalf("batch descriptor accepted %+v at position %d", d, pos)
			}
			e := make([]byte, batchEntryBytes)
			writeBatchDesc(e, d)
			if d2, err := readBatchDesc(e, pos, g); err != nil || d2 != d {
				t.Fatalf("batch descriptor round trip: %+v %v", d2, err)
			}
		} else if d.Staging != 0 || d.Entries != 0 {
			t.Fatalf("refused batch descriptor kept staging %d entries %d", d.Staging, d.Entries)
		}

		if e, err := readStagingEntry(rec(stagingEntryBytes), g, examples); err == nil {
			if e.Lane < 0 || e.Lane >= g.Lanes || e.Slot < 0 || e.Slot >= g.SlotsPerLane ||
				e.FirstRow < 0 || e.Rows < 0 || e.FirstRow+e.Rows > max(examples, 0) {
				t.Fatalf("staging entry accepted %+v for %d examples", e, examples)
			}
			p := make([]byte, stagingEntryBytes)
			writeStagingEntry(p, e)
			if e2, err := readStagingEntry(p, g, examples); err != nil || e2 != e {
				t.Fatalf("staging entry round trip: %+v %v", e2, err)
			}
		} else if e.Lane != 0 || e.Slot != 0 || e.Rows != 0 {
			t.Fatalf("refused staging entry kept lane %d slot %d rows %d", e.Lane, e.Slot, e.Rows)
		}
	})
}
