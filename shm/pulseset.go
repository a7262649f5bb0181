package shm

import (
	"sync"
	"time"
)

// PulseSet holds the pulses of a process's work loops, one per segment
// generation it serves, so its health endpoint can ask them all: the
// process is live while every loop is. The embedder and the accelerator
// both serve a draining generation beside the new one during a rollout, so
// both keep one. The zero value is an empty set; its methods are safe for
// concurrent use (the loops register, health endpoints read).
type PulseSet struct {
	mu     sync.Mutex
	pulses map[*Pulse]struct{}
}

// Add registers a loop's pulse until Remove.
func (s *PulseSet) Add(p *Pulse) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.pulses == nil {
		s.pulses = map[*Pulse]struct{}{}
	}
	s.pulses[p] = struct{}{}
}

// Remove forgets a pulse whose loop has returned.
func (s *PulseSet) Remove(p *Pulse) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.pulses, p)
}

// Live reports whether every registered pulse is Live(gap): true with
// none, since waiting for a generation to serve is not being stuck.
func (s *PulseSet) Live(gap time.Duration) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for p := range s.pulses {
		if !p.Live(gap) {
			return false
		}
	}
	return true
}
