package shmbackend

import "sync/atomic"

// slotState is the one state machine of a slot handle's life, shared by
// the call that holds it and the attachment's completion reader. It is a
// set of claims, each dropped exactly once by exactly one party:
//
//   - held: a call holds the handle, from Acquire until its Release. Only
//     Release drops it.
//   - inFlight: the request was committed and its completion has not been
//     consumed. Only the completion reader drops it, or the attachment's
//     owner once the reader has stopped (dropInFlight).
//   - abandoned: the call stopped waiting (its context ended): the reader
//     must not deliver the completion. It is only ever added while
//     inFlight is set, and goes with it.
//
// Whoever drops the last claim frees the slot and its reference on the
// attachment, so a slot is freed once, by one party, whatever the order in
// which a cancelled call, its completion and a lost generation arrive.
type slotState struct{ v atomic.Uint32 }

const (
	claimHeld      uint32 = 1 << iota // a call holds the handle
	claimInFlight                     // committed, completion not consumed
	claimAbandoned                    // the caller stopped waiting
)

// acquire marks a free slot held.
func (s *slotState) acquire() { s.v.Store(claimHeld) }

// commit marks a held slot in flight, before the request is published: its
// completion may be read the moment it is.
func (s *slotState) commit() { s.v.Or(claimInFlight) }

// uncommit undoes commit when publishing failed: no completion will come.
func (s *slotState) uncommit() { s.v.And(^claimInFlight) }

// complete consumes a completion. deliver says the holder waits for it;
// last says no claim is left, so the caller of complete frees the slot.
// ok is false for a completion of a slot that is not in flight (stale or
// forged), which changes nothing.
func (s *slotState) complete() (deliver, last, ok bool) {
	for {
		old := s.v.Load()
		if old&claimInFlight == 0 {
			return false, false, false
		}
		next := old &^ (claimInFlight | claimAbandoned)
		if s.v.CompareAndSwap(old, next) {
			return old&claimHeld != 0 && old&claimAbandoned == 0, next == 0, true
		}
	}
}

// abandon records that the holder stops waiting. It returns false when the
// completion was consumed first: the reader delivers it (or, after a loss,
// nothing will), and the holder must not expect it to stay unread.
func (s *slotState) abandon() bool {
	for {
		old := s.v.Load()
		if old&claimInFlight == 0 {
			return false
		}
		if s.v.CompareAndSwap(old, old|claimAbandoned) {
			return true
		}
	}
}

// release drops the holder's claim; last says no claim is left.
func (s *slotState) release() (last bool) {
	return s.v.And(^claimHeld)&^claimHeld == 0
}

// inFlight reports whether a completion is still expected.
func (s *slotState) inFlight() bool { return s.v.Load()&claimInFlight != 0 }
