package shm

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// laneCtl is the set of views into one lane's control block and arena.
type laneCtl struct {
	index     int
	owner     *uint32
	epoch     *uint32
	state     *uint32
	heartbeat *uint64
	pidNS     *uint64
	drainSeq  *uint64
	counters  counterBlock // lane counters record (counters.go): served, missed
	bell      *Doorbell
	block     []byte // the control block
	slots     []byte // the slot table
	arena     []byte
	reqCtl    int // offsets of the ring parts within the mapping
	reqEnts   int
	complCtl  int
	complEnts int
}

// lane returns the views of lane i; i must be in [0, Lanes).
func (s *Segment) lane(i int) *laneCtl { return &s.lanes[i] }

func (s *Segment) newLaneCtl(i int) laneCtl {
	base := s.lay.laneBase(i)
	block := s.mem[base : base+s.lay.laneStride : base+s.lay.laneStride]
	slots := block[s.lay.slots : s.lay.slots+s.geo.SlotsPerLane*SlotBytes]
	ab := s.lay.arenaBase(i, s.geo)
	return laneCtl{
		index:     i,
		owner:     word32(block, laneOwner),
		epoch:     word32(block, laneEpoch),
		state:     word32(block, laneState),
		heartbeat: word64(block, laneHeartbeat),
		pidNS:     word64(block, lanePidNS),
		drainSeq:  word64(block, laneDrainSeq),
		counters:  newCounterBlock(block, laneCounters, &laneCounterRecord),
		bell:      newDoorbell(block, laneBell),
		block:     block,
		slots:     slots[:len(slots):len(slots)],
		arena:     s.mem[ab : ab+s.geo.ArenaBytes : ab+s.geo.ArenaBytes],
		reqCtl:    base + laneReqCtl,
		reqEnts:   base + laneReqEntries,
		complCtl:  base + laneComplCtl,
		complEnts: base + s.lay.complEntries,
	}
}

func (s *Segment) requestRing(c *laneCtl) ring {
	return newRing(s.mem, c.reqCtl, c.reqEnts, s.geo.RingCapacity, reqEntryBytes)
}

func (s *Segment) completionRing(c *laneCtl) ring {
	return newRing(s.mem, c.complCtl, c.complEnts, s.geo.RingCapacity, complEntryBytes)
}

// slot is the header bytes of slot i; i must be in [0, SlotsPerLane).
func (c *laneCtl) slot(i int) []byte {
	return c.slots[i*SlotBytes : (i+1)*SlotBytes : (i+1)*SlotBytes]
}

func (s *Segment) checkLaneIndex(i int) error {
	if i < 0 || i >= s.geo.Lanes {
		return fmt.Errorf("shm: lane %d outside [0, %d)", i, s.geo.Lanes)
	}
	return nil
}

// Completion is one completion ring entry: the serving side's answer to
// the request in Slot.
type Completion struct {
	Slot     int
	Epoch    uint32
	Status   Status // StatusOK or the producer's code
	Examples int
}

// RequestMeta is what Commit writes into the slot header beside what Claim
// already decided (examples, payload and scores placement).
type RequestMeta struct {
	ID       uint64
	Deadline int64 // unix ns; 0 means none
	Trace    TraceContext
	// Arrival is when the request reached the frontend; zero: unknown.
	Arrival time.Time
}

// Lane is a frontend's claimed lane: the producer side of its request ring,
// the consumer side of its completion ring, its slots and its arena.
//
// A request goes Claim → (fill the payload) → Commit → completion (Poll or
// WaitCompletion) → Scores → Free; Free after Claim aborts it. A completed
// slot may be committed again with the same room. A caller that gives up
// waits no longer: Abandon, then Free. Each slot's life is one state
// machine, kept here (slotstate.go): its room belongs to the serving side
// from Commit until its completion is consumed, also when the request is
// abandoned, and whoever of the holder's Free, the completion and
// DropInFlight comes last frees it.
//
// Concurrency, the one contract of the package's shared handles: a Lane is
// shared by a frontend's callers and its completion consumer.
//
//   - Any goroutine may Claim, and call InFlight, FreePages, Beat,
//     Heartbeat and Release.
//   - A slot's holder (from Claim until its Free) alone calls Commit,
//     Cancel, Abandon, Scores and Free on it.
//   - One goroutine at a time consumes completions (Poll, WaitCompletion)
//     and hands them to the holders; DropInFlight is for once it has
//     stopped for good.
//
// Claim, Commit and a Free that frees room take mu (the request ring's
// producer side, the free stack and the page allocator). Nothing else on
// a request's path locks: the slot states are atomic, so Scores, Cancel,
// Abandon and a Free of a slot in flight do not, and the consumer, alone
// on its side of the completion ring, never waits on a caller.
type Lane struct {
	seg   *Segment
	ctl   *laneCtl
	pid   uint32
	epoch uint32
	recs  []slotRecord // each slot's state machine; see slotstate.go

	mu    sync.Mutex
	req   ring // producer side
	pages *PageAllocator
	free  []int32 // idle slot indices, a stack
	lost  bool

	compl   ring        // consumer side: the one consumer goroutine's
	hasWork func() bool // compl has entries; stored once so waits do not allocate
}

// ClaimLane claims a free lane for the frontend process pid and bumps the
// lane's epoch so nothing addressed to a previous owner can be mistaken for
// this one's. In an attached frontend the owner's broker chooses the lane
// (pid must be this process) and hands over its memory; in the owner's own
// process (and the accelerator's, which maps every lane) the claim is a
// compare-and-swap on the lane's owner word. It fails with ErrNoFreeLane
// when every lane is owned and with ErrDraining or ErrClosed when the
// segment no longer accepts work.
func (s *Segment) ClaimLane(pid int) (*Lane, error) {
	if pid <= 0 || pid > 1<<31-1 {
		return nil, fmt.Errorf("shm: claim lane: bad pid %d", pid)
	}
	if err := s.acceptsWork(); err != nil {
		return nil, fmt.Errorf("shm: claim lane: %w", err)
	}
	if s.cl != nil && !s.cl.accel.Load() {
		// A frontend is assigned a lane by the owner's broker; the
		// accelerator maps every lane already.
		return s.claimRemote(pid)
	}
	n := s.geo.Lanes
	for k := 0; k < n; k++ {
		// Start at a pid-dependent lane so concurrent claimers rarely collide.
		c := s.lane((pid + k) % n)
		if epoch, ok := s.claimCtl(c, uint32(pid), s.pidNS); ok {
			return s.newLane(c, uint32(pid), epoch), nil
		}
	}
	return nil, fmt.Errorf("shm: claim lane in %s: %w", s.path, ErrNoFreeLane)
}

// claimCtl claims lane c for pid (of pid namespace pidNS) if it is free,
// and returns the lane's new epoch.
func (s *Segment) claimCtl(c *laneCtl, pid uint32, pidNS uint64) (uint32, bool) {
	if atomic.LoadUint32(c.owner) != noOwner {
		return 0, false
	}
	// A fresh heartbeat before the claim is visible, so the reclaimer
	// never judges a just-claimed lane by its previous owner's beat.
	atomic.StoreUint64(c.heartbeat, uint64(monoNow()))
	if !atomic.CompareAndSwapUint32(c.owner, noOwner, pid) {
		return 0, false
	}
	epoch := atomic.AddUint32(c.epoch, 1)
	atomic.StoreUint64(c.pidNS, pidNS)
	atomic.StoreUint64(c.heartbeat, uint64(monoNow()))
	if !atomic.CompareAndSwapUint32(c.state, laneFree, laneActive) {
		// The owner word said free but the state did not: corrupt.
		// Hand the owner word back and try the next lane.
		atomic.StoreUint32(c.owner, noOwner)
		return 0, false
	}
	return epoch, true
}

func (s *Segment) newLane(c *laneCtl, pid, epoch uint32) *Lane {
	slots := s.geo.SlotsPerLane
	l := &Lane{
		seg:   s,
		ctl:   c,
		pid:   pid,
		epoch: epoch,
		req:   s.requestRing(c).producer(),
		compl: s.completionRing(c).consumer(),
		pages: NewPageAllocator(s.geo.ArenaBytes),
		recs:  make([]slotRecord, slots),
		free:  make([]int32, slots),
	}
	for i := range l.free {
		l.free[i] = int32(slots - 1 - i) // pop order 0, 1, 2, ...
	}
	l.hasWork = l.compl.pending
	return l
}

// acceptsWork reports why the segment takes no new work, if it does not.
func (s *Segment) acceptsWork() error {
	switch st := s.State(); st {
	case StateReady:
		return nil
	case StateDraining:
		return ErrDraining
	case StateClosed:
		return ErrClosed
	default:
		return fmt.Errorf("%w: state %v", ErrNotReady, st)
	}
}

// Index is the lane's index in the segment.
func (l *Lane) Index() int { return l.ctl.index }

// Epoch is the lane epoch this claim holds.
func (l *Lane) Epoch() uint32 { return l.epoch }

// Arena is the lane's payload and scores arena.
func (l *Lane) Arena() []byte { return l.ctl.arena }

// Bell is the doorbell the accelerator rings after publishing completions.
func (l *Lane) Bell() *Doorbell { return l.ctl.bell }

// InFlight is the number of committed requests still awaiting completion.
// It reads the slot states, a snapshot: the hot path keeps no count.
func (l *Lane) InFlight() int {
	n := 0
	for i := range l.recs {
		if l.recs[i].state.Load()&slotInFlight != 0 {
			n++
		}
	}
	return n
}

// FreePages is the number of arena pages not reserved by a slot.
func (l *Lane) FreePages() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.pages.FreePages()
}

// checkOwned fails with ErrLaneLost once the lane is no longer this claim's.
// Caller holds mu.
func (l *Lane) checkOwned() error {
	if l.lost || atomic.LoadUint32(l.ctl.epoch) != l.epoch || atomic.LoadUint32(l.ctl.owner) != l.pid {
		l.lost = true
		return fmt.Errorf("shm: lane %d epoch %d: %w", l.ctl.index, l.epoch, ErrLaneLost)
	}
	return nil
}

// Claim reserves an idle slot and arena room for a request of examples
// examples and payloadBytes of payload (and its float32 scores). It returns
// the slot and the payload bytes to fill. ErrFull means no idle slot or no
// room: the frontend should answer "resource exhausted".
func (l *Lane) Claim(examples, payloadBytes int) (slot int, payload []byte, err error) {
	g := l.seg.geo
	if examples < 1 || examples > g.MaxExamples || payloadBytes < 0 || payloadBytes > g.ArenaBytes {
		return 0, nil, fmt.Errorf("shm: claim slot: %d examples, %d bytes outside the lane's limits", examples, payloadBytes)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.checkOwned(); err != nil {
		return 0, nil, err
	}
	if len(l.free) == 0 {
		return 0, nil, fmt.Errorf("shm: claim slot: %w: all %d slots in use", ErrFull, g.SlotsPerLane)
	}
	// Payload then scores in one run; scores start 4-byte aligned.
	scores := roundUp(payloadBytes, 4)
	off, ok := l.pages.Alloc(scores + 4*examples)
	if !ok {
		return 0, nil, fmt.Errorf("shm: claim slot: %w: no %d-byte run in the arena", ErrFull, scores+4*examples)
	}
	slot = int(l.free[len(l.free)-1])
	l.free = l.free[:len(l.free)-1]
	rec := &l.recs[slot]
	rec.examples, rec.off, rec.payload = int32(examples), int32(off), int32(payloadBytes)
	rec.state.Store(slotHeld) // last: the record is complete for whoever sees the state
	return slot, l.ctl.arena[off : off+payloadBytes : off+payloadBytes], nil
}

// Commit writes the slot header and publishes the slot on the request ring
// (the tail store is the last write), then rings the embedder's doorbell.
// The slot must be claimed, or completed (to send it again).
func (l *Lane) Commit(slot int, m RequestMeta) error {
	rec, err := l.record(slot)
	if err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.checkOwned(); err != nil {
		return err
	}
	if err := l.seg.acceptsWork(); err != nil {
		return fmt.Errorf("shm: commit lane %d: %w", l.ctl.index, err)
	}
	s := rec.state.Load()
	if s&(slotHeld|slotInFlight) != slotHeld {
		return l.stateError(slot, s)
	}
	t, err := l.req.claim(1)
	if err != nil {
		return fmt.Errorf("shm: commit lane %d slot %d: %w", l.ctl.index, slot, err)
	}
	h := SlotHeader{
		RequestID:     m.ID,
		Deadline:      m.Deadline,
		Examples:      int(rec.examples),
		PayloadOffset: int(rec.off),
		PayloadLength: int(rec.payload),
		ScoresOffset:  int(rec.off) + roundUp(int(rec.payload), 4),
		Trace:         m.Trace,
	}
	if !m.Arrival.IsZero() {
		h.Arrival = ArrivalStamp(m.Arrival)
	}
	writeSlotHeader(l.ctl.slot(slot), &h)
	writeReqEntry(l.req.entry(t), slot, l.epoch)
	// In flight before it is published: its completion may be consumed
	// the moment it is.
	if !rec.commit(s) {
		return l.stateError(slot, rec.state.Load()) // the holder raced itself
	}
	l.req.commit(t + 1)
	l.seg.embedder.Ring()
	return nil
}

// Poll consumes the next completion, or returns ok=false when none is
// waiting. The completion's slot is then completed (its scores readable)
// if its holder waits for it; Completed says when not, and when consuming
// it freed the slot. A completion that fails validation is consumed and
// reported as an error: ErrStaleEpoch (left over from a previous owner) is
// harmless and the caller may keep polling; ErrCorrupt (unknown or not
// committed slot, wrong count, broken counters) means the lane cannot be
// trusted: fail its in-flight work, Release it and claim another.
func (l *Lane) Poll() (c Completed, ok bool, err error) {
	h, n, err := l.compl.peek()
	if err != nil {
		return Completed{}, false, fmt.Errorf("shm: lane %d completions: %w", l.ctl.index, err)
	}
	if n == 0 {
		return Completed{}, false, nil
	}
	cpl, err := readCompletion(l.compl.entry(h), l.epoch, l.seg.geo)
	l.compl.release(h + 1)
	if err != nil {
		return Completed{Completion: cpl}, false, fmt.Errorf("shm: lane %d completion for slot %d: %w", l.ctl.index, cpl.Slot, err)
	}
	if c, err = l.consume(cpl); err != nil {
		return c, false, err
	}
	return c, true, nil
}

// WaitCompletion returns the next completion. It spins briefly, then
// sleeps on the lane's doorbell; every DefaultLivenessTick without a
// completion it checks that the owner and the accelerator are alive and the
// lane is still this claim's, and returns an error wrapping ErrOwnerDead,
// ErrAcceleratorDead, ErrClosed or ErrLaneLost when not, so in-flight work
// fails instead of hanging. It also returns ctx's error when ctx is done.
func (l *Lane) WaitCompletion(ctx context.Context) (Completed, error) {
	for {
		c, ok, err := l.Poll()
		if ok || err != nil {
			return c, err
		}
		got, err := l.ctl.bell.Wait(ctx, l.hasWork, DefaultLivenessTick)
		if err != nil {
			return Completed{}, err
		}
		if got {
			continue
		}
		if err := l.seg.PeersAlive(); err != nil {
			return Completed{}, err
		}
		l.mu.Lock()
		err = l.checkOwned()
		l.mu.Unlock()
		if err != nil {
			return Completed{}, err
		}
	}
}

// Beat stamps the lane heartbeat, or returns ErrLaneLost when the lane was
// reclaimed from under this claim (the frontend stalled too long).
func (l *Lane) Beat() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.checkOwned(); err != nil {
		return err
	}
	atomic.StoreUint64(l.ctl.heartbeat, uint64(monoNow()))
	return nil
}

// Heartbeat beats every interval (0: DefaultHeartbeatInterval) until ctx is
// done (returning ctx's error) or the lane is lost (ErrLaneLost).
func (l *Lane) Heartbeat(ctx context.Context, interval time.Duration) error {
	if interval <= 0 {
		interval = DefaultHeartbeatInterval
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if err := l.Beat(); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

// Release gives the lane back. With nothing in flight and nothing unread
// the lane is free at once; otherwise it is handed to the embedder, which
// frees it, emptying its rings, when no batch can still write into its
// arena. The handle is dead afterwards.
func (l *Lane) Release() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.checkOwned(); err != nil {
		return err
	}
	l.lost = true
	// No Commit can start under mu; a flight that ends meanwhile only
	// makes the lane look busier than it is. Unread completions with
	// nothing in flight (spurious ones: every committed request is in
	// flight until its completion is read) go the embedder's way too,
	// rather than being dropped here: the consumer, which takes no lock,
	// may be reading them, and its head store would undo a drop.
	idle := l.InFlight() == 0 && !l.req.pending() && !l.compl.pending()
	if idle && atomic.CompareAndSwapUint32(l.ctl.state, laneActive, laneFree) {
		atomic.AddUint32(l.ctl.epoch, 1)
		atomic.StoreUint32(l.ctl.owner, noOwner) // last: the lane is claimable
		return nil
	}
	if !atomic.CompareAndSwapUint32(l.ctl.state, laneActive, laneReleasing) {
		return fmt.Errorf("shm: release lane %d: %w", l.ctl.index, ErrLaneLost)
	}
	return nil
}

// CountServed records one call served through the lane (answered with its
// scores) and whether it took longer than the latency target. The
// embedder's SLO batching reads the sums (ServedCalls) to learn how the
// answers it planned actually fared end to end.
func (l *Lane) CountServed(missedTarget bool) {
	l.ctl.counters.Add(counterServed, 1)
	if missedTarget {
		l.ctl.counters.Add(counterMissed, 1)
	}
}

// ServedCalls sums every lane's CountServed counters, counts of the lane
// counters record (counters.go). They only grow while the segment lives (a
// lane keeps its counts across owners), so a reader takes differences; a
// hostile frontend can make its lane's move backwards, or the sums wrap,
// which a reader must treat as a restart, not a negative count.
func (s *Segment) ServedCalls() (calls, misses uint64) {
	for i := range s.lanes {
		c := &s.lanes[i].counters
		calls += c.Load(counterServed)
		misses += c.Load(counterMissed)
	}
	return calls, misses
}

// ControlBlock is the lane's control block as raw bytes: header, doorbell,
// ring counters, ring entries and slot table. Nothing in recmesh writes it
// this way; fault-injection tools (make chaos's hostile frontend) do, to
// prove that what one lane's owner scribbles there stays in its lane.
func (l *Lane) ControlBlock() []byte { return l.ctl.block }
