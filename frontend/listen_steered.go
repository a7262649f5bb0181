//go:build linux

package frontend

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/recmesh/recmesh/frontend/steering"
)

// steered is the gRPC listening socket of a frontend that takes part in
// steering: bound at once (so the port and address are known and held),
// but listening, and so in the port's reuseport group, only from the
// first time the backend is ready. In eBPF mode it also holds the slot in
// the steering group that carries its readiness and load.
type steered struct {
	mode   steering.Mode
	fd     int
	addr   net.Addr
	dir    string
	reason string // why eBPF is not used, in kernel-hash mode

	mu sync.Mutex // serialises listen, setReady, retire and close
	// retired: the drain began; the slot stays unready whatever
	// readiness polls still report.
	retired bool
	group   *steering.Group
	// member is read on every call (in-flight counts) and accept: an
	// atomic pointer, so the hot path takes no lock.
	member atomic.Pointer[steering.Member]
	lis    net.Listener
}

// bindSteered binds addr with SO_REUSEPORT without listening.
func bindSteered(addr, mode, pinRoot string) (*steered, error) {
	tcp, err := net.ResolveTCPAddr("tcp", addr)
	if err != nil {
		return nil, err
	}
	family, sa := unix.AF_INET6, unix.Sockaddr(&unix.SockaddrInet6{Port: tcp.Port})
	if ip4 := tcp.IP.To4(); ip4 != nil {
		family = unix.AF_INET
		sa = &unix.SockaddrInet4{Port: tcp.Port, Addr: [4]byte(ip4)}
	} else if tcp.IP != nil {
		sa = &unix.SockaddrInet6{Port: tcp.Port, Addr: [16]byte(tcp.IP.To16())}
	}
	fd, err := unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("socket: %w", err)
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("set SO_REUSEADDR: %w", err)
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEPORT, 1); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("set SO_REUSEPORT: %w", err)
	}
	if err := unix.Bind(fd, sa); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("bind %s: %w", addr, err)
	}
	bound, err := unix.Getsockname(fd)
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	s := &steered{mode: steering.ModeKernelHash, fd: fd, addr: sockaddrTCP(bound)}
	if mode == SteeringAuto || mode == SteeringEBPF {
		s.dir = filepath.Join(pinRoot, strconv.Itoa(s.addr.(*net.TCPAddr).Port))
		g, err := steering.Open(s.dir)
		switch {
		case err == nil:
			s.group, s.mode = g, steering.ModeEBPF
		case mode == SteeringEBPF:
			unix.Close(fd)
			return nil, fmt.Errorf("eBPF steering (set --steering=auto or kernel-hash to fall back): %w", err)
		default:
			s.reason = err.Error()
		}
	}
	return s, nil
}

func sockaddrTCP(sa unix.Sockaddr) *net.TCPAddr {
	switch a := sa.(type) {
	case *unix.SockaddrInet4:
		return &net.TCPAddr{IP: net.IP(a.Addr[:]).To16(), Port: a.Port}
	case *unix.SockaddrInet6:
		return &net.TCPAddr{IP: net.IP(a.Addr[:]), Port: a.Port}
	}
	return &net.TCPAddr{}
}

// listen starts listening (joining the reuseport group) and, in eBPF
// mode, takes a steering slot, marked ready, and counts accepted
// connections into the slot's load.
func (s *steered) listen() (net.Listener, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lis != nil {
		return s.lis, nil
	}
	if err := unix.Listen(s.fd, unix.SOMAXCONN); err != nil {
		return nil, fmt.Errorf("listen: %w", err)
	}
	f := os.NewFile(uintptr(s.fd), "grpc-listener")
	lis, err := net.FileListener(f)
	f.Close() // FileListener holds its own duplicate
	s.fd = -1
	if err != nil {
		return nil, err
	}
	if s.group != nil {
		var m *steering.Member
		var jerr error
		rc, err := lis.(*net.TCPListener).SyscallConn()
		if err == nil {
			err = rc.Control(func(fd uintptr) { m, jerr = s.group.Join(int(fd)) })
		}
		if err = errors.Join(err, jerr); err != nil {
			lis.Close()
			return nil, fmt.Errorf("join the steering group: %w", err)
		}
		m.SetReady(!s.retired)
		s.member.Store(m)
	}
	s.lis = &countingListener{Listener: lis, s: s}
	return s.lis, nil
}

// setReady tells the steering program whether to send new connections
// here (eBPF mode; the kernel's hash cannot be told).
func (s *steered) setReady(ready bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if m := s.member.Load(); m != nil && !s.retired {
		m.SetReady(ready)
	}
}

// retire marks the slot unready for good: the drain began.
func (s *steered) retire() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.retired = true
	if m := s.member.Load(); m != nil {
		m.SetReady(false)
	}
}

// settle waits, for at most timeout, until every connection the program
// sent here before retire has been accepted (eBPF mode). Closing the
// listener sooner would race the kernel: a handshake that completes as
// the listener closes is reset, not moved to another frontend.
func (s *steered) settle(timeout time.Duration) bool {
	m := s.member.Load()
	if m == nil {
		return true
	}
	deadline := time.Now().Add(timeout)
	for m.Pending() > 0 {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(time.Millisecond)
	}
	return true
}

// addInflight moves the slot's in-flight count (eBPF mode).
func (s *steered) addInflight(d int32) {
	if m := s.member.Load(); m != nil {
		m.AddInflight(d)
	}
}

// sweep clears the slots of frontends that died, until stop closes.
func (s *steered) sweep(stop <-chan struct{}) {
	if s.group == nil {
		return
	}
	t := time.NewTicker(250 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			s.group.Sweep()
			if m := s.member.Load(); m != nil {
				m.ForgetPending()
			}
		}
	}
}

// close gives the slot up and releases the socket and the maps. The
// listener itself is closed by the gRPC server.
func (s *steered) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if m := s.member.Swap(nil); m != nil {
		m.Leave()
	}
	if s.group != nil {
		s.group.Close()
		s.group = nil
	}
	if s.fd >= 0 {
		unix.Close(s.fd)
		s.fd = -1
	}
}

// countingListener counts accepted connections into the steering slot's
// load (the connections gauge is limitListener's, for every frontend).
type countingListener struct {
	net.Listener
	s *steered
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	m := l.s.member.Load()
	if m != nil {
		m.Accepted()
	}
	return &countedConn{Conn: c, m: m}, nil
}

type countedConn struct {
	net.Conn
	m    *steering.Member
	once sync.Once
}

func (c *countedConn) Close() error {
	c.once.Do(func() {
		if c.m != nil {
			c.m.AddConns(-1)
		}
	})
	return c.Conn.Close()
}

// CloseWrite passes through to the socket (h2unary lingers with it).
func (c *countedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.ErrUnsupported
}
