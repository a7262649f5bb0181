//go:build linux

package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

// reapOrphans waits for ctx, collecting every exited child meanwhile: as
// PID 1 of a pid namespace, the process inherits the orphans of the others,
// and an unreaped one stays a zombie that holds a pid.
func reapOrphans(ctx context.Context) {
	chld := make(chan os.Signal, 1)
	signal.Notify(chld, syscall.SIGCHLD)
	defer signal.Stop(chld)
	for {
		for {
			pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-chld:
		}
	}
}
