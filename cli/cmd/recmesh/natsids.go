package main

import (
	"bytes"
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
	jsDir := fs.String("jetstream-dir", "/nats/jetstream", "`dir` where the NATS server that runs with "+meshnats.ConfigFile+" keeps its JetStream streams (fresh embeddings' row updates and dense weights), as that server sees it: compose's nats service mounts a volume there; empty leaves JetStream off")
	if err := parseFlags(fs, args, e); err != nil {
		return err
	}
	if *out == "" {
		return usagef("nats-identities needs --out DIR")
	}
	conf := filepath.Join(*out, meshnats.ServerDir, meshnats.ConfigFile)
	// Idempotent: a restarted compose project keeps the identities its
	// running processes hold.
	if b, err := os.ReadFile(conf); err == nil && !*force {
		fmt.Fprintf(e.stdout, "nats-identities: %s exists; keeping it (--force replaces it)\n", conf)
		// Identities from before fresh embeddings have no trainer and
		// no JetStream: say how to get them rather than let updates
		// fail later with a timeout.
		if !bytes.Contains(b, []byte("# "+string(control.RoleTrainer)+"\n")) || *jsDir != "" && !bytes.Contains(b, []byte("jetstream {")) {
			fmt.Fprintf(e.stdout, "nats-identities: %s predates the %s role or JetStream (fresh embeddings); --force regenerates it, and every process must then restart\n", conf, control.RoleTrainer)
		}
		return nil
	} else if err != nil && !errors.Is(err, iofs.ErrNotExist) {
		return fmt.Errorf("nats-identities: %w", err)
	}
	if err := os.MkdirAll(*out, 0o755); err != nil {
		return fmt.Errorf("nats-identities: %w", err)
	}
	ids, err := meshnats.Generate(*out, *jsDir)
	if err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "nats-identities: wrote %s; start NATS with -c %s and give each process NATS_NKEY:\n", conf, conf)
	for _, r := range control.Roles {
		fmt.Fprintf(e.stdout, "  %-12s %s\n", r, ids.Seed(r))
	}
	return nil
}
