// Command accelerator owns the PJRT device of the mesh. Subcommands:
//
//	accelerator serve   attach to the embedder's segment and run its batches
//	accelerator parity  compare every bucket with the plain-Go reference
//	accelerator bench   examples/s of the compiled program per bucket
//	accelerator hlobench  calls/s of StableHLO files, alternating in one process
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	// Every thread allocates from glibc's main arena, where ReleaseHeap
	// reaches all that is free.
	_ "github.com/recmesh/recmesh/accelerator/device/onearena"
)

type command struct {
	summary string
	run     func(ctx context.Context, args []string) error
}

var commands = map[string]command{
	"serve":    {"attach to the embedder's segment and run its batches", runServe},
	"parity":   {"compare every bucket with the plain-Go reference", runParity},
	"bench":    {"examples/s of the compiled program per bucket", runBench},
	"hlobench": {"calls/s of StableHLO files (recmesh's, JAX's), alternating in one process", runHLOBench},
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: accelerator <command> [flags]")
	for _, name := range []string{"serve", "parity", "bench", "hlobench"} {
		fmt.Fprintf(os.Stderr, "  %-9s %s\n", name, commands[name].summary)
	}
}

func main() {
	if len(os.Args) < 2 {
		usage()
		os.Exit(2)
	}
	cmd, ok := commands[os.Args[1]]
	if !ok {
		fmt.Fprintf(os.Stderr, "accelerator: unknown command %q\n", os.Args[1])
		usage()
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := cmd.run(ctx, os.Args[2:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return // -h or -print-config
		}
		fmt.Fprintf(os.Stderr, "accelerator %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}
