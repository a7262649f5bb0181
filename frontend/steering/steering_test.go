package steering

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// testGroup opens a group in a fresh pin directory, or skips where eBPF
// steering cannot run (RECMESH_REQUIRE_EBPF=1, as CI sets it, fails
// instead).
func testGroup(t *testing.T) *Group {
	t.Helper()
	dir := filepath.Join("/sys/fs/bpf", fmt.Sprintf("recmesh-test-%d-%s", os.Getpid(), t.Name()))
	g, err := Open(dir)
	if err != nil {
		_ = os.RemoveAll(dir)
		if os.Getenv("RECMESH_REQUIRE_EBPF") != "" {
			t.Fatalf("eBPF steering required here: %v", err)
		}
		t.Skipf("no eBPF steering here: %v", err)
	}
	t.Cleanup(func() {
		g.Close()
		_ = os.RemoveAll(dir)
	})
	return g
}

// listener is one raw listening socket of a reuseport group.
type listener struct {
	fd int
	m  *Member
}

func listenAt(t *testing.T, port int) *listener {
	t.Helper()
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEPORT, 1); err != nil {
		t.Fatal(err)
	}
	if err := unix.Bind(fd, &unix.SockaddrInet4{Port: port, Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := unix.Listen(fd, 128); err != nil {
		t.Fatal(err)
	}
	l := &listener{fd: fd}
	t.Cleanup(func() { l.close() })
	return l
}

func (l *listener) close() {
	if l.fd >= 0 {
		_ = unix.Close(l.fd)
		l.fd = -1
	}
}

func (l *listener) port(t *testing.T) int {
	sa, err := unix.Getsockname(l.fd)
	if err != nil {
		t.Fatal(err)
	}
	return sa.(*unix.SockaddrInet4).Port
}

// drain accepts every connection queued on l, without blocking.
func (l *listener) drain(t *testing.T) int {
	t.Helper()
	n := 0
	for {
		fd, _, err := unix.Accept4(l.fd, unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC)
		if errors.Is(err, unix.EAGAIN) {
			return n
		}
		if err != nil {
			t.Fatal(err)
		}
		_ = unix.Close(fd)
		n++
		if l.m != nil {
			l.m.Accepted()
		}
	}
}

func setNonblock(t *testing.T, ls ...*listener) {
	for _, l := range ls {
		if err := unix.SetNonblock(l.fd, true); err != nil {
			t.Fatal(err)
		}
	}
}

func dial(t *testing.T, port int) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestSteersToReadyLeastLoaded: of three listeners, one never ready,
// every connection goes to the two ready ones, alternating as their
// connection counts grow.
func TestSteersToReadyLeastLoaded(t *testing.T) {
	g := testGroup(t)
	a := listenAt(t, 0)
	port := a.port(t)
	b, c := listenAt(t, port), listenAt(t, port)
	setNonblock(t, a, b, c)
	for _, l := range []*listener{a, b, c} {
		m, err := g.Join(l.fd)
		if err != nil {
			t.Fatal(err)
		}
		l.m = m
	}
	a.m.SetReady(true)
	b.m.SetReady(true)
	counts := map[*listener]int{}
	for range 40 {
		dial(t, port)
		deadline := time.Now().Add(2 * time.Second)
		got := 0
		for got == 0 && time.Now().Before(deadline) {
			for _, l := range []*listener{a, b, c} {
				n := l.drain(t)
				counts[l] += n
				got += n
			}
		}
		if got != 1 {
			t.Fatalf("a connection was accepted %d times", got)
		}
	}
	if counts[c] != 0 {
		t.Fatalf("the frontend that is not ready got %d of 40 connections", counts[c])
	}
	if d := counts[a] - counts[b]; d < -1 || d > 1 {
		t.Fatalf("least-loaded steering split 40 connections %d / %d", counts[a], counts[b])
	}
	loads := g.Loads()
	if len(loads) != 3 {
		t.Fatalf("Loads = %+v, want three slots", loads)
	}
	for _, l := range loads {
		if l.Pending != 0 {
			t.Errorf("slot %d: %d connections sent and never accepted", l.Slot, l.Pending)
		}
	}
}

// TestQueuedConnectionsMigrate: connections queued on a listener that
// stops being ready and closes are accepted by the ready one, not reset.
func TestQueuedConnectionsMigrate(t *testing.T) {
	g := testGroup(t)
	if !g.Migrates() {
		t.Skip("kernel older than 5.14: no SELECT_OR_MIGRATE")
	}
	a := listenAt(t, 0)
	port := a.port(t)
	b := listenAt(t, port)
	setNonblock(t, a, b)
	ma, err := g.Join(a.fd)
	if err != nil {
		t.Fatal(err)
	}
	mb, err := g.Join(b.fd)
	if err != nil {
		t.Fatal(err)
	}
	ma.SetReady(true)
	mb.AddConns(100) // b ready but busy: new connections prefer a
	mb.SetReady(true)
	for range 5 {
		dial(t, port)
	}
	time.Sleep(50 * time.Millisecond) // let the handshakes finish into a's queue
	ma.SetReady(false)
	a.close()
	ma.Leave()
	deadline := time.Now().Add(2 * time.Second)
	got := 0
	for got < 5 && time.Now().Before(deadline) {
		got += b.drain(t)
		time.Sleep(5 * time.Millisecond)
	}
	if got != 5 {
		t.Fatalf("%d of 5 connections queued on the closed listener reached the live one", got)
	}
}

// TestSweepClearsDeadSlots: a slot marked ready whose listener closed
// without leaving (a killed frontend) is marked not ready by Sweep, and
// its slot can be claimed again once stale.
func TestSweepClearsDeadSlots(t *testing.T) {
	g := testGroup(t)
	a := listenAt(t, 0)
	m, err := g.Join(a.fd)
	if err != nil {
		t.Fatal(err)
	}
	m.SetReady(true)
	a.close() // no Leave: as if killed
	g.Sweep()
	for _, l := range g.Loads() {
		if l.Slot == m.Slot() && l.Ready {
			t.Fatal("Sweep left a dead listener's slot ready")
		}
	}
}

// TestBurstSpreads: a burst of connections made before any is accepted
// still spreads over the ready frontends, because the program counts what
// it sent and not yet accepted.
func TestBurstSpreads(t *testing.T) {
	g := testGroup(t)
	a := listenAt(t, 0)
	port := a.port(t)
	b := listenAt(t, port)
	setNonblock(t, a, b)
	for _, l := range []*listener{a, b} {
		m, err := g.Join(l.fd)
		if err != nil {
			t.Fatal(err)
		}
		l.m = m
		m.SetReady(true)
	}
	for range 10 {
		dial(t, port)
	}
	time.Sleep(50 * time.Millisecond)
	na, nb := a.drain(t), b.drain(t)
	if na+nb != 10 || na != 5 {
		t.Fatalf("a burst of 10 unaccepted connections split %d / %d, want 5 / 5", na, nb)
	}
}
