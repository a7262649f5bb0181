// Command recmesh is the operator's tool for a recmesh deployment: it
// exports model bundles and talks to running services. Each subcommand
// lives in its own file and registers itself; see command.go.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], newEnv())
	stop()
	os.Exit(code)
}
