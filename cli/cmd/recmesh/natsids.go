package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	iofs "io/fs"
	"os"
	"path/filepath"

	"github.com/recmesh/recmesh/cli/internal/meshnats"
	"github.com/recmesh/recmesh/proto/control"
)

func init() {
	register(&command{
		name:    "nats-identities",
		summary: "generate the control plane's identities: an nkey seed per role and the NATS server's auth.conf (docker compose runs this once)",
		run:     runNATSIdentities,
	})
}

func runNATSIdentities(_ context.Context, e *env, args []string) error {
	fs := flag.NewFlagSet("nats-identities", flag.ContinueOnError)
	out := fs.String("out", "", "`dir` to write <role>/<role>.nk seeds (0600) and server/"+meshnats.ConfigFile+" into")
	force := fs.Bool("force", false, "replace identities already there (every process must then restart)")
	if err := parseFlags(fs, args, e); err != nil {
		return err
	}
	if *out == "" {
		return usagef("nats-identities needs --out DIR")
	}
	conf := filepath.Join(*out, meshnats.ServerDir, meshnats.ConfigFile)
	// Idempotent: a restarted compose project keeps the identities its
	// running processes hold.
	if _, err := os.Stat(conf); err == nil && !*force {
		fmt.Fprintf(e.stdout, "nats-identities: %s exists; keeping it (--force replaces it)\n", conf)
		return nil
	} else if err != nil && !errors.Is(err, iofs.ErrNotExist) {
		return fmt.Errorf("nats-identities: %w", err)
	}
	if err := os.MkdirAll(*out, 0o755); err != nil {
		return fmt.Errorf("nats-identities: %w", err)
	}
	ids, err := meshnats.Generate(*out)
	if err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "nats-identities: wrote %s; start NATS with -c %s and give each process NATS_NKEY:\n", conf, conf)
	for _, r := range control.Roles {
		fmt.Fprintf(e.stdout, "  %-12s %s\n", r, ids.Seed(r))
	}
	return nil
}
