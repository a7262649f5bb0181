//go:build linux || darwin || dragonfly || freebsd || netbsd || openbsd

package frontend

import (
	"context"
	"fmt"
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// listenReusePort listens on addr with SO_REUSEPORT, so that N frontend
// processes (same user) can bind the same port and the kernel spreads new
// connections among them; when one exits, its share goes to the others.
//
// Multipath TCP is switched off explicitly: Go may default listeners to
// MPTCP where the kernel supports it, and a reuseport group (and the
// SK_REUSEPORT eBPF steering planned for it) is meant to hold plain TCP
// sockets only.
func listenReusePort(ctx context.Context, addr string) (net.Listener, error) {
	lc := net.ListenConfig{Control: setReusePort}
	lc.SetMultipathTCP(false)
	return lc.Listen(ctx, "tcp", addr)
}

func setReusePort(_, _ string, c syscall.RawConn) error {
	var serr error
	if err := c.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1)
	}); err != nil {
		return err
	}
	if serr != nil {
		return fmt.Errorf("set SO_REUSEPORT: %w", serr)
	}
	return nil
}
