package shm

import (
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// client is an attached process's connection to the owner's broker. It
// stays open while the segment is attached: the broker assigns lanes over
// it and, to the accelerator, pushes lane memfds that replace old ones.
type client struct {
	c     *wireConn
	key   []byte // the accelerator key, presented when asking for the role
	z     sizes
	mu    sync.Mutex  // one request at a time
	fds   []int       // the shared memfds received, closed by Close
	lanes map[int]int // the lane memfds received, by lane
	accel atomic.Bool // SetAccelerator was granted: every lane is mapped
	push  sync.WaitGroup
}

// replyTimeout bounds every wait for the broker's answer: a live owner
// answers in microseconds; one that does not within this is stalled, and
// the attacher should try again later rather than wait on it.
const replyTimeout = 3 * time.Second

// request sends m and reads the answer with want descriptors.
func (cl *client) request(m wireMsg, want int) (wireMsg, []int, error) {
	if err := cl.c.send(m); err != nil {
		return wireMsg{}, nil, fmt.Errorf("send %s: %w", m.Op, err)
	}
	return cl.answer(want)
}

func (cl *client) answer(want int) (wireMsg, []int, error) {
	r, fds, err := cl.c.recv(time.Now().Add(replyTimeout))
	if err != nil {
		return wireMsg{}, nil, fmt.Errorf("broker answer: %w", err)
	}
	if err := r.refusal(); err != nil {
		closeAll(fds)
		return wireMsg{}, nil, err
	}
	if len(fds) != want {
		closeAll(fds)
		return wireMsg{}, nil, fmt.Errorf("%w: answer carries %d descriptors, want %d", ErrProtocol, len(fds), want)
	}
	return r, fds, nil
}

func attach(path string, want AttachOptions) (*Segment, error) {
	if err := setUndumpable(); err != nil {
		return nil, err
	}
	c, err := dialSegment(path, want.OwnerUID)
	if err != nil {
		return nil, err
	}
	cl := &client{c: c, lanes: map[int]int{}, key: want.AcceleratorKey}
	ok := false
	var vm *vmRange
	defer func() {
		if !ok {
			cl.close()
			vm.release()
		}
	}()
	pidNS := pidNamespace()
	r, fds, err := cl.request(wireMsg{Op: "hello", Pid: uint32(os.Getpid()), PidNS: pidNS}, 2)
	if err != nil {
		return nil, err
	}
	cl.fds = append(cl.fds, fds...)
	hfd, bfd := fds[0], fds[1]
	if err := checkMemfd(hfd, HeaderBytes); err != nil {
		return nil, err
	}
	hdr, err := unix.Mmap(hfd, 0, HeaderBytes, unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("map the header: %w", err)
	}
	g, lay, err := readSegmentHeader(hdr)
	unix.Munmap(hdr)
	if err != nil {
		return nil, err
	}
	block := r.Block
	if block < PageSize || block&(block-1) != 0 || block > 1<<30 {
		return nil, fmt.Errorf("%w: staging page size %d", ErrProtocol, block)
	}
	cl.z = lay.memfdSizes(g, block)
	if err := checkMemfd(bfd, PageSize); err != nil {
		return nil, err
	}
	if vm, err = reserveVM(cl.z.vm, lay.stagingData); err != nil {
		return nil, err
	}
	// The header read-only (the seal allows no other way), the bell
	// read-write; everything else stays PROT_NONE until a lane is claimed
	// or the accelerator role granted.
	if err := vm.mapFixed(0, HeaderBytes, hfd, 0, false); err != nil {
		return nil, err
	}
	if err := vm.mapFixed(lay.bell, PageSize, bfd, 0, true); err != nil {
		return nil, err
	}
	s, err := attachMem(path, vm.bytes(lay.total), want)
	if err != nil {
		return nil, err
	}
	s.vm, s.cl = vm, cl
	if err := s.OwnerAlive(0); err != nil {
		return nil, err
	}
	ok = true
	return s, nil
}

// claimRemote asks the broker for a lane and maps its memfd read-write.
func (s *Segment) claimRemote(pid int) (*Lane, error) {
	cl := s.cl
	cl.mu.Lock()
	defer cl.mu.Unlock()
	if pid != os.Getpid() {
		// The broker assigns lanes to the process at the other end of
		// the socket, which is this one.
		return nil, fmt.Errorf("shm: claim lane: pid %d is not this process (%d)", pid, os.Getpid())
	}
	r, fds, err := cl.request(wireMsg{Op: "claim"}, 1)
	if err != nil {
		return nil, fmt.Errorf("shm: claim lane in %s: %w", s.path, err)
	}
	fd := fds[0]
	if r.Lane < 0 || r.Lane >= s.geo.Lanes {
		unix.Close(fd)
		return nil, fmt.Errorf("shm: claim lane in %s: %w: lane %d", s.path, ErrProtocol, r.Lane)
	}
	if err := checkMemfd(fd, cl.z.lane); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("shm: claim lane in %s: %w", s.path, err)
	}
	if err := s.mapLane(r.Lane, fd); err != nil {
		unix.Close(fd)
		return nil, err
	}
	cl.keepLane(r.Lane, fd)
	return s.newLane(s.lane(r.Lane), uint32(pid), r.Epoch), nil
}

// becomeAccelerator asks the broker for the accelerator's memfds, maps
// them all read-write, and starts taking lane replacements.
func (s *Segment) becomeAccelerator(pid int) error {
	cl := s.cl
	cl.mu.Lock()
	defer cl.mu.Unlock()
	if cl.accel.Load() {
		return nil
	}
	_, fds, err := cl.request(wireMsg{Op: "accel", Pid: uint32(pid), Key: string(cl.key)}, 2)
	if err != nil {
		return fmt.Errorf("shm: %s: %w", s.path, err)
	}
	cl.fds = append(cl.fds, fds...)
	if err := checkMemfd(fds[0], cl.z.shared[fdCore]); err != nil {
		return err
	}
	if err := checkMemfd(fds[1], cl.z.staging); err != nil {
		return err
	}
	byKind := map[int]int{fdCore: fds[0], fdStaging: fds[1]}
	s.mapMu.Lock()
	for _, p := range s.lay.sharedPieces(cl.z) {
		fd, ok := byKind[p.kind]
		if !ok {
			continue
		}
		if err := s.vm.mapFixed(p.off, p.n, fd, p.fdOff, true); err != nil {
			s.mapMu.Unlock()
			return fmt.Errorf("shm: %s: %w", s.path, err)
		}
	}
	s.mapMu.Unlock()
	for i := 0; i < s.geo.Lanes; i++ {
		r, fds, err := cl.answer(1)
		if err != nil {
			return fmt.Errorf("shm: %s: lane %d: %w", s.path, i, err)
		}
		if err := s.takeLane(r, fds[0]); err != nil {
			return err
		}
	}
	s.useAccelPage()
	cl.accel.Store(true)
	cl.push.Add(1)
	go func() {
		defer cl.push.Done()
		s.takePushes()
	}()
	return nil
}

// takeLane maps a lane memfd the broker sent to the accelerator.
func (s *Segment) takeLane(r wireMsg, fd int) error {
	if r.Op != "lane" || r.Lane < 0 || r.Lane >= s.geo.Lanes {
		unix.Close(fd)
		return fmt.Errorf("shm: %s: %w: expected a lane, got %q %d", s.path, ErrProtocol, r.Op, r.Lane)
	}
	if err := checkMemfd(fd, s.cl.z.lane); err != nil {
		unix.Close(fd)
		return err
	}
	if err := s.mapLane(r.Lane, fd); err != nil {
		unix.Close(fd)
		return err
	}
	s.cl.keepLane(r.Lane, fd)
	return nil
}

// keepLane records lane i's memfd, closing the one it replaces.
func (cl *client) keepLane(i, fd int) {
	if old, ok := cl.lanes[i]; ok {
		unix.Close(old)
	}
	cl.lanes[i] = fd
}

// close ends the connection, waits for the push loop, and closes every
// descriptor. The mapping outlives the descriptors.
func (cl *client) close() {
	cl.c.close()
	cl.push.Wait()
	closeAll(cl.fds)
	for _, fd := range cl.lanes {
		unix.Close(fd)
	}
	cl.fds, cl.lanes = nil, nil
}

// takePushes maps each lane memfd the broker pushes and acknowledges it,
// until the connection closes (Close, or the owner gone).
func (s *Segment) takePushes() {
	cl := s.cl
	for {
		r, fds, err := cl.c.recv(time.Time{})
		if err != nil {
			return
		}
		if len(fds) != 1 {
			closeAll(fds)
			continue
		}
		cl.mu.Lock()
		err = s.takeLane(r, fds[0])
		cl.mu.Unlock()
		if err != nil {
			continue // no ack: the broker keeps the old memfd in service
		}
		_ = cl.c.send(wireMsg{Op: "ack", Lane: r.Lane, Seq: r.Seq})
	}
}

// probe asks the broker at path for its generation, and, from the owner's
// own process, may tell it to drain. It returns 0 when nobody answers.
func probe(path string, drain bool) uint64 {
	c, err := dialSegment(path, 0)
	if err != nil {
		return 0
	}
	defer c.close()
	cl := &client{c: c, lanes: map[int]int{}}
	r, fds, err := cl.request(wireMsg{Op: "hello", Pid: uint32(os.Getpid()), PidNS: pidNamespace()}, 2)
	if err != nil {
		return 0
	}
	closeAll(fds)
	if drain {
		_, _, _ = cl.request(wireMsg{Op: "drain"}, 0)
	}
	return r.Gen
}
