//go:build !(linux || darwin || dragonfly || freebsd || netbsd || openbsd)

package frontend

import (
	"context"
	"net"
)

// listenReusePort listens without SO_REUSEPORT, which this platform lacks:
// one frontend process per port.
func listenReusePort(ctx context.Context, addr string) (net.Listener, error) {
	var lc net.ListenConfig
	lc.SetMultipathTCP(false)
	return lc.Listen(ctx, "tcp", addr)
}
