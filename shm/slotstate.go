package shm

import (
	"fmt"
	"sync/atomic"
)

// A slot's life is one state machine, kept by its Lane in the slot's
// record: a word of bits, two of them claims on the slot's arena room.
//
//   - slotHeld: a holder has the slot, from Claim until its Free. Only
//     Free drops it.
//   - slotInFlight: the request is committed and its completion not
//     consumed. Only the completion consumer (Poll) drops it, or
//     DropInFlight once nothing will consume completions any more.
//   - slotAbandoned: the holder stopped waiting (Abandon): the completion
//     is consumed but not delivered. Only set while in flight, and dropped
//     with it.
//   - slotAnswered: the completion was delivered to the holder, so its
//     scores are readable. Only set while held; Commit and Free drop it.
//
// Whoever drops the last claim frees the slot's room, so it is freed
// exactly once, and only when both the holder and the serving side are
// done with it, whatever the order in which a cancelled caller, its
// completion and a lost lane arrive. That keeps the rule that a slot's
// room belongs to the serving side from Commit until its completion,
// even when the caller gave up.
//
// The word is atomic because its parties run on different goroutines
// without a common lock: the holder's calls, the completion consumer and
// DropInFlight. Each transition is one atomic step, a compare-and-swap
// wherever another party may change the word at the same time.
const (
	slotHeld uint32 = 1 << iota
	slotInFlight
	slotAbandoned
	slotAnswered
)

// slotRecord is the frontend's own record of a slot: its state, and what
// it put in the slot, so it never has to trust the shared header to find
// the scores or free the room. examples, off and payload are written by
// Claim (under Lane.mu, before the state says held) and read by the
// parties the state admits, so they need no lock of their own.
type slotRecord struct {
	state    atomic.Uint32
	examples int32
	off      int32 // arena offset of the payload; scores follow
	payload  int32 // payload bytes
}

// room is the arena room of the record: payload then scores, 4-byte
// aligned.
func (r *slotRecord) room() (off, n int) {
	return int(r.off), roundUp(int(r.payload), 4) + 4*int(r.examples)
}

// scoresAt is where the record's scores start in the arena.
func (r *slotRecord) scoresAt() int { return int(r.off) + roundUp(int(r.payload), 4) }

// commit marks a held slot (new or answered) in flight, from the state old
// that Commit checked. Only the holder changes a slot that is not in
// flight, so the swap fails only when the holder raced itself.
func (r *slotRecord) commit(old uint32) bool {
	return r.state.CompareAndSwap(old, old&^slotAnswered|slotInFlight)
}

// endFlight drops the in-flight claim (and an abandonment with it).
// answer says a completion arrived: it is delivered if the holder still
// waits. freed says no claim is left, so the caller frees the room. ok is
// false when the slot was not in flight, which changes nothing.
func (r *slotRecord) endFlight(answer bool) (delivered, freed, ok bool) {
	for {
		old := r.state.Load()
		if old&slotInFlight == 0 {
			return false, false, false
		}
		next := old &^ (slotInFlight | slotAbandoned)
		delivered = answer && old&(slotHeld|slotAbandoned) == slotHeld
		if delivered {
			next |= slotAnswered
		}
		if r.state.CompareAndSwap(old, next) {
			return delivered, next == 0, true
		}
	}
}

// abandon marks an in-flight slot abandoned; false when its completion
// was consumed first (or the slot is not held).
func (r *slotRecord) abandon() bool {
	for {
		old := r.state.Load()
		if old&(slotHeld|slotInFlight) != slotHeld|slotInFlight {
			return false
		}
		if r.state.CompareAndSwap(old, old|slotAbandoned) {
			return true
		}
	}
}

// release drops the holder's claim. freed says no claim is left; ok is
// false when the slot was not held.
func (r *slotRecord) release() (freed, ok bool) {
	for {
		old := r.state.Load()
		if old&slotHeld == 0 {
			return false, false
		}
		next := old &^ (slotHeld | slotAnswered)
		if r.state.CompareAndSwap(old, next) {
			return next == 0, true
		}
	}
}

// slotStateName names a state word for errors.
func slotStateName(s uint32) string {
	switch s {
	case 0:
		return "idle"
	case slotHeld:
		return "claimed"
	case slotHeld | slotInFlight:
		return "committed"
	case slotHeld | slotInFlight | slotAbandoned:
		return "abandoned"
	case slotHeld | slotAnswered:
		return "completed"
	case slotInFlight, slotInFlight | slotAbandoned:
		return "released in flight"
	}
	return fmt.Sprintf("state %#x", s)
}

// Completed is a completion the lane consumed, with what consuming it did
// to its slot. A frontend that never abandons a slot nor frees one in
// flight can ignore all but the Completion.
type Completed struct {
	Completion
	// Abandoned: the holder stopped waiting (Abandon) or let the slot go
	// (Free) before the completion came: deliver nothing.
	Abandoned bool
	// Freed: the completion dropped the slot's last claim, so the slot
	// and its room are free again (the holder had let it go).
	Freed bool
}

// record is slot's record, if slot is one of the lane's.
func (l *Lane) record(slot int) (*slotRecord, error) {
	if slot < 0 || slot >= len(l.recs) {
		return nil, fmt.Errorf("shm: lane %d: slot %d outside [0, %d)", l.ctl.index, slot, len(l.recs))
	}
	return &l.recs[slot], nil
}

// stateError says slot is in state s, not one the call needs.
func (l *Lane) stateError(slot int, s uint32) error {
	return fmt.Errorf("shm: lane %d slot %d: %w: %s", l.ctl.index, slot, ErrState, slotStateName(s))
}

// Cancel asks the serving side to drop a committed request. The request
// still completes (with StatusCanceled, or normally if it was too late),
// and its room stays reserved until then. It is the holder's call.
func (l *Lane) Cancel(slot int) error {
	rec, err := l.record(slot)
	if err != nil {
		return err
	}
	if s := rec.state.Load(); s&(slotHeld|slotInFlight) != slotHeld|slotInFlight {
		return l.stateError(slot, s)
	}
	// The holder still holds the slot, so the flag lands in its own slot
	// even if the completion is consumed meanwhile; the next Commit
	// clears it.
	atomic.StoreUint32(slotCancelWord(l.ctl.slot(slot)), 1)
	return nil
}

// Abandon is the holder giving up on a committed request: it cancels it
// (Cancel) and marks it abandoned, so its completion will be consumed
// without being delivered. It returns false when the completion was
// consumed first: it was delivered (Poll returned it to be handed over)
// or, after DropInFlight, will never come. Either way the holder still
// holds the slot until its Free; the room is freed once both the holder
// has freed the slot and the completion was consumed.
func (l *Lane) Abandon(slot int) bool {
	if l.Cancel(slot) != nil {
		return false
	}
	return l.recs[slot].abandon()
}

// Scores returns the float32 scores (native-endian bytes) of a completed
// slot, located from the frontend's own record rather than the shared
// header. It is the holder's call and takes no lock: the record is the
// holder's until its Free.
func (l *Lane) Scores(slot int) ([]byte, error) {
	rec, err := l.record(slot)
	if err != nil {
		return nil, err
	}
	if s := rec.state.Load(); s&slotAnswered == 0 {
		return nil, l.stateError(slot, s)
	}
	off, n := rec.scoresAt(), 4*int(rec.examples)
	return l.ctl.arena[off : off+n : off+n], nil
}

// Free drops the holder's claim on a slot: after Claim it aborts the
// request, after its completion it ends it. freed says the slot and its
// room are free now. Freeing a slot still in flight gives up the request
// (its completion will not be delivered) but not the room, which belongs
// to the serving side until the completion is consumed (Poll, which then
// reports Freed) or DropInFlight. ErrState: the slot is not held.
func (l *Lane) Free(slot int) (freed bool, err error) {
	rec, err := l.record(slot)
	if err != nil {
		return false, err
	}
	freed, ok := rec.release()
	if !ok {
		return false, l.stateError(slot, rec.state.Load())
	}
	if !freed {
		return false, nil
	}
	return true, l.freeRoom(slot)
}

// freeRoom gives an idle slot's room back to the page allocator and the
// slot to the free stack. Only the party that dropped the slot's last
// claim calls it, so it runs once per Claim. The allocator refuses only a
// record that does not match what it handed out, a bug; the slot is idle
// either way, so it goes back to the stack, and the error is returned.
func (l *Lane) freeRoom(slot int) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	rec := &l.recs[slot]
	off, n := rec.room()
	err := l.pages.Free(off, n)
	rec.examples, rec.off, rec.payload = 0, 0, 0
	l.free = append(l.free, int32(slot))
	if err != nil {
		return fmt.Errorf("shm: lane %d slot %d: %w", l.ctl.index, slot, err)
	}
	return nil
}

// consume validates a completion against the slot it names and ends the
// slot's flight. A completion for a slot not in flight (never committed,
// already completed: stale or forged) or with the wrong example count is
// corrupt and changes nothing. Only the consumer calls it.
func (l *Lane) consume(c Completion) (Completed, error) {
	rec, err := l.record(c.Slot)
	if err != nil {
		return Completed{Completion: c}, fmt.Errorf("%w: completion: %w", ErrCorrupt, err)
	}
	// Only the consumer ends a flight (DropInFlight waits until it has
	// stopped): a slot seen in flight here stays so, with its record
	// fixed, until endFlight.
	if s := rec.state.Load(); s&slotInFlight == 0 {
		return Completed{Completion: c}, fmt.Errorf("%w: completion: %w", ErrCorrupt, l.stateError(c.Slot, s))
	}
	if c.Examples != int(rec.examples) && c.Status == StatusOK {
		return Completed{Completion: c}, fmt.Errorf("shm: lane %d slot %d: %w: completion for %d examples, request had %d",
			l.ctl.index, c.Slot, ErrCorrupt, c.Examples, rec.examples)
	}
	delivered, freed, _ := rec.endFlight(true)
	if freed {
		// The slot is idle whatever the allocator says; an error here is
		// a bug in the records, not the completion's doing.
		_ = l.freeRoom(c.Slot)
	}
	return Completed{Completion: c, Abandoned: !delivered, Freed: freed}, nil
}

// DropInFlight ends the flight of every slot whose completion was not
// consumed, as if it had come and nobody wanted it: call it once no
// completion will be consumed any more (the frontend gave the lane back,
// or lost it, and its consumer stopped). It returns how many slots it
// freed, those whose holder had let them go; a slot still held is freed by
// its holder's Free. The handle takes no new Claim or Commit afterwards
// (ErrLaneLost), so room the serving side may still write is never handed
// out again.
func (l *Lane) DropInFlight() (freed int) {
	l.mu.Lock()
	l.lost = true
	l.mu.Unlock()
	for i := range l.recs {
		if _, last, _ := l.recs[i].endFlight(false); last {
			_ = l.freeRoom(i) // as in consume
			freed++
		}
	}
	return freed
}
