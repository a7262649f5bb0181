package shm

import (
	"crypto/subtle"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// broker is the owner's side of attaching: it listens on the unix socket
// at the segment path and hands every process the memfds its role may map
// (see memfd.go): a frontend gets the header and the bell at hello and one
// lane memfd per claim, the lane chosen here; the accelerator gets
// everything. The owner runs one broker per segment; Close stops it.
type broker struct {
	s       *Segment
	ln      *wireConn
	reserve bool
	block   int // the staging memfd's page size
	z       sizes
	fds     [numShared]int // the owner's descriptors, read-write

	// key, when set, is the secret an accelerator must present
	// (Options.AcceleratorKey); maxLanes caps the lanes one process may
	// hold (Options.MaxLanesPerPeer).
	key      []byte
	maxLanes int

	mu     sync.Mutex // lane assignment, lane memfds, the accelerator set
	lanes  []int      // current memfd of each lane
	dirty  []bool     // handed to a frontend since its memfd was made
	seq    uint64     // lane pushes
	accel  map[*brokerConn]bool
	claims map[peerKey][]laneClaim // lanes handed to each process, pruned when counted

	connMu sync.Mutex
	conns  map[*brokerConn]bool
	closed bool
	done   chan struct{} // closed by stop
	wg     sync.WaitGroup
}

// brokerConn is one attached process.
type brokerConn struct {
	c    *wireConn
	id   peerID // set by hello, from the kernel's word where it can see the peer
	cred unix.Ucred
	acks chan uint64 // lane pushes acknowledged (accelerator only)
	// claimed counts the lanes handed out on this connection; a peer that
	// claimed one is a frontend and may not become the accelerator.
	claimed int
}

// laneClaim is a lane handed to a process, at the epoch it got.
type laneClaim struct {
	lane  int
	epoch uint32
}

// brokerWatch is how often the broker checks that the path still names its
// socket: a successor generation renamed over it means draining.
const brokerWatch = 50 * time.Millisecond

// ackTimeout bounds the wait for the accelerator to map a new lane memfd.
const ackTimeout = 5 * time.Second

func (b *broker) start() {
	b.done = make(chan struct{})
	b.wg.Add(2)
	go func() {
		defer b.wg.Done()
		b.acceptLoop()
	}()
	go func() {
		defer b.wg.Done()
		b.watchLoop()
	}()
}

// stop closes the listener and every connection and waits for the
// broker's goroutines: after it no lane is remapped any more.
func (b *broker) stop() {
	b.connMu.Lock()
	b.closed = true
	close(b.done)
	b.ln.close()
	for bc := range b.conns {
		bc.c.close()
	}
	b.connMu.Unlock()
	b.wg.Wait()
	b.mu.Lock()
	for i, fd := range b.lanes {
		unix.Close(fd)
		b.lanes[i] = -1
	}
	for i, fd := range b.fds {
		unix.Close(fd)
		b.fds[i] = -1
	}
	b.mu.Unlock()
}

func (b *broker) acceptLoop() {
	for {
		var nfd int
		var aerr error
		err := b.ln.rc.Read(func(fd uintptr) bool {
			nfd, _, aerr = unix.Accept4(int(fd), unix.SOCK_CLOEXEC)
			return aerr != unix.EAGAIN
		})
		if err != nil {
			return // closed
		}
		if aerr != nil {
			if errors.Is(aerr, unix.EMFILE) || errors.Is(aerr, unix.ENFILE) {
				time.Sleep(brokerWatch) // out of descriptors: let some close
			}
			continue
		}
		c, err := newWireConn(nfd, "broker")
		if err != nil {
			continue
		}
		cred, err := c.peer()
		if err != nil {
			c.close()
			continue
		}
		bc := &brokerConn{c: c, cred: *cred, acks: make(chan uint64, 16)}
		b.connMu.Lock()
		if b.closed {
			b.connMu.Unlock()
			c.close()
			return
		}
		b.conns[bc] = true
		b.wg.Add(1)
		b.connMu.Unlock()
		go func() {
			defer b.wg.Done()
			b.serveConn(bc)
		}()
	}
}

// watchLoop drains the segment once another socket took its path: a
// newer generation was created by another process, which cannot flip our
// state word itself (only we may write the header). It allocates nothing
// while it waits, so an idle owner's heap stays still (the embedder's
// allocation tests count the whole process).
func (b *broker) watchLoop() {
	path, err := unix.BytePtrFromString(b.s.path)
	if err != nil {
		return
	}
	t := time.NewTicker(brokerWatch)
	defer t.Stop()
	var st unix.Stat_t
	for {
		select {
		case <-b.done:
			return
		case <-t.C:
		}
		if statPtr(path, &st) == nil && (uint64(st.Dev) != b.s.dev || st.Ino != b.s.ino) {
			_ = b.s.Drain()
		}
	}
}

func (b *broker) serveConn(bc *brokerConn) {
	defer func() {
		b.mu.Lock()
		delete(b.accel, bc)
		b.publishAccelLinked()
		b.mu.Unlock()
		b.connMu.Lock()
		delete(b.conns, bc)
		b.connMu.Unlock()
		bc.c.close()
	}()
	hello := false
	for {
		m, fds, err := bc.c.recv(time.Time{})
		closeAll(fds) // clients send no descriptors
		if err != nil {
			return
		}
		if !hello && m.Op != "hello" {
			_ = bc.c.send(refuse(fmt.Errorf("%w: %q before hello", ErrProtocol, m.Op)))
			return
		}
		switch m.Op {
		case "hello":
			if hello {
				// Once named, a peer stays who it is: its lanes are
				// counted and judged by that name.
				_ = bc.c.send(refuse(fmt.Errorf("%w: a second hello", ErrProtocol)))
				return
			}
			if err := b.hello(bc, m); err != nil {
				_ = bc.c.send(refuse(err))
				return
			}
			hello = true
		case "claim":
			b.claim(bc)
		case "accel":
			b.grantAccel(bc, m)
		case "ack":
			select {
			case bc.acks <- m.Seq:
			default:
			}
		case "drain":
			// Only the owner process itself (a successor generation
			// created in it) may drain us this way; anyone else could
			// otherwise end the generation for every lane.
			if bc.cred.Pid != int32(b.s.pid) {
				_ = bc.c.send(refuse(fmt.Errorf("%w: drain from pid %d", ErrNotOwner, bc.cred.Pid)))
				continue
			}
			_ = b.s.Drain()
			_ = bc.c.send(wireMsg{})
		default:
			_ = bc.c.send(refuse(fmt.Errorf("%w: unknown op %q", ErrProtocol, m.Op)))
			return
		}
	}
}

// hello records who the peer is, as the kernel vouches for it (see
// verifyPeer), and hands it the header (which it can only map read-only:
// the memfd is sealed against new writable mappings) and the bell page.
func (b *broker) hello(bc *brokerConn, m wireMsg) error {
	id, err := verifyPeer(bc.cred, m.Pid, m.PidNS, b.s.pidNS)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrProtocol, err)
	}
	bc.id = id
	return bc.c.send(wireMsg{Gen: b.s.gen, Block: b.block}, b.fds[fdHeader], b.fds[fdBell])
}

// lanesHeld counts the lanes process k still holds (the lane's owner and
// epoch are still those of the claim), forgetting the others. Call with
// b.mu held.
func (b *broker) lanesHeld(k peerKey, pid uint32) int {
	held := b.claims[k][:0]
	for _, c := range b.claims[k] {
		l := b.s.lane(c.lane)
		if atomic.LoadUint32(l.owner) == pid && atomic.LoadUint32(l.epoch) == c.epoch && atomic.LoadUint32(l.state) != laneFree {
			held = append(held, c)
		}
	}
	if len(held) == 0 {
		delete(b.claims, k)
	} else {
		b.claims[k] = held
	}
	return len(held)
}

// claim assigns the peer a free lane and sends its memfd. A lane that was
// held by a frontend before gets a fresh memfd first, so the previous
// holder's mapping (it may still be alive, and hostile) reaches nothing.
func (b *broker) claim(bc *brokerConn) {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := b.s
	pid := bc.id.pid
	if pid == 0 || pid > 1<<31-1 {
		_ = bc.c.send(refuse(fmt.Errorf("%w: bad pid %d", ErrProtocol, pid)))
		return
	}
	if b.accel[bc] {
		_ = bc.c.send(refuse(fmt.Errorf("%w: the accelerator claims no lane", ErrProtocol)))
		return
	}
	if err := s.acceptsWork(); err != nil {
		_ = bc.c.send(refuse(err))
		return
	}
	// One process, one lane (by default): a frontend that claimed every
	// lane would lock out its restarted or newly scaled peers.
	held := b.lanesHeld(bc.id.key, pid)
	if b.maxLanes > 0 && (held >= b.maxLanes || (!bc.id.visible && bc.claimed >= b.maxLanes)) {
		_ = bc.c.send(refuse(fmt.Errorf("%w in %s: pid %d holds %d lanes already, the most one process may (the embedder's --lanes-per-frontend)", ErrNoFreeLane, s.path, pid, max(held, bc.claimed))))
		return
	}
	n := s.geo.Lanes
	var swapErr error
	for k := 0; k < n; k++ {
		i := (int(pid) + k) % n
		c := s.lane(i)
		if atomic.LoadUint32(c.owner) != noOwner || atomic.LoadUint32(c.state) != laneFree {
			continue
		}
		if b.dirty[i] {
			if err := b.swapLane(i); err != nil {
				swapErr = err
				continue
			}
		}
		epoch, ok := s.claimCtl(c, pid, bc.id.pidNS)
		if !ok {
			continue
		}
		b.dirty[i] = true
		bc.claimed++
		b.claims[bc.id.key] = append(b.claims[bc.id.key], laneClaim{lane: i, epoch: epoch})
		_ = bc.c.send(wireMsg{Lane: i, Epoch: epoch}, b.lanes[i])
		return
	}
	err := fmt.Errorf("%w in %s", ErrNoFreeLane, s.path)
	if swapErr != nil {
		err = fmt.Errorf("%w: %v", ErrNoFreeLane, swapErr)
	}
	_ = bc.c.send(refuse(err))
}

// swapLane gives free lane i a fresh memfd: a copy of the lane's counters
// (so every cached ring position stays valid) with the owner, state and
// doorbell words cleared. The accelerators map it first and acknowledge;
// then the owner maps it. The lane is free and drained (reclaim waited for
// its batches), so nothing in flight can touch it meanwhile. Call with
// b.mu held.
func (b *broker) swapLane(i int) error {
	s := b.s
	fd, err := newMemfd(fmt.Sprintf("recmesh-lane-%d", i), b.z.lane, PageSize, b.reserve)
	if err != nil {
		return err
	}
	base := s.lay.laneBase(i)
	blk := make([]byte, laneReqEntries)
	copy(blk, s.mem[base:base+laneReqEntries])
	put32(blk, laneOwner, noOwner)
	put32(blk, laneState, laneFree)
	put64(blk, laneHeartbeat, 0)
	put64(blk, lanePidNS, 0)
	put64(blk, laneDrainSeq, 0)
	clear(blk[laneBell : laneBell+LinePair])
	// Empty rings, as reclaim leaves them: head = tail.
	put64(blk, laneReqCtl+ringHead, get64(blk, laneReqCtl+ringTail))
	put64(blk, laneComplCtl+ringHead, get64(blk, laneComplCtl+ringTail))
	if _, err := unix.Pwrite(fd, blk, 0); err != nil {
		unix.Close(fd)
		return fmt.Errorf("write lane %d's new memfd: %w", i, err)
	}
	if err := seal(fd, baseSeals); err != nil {
		unix.Close(fd)
		return err
	}
	for bc := range b.accel {
		b.seq++
		seq := b.seq
		if err := bc.c.send(wireMsg{Op: "lane", Lane: i, Seq: seq}, fd); err != nil {
			unix.Close(fd)
			return fmt.Errorf("send lane %d to the accelerator: %w", i, err)
		}
		if err := b.waitAck(bc, seq); err != nil {
			// The accelerator may or may not have switched: the lane
			// stays dirty and this memfd unused; the next claim tries
			// again with another.
			unix.Close(fd)
			return fmt.Errorf("accelerator pid %d did not map lane %d's new memfd: %w", bc.id.pid, i, err)
		}
	}
	if err := s.mapLane(i, fd); err != nil {
		unix.Close(fd)
		return err
	}
	unix.Close(b.lanes[i])
	b.lanes[i] = fd
	b.dirty[i] = false
	return nil
}

// waitAck waits for the accelerator to acknowledge push seq, for at most
// ackTimeout, and not past the broker's stop.
func (b *broker) waitAck(bc *brokerConn, seq uint64) error {
	t := time.NewTimer(ackTimeout)
	defer t.Stop()
	for {
		select {
		case got := <-bc.acks:
			if got == seq {
				return nil
			}
		case <-b.done:
			return ErrClosed
		case <-t.C:
			return fmt.Errorf("no acknowledgement within %v", ackTimeout)
		}
	}
}

// grantAccel hands the peer every memfd, read-write, and registers it for
// lane replacements. Only a peer that proves it is the accelerator may
// have it: it runs as the owner's user (in a deployment where frontends
// run as another user, see docs/security.md, that alone keeps them out),
// it presents the accelerator key when the segment has one (a secret
// frontends are not given), and it claimed no lane. It is refused while
// another accelerator holds the segment: one whose connection is open and
// that has not detached, or whose pid, as the kernel vouched for it, is
// alive and beating.
func (b *broker) grantAccel(bc *brokerConn, m wireMsg) {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := b.s
	if int(bc.cred.Uid) != os.Geteuid() {
		_ = bc.c.send(refuse(fmt.Errorf("%w: uid %d may not be the accelerator", ErrNotOwner, bc.cred.Uid)))
		return
	}
	running := atomic.LoadUint32(s.accelState) == accelRunning
	for other := range b.accel {
		if running {
			_ = bc.c.send(refuse(fmt.Errorf("%w: pid %d holds it", ErrAcceleratorPresent, other.id.pid)))
			return
		}
	}
	cur := atomic.LoadUint32(s.accelPid)
	if cur != 0 && running && s.peerAlive(cur, atomic.LoadUint64(s.accelPidNS), atomic.LoadUint64(s.accelHB), 0, linkAccel) == nil {
		_ = bc.c.send(refuse(fmt.Errorf("%w: pid %d", ErrAcceleratorPresent, cur)))
		return
	}
	if b.key != nil && subtle.ConstantTimeCompare([]byte(m.Key), b.key) != 1 {
		_ = bc.c.send(refuse(fmt.Errorf("%w: pid %d did not present the accelerator key", ErrNotOwner, bc.id.pid)))
		return
	}
	if bc.claimed > 0 {
		_ = bc.c.send(refuse(fmt.Errorf("%w: pid %d claimed a lane: a frontend may not become the accelerator", ErrNotOwner, bc.id.pid)))
		return
	}
	if b.accel[bc] {
		_ = bc.c.send(refuse(fmt.Errorf("%w: already the accelerator", ErrProtocol)))
		return
	}
	if err := bc.c.send(wireMsg{}, b.fds[fdCore], b.fds[fdStaging]); err != nil {
		return
	}
	for i, fd := range b.lanes {
		if err := bc.c.send(wireMsg{Op: "lane", Lane: i}, fd); err != nil {
			return
		}
	}
	b.accel[bc] = true
	b.publishAccelLinked()
}

// publishAccelLinked tells every peer whether an accelerator's connection
// is open (hdrAccelLinked). Call with b.mu held, after the set changed.
func (b *broker) publishAccelLinked() {
	var linked uint32
	if len(b.accel) > 0 {
		linked = 1
	}
	atomic.StoreUint32(word32(b.s.mem, hdrAccelLinked), linked)
}

// mapLane maps lane i's memfd read-write over the lane's two places.
func (s *Segment) mapLane(i int, fd int) error {
	s.mapMu.Lock()
	defer s.mapMu.Unlock()
	if s.vm == nil || s.vm.base == nil {
		return fmt.Errorf("shm: map lane %d: %w", i, ErrClosed)
	}
	for _, p := range s.lay.lanePieces(i, s.geo) {
		if err := s.vm.mapFixed(p.off, p.n, fd, p.fdOff, true); err != nil {
			return fmt.Errorf("shm: map lane %d: %w", i, err)
		}
	}
	return nil
}
