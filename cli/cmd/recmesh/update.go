package main

import (
	"context"
	"fmt"
	"io"
	"slices"
)

func init() {
	register(&command{
		name:    "update",
		summary: "fresh embeddings while serving: recmesh update push|status|dense (row updates and dense weights over NATS JetStream)",
		run:     runUpdate,
	})
}

// An updateCommand is one `recmesh update` subcommand; each file adds its
// own from an init function.
type updateCommand struct {
	name, summary string
	run           func(ctx context.Context, e *env, args []string) error
}

var updateCommands = map[string]*updateCommand{}

func registerUpdate(c *updateCommand) {
	if _, dup := updateCommands[c.name]; dup {
		panic("recmesh: update command " + c.name + " registered twice")
	}
	updateCommands[c.name] = c
}

func runUpdate(ctx context.Context, e *env, args []string) error {
	if len(args) == 0 {
		printUpdateCommands(e.stderr)
		return usagef("update needs a subcommand")
	}
	if args[0] == "-h" || args[0] == "-help" || args[0] == "--help" || args[0] == "help" {
		printUpdateCommands(e.stdout)
		return nil
	}
	c, ok := updateCommands[args[0]]
	if !ok {
		printUpdateCommands(e.stderr)
		return usagef("unknown update subcommand %q", args[0])
	}
	return c.run(ctx, e, args[1:])
}

func printUpdateCommands(w io.Writer) {
	fmt.Fprintln(w, "Usage: recmesh update <subcommand> [flags]\n\nSubcommands:")
	names := make([]string, 0, len(updateCommands))
	for n := range updateCommands {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-8s %s\n", n, updateCommands[n].summary)
	}
}
