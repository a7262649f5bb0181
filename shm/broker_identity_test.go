package shm

import (
	"errors"
	"os"
	"testing"
)

// rawHello dials the segment's broker as a client would and says hello
// with the given pid and pid namespace, bypassing Attach's honest one.
func rawHello(t *testing.T, s *Segment, pid uint32, pidNS uint64) (*client, error) {
	t.Helper()
	c, err := dialSegment(s.Path(), 0)
	if err != nil {
		t.Fatal(err)
	}
	cl := &client{c: c, lanes: map[int]int{}}
	t.Cleanup(cl.close)
	_, fds, err := cl.request(wireMsg{Op: "hello", Pid: pid, PidNS: pidNS}, 2)
	closeAll(fds)
	return cl, err
}

// TestHelloIdentityFromKernel: a peer cannot name itself another process
// (another pid, or another pid namespace than the kernel sees it in), and
// says hello once.
func TestHelloIdentityFromKernel(t *testing.T) {
	s := newTestSegment(t, testGeometry())
	me := uint32(os.Getpid())
	for _, tc := range []struct {
		name  string
		pid   uint32
		pidNS uint64
	}{
		{"another pid, no namespace", me + 1, 0},
		{"another pid, this namespace", me + 1, s.pidNS},
		{"this pid, another namespace", me, s.pidNS + 1},
		{"pid 0", 0, s.pidNS},
	} {
		if _, err := rawHello(t, s, tc.pid, tc.pidNS); !errors.Is(err, ErrProtocol) {
			t.Errorf("%s: hello = %v, want ErrProtocol", tc.name, err)
		}
	}
	cl, err := rawHello(t, s, me, 0)
	if err != nil {
		t.Fatalf("an honest hello without a namespace: %v", err)
	}
	if _, _, err := cl.request(wireMsg{Op: "hello", Pid: me + 1}, 2); !errors.Is(err, ErrProtocol) {
		t.Fatalf("a second hello = %v, want ErrProtocol", err)
	}
}

// TestAcceleratorRoleNotTakenWhileHeld: while an accelerator holds the
// segment nobody else gets its memory, not even a peer of the same
// process (the same pid the role was granted to), and a peer that claimed
// a lane never does.
func TestAcceleratorRoleNotTakenWhileHeld(t *testing.T) {
	s := newTestSegment(t, testGeometry())
	acc := attachTest(t, s)
	if err := acc.SetAccelerator(os.Getpid()); err != nil {
		t.Fatal(err)
	}
	cl, err := rawHello(t, s, uint32(os.Getpid()), 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, fds, err := cl.request(wireMsg{Op: "accel", Pid: uint32(os.Getpid())}, 2); !errors.Is(err, ErrAcceleratorPresent) {
		closeAll(fds)
		t.Fatalf("accel while held = %v, want ErrAcceleratorPresent", err)
	}

	// Once it detaches, the role is free again, but not for a frontend.
	acc.DetachAccelerator()
	fe := attachTest(t, s)
	if _, err := fe.ClaimLane(os.Getpid()); err != nil {
		t.Fatal(err)
	}
	if err := fe.SetAccelerator(os.Getpid()); !errors.Is(err, ErrNotOwner) {
		t.Fatalf("a frontend with a lane asks for the role = %v, want ErrNotOwner", err)
	}
}

// TestAcceleratorKey: a segment created with a key gives the role only to
// a peer that presents it.
func TestAcceleratorKey(t *testing.T) {
	key := []byte("0123456789abcdef0123456789abcdef")
	s, err := Create(Options{Name: testName(t), Dir: testDir(t), ModelID: "test-model", Geometry: testGeometry(), AcceleratorKey: key})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close(); s.Remove() })
	for _, k := range [][]byte{nil, []byte("0123456789abcdef0123456789abcdeX")} {
		a, err := Attach(s.Path(), AttachOptions{AcceleratorKey: k})
		if err != nil {
			t.Fatal(err)
		}
		if err := a.SetAccelerator(os.Getpid()); !errors.Is(err, ErrNotOwner) {
			t.Errorf("key %q: SetAccelerator = %v, want ErrNotOwner", k, err)
		}
		a.Close()
	}
	a, err := Attach(s.Path(), AttachOptions{AcceleratorKey: key})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if err := a.SetAccelerator(os.Getpid()); err != nil {
		t.Fatalf("with the key: %v", err)
	}
}

// TestLanesPerProcessCapped: one process gets MaxLanesPerPeer lanes,
// however many connections it opens; others still find free lanes.
func TestLanesPerProcessCapped(t *testing.T) {
	for _, limit := range []int{0, 2} {
		s, err := Create(Options{Name: testName(t), Dir: testDir(t), ModelID: "test-model", Geometry: testGeometry(), MaxLanesPerPeer: limit})
		if err != nil {
			t.Fatal(err)
		}
		want := max(limit, DefaultMaxLanesPerPeer)
		got := 0
		for range testGeometry().Lanes {
			a, err := Attach(s.Path(), AttachOptions{})
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close()
			if _, err := a.ClaimLane(os.Getpid()); err == nil {
				got++
			} else if !errors.Is(err, ErrNoFreeLane) {
				t.Fatalf("claim = %v, want ErrNoFreeLane", err)
			}
		}
		if got != want {
			t.Errorf("limit %d: one process got %d lanes, want %d", limit, got, want)
		}
		s.Close()
		s.Remove()
	}
}
