package shm

import (
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// TestFrontendViewIsConfined: an attached frontend maps the header
// read-only and cannot make it writable by any route, cannot resize any
// memfd it holds, cannot read or write the regions it was not given, and
// what it does to the address space there reaches nobody else.
func TestFrontendViewIsConfined(t *testing.T) {
	s := newTestSegment(t, testGeometry())
	fe := attachTest(t, s)
	l, err := fe.ClaimLane(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range frontendRefusals(fe) {
		if r.err == nil {
			t.Errorf("%s: allowed", r.what)
		} else if !errors.Is(r.err, r.want) {
			t.Errorf("%s: %v, want %v", r.what, r.err, r.want)
		}
	}
	// Regions it was not given fault (GuardFaults makes that an error).
	other := (l.Index() + 1) % fe.geo.Lanes
	for name, off := range map[string]int{
		"accelerator page": fe.lay.accel,
		"batch ring":       fe.lay.batchRing,
		"staging meta":     fe.lay.stagingMeta,
		"staging data":     fe.lay.stagingData,
		"another lane":     fe.lay.laneBase(other),
		"another arena":    fe.lay.arenaBase(other, fe.geo),
	} {
		err := GuardFaults(func() error { _ = atomic.LoadUint32(word32(fe.mem, off)); return nil })
		if !errors.Is(err, ErrSegmentLost) {
			t.Errorf("reading the %s: %v, want a fault", name, err)
		}
	}
	// mprotect can make another lane's place private memory, never the
	// lane itself.
	base := fe.lay.laneBase(other)
	if err := unix.Mprotect(fe.mem[base:base+PageSize], unix.PROT_READ|unix.PROT_WRITE); err != nil {
		t.Fatalf("mprotect over a PROT_NONE hole: %v", err)
	}
	put32(fe.mem, base+laneEpoch, 0xdead)
	if got := atomic.LoadUint32(s.lane(other).epoch); got == 0xdead {
		t.Fatal("a write into another lane's place reached the owner")
	}
	// Its own lane is shared with the owner.
	l.ctl.counters.Store(counterServed, 12345)
	if got := s.lane(l.Index()).counters.Load(counterServed); got != 12345 {
		t.Fatalf("own lane word not shared: owner reads %d", got)
	}
}

type refusal struct {
	what string
	err  error
	want error
}

// frontendRefusals tries, through fe's descriptors and mappings, every way
// to write memory a frontend must not or to resize any memfd, and returns
// what each attempt got.
func frontendRefusals(fe *Segment) []refusal {
	var out []refusal
	add := func(what string, err, want error) { out = append(out, refusal{what, err, want}) }
	hdr := fe.mem[:HeaderBytes]
	add("mprotect the header writable", unix.Mprotect(hdr, unix.PROT_READ|unix.PROT_WRITE), unix.EACCES)
	hfd := fe.cl.fds[fdHeader]
	if m, err := unix.Mmap(hfd, 0, HeaderBytes, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED); err == nil {
		unix.Munmap(m)
		add("map the header fd writable", nil, unix.EPERM)
	} else {
		add("map the header fd writable", err, unix.EPERM)
	}
	_, err := unix.Pwrite(hfd, []byte{1}, hdrState)
	add("write() the header fd", err, unix.EPERM)
	if rw, err := unix.Open(fmt.Sprintf("/proc/self/fd/%d", hfd), unix.O_RDWR, 0); err == nil {
		if m, err := unix.Mmap(rw, 0, HeaderBytes, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED); err == nil {
			unix.Munmap(m)
			add("map the header reopened read-write", nil, unix.EPERM)
		} else {
			add("map the header reopened read-write", err, unix.EPERM)
		}
		unix.Close(rw)
	}
	fds := append([]int(nil), fe.cl.fds...)
	for _, fd := range fe.cl.lanes {
		fds = append(fds, fd)
	}
	for _, fd := range fds {
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			add("fstat", err, nil)
			continue
		}
		add(fmt.Sprintf("ftruncate fd %d down", fd), unix.Ftruncate(fd, st.Size/2), unix.EPERM)
		add(fmt.Sprintf("ftruncate fd %d up", fd), unix.Ftruncate(fd, st.Size+PageSize), unix.EPERM)
		add(fmt.Sprintf("fallocate fd %d past its end", fd), unix.Fallocate(fd, 0, st.Size, PageSize), unix.EPERM)
	}
	// Punching a hole zeroes pages: refused where writing is (the bell
	// and its lanes are the frontend's to write anyway).
	add("punch a hole in the header", unix.Fallocate(hfd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, 0, PageSize), unix.EPERM)
	return out
}

// TestLaneChangesHandsWithFreshMemory: a lane handed to the next frontend
// is new memory in the owner and in the accelerator; the previous holder's
// mapping reaches neither.
func TestLaneChangesHandsWithFreshMemory(t *testing.T) {
	s := newTestSegment(t, testGeometry())
	acc := attachTest(t, s)
	if err := acc.SetAccelerator(os.Getpid()); err != nil {
		t.Fatal(err)
	}
	fe1 := attachTest(t, s)
	l1, err := fe1.ClaimLane(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	i := l1.Index()
	sv := newServing(t, s, i)
	roundTrip(t, l1, sv.rr, sv.cw, 1)
	if err := l1.Release(); err != nil {
		t.Fatal(err)
	}
	fe2 := attachTest(t, s)
	l2, err := fe2.ClaimLane(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if l2.Index() != i {
		t.Fatalf("second claim got lane %d, want the released lane %d", l2.Index(), i)
	}
	// The old holder scribbles over what it still maps.
	clear(l1.ControlBlock())
	for k := range l1.Arena()[:PageSize] {
		l1.Arena()[k] = 0xff
	}
	if got := atomic.LoadUint32(s.lane(i).owner); got != uint32(os.Getpid()) {
		t.Fatalf("owner word %d after the old holder cleared its block", got)
	}
	if got := atomic.LoadUint32(acc.lane(i).epoch); got != l2.Epoch() {
		t.Fatalf("accelerator sees epoch %d, the new holder has %d", got, l2.Epoch())
	}
	// Owner, accelerator and new holder share the new memory.
	l2.ctl.counters.Store(counterServed, 777)
	if a, o := acc.lane(i).counters.Load(counterServed), s.lane(i).counters.Load(counterServed); a != 777 || o != 777 {
		t.Fatalf("new lane not shared: accelerator %d, owner %d", a, o)
	}
	// And it serves: the accelerator's completion reaches the new holder.
	rr, _ := s.RequestReader(i)
	cw, _ := acc.CompletionWriter(i)
	roundTrip(t, l2, rr, cw, 2)
}

// TestReserveVMAligns: the staging data lands on a huge page boundary, so
// a huge-page memfd can be mapped there, whatever address the kernel picks.
func TestReserveVMAligns(t *testing.T) {
	for _, at := range []int{0, PageSize, 3 * PageSize, hugeAlign + 5*PageSize} {
		vm, err := reserveVM(at+hugeAlign, at)
		if err != nil {
			t.Fatal(err)
		}
		b := vm.bytes(at + hugeAlign)
		if addr := uintptr(unsafe.Pointer(&b[0])) + uintptr(at); addr%hugeAlign != 0 {
			t.Errorf("offset %d at %#x, not huge page aligned", at, addr)
		}
		if err := vm.release(); err != nil {
			t.Fatal(err)
		}
	}
}
