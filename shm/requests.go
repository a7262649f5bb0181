package shm

import (
	"fmt"
	"sync/atomic"
)

// Request is one validated request as the embedder reads it: where it came
// from, its slot header, and its payload inside the lane arena.
type Request struct {
	Lane  int
	Slot  int
	Epoch uint32
	SlotHeader
	// Payload is the request bytes in the lane arena. It stays valid until
	// the request is completed; the frontend does not touch it before.
	Payload []byte
}

// RequestReader is the embedder's consumer side of one lane's request ring.
// Use one per lane, from one goroutine.
type RequestReader struct {
	seg *Segment
	ctl *laneCtl
	r   ring
}

// RequestReader returns the consumer of lane i's request ring.
func (s *Segment) RequestReader(i int) (*RequestReader, error) {
	if err := s.checkLaneIndex(i); err != nil {
		return nil, err
	}
	c := s.lane(i)
	return &RequestReader{seg: s, ctl: c, r: s.requestRing(c).consumer()}, nil
}

// Lane is the lane index this reader consumes.
func (r *RequestReader) Lane() int { return r.ctl.index }

// Pending reports cheaply whether the ring seems to hold requests; Next
// does the validated read.
func (r *RequestReader) Pending() bool { return r.r.pending() }

// Next returns the next request, or ok=false when there is none or the
// lane is not active (entries of a releasing or draining lane are left for
// the reclaimer to drop). An entry that fails validation is consumed and
// reported as an error wrapping ErrStaleEpoch or ErrCorrupt, with Lane and
// Slot filled in when they are known; the caller may keep reading. Counters
// that fail validation return ErrCorrupt without consuming anything: the
// lane is unusable and should be evicted (Segment.EvictLane).
func (r *RequestReader) Next() (req Request, ok bool, err error) {
	if atomic.LoadUint32(r.ctl.state) != laneActive {
		return Request{}, false, nil
	}
	h, n, err := r.r.peek()
	if err != nil {
		return Request{Lane: r.ctl.index, Slot: -1}, false, fmt.Errorf("shm: lane %d requests: %w", r.ctl.index, err)
	}
	if n == 0 {
		return Request{}, false, nil
	}
	slot, epoch, err := readReqEntry(r.r.entry(h), r.seg.geo)
	r.r.release(h + 1)
	req = Request{Lane: r.ctl.index, Slot: slot, Epoch: epoch}
	if err != nil {
		return req, false, fmt.Errorf("shm: lane %d request: %w", r.ctl.index, err)
	}
	if cur := atomic.LoadUint32(r.ctl.epoch); epoch != cur {
		return req, false, fmt.Errorf("shm: lane %d slot %d: %w: entry epoch %d, lane epoch %d", r.ctl.index, slot, ErrStaleEpoch, epoch, cur)
	}
	if req.SlotHeader, err = readSlotHeader(r.ctl.slot(slot), r.seg.geo); err != nil {
		return req, false, fmt.Errorf("shm: lane %d slot %d: %w", r.ctl.index, slot, err)
	}
	o, l := req.PayloadOffset, req.PayloadLength
	req.Payload = r.ctl.arena[o : o+l : o+l]
	return req, true, nil
}

// Canceled reports whether the frontend has set the slot's cancel flag.
// The embedder checks it before lookup and drops cancelled work.
func (r *RequestReader) Canceled(slot int) bool {
	if slot < 0 || slot >= r.seg.geo.SlotsPerLane {
		return false
	}
	return atomic.LoadUint32(slotCancelWord(r.ctl.slot(slot))) != 0
}

// RequestsPending reports cheaply whether any lane's request ring seems to
// hold requests: the embedder's doorbell condition.
func (s *Segment) RequestsPending() bool {
	for i := 0; i < s.geo.Lanes; i++ {
		base := s.lay.laneBase(i) + laneReqCtl
		if atomic.LoadUint64(word64(s.mem, base+ringTail)) != atomic.LoadUint64(word64(s.mem, base+ringHead)) {
			return true
		}
	}
	return false
}

// CompletionWriter is the accelerator's producer side of one lane's
// completion ring. Use one per lane, from one goroutine.
type CompletionWriter struct {
	seg     *Segment
	ctl     *laneCtl
	r       ring
	start   uint64 // tail when the first pending entry was claimed
	pending uint64 // written but not yet published
}

// CompletionWriter returns the producer of lane i's completion ring.
func (s *Segment) CompletionWriter(i int) (*CompletionWriter, error) {
	if err := s.checkLaneIndex(i); err != nil {
		return nil, err
	}
	c := s.lane(i)
	return &CompletionWriter{seg: s, ctl: c, r: s.completionRing(c).producer()}, nil
}

// Lane is the lane index this writer completes.
func (w *CompletionWriter) Lane() int { return w.ctl.index }

// Scores returns the validated bytes where the accelerator writes the
// float32 scores of slot (4 × examples bytes, native-endian), after
// checking that the lane still holds epoch. ErrStaleEpoch means the request
// belonged to a previous owner of the lane: drop it, write nothing.
func (w *CompletionWriter) Scores(slot int, epoch uint32) ([]byte, error) {
	if err := w.check(slot, epoch); err != nil {
		return nil, err
	}
	h, err := readSlotHeader(w.ctl.slot(slot), w.seg.geo)
	if err != nil {
		return nil, fmt.Errorf("shm: lane %d slot %d: %w", w.ctl.index, slot, err)
	}
	o, n := h.ScoresOffset, 4*h.Examples
	return w.ctl.arena[o : o+n : o+n], nil
}

// Trace returns the trace context the frontend wrote into slot, after
// checking that the lane still holds epoch. The accelerator links its spans
// to it; a hostile value can only produce a useless link.
func (w *CompletionWriter) Trace(slot int, epoch uint32) (TraceContext, error) {
	if err := w.check(slot, epoch); err != nil {
		return TraceContext{}, err
	}
	return readSlotTrace(w.ctl.slot(slot)), nil
}

func (w *CompletionWriter) check(slot int, epoch uint32) error {
	if slot < 0 || slot >= w.seg.geo.SlotsPerLane {
		return fmt.Errorf("shm: lane %d: slot %d outside [0, %d)", w.ctl.index, slot, w.seg.geo.SlotsPerLane)
	}
	if cur := atomic.LoadUint32(w.ctl.epoch); cur != epoch {
		return fmt.Errorf("shm: lane %d slot %d: %w: request epoch %d, lane epoch %d", w.ctl.index, slot, ErrStaleEpoch, epoch, cur)
	}
	return nil
}

// Add writes a completion without publishing it; Flush publishes every
// added completion with one tail store and one doorbell ring. ErrFull can
// only happen when the frontend has stopped reading (ring capacity is at
// least the slot count).
func (w *CompletionWriter) Add(c Completion) error {
	if err := w.check(c.Slot, c.Epoch); err != nil {
		return err
	}
	if c.Examples < 0 || c.Examples > w.seg.geo.MaxExamples {
		return fmt.Errorf("shm: lane %d slot %d: %d examples outside [0, %d]", w.ctl.index, c.Slot, c.Examples, w.seg.geo.MaxExamples)
	}
	t, err := w.r.claim(w.pending + 1)
	if err != nil {
		return fmt.Errorf("shm: lane %d completions: %w", w.ctl.index, err)
	}
	if w.pending == 0 {
		w.start = t
	}
	t = w.start
	atomic.StoreUint32(slotStatusWord(w.ctl.slot(c.Slot)), uint32(c.Status))
	writeCompletion(w.r.entry(t+w.pending), c)
	w.pending++
	return nil
}

// Flush publishes the added completions and wakes the frontend if it sleeps.
func (w *CompletionWriter) Flush() {
	if w.pending == 0 {
		return
	}
	w.r.commit(w.start + w.pending)
	w.pending = 0
	w.ctl.bell.Ring()
}

// Complete is Add followed by Flush.
func (w *CompletionWriter) Complete(c Completion) error {
	if err := w.Add(c); err != nil {
		return err
	}
	w.Flush()
	return nil
}
