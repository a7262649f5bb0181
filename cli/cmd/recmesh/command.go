package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"

	"golang.org/x/term"

	"github.com/recmesh/recmesh/telemetry/flagenv"
)

// Exit codes.
const (
	exitOK      = 0
	exitFailure = 1 // the command ran and failed
	exitUsage   = 2 // bad subcommand, flag or environment value
)

// A command is one recmesh subcommand. To add one, add a file that calls
// register from an init function; nothing else needs to change.
type command struct {
	// name is the word after recmesh on the command line.
	name string
	// summary is the one-line description in the command list.
	summary string
	// run runs the command with the arguments after its name. It returns a
	// usage error (usagef, or a parseFlags error) for bad input, which
	// exits 2; any other error exits 1.
	run func(ctx context.Context, e *env, args []string) error
}

// commands is the registry, filled by each command file's init.
var commands = map[string]*command{}

func register(c *command) {
	if _, dup := commands[c.name]; dup {
		panic("recmesh: command " + c.name + " registered twice")
	}
	commands[c.name] = c
}

// env is what a command may touch of the outside world, so tests can run
// commands in-process.
type env struct {
	stdout, stderr io.Writer
	getenv         func(string) string
	// isTerminal reports whether w is an interactive terminal (progress
	// bars are drawn only there).
	isTerminal func(w io.Writer) bool
}

func newEnv() *env {
	return &env{
		stdout: os.Stdout,
		stderr: os.Stderr,
		getenv: os.Getenv,
		isTerminal: func(w io.Writer) bool {
			f, ok := w.(*os.File)
			return ok && term.IsTerminal(int(f.Fd()))
		},
	}
}

// usageError marks an error as the user's input being wrong.
type usageError struct{ err error }

func (u *usageError) Error() string { return u.err.Error() }
func (u *usageError) Unwrap() error { return u.err }

func usagef(format string, args ...any) error {
	return &usageError{fmt.Errorf(format, args...)}
}

// run dispatches args to a command and returns the process exit code.
func run(ctx context.Context, args []string, e *env) int {
	if len(args) == 0 {
		printCommands(e.stderr)
		return exitUsage
	}
	name := args[0]
	if name == "-h" || name == "-help" || name == "--help" || name == "help" {
		printCommands(e.stdout)
		return exitOK
	}
	c, ok := commands[name]
	if !ok {
		fmt.Fprintf(e.stderr, "recmesh: unknown command %q\n", name)
		printCommands(e.stderr)
		return exitUsage
	}
	err := c.run(ctx, e, args[1:])
	var ue *usageError
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, flag.ErrHelp):
		return exitOK
	case errors.As(err, &ue):
		fmt.Fprintf(e.stderr, "recmesh %s: %v\nRun 'recmesh %s -h' for usage.\n", name, err, name)
		return exitUsage
	default:
		fmt.Fprintf(e.stderr, "recmesh %s: %v\n", name, err)
		return exitFailure
	}
}

func printCommands(w io.Writer) {
	fmt.Fprintln(w, "Usage: recmesh <command> [flags]\n\nCommands:")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-10s %s\n", n, commands[n].summary)
	}
	fmt.Fprintln(w, "\nRun 'recmesh <command> -h' for a command's flags.")
}

// parseFlags parses args into fs, then fills unset flags from their
// environment twins (see flagenv). -h prints the flags to stdout and
// returns flag.ErrHelp; a bad flag, variable or stray argument is a usage
// error naming it.
func parseFlags(fs *flag.FlagSet, args []string, e *env) error {
	return parseFlagsArgs(fs, args, e, 0)
}

// parseFlagsArgs is parseFlags for a command that takes up to maxArgs
// positional arguments after its flags.
func parseFlagsArgs(fs *flag.FlagSet, args []string, e *env, maxArgs int) error {
	fs.SetOutput(io.Discard) // errors are reported once, by run
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.SetOutput(e.stdout)
			fmt.Fprintf(e.stdout, "Usage: recmesh %s [flags]\n\nFlags:\n", fs.Name())
			flagenv.Usage(fs)
			return err
		}
		return &usageError{err}
	}
	if fs.NArg() > maxArgs {
		return usagef("unexpected argument %q", fs.Arg(maxArgs))
	}
	if err := flagenv.Apply(fs, e.getenv); err != nil {
		return &usageError{err}
	}
	return nil
}
