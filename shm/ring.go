package shm

import (
	"fmt"
	"sync/atomic"
)

// ring is one side of a single-producer single-consumer ring of fixed-size
// entries over shared memory (the ring control block in layout.go).
//
// Protocol. tail counts entries published, head entries consumed; both only
// grow. The producer claims room, writes entries at tail, tail+1, ... with
// plain stores, then commits with one atomic store of the new tail: that
// store is the publication, so a producer killed while writing leaves
// entries no consumer will ever read. The consumer loads tail (acquire),
// reads entries from head up to it, then stores the new head (release),
// handing the entries' room back.
//
// Each side keeps the last value it saw of the other side's counter, so the
// common case touches no line the other process writes. A stale value is
// always conservative, because counters only grow.
//
// Trust. Counters live in shared memory and may be corrupt; a side checks
// 0 ≤ tail-head ≤ capacity before every use and reports ErrCorrupt
// otherwise. Entry positions are masked, so they are in bounds whatever the
// counters say. Entry contents are validated by the typed wrappers.
type ring struct {
	tail   *uint64
	head   *uint64
	ents   []byte // capacity × size bytes
	size   int
	mask   uint64
	cap    uint64
	cached uint64 // producer: last head seen; consumer: last tail seen
}

func newRing(mem []byte, ctl, ents, capacity, size int) ring {
	return ring{
		tail: word64(mem, ctl+ringTail),
		head: word64(mem, ctl+ringHead),
		ents: mem[ents : ents+capacity*size : ents+capacity*size],
		size: size,
		mask: uint64(capacity - 1),
		cap:  uint64(capacity),
	}
}

// producer primes r for the producer side: the cached head must be a value
// head really had, or a zero cache could pass for room that is not there.
func (r ring) producer() ring {
	r.cached = atomic.LoadUint64(r.head)
	return r
}

// consumer primes r for the consumer side with a tail head really had.
func (r ring) consumer() ring {
	r.cached = atomic.LoadUint64(r.tail)
	return r
}

// claim returns the producer's current tail once n entries fit, ErrFull if
// they do not, or ErrCorrupt if the counters are inconsistent. Nothing is
// visible until commit.
func (r *ring) claim(n uint64) (uint64, error) {
	t := atomic.LoadUint64(r.tail)
	if t-r.cached+n <= r.cap && t-r.cached <= r.cap {
		return t, nil
	}
	h := atomic.LoadUint64(r.head)
	used := t - h // wraps to a huge value when head > tail
	if used > r.cap {
		return 0, fmt.Errorf("%w: ring head %d tail %d capacity %d", ErrCorrupt, h, t, r.cap)
	}
	r.cached = h
	if used+n > r.cap {
		return 0, ErrFull
	}
	return t, nil
}

// entry is the bytes of the entry at position pos.
func (r *ring) entry(pos uint64) []byte {
	i := int(pos&r.mask) * r.size
	return r.ents[i : i+r.size : i+r.size]
}

// commit publishes every entry below tail. It is the last store of a write.
func (r *ring) commit(tail uint64) { atomic.StoreUint64(r.tail, tail) }

// peek returns the consumer's head and how many entries are readable from
// it, or ErrCorrupt if the counters are inconsistent.
func (r *ring) peek() (uint64, uint64, error) {
	h := atomic.LoadUint64(r.head)
	if n := r.cached - h; n != 0 && n <= r.cap {
		return h, n, nil
	}
	t := atomic.LoadUint64(r.tail)
	n := t - h
	if n > r.cap {
		return 0, 0, fmt.Errorf("%w: ring head %d tail %d capacity %d", ErrCorrupt, h, t, r.cap)
	}
	r.cached = t
	return h, n, nil
}

// release hands the room of every entry below head back to the producer.
func (r *ring) release(head uint64) { atomic.StoreUint64(r.head, head) }

// pending reports, without validation, whether entries seem readable: the
// cheap test a doorbell condition needs. The read that follows validates.
func (r *ring) pending() bool {
	return atomic.LoadUint64(r.tail) != atomic.LoadUint64(r.head)
}

// drop discards every published entry, as the consumer. The reclaimer uses
// it on a lane whose producer or consumer is gone.
func (r *ring) drop() { atomic.StoreUint64(r.head, atomic.LoadUint64(r.tail)) }
