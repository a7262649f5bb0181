package shm

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"
)

// This file holds the liveness rule every process applies to the others
// (doc.go, Liveness): pid checks where the pid namespace is shared,
// heartbeats everywhere, and the loop that beats them.

// OwnerAlive returns nil while the owner is serving: the state word is not
// closed and the owner passes the liveness rule (see peerAlive: pid check
// when the pid namespace is shared, else a heartbeat younger than
// staleAfter, 0 meaning the value given to Attach). Otherwise it returns an
// error wrapping ErrClosed or ErrOwnerDead.
func (s *Segment) OwnerAlive(staleAfter time.Duration) error {
	if s.State() == StateClosed {
		return fmt.Errorf("shm: %s: %w", s.path, ErrClosed)
	}
	pid := get32(s.mem, hdrOwnerPid)
	if s.owner && pid == s.pid {
		return nil // we are the owner and we are running
	}
	if err := s.peerAlive(pid, get64(s.mem, hdrOwnerPidNS), atomic.LoadUint64(s.ownerHB), staleAfter); err != nil {
		return fmt.Errorf("shm: %s: %w: owner pid %d %v", s.path, ErrOwnerDead, pid, err)
	}
	return nil
}

// PeersAlive is the check a frontend runs while it waits: the owner must be
// alive, and so must the accelerator once one has attached.
func (s *Segment) PeersAlive() error {
	if err := s.OwnerAlive(0); err != nil {
		return err
	}
	if err := s.AcceleratorAlive(0); err != nil && !errors.Is(err, ErrNoAccelerator) {
		return err
	}
	return nil
}

// peerAlive applies the liveness rule to one peer. When the peer shares
// this process's pid namespace, a pid that has exited is dead at once; a
// live pid whose beats stopped for DefaultHungAfter is dead when the kernel
// says it is stopped or that every thread of it sleeps (its work loop waits
// for something that will not come, so its pulse stopped the beats), and
// otherwise (a thread runs or waits for a CPU: an overloaded host starves
// it, it is not hung) only after DefaultStarvedAfter. A peer in another
// namespace is judged by its heartbeat alone, with staleAfter (0: the
// segment's value). The returned error only says why; callers wrap it.
func (s *Segment) peerAlive(pid uint32, pidNS, heartbeat uint64, staleAfter time.Duration) error {
	if staleAfter <= 0 {
		staleAfter = s.stale
	}
	// A heartbeat from the future is as suspect as an old one: it is either
	// corrupt or written under another clock.
	age := time.Duration(monoNow() - int64(heartbeat))
	if pidNS != 0 && pidNS == s.pidNS {
		if !pidAlive(pid) {
			return errors.New("has exited")
		}
		hung := max(staleAfter, DefaultHungAfter)
		if age <= hung && age >= -hung {
			return nil
		}
		switch activity(pid) {
		case procBusy:
			if age <= DefaultStarvedAfter && age >= -DefaultStarvedAfter {
				return nil
			}
			return fmt.Errorf("heartbeat is %v old though it runs (limit %v)", age, DefaultStarvedAfter)
		case procStopped:
			return fmt.Errorf("is stopped, heartbeat %v old (limit %v)", age, hung)
		default:
			return fmt.Errorf("heartbeat is %v old and it sleeps (limit %v)", age, hung)
		}
	}
	if age > staleAfter || age < -staleAfter {
		return fmt.Errorf("heartbeat is %v old (limit %v)", age, staleAfter)
	}
	return nil
}

// beatLoop calls beat every interval (0: DefaultHeartbeatInterval) while
// pulse is Live (nil: always), until ctx is done: Heartbeat and
// AcceleratorHeartbeat.
func beatLoop(ctx context.Context, interval time.Duration, pulse *Pulse, beat func()) error {
	if interval <= 0 {
		interval = DefaultHeartbeatInterval
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if pulse == nil || pulse.Live(0) {
			beat()
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}
