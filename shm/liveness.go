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
	if err := s.peerAlive(pid, get64(s.mem, hdrOwnerPidNS), atomic.LoadUint64(s.ownerHB), staleAfter, linkOwner); err != nil {
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

// peerLink names the kernel-held connection, if any, that says a peer in
// another pid namespace still exists: its pid is not ours to look up, but
// the broker connection it holds closes when it dies.
type peerLink uint8

const (
	linkNone  peerLink = iota // lanes: judged by their heartbeat alone
	linkOwner                 // this attacher's own connection to the owner's broker
	linkAccel                 // the accelerator's connection, as the owner publishes it
)

// linkOpen reports whether the kernel still holds link open. It costs a
// syscall for linkOwner, so peerAlive asks only about a late heartbeat.
func (s *Segment) linkOpen(link peerLink) bool {
	switch link {
	case linkOwner:
		return s.cl != nil && s.cl.c.open()
	case linkAccel:
		return atomic.LoadUint32(word32(s.mem, hdrAccelLinked)) != 0
	}
	return false
}

// peerAlive applies the liveness rule to one peer. When the peer shares
// this process's pid namespace, a pid that has exited is dead at once; a
// live pid whose beats stopped for DefaultHungAfter is dead when the kernel
// says it is stopped or that every thread of it sleeps (its work loop waits
// for something that will not come, so its pulse stopped the beats), and
// otherwise (a thread runs or waits for a CPU: an overloaded host starves
// it, it is not hung) only after DefaultStarvedAfter. A peer in another
// namespace is judged by its heartbeat, with staleAfter (0: the segment's
// value), unless link says the kernel still holds its connection open: the
// process exists, and a host too loaded to run it for a few beats (a node
// starting pods, say) must not end a generation, so its beats may then be
// late up to DefaultHungAfter. A killed peer's connection closes with it,
// so staleAfter still bounds how long a dead one is believed. The
// returned error only says why; callers wrap it.
func (s *Segment) peerAlive(pid uint32, pidNS, heartbeat uint64, staleAfter time.Duration, link peerLink) error {
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
	if age <= staleAfter && age >= -staleAfter {
		return nil
	}
	if !s.linkOpen(link) {
		return fmt.Errorf("heartbeat is %v old (limit %v)", age, staleAfter)
	}
	if hung := max(staleAfter, DefaultHungAfter); age > hung || age < -hung {
		return fmt.Errorf("heartbeat is %v old though its connection is open (limit %v)", age, hung)
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
