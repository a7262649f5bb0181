package main

import (
	"context"
	"flag"
	"fmt"
	"runtime"

	"github.com/recmesh/recmesh/telemetry"
)

func init() {
	register(&command{
		name:    "version",
		summary: "print the version of this build (the services report theirs in ServerMetadata and recmesh_build_info)",
		run:     runVersion,
	})
}

func runVersion(_ context.Context, e *env, args []string) error {
	fs := flag.NewFlagSet("version", flag.ContinueOnError)
	if err := parseFlags(fs, args, e); err != nil {
		return err
	}
	_, err := fmt.Fprintf(e.stdout, "recmesh %s (%s %s/%s)\n", telemetry.Version(), runtime.Version(), runtime.GOOS, runtime.GOARCH)
	return err
}
