package main

import (
	"context"
	"flag"
	"fmt"
)

func init() {
	register(&command{
		name:    "pause",
		summary: "hold a container's namespaces until stopped, reaping orphans (compose's mesh service: what a Kubernetes pod's pause container does)",
		run:     runPause,
	})
}

// runPause blocks until ctx ends (SIGTERM or SIGINT, see main). Compose
// puts the shared-memory segment's IPC namespace, the pid namespace that
// liveness checks use and the frontends' network namespace on a container
// that runs this, not on the embedder: namespaces die with the process that
// holds them, so a restarted embedder would come back in new ones, beside
// frontends and an accelerator still in the old. As PID 1 of the shared pid
// namespace it also reaps the processes reparented to it.
func runPause(ctx context.Context, e *env, args []string) error {
	fs := flag.NewFlagSet("pause", flag.ContinueOnError)
	if err := parseFlags(fs, args, e); err != nil {
		return err
	}
	fmt.Fprintln(e.stdout, "pause: holding the namespaces until stopped")
	reapOrphans(ctx)
	return nil
}
