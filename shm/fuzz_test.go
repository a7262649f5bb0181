package shm

import (
	"encoding/binary"
	"os"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"
)

// The fuzz targets write random bytes over a valid segment image and run
// every reader over it. Passing means the readers return errors and never
// panic: a panic would also be the only symptom of an out-of-bounds read,
// because every access goes through bounds-checked slices.
//
// Fuzz input is a list of patches: [offset u16][length u8][bytes...],
// offsets taken modulo the region being fuzzed.
//
//	go test -run=NONE -fuzz='^FuzzAttachHeader$' -fuzztime=10s ./shm/
//	go test -run=NONE -fuzz='^FuzzSharedMemory$' -fuzztime=10s ./shm/

func fuzzGeometry() Geometry {
	return Geometry{
		Lanes: 2, RingCapacity: 8, SlotsPerLane: 8, ArenaBytes: 4 * PageSize,
		StagingCount: 2, StagingBytes: PageSize, MaxBatchEntries: 8,
		MaxExamples: 4, ExampleBytes: 16,
	}
}

// fuzzImage is a valid segment image with traffic in flight: requests
// queued on lane 0, a completion waiting for its frontend, one batch on the
// batch ring and a staging buffer being filled.
type fuzzImage struct {
	tmpl []byte // pristine copy
	mem  []byte // page-aligned working mapping
	lay  layout
}

func newFuzzImage(tb testing.TB) *fuzzImage {
	g := fuzzGeometry()
	lay, err := computeLayout(g)
	if err != nil {
		tb.Fatal(err)
	}
	mem, err := unix.Mmap(-1, 0, roundUp(lay.total, PageSize), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_ANON)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { unix.Munmap(mem) })
	s := initMem(mem, g, lay)
	l, err := s.ClaimLane(os.Getpid())
	if err != nil {
		tb.Fatal(err)
	}
	for i := 0; i < 4; i++ {
		slot, p, err := l.Claim(1+i%g.MaxExamples, 16*(i+1))
		if err != nil {
			tb.Fatal(err)
		}
		p[0] = byte(i)
		if err := l.Commit(slot, RequestMeta{ID: uint64(i + 1), Trace: TraceContext{Flags: 1}}); err != nil {
			tb.Fatal(err)
		}
	}
	rr, _ := s.RequestReader(0)
	cw, _ := s.CompletionWriter(0)
	req, _, err := rr.Next()
	if err != nil {
		tb.Fatal(err)
	}
	if err := cw.Complete(Completion{Slot: req.Slot, Epoch: req.Epoch, Examples: req.Examples}); err != nil {
		tb.Fatal(err)
	}
	bw := s.BatchWriter()
	st, _ := bw.TryAcquire()
	st.SetEntry(0, BatchEntry{Lane: 0, Slot: req.Slot, Epoch: req.Epoch, Rows: req.Examples})
	if _, err := bw.Publish(st, BatchDesc{Examples: req.Examples, Entries: 1}); err != nil {
		tb.Fatal(err)
	}
	bw.TryAcquire()
	return &fuzzImage{tmpl: append([]byte(nil), mem...), mem: mem, lay: lay}
}

// patch applies the fuzz patches to region.
func patch(region []byte, data []byte) {
	for len(data) >= 3 {
		off := int(binary.LittleEndian.Uint16(data)) % len(region)
		n := min(int(data[2]), len(data)-3)
		copy(region[off:], data[3:3+n])
		data = data[3+n:]
	}
}

// seedPatch builds one patch record.
func seedPatch(off int, b ...byte) []byte {
	return append([]byte{byte(off), byte(off >> 8), byte(len(b))}, b...)
}

func le32(v uint32) []byte { return binary.LittleEndian.AppendUint32(nil, v) }
func le64(v uint64) []byte { return binary.LittleEndian.AppendUint64(nil, v) }

func FuzzAttachHeader(f *testing.F) {
	img := newFuzzImage(f)
	f.Add([]byte{})
	f.Add(seedPatch(hdrLanes, le32(3)...))
	f.Add(seedPatch(hdrRingCapacity, le32(1<<31)...))
	f.Add(seedPatch(hdrArenaBytes, le64(1<<62)...))
	f.Add(seedPatch(hdrSlotsPerLane, le32(0)...))
	f.Add(seedPatch(hdrLanesOff, le64(0)...))
	f.Add(seedPatch(hdrState, le32(9)...))
	f.Add(seedPatch(hdrFileSize, le64(^uint64(0))...))
	f.Add(append(seedPatch(hdrMaxBatchEntries, le32(1<<20)...), seedPatch(hdrStagingMetaStride, le64(1<<40)...)...))
	f.Fuzz(func(t *testing.T, data []byte) {
		copy(img.mem, img.tmpl)
		patch(img.mem[:HeaderBytes], data)
		s, err := attachMem("fuzz", img.mem, AttachOptions{})
		if err != nil {
			return
		}
		// A header that passes must describe a layout inside the image.
		if s.lay.total > len(img.mem) {
			t.Fatalf("accepted a layout of %d bytes in a %d-byte image", s.lay.total, len(img.mem))
		}
		exercise(t, s, nil)
	})
}

func FuzzSharedMemory(f *testing.F) {
	img := newFuzzImage(f)
	c := img.lay.laneBase(0)
	slot0 := c + img.lay.slots
	f.Add([]byte{})
	f.Add(seedPatch(c+laneReqCtl+ringTail-HeaderBytes, le64(1<<40)...))
	f.Add(seedPatch(c+laneReqCtl+ringHead-HeaderBytes, le64(^uint64(0))...))
	f.Add(seedPatch(c+laneReqEntries-HeaderBytes, le32(7)...))
	f.Add(seedPatch(c+laneReqEntries+8-HeaderBytes, le32(1<<31)...))
	f.Add(seedPatch(slot0+SlotBytes+slotPayloadOff-HeaderBytes, le32(4*PageSize-2)...))
	f.Add(seedPatch(slot0+SlotBytes+slotPayloadLen-HeaderBytes, le32(^uint32(0))...))
	f.Add(seedPatch(slot0+2*SlotBytes+slotExamples-HeaderBytes, le32(1<<30)...))
	f.Add(seedPatch(slot0+slotScoresOff-HeaderBytes, le32(4*PageSize-3)...))
	f.Add(seedPatch(c+img.lay.complEntries-HeaderBytes, le32(3)...))
	f.Add(seedPatch(c+laneState-HeaderBytes, le32(77)...))
	f.Add(seedPatch(c+laneEpoch-HeaderBytes, le32(0)...))
	f.Add(seedPatch(img.lay.batchRing+batchEntriesOff+batchStaging-HeaderBytes, le32(5)...))
	f.Add(seedPatch(img.lay.batchRing+batchEntriesOff+batchEntries-HeaderBytes, le32(9)...))
	f.Add(seedPatch(img.lay.stagingMeta+stagingEntriesOff+stFirstRow-HeaderBytes, le32(^uint32(0))...))
	f.Add(seedPatch(img.lay.stagingMeta-HeaderBytes, le32(1)...))
	f.Fuzz(func(t *testing.T, data []byte) {
		copy(img.mem, img.tmpl)
		s, err := attachMem("fuzz", img.mem, AttachOptions{})
		if err != nil {
			t.Fatal(err) // the template is valid
		}
		// Everything past the header is fair game. Half the patches land
		// before the handles exist, half while they are in use, as a
		// hostile process writing concurrently would.
		body := img.mem[HeaderBytes:]
		half := len(data) / 2
		patch(body, data[:half])
		exercise(t, s, func() { patch(body, data[half:]) })
	})
}

// exercise runs every reader and writer of the package over s, calling
// midway (if not nil) between two rounds. Errors are expected; panics fail.
func exercise(t *testing.T, s *Segment, midway func()) {
	g := s.Geometry()
	// The image is one contiguous mapping: play the owner (and the
	// accelerator), whose views of the accelerator's words are the
	// accelerator page's.
	s.owner = true
	s.useAccelPage()
	pid := uint32(os.Getpid())

	// The frontend of lane 0, holding whatever epoch the image says, with
	// every slot believed committed so Poll validates all the way.
	fe := s.newLane(s.lane(0), pid, atomic.LoadUint32(s.lane(0).epoch))
	for i := range fe.recs {
		fe.recs[i].state.Store(slotHeld | slotInFlight)
		fe.recs[i].examples = 1
	}
	fe.free = fe.free[:0]

	readers := make([]*RequestReader, g.Lanes)
	writers := make([]*CompletionWriter, g.Lanes)
	for i := range readers {
		readers[i], _ = s.RequestReader(i)
		writers[i], _ = s.CompletionWriter(i)
	}
	br, bw := s.BatchReader(), s.BatchWriter()

	for round := 0; round < 2; round++ {
		for _, rr := range readers {
			for k := 0; k < 2*g.RingCapacity; k++ {
				req, ok, err := rr.Next()
				if ok {
					if err != nil || len(req.Payload) != req.PayloadLength || req.Examples < 1 || req.Examples > g.MaxExamples {
						t.Fatalf("Next accepted %+v (%v)", req.SlotHeader, err)
					}
					rr.Canceled(req.Slot)
					w := writers[rr.Lane()]
					if sc, err := w.Scores(req.Slot, req.Epoch); err == nil && len(sc) != 4*req.Examples {
						t.Fatalf("scores of %d bytes for %d examples", len(sc), req.Examples)
					}
					w.Add(Completion{Slot: req.Slot, Epoch: req.Epoch, Examples: req.Examples})
				} else if err == nil {
					break
				}
			}
			rr.Canceled(-1)
			rr.Canceled(1 << 30)
		}
		for _, w := range writers {
			w.Scores(0, 0)
			w.Scores(g.SlotsPerLane, 0)
			w.Flush()
		}
		for k := 0; k < 2*g.RingCapacity; k++ {
			c, ok, err := fe.Poll()
			if ok {
				if sc, err := fe.Scores(c.Slot); err != nil || len(sc) != 4 {
					t.Fatalf("Scores of a completed slot: %d bytes, %v", len(sc), err)
				}
			} else if err == nil {
				break
			}
		}
		for k := 0; k < 4; k++ {
			b, ok, err := br.Poll()
			if ok {
				if len(b.Data) != g.StagingBytes {
					t.Fatalf("batch data of %d bytes", len(b.Data))
				}
				for i := 0; i < b.Entries+1; i++ {
					if e, err := br.Entry(b, i); err == nil && (e.Lane >= g.Lanes || e.Slot >= g.SlotsPerLane || e.FirstRow+e.Rows > b.Examples) {
						t.Fatalf("Entry accepted %+v", e)
					}
				}
				br.Done(b)
			} else if err == nil {
				break
			}
		}
		if st, ok := bw.TryAcquire(); ok {
			st.SetEntry(0, BatchEntry{})
			bw.Publish(st, BatchDesc{Entries: 1})
		}
		if l, err := s.ClaimLane(int(pid)); err == nil {
			if slot, _, err := l.Claim(1, 8); err == nil {
				l.Commit(slot, RequestMeta{ID: 1})
			}
			l.Poll()
			l.Release()
		}
		s.ReclaimLanes(0)
		s.EvictLane(0)
		s.Lanes()
		s.RequestsPending()
		s.PeersAlive()
		s.OwnerAlive(0)
		s.ServedCalls()
		for b := 1; b <= 1<<ExecTableBuckets; b *= 2 {
			if s.ExecTime(b) < 0 {
				t.Fatalf("ExecTime(%d) negative", b)
			}
		}
		if midway != nil && round == 0 {
			midway()
		}
	}
}
