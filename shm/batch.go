package shm

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
)

// BatchDesc describes one batch on the batch ring.
type BatchDesc struct {
	Seq      uint64 // 1, 2, 3, ... in publication order; set by Publish
	Staging  int    // staging buffer holding the batch; set by Publish
	Examples int    // rows in the staging buffer
	Entries  int    // requests carried (entries table length)
	Trace    TraceContext
}

// BatchEntry is one request carried by a batch: which lane slot it answers
// and which rows of the staging buffer are its examples.
type BatchEntry struct {
	Lane     int
	Slot     int
	Epoch    uint32
	FirstRow int
	Rows     int
	Status   Status // StatusOK, or why the embedder dropped it (Rows is then 0)
}

// Batch is a batch as the accelerator reads it.
type Batch struct {
	BatchDesc
	// Data is the staging buffer: Examples rows the embedder wrote, in a
	// format the embedder and accelerator agree on. It starts page-aligned,
	// so it can be wrapped as a zero-copy device buffer.
	Data []byte
}

// Staging is one staging buffer: its state word, entries table and data.
type Staging struct {
	index   int
	state   *uint32
	entries []byte
	data    []byte
}

func (s *Segment) newStagings() []Staging {
	out := make([]Staging, s.geo.StagingCount)
	for i := range out {
		m := s.lay.stagingMeta + i*s.lay.metaStride
		d := s.lay.stagingData + i*s.geo.StagingBytes
		ents := m + stagingEntriesOff
		out[i] = Staging{
			index:   i,
			state:   word32(s.mem, m+stagingState),
			entries: s.mem[ents : ents+s.geo.MaxBatchEntries*stagingEntryBytes : ents+s.geo.MaxBatchEntries*stagingEntryBytes],
			data:    s.mem[d : d+s.geo.StagingBytes : d+s.geo.StagingBytes],
		}
	}
	return out
}

// Index is the staging buffer's index.
func (st *Staging) Index() int { return st.index }

// Data is the whole staging buffer, for the embedder to fill.
func (st *Staging) Data() []byte { return st.data }

// SetEntry writes entry i of the batch being filled.
func (st *Staging) SetEntry(i int, e BatchEntry) error {
	if i < 0 || i >= len(st.entries)/stagingEntryBytes {
		return fmt.Errorf("shm: staging %d: entry %d outside [0, %d)", st.index, i, len(st.entries)/stagingEntryBytes)
	}
	if atomic.LoadUint32(st.state) != stagingFilling {
		return fmt.Errorf("shm: staging %d: %w: not filling", st.index, ErrState)
	}
	writeStagingEntry(st.entries[i*stagingEntryBytes:(i+1)*stagingEntryBytes], e)
	return nil
}

// BatchWriter is the embedder's side of the staging buffers and the batch
// ring. Use one per segment, from the goroutine that builds batches.
type BatchWriter struct {
	seg  *Segment
	r    ring
	st   []Staging
	next int // where the next free-buffer scan starts
	free func() bool
	// Pulse, when set, is ticked on every wake-up of Acquire's wait.
	Pulse *Pulse
}

// BatchWriter returns the embedder's batch producer.
func (s *Segment) BatchWriter() *BatchWriter {
	w := &BatchWriter{
		seg: s,
		r:   newRing(s.mem, s.lay.batchRing, s.lay.batchRing+batchEntriesOff, s.lay.batchRingCap, batchEntryBytes).producer(),
		st:  s.staging,
	}
	w.free = w.anyFree
	return w
}

func (w *BatchWriter) anyFree() bool {
	for i := range w.st {
		if atomic.LoadUint32(w.st[i].state) == stagingFree {
			return true
		}
	}
	return false
}

// TryAcquire claims a free staging buffer for filling, or returns ok=false
// when the accelerator holds them all.
func (w *BatchWriter) TryAcquire() (*Staging, bool) {
	for k := range w.st {
		st := &w.st[(w.next+k)%len(w.st)]
		if atomic.CompareAndSwapUint32(st.state, stagingFree, stagingFilling) {
			w.next = (st.index + 1) % len(w.st)
			return st, true
		}
	}
	return nil, false
}

// Acquire claims a free staging buffer, waiting on the staging doorbell
// while the accelerator holds them all. It fails when ctx is done or the
// accelerator dies (ErrAcceleratorDead), so the embedder can fail the
// requests it holds instead of hanging.
func (w *BatchWriter) Acquire(ctx context.Context) (*Staging, error) {
	for {
		if st, ok := w.TryAcquire(); ok {
			return st, nil
		}
		got, err := w.seg.stagingBell.Wait(ctx, w.free, DefaultLivenessTick)
		if err != nil {
			return nil, err
		}
		if w.Pulse != nil {
			w.Pulse.Tick() // waiting on the accelerator is not being stuck
		}
		if !got {
			if err := w.seg.AcceleratorAlive(0); err != nil && !errors.Is(err, ErrNoAccelerator) {
				return nil, err
			}
		}
	}
}

// Abort returns a buffer that is being filled without publishing it.
func (w *BatchWriter) Abort(st *Staging) error {
	if !atomic.CompareAndSwapUint32(st.state, stagingFilling, stagingFree) {
		return fmt.Errorf("shm: abort staging %d: %w: not filling", st.index, ErrState)
	}
	return nil
}

// Publish hands a filled buffer to the accelerator: it marks the buffer
// ready, publishes the descriptor on the batch ring (the tail store is the
// last write) and rings the batch doorbell. It returns the batch seq.
func (w *BatchWriter) Publish(st *Staging, d BatchDesc) (uint64, error) {
	if d.Entries < 0 || d.Entries > w.seg.geo.MaxBatchEntries || d.Examples < 0 || d.Examples > 1<<31-1 {
		return 0, fmt.Errorf("shm: publish batch: %d entries, %d examples out of range", d.Entries, d.Examples)
	}
	if atomic.LoadUint32(st.state) != stagingFilling {
		return 0, fmt.Errorf("shm: publish staging %d: %w: not filling", st.index, ErrState)
	}
	t, err := w.r.claim(1)
	if err != nil {
		return 0, fmt.Errorf("shm: publish batch: %w", err)
	}
	seq := t + 1
	d.Seq, d.Staging = seq, st.index
	writeBatchDesc(w.r.entry(t), d)
	atomic.StoreUint32(st.state, stagingReady)
	w.r.commit(seq)
	w.seg.batchBell.Ring()
	return seq, nil
}

// BatchReader is the accelerator's side of the batch ring. Use one per
// segment, from one goroutine.
type BatchReader struct {
	seg     *Segment
	r       ring
	st      []Staging
	done    uint64 // every batch ≤ done is finished
	window  uint64 // bit i: batch done+2+i finished out of order
	hasWork func() bool
	// Pulse, when set, is ticked on every wake-up of Wait, so an idle
	// accelerator loop counts as live.
	Pulse *Pulse
}

// BatchReader returns the accelerator's batch consumer.
func (s *Segment) BatchReader() *BatchReader {
	r := &BatchReader{
		seg:  s,
		r:    newRing(s.mem, s.lay.batchRing, s.lay.batchRing+batchEntriesOff, s.lay.batchRingCap, batchEntryBytes).consumer(),
		st:   s.staging,
		done: s.CompletedSeq(),
	}
	r.hasWork = r.r.pending
	return r
}

// Poll returns the next batch, or ok=false when none is waiting. A
// descriptor that fails validation is consumed and reported as an error
// wrapping ErrCorrupt.
func (r *BatchReader) Poll() (b Batch, ok bool, err error) {
	h, n, err := r.r.peek()
	if err != nil {
		return Batch{}, false, fmt.Errorf("shm: batch ring: %w", err)
	}
	if n == 0 {
		return Batch{}, false, nil
	}
	b.BatchDesc, err = readBatchDesc(r.r.entry(h), h, r.seg.geo)
	r.r.release(h + 1)
	if err != nil {
		return b, false, err
	}
	st := &r.st[b.Staging]
	if s := atomic.LoadUint32(st.state); s != stagingReady {
		// Staging and Entries stay zero, as readBatchDesc leaves them on
		// its own errors: nothing can index with a rejected descriptor.
		err := fmt.Errorf("shm: batch %d: %w: staging %d in state %d, not ready", b.Seq, ErrCorrupt, b.Staging, s)
		b.Staging, b.Entries = 0, 0
		return b, false, err
	}
	b.Data = st.data
	return b, true, nil
}

// Wait returns the next batch, sleeping on the batch doorbell while there
// is none. It fails with the owner's liveness error when the embedder
// dies, or with ctx's error.
func (r *BatchReader) Wait(ctx context.Context) (Batch, error) {
	for {
		b, ok, err := r.Poll()
		if ok || err != nil {
			return b, err
		}
		got, err := r.seg.batchBell.Wait(ctx, r.hasWork, DefaultLivenessTick)
		if err != nil {
			return Batch{}, err
		}
		if r.Pulse != nil {
			r.Pulse.Tick() // waiting is progress: the loop is here, not stuck
		}
		if !got {
			if err := r.seg.OwnerAlive(0); err != nil {
				return Batch{}, err
			}
		}
	}
}

// Entry returns entry i of batch b, validated against the segment and the
// batch: lane and slot in range, rows inside the batch.
func (r *BatchReader) Entry(b Batch, i int) (BatchEntry, error) {
	if i < 0 || i >= b.Entries || b.Staging < 0 || b.Staging >= len(r.st) {
		return BatchEntry{}, fmt.Errorf("shm: batch %d: entry %d outside [0, %d)", b.Seq, i, b.Entries)
	}
	st := &r.st[b.Staging]
	if (i+1)*stagingEntryBytes > len(st.entries) {
		return BatchEntry{}, fmt.Errorf("shm: batch %d: entry %d beyond the entries table", b.Seq, i)
	}
	e, err := readStagingEntry(st.entries[i*stagingEntryBytes:(i+1)*stagingEntryBytes], r.seg.geo, b.Examples)
	if err != nil {
		return e, fmt.Errorf("shm: batch %d entry %d: %w", b.Seq, i, err)
	}
	return e, nil
}

// Executed records that the device finished executing batch b, before its
// completions are written: the embedder's batching then knows the device
// is free for the next batch. Batches execute in seq order on the one
// device; an older seq than one already recorded is ignored.
func (r *BatchReader) Executed(b Batch) {
	for {
		cur := atomic.LoadUint64(r.seg.executed)
		if b.Seq <= cur || atomic.CompareAndSwapUint64(r.seg.executed, cur, b.Seq) {
			return
		}
	}
}

// Done returns batch b's staging buffer to the embedder and advances the
// completed seq, which the reclaimer reads to know that no batch still
// writes into a draining lane's arena. Batches may finish out of order (up
// to 64 ahead); the completed seq only covers a gap-free prefix.
func (r *BatchReader) Done(b Batch) error {
	if b.Staging < 0 || b.Staging >= len(r.st) {
		return fmt.Errorf("shm: batch %d done: staging %d out of range", b.Seq, b.Staging)
	}
	if b.Seq <= r.done || b.Seq > r.done+65 {
		return fmt.Errorf("shm: batch %d done: %w: completed up to %d", b.Seq, ErrState, r.done)
	}
	if b.Seq > r.done+1 && r.window&(1<<(b.Seq-r.done-2)) != 0 {
		return fmt.Errorf("shm: batch %d done twice: %w", b.Seq, ErrState)
	}
	if !atomic.CompareAndSwapUint32(r.st[b.Staging].state, stagingReady, stagingFree) {
		return fmt.Errorf("shm: batch %d done: %w: staging %d not ready", b.Seq, ErrState, b.Staging)
	}
	if b.Seq == r.done+1 {
		r.done++
		for r.window&1 != 0 {
			r.window >>= 1
			r.done++
		}
		r.window >>= 1
	} else {
		r.window |= 1 << (b.Seq - r.done - 2)
	}
	atomic.StoreUint64(r.seg.completed, r.done)
	r.seg.stagingBell.Ring()
	return nil
}
