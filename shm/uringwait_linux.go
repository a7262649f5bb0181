package shm

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// A doorbell sleeper normally blocks in futex(2). A goroutine blocked in a
// system call keeps its P (the runtime's right to run Go code), so in a
// process with one usable CPU (GOMAXPROCS 1: every mesh process of the
// one-core benchmarks) nothing else in the process runs until the
// runtime's monitor thread, sysmon, takes the P back, and while it keeps
// finding Ps to take back it wakes every 20 µs instead of backing off to
// 10 ms. In the mesh on one core (hostbound, B_req 1, C=64) the four
// sysmon threads woke about 17,000 times a second, and on a VM each timed
// wake-up costs the core far more than the thread's own few instructions.
//
// uringWaiter sleeps on the same futex word through io_uring instead: an
// IORING_OP_FUTEX_WAIT (Linux 6.7) whose completion signals an eventfd the
// Go netpoller watches. The ringer is unchanged (it still calls futex
// wake, which wakes io_uring waiters too); the sleeping goroutine parks in
// the Go scheduler, the P stays free for the process's other goroutines,
// and a process with nothing to do parks its one thread in epoll, where
// sysmon leaves it alone. Where io_uring or its futex operations are not
// available (older kernels, seccomp profiles that forbid io_uring), the
// first attempt fails and the process keeps sleeping in futex(2).

// io_uring ABI values (include/uapi/linux/io_uring.h).
const (
	uringOpAsyncCancel = 14
	uringOpFutexWait   = 51

	uringFeatSingleMmap  = 1 << 0
	uringEnterGetEvents  = 1 << 0
	uringRegisterEventfd = 4
	uringOffSQEs         = 0x10000000

	futex2SizeU32       = 0x02       // FUTEX2_SIZE_U32; not FUTEX2_PRIVATE: the word is shared between processes
	futexBitsetMatchAll = 0xffffffff // FUTEX_BITSET_MATCH_ANY: a plain FUTEX_WAKE wakes it

	sqeSize = 64
	cqeSize = 16

	// cancelTag marks the user data of a cancel request, so its
	// completion is told apart from the wait's.
	cancelTag = 1 << 63
)

// uringParams is struct io_uring_params.
type uringParams struct {
	sqEntries, cqEntries, flags, sqThreadCPU, sqThreadIdle, features, wqFD uint32
	resv                                                                   [3]uint32
	sqOff                                                                  struct {
		head, tail, ringMask, ringEntries, flags, dropped, array, resv1 uint32
		userAddr                                                        uint64
	}
	cqOff struct {
		head, tail, ringMask, ringEntries, overflow, cqes, flags, resv1 uint32
		userAddr                                                        uint64
	}
}

// uringWaiter is one io_uring instance with one futex wait in flight at a
// time. It is used by one goroutine at a time (see takeUringWaiter), and a
// sleep never leaves a wait armed when it returns, so a waiter carries no
// state from one doorbell to the next.
type uringWaiter struct {
	fd    int
	ring  []byte // the SQ and CQ rings (one mapping)
	sqes  []byte
	efd   int      // eventfd the ring signals on every completion
	efile *os.File // efd, watched by the netpoller

	sqHead, sqTail, sqMask, sqArray *uint32
	cqHead, cqTail, cqMask          *uint32
	cqes                            unsafe.Pointer

	seq uint64 // user data of the last wait armed
	buf [8]byte
}

func newUringWaiter() (w *uringWaiter, err error) {
	var p uringParams
	fd, _, errno := unix.Syscall(unix.SYS_IO_URING_SETUP, 4, uintptr(unsafe.Pointer(&p)), 0)
	if errno != 0 {
		return nil, fmt.Errorf("shm: io_uring_setup: %w", errno)
	}
	w = &uringWaiter{fd: int(fd), efd: -1}
	defer func() {
		if err != nil {
			w.close()
		}
	}()
	if p.features&uringFeatSingleMmap == 0 {
		return nil, errors.New("shm: io_uring without single-mmap rings")
	}
	size := max(int(p.sqOff.array+p.sqEntries*4), int(p.cqOff.cqes+p.cqEntries*cqeSize))
	if w.ring, err = unix.Mmap(w.fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE); err != nil {
		return nil, fmt.Errorf("shm: map io_uring rings: %w", err)
	}
	if w.sqes, err = unix.Mmap(w.fd, uringOffSQEs, int(p.sqEntries)*sqeSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE); err != nil {
		return nil, fmt.Errorf("shm: map io_uring entries: %w", err)
	}
	at := func(off uint32) *uint32 { return (*uint32)(unsafe.Pointer(&w.ring[off])) }
	w.sqHead, w.sqTail, w.sqMask, w.sqArray = at(p.sqOff.head), at(p.sqOff.tail), at(p.sqOff.ringMask), at(p.sqOff.array)
	w.cqHead, w.cqTail, w.cqMask = at(p.cqOff.head), at(p.cqOff.tail), at(p.cqOff.ringMask)
	w.cqes = unsafe.Pointer(&w.ring[p.cqOff.cqes])

	if w.efd, err = unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC); err != nil {
		return nil, fmt.Errorf("shm: eventfd: %w", err)
	}
	efd := int32(w.efd)
	if _, _, errno := unix.Syscall6(unix.SYS_IO_URING_REGISTER, uintptr(w.fd), uringRegisterEventfd,
		uintptr(unsafe.Pointer(&efd)), 1, 0, 0); errno != 0 {
		return nil, fmt.Errorf("shm: register io_uring eventfd: %w", errno)
	}
	// Arm a wait on a word that does not hold the value: a kernel with the
	// futex operations answers EAGAIN at once, one without them EINVAL.
	var probe uint32 = 1
	res, err := w.waitOnce(&probe, 0)
	if err != nil {
		return nil, err
	}
	if res != -int32(unix.EAGAIN) {
		return nil, fmt.Errorf("shm: io_uring futex wait: %w", unix.Errno(-res))
	}
	w.drainEventfd()
	// The netpoller registers the eventfd: it is non-blocking.
	w.efile = os.NewFile(uintptr(w.efd), "doorbell-uring")
	return w, nil
}

// close releases the ring and the eventfd.
func (w *uringWaiter) close() {
	if w.efile != nil {
		w.efile.Close()
	} else if w.efd >= 0 {
		unix.Close(w.efd)
	}
	if w.sqes != nil {
		unix.Munmap(w.sqes)
	}
	if w.ring != nil {
		unix.Munmap(w.ring)
	}
	unix.Close(w.fd)
}

// push queues one submission; the caller then calls enter.
func (w *uringWaiter) push(op uint8, fd int32, addr, off, addr3, userData uint64) {
	tail := atomic.LoadUint32(w.sqTail)
	idx := tail & *w.sqMask
	sqe := w.sqes[idx*sqeSize : (idx+1)*sqeSize]
	clear(sqe)
	sqe[0] = op
	*(*int32)(unsafe.Pointer(&sqe[4])) = fd
	*(*uint64)(unsafe.Pointer(&sqe[8])) = off
	*(*uint64)(unsafe.Pointer(&sqe[16])) = addr
	*(*uint64)(unsafe.Pointer(&sqe[32])) = userData
	*(*uint64)(unsafe.Pointer(&sqe[48])) = addr3
	*(*uint32)(unsafe.Add(unsafe.Pointer(w.sqArray), uintptr(idx)*4)) = idx
	atomic.StoreUint32(w.sqTail, tail+1)
}

// enter submits what push queued and, with minComplete > 0, waits until
// that many completions are in the ring.
func (w *uringWaiter) enter(submit, minComplete uint32) error {
	flags := uintptr(0)
	if minComplete > 0 {
		flags = uringEnterGetEvents
	}
	for {
		_, _, errno := unix.Syscall6(unix.SYS_IO_URING_ENTER, uintptr(w.fd), uintptr(submit), uintptr(minComplete), flags, 0, 0)
		switch errno {
		case 0:
			return nil
		case unix.EINTR:
			// A signal (the runtime preempts with SIGURG) cut the call
			// short; submit again only what the kernel has not consumed.
			if submit > 0 && atomic.LoadUint32(w.sqHead) == atomic.LoadUint32(w.sqTail) {
				submit = 0
			}
			continue
		default:
			return fmt.Errorf("shm: io_uring_enter: %w", errno)
		}
	}
}

// reap consumes the completions in the ring and reports the result of the
// armed wait, if its completion was among them.
func (w *uringWaiter) reap() (res int32, done bool) {
	head := atomic.LoadUint32(w.cqHead)
	tail := atomic.LoadUint32(w.cqTail)
	for ; head != tail; head++ {
		cqe := unsafe.Add(w.cqes, uintptr(head&*w.cqMask)*cqeSize)
		if *(*uint64)(cqe) == w.seq {
			res, done = *(*int32)(unsafe.Add(cqe, 8)), true
		}
	}
	atomic.StoreUint32(w.cqHead, head)
	return res, done
}

// drainEventfd resets the eventfd's count, so the next sleep waits for a
// completion that has not been seen yet.
func (w *uringWaiter) drainEventfd() { unix.Read(w.efd, w.buf[:]) }

// waitOnce arms a wait for *word != val and waits for its completion
// without the netpoller (used once, to probe the kernel).
func (w *uringWaiter) waitOnce(word *uint32, val uint32) (int32, error) {
	w.seq++
	w.push(uringOpFutexWait, futex2SizeU32, uint64(uintptr(unsafe.Pointer(word))), uint64(val), futexBitsetMatchAll, w.seq)
	if err := w.enter(1, 1); err != nil {
		return 0, err
	}
	res, _ := w.reap()
	return res, nil
}

// sleep waits until *word moves off val and a futex wake is issued on it,
// or d passes, whichever is first; like futexSleep it may return early,
// and the caller re-checks its condition. The goroutine parks in the
// netpoller meanwhile. It returns an error only if the ring failed, after
// which the waiter must not be used again.
func (w *uringWaiter) sleep(word *uint32, val uint32, d time.Duration) error {
	w.seq++
	w.push(uringOpFutexWait, futex2SizeU32, uint64(uintptr(unsafe.Pointer(word))), uint64(val), futexBitsetMatchAll, w.seq)
	if err := w.enter(1, 0); err != nil {
		return err
	}
	_, done := w.reap()
	if !done {
		w.efile.SetReadDeadline(time.Now().Add(d))
		w.efile.Read(w.buf[:]) // a timeout is fine: the wait is cancelled below
		_, done = w.reap()
	}
	if !done {
		// Timed out (or a spurious wake): withdraw the wait, so nothing
		// refers to the word once this returns.
		w.push(uringOpAsyncCancel, -1, w.seq, 0, 0, w.seq|cancelTag)
		submit := uint32(1)
		for !done {
			if err := w.enter(submit, 1); err != nil {
				return err
			}
			submit = 0
			_, done = w.reap()
		}
	}
	w.drainEventfd()
	return nil
}

// uringWaiters is the process's pool of idle waiters: as many as
// goroutines have slept at once.
var uringWaiters struct {
	mu     sync.Mutex
	idle   []*uringWaiter
	failed bool // io_uring unusable here: sleep in futex(2)
}

// takeUringWaiter returns an idle waiter, a new one, or nil where io_uring
// futex waits are unavailable or switched off.
func takeUringWaiter() *uringWaiter {
	p := &uringWaiters
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.failed {
		return nil
	}
	if n := len(p.idle); n > 0 {
		w := p.idle[n-1]
		p.idle = p.idle[:n-1]
		return w
	}
	if !uringWaitAllowed() {
		p.failed = true
		return nil
	}
	w, err := newUringWaiter()
	if err != nil {
		p.failed = true
		return nil
	}
	return w
}

// giveUringWaiter returns a waiter to the pool, or closes it after a
// failure (and stops further use of io_uring in this process).
func giveUringWaiter(w *uringWaiter, err error) {
	p := &uringWaiters
	p.mu.Lock()
	defer p.mu.Unlock()
	if err != nil {
		p.failed = true
		w.close()
		return
	}
	p.idle = append(p.idle, w)
}

// UringWaitEnv names the environment variable that, set to "off", makes
// doorbell sleepers block in futex(2) instead of waiting through io_uring.
const UringWaitEnv = "RECMESH_DOORBELL_URING"

var uringWaitAllowed = sync.OnceValue(func() bool { return os.Getenv(UringWaitEnv) != "off" })

// sleepOn is how Doorbell.Wait sleeps: through io_uring where it can,
// else in futex(2).
func sleepOn(word *uint32, val uint32, d time.Duration) {
	w := takeUringWaiter()
	if w == nil {
		futexSleep(word, val, d)
		return
	}
	err := w.sleep(word, val, d)
	giveUringWaiter(w, err)
}
