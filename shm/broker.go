package shm

import (
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

	mu    sync.Mutex // lane assignment, lane memfds, the accelerator set
	lanes []int      // current memfd of each lane
	dirty []bool     // handed to a frontend since its memfd was made
	seq   uint64     // lane pushes
	accel map[*brokerConn]bool

	connMu sync.Mutex
	conns  map[*brokerConn]bool
	closed bool
	done   chan struct{} // closed by stop
	wg     sync.WaitGroup
}

// brokerConn is one attached process.
type brokerConn struct {
	c     *wireConn
	pid   uint32 // as the process names itself (its own pid namespace)
	pidNS uint64
	cred  unix.Ucred
	acks  chan uint64 // lane pushes acknowledged (accelerator only)
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
			if err := b.hello(bc, m); err != nil {
				_ = bc.c.send(refuse(err))
				return
			}
			hello = true
		case "claim":
			b.claim(bc)
		case "accel":
			b.grantAccel(bc)
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

// hello records who the peer says it is and hands it the header (which it
// can only map read-only: the memfd is sealed against new writable
// mappings) and the bell page.
func (b *broker) hello(bc *brokerConn, m wireMsg) error {
	// The peer names its pid as its own namespace numbers it, which is
	// what its lane records. When it shares ours, the kernel's word must
	// agree, so nobody can make a lane look owned by another process.
	if m.PidNS == b.s.pidNS && m.PidNS != 0 && int32(m.Pid) != bc.cred.Pid {
		return fmt.Errorf("%w: hello names pid %d, the socket's peer is pid %d", ErrProtocol, m.Pid, bc.cred.Pid)
	}
	bc.pid, bc.pidNS = m.Pid, m.PidNS
	return bc.c.send(wireMsg{Gen: b.s.gen, Block: b.block}, b.fds[fdHeader], b.fds[fdBell])
}

// claim assigns the peer a free lane and sends its memfd. A lane that was
// held by a frontend before gets a fresh memfd first, so the previous
// holder's mapping (it may still be alive, and hostile) reaches nothing.
func (b *broker) claim(bc *brokerConn) {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := b.s
	if bc.pid == 0 || bc.pid > 1<<31-1 {
		_ = bc.c.send(refuse(fmt.Errorf("%w: bad pid %d", ErrProtocol, bc.pid)))
		return
	}
	if err := s.acceptsWork(); err != nil {
		_ = bc.c.send(refuse(err))
		return
	}
	n := s.geo.Lanes
	var swapErr error
	for k := 0; k < n; k++ {
		i := (int(bc.pid) + k) % n
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
		epoch, ok := s.claimCtl(c, bc.pid, bc.pidNS)
		if !ok {
			continue
		}
		b.dirty[i] = true
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
			return fmt.Errorf("accelerator pid %d did not map lane %d's new memfd: %w", bc.pid, i, err)
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
// lane replacements. It is refused while another live accelerator holds
// the segment. Only a peer running as the owner's user may have it: in a
// deployment where frontends run as another user (see docs/security.md),
// that is what keeps them from asking.
func (b *broker) grantAccel(bc *brokerConn) {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := b.s
	if int(bc.cred.Uid) != os.Geteuid() {
		_ = bc.c.send(refuse(fmt.Errorf("%w: uid %d may not be the accelerator", ErrNotOwner, bc.cred.Uid)))
		return
	}
	cur := atomic.LoadUint32(s.accelPid)
	if cur != 0 && cur != bc.pid && atomic.LoadUint32(s.accelState) == accelRunning &&
		s.peerAlive(cur, atomic.LoadUint64(s.accelPidNS), atomic.LoadUint64(s.accelHB), 0) == nil {
		_ = bc.c.send(refuse(fmt.Errorf("%w: pid %d", ErrAcceleratorPresent, cur)))
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
