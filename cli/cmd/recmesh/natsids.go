package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	iofs "io/fs"
	"os"
	"path/filepath"
	"regexp"

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
	secretsNS := fs.String("kubernetes-secrets", "", "also write "+secretsFile+" into --out: a Secret per role (recmesh-nats-<role>) and the server's (recmesh-nats-server) in `namespace`, for kubectl apply -f (deploy/k8s mounts them)")
	jsDir := fs.String("jetstream-dir", "/nats/jetstream", "`dir` where the NATS server that runs with "+meshnats.ConfigFile+" keeps its JetStream streams (fresh embeddings' row updates and dense weights), as that server sees it: compose's nats service mounts a volume there; empty leaves JetStream off")
	if err := parseFlags(fs, args, e); err != nil {
		return err
	}
	if *out == "" {
		return usagef("nats-identities needs --out DIR")
	}
	if ns := *secretsNS; ns != "" && (len(ns) > 63 || !namespaceName.MatchString(ns)) {
		return usagef("nats-identities: --kubernetes-secrets %q is not a namespace name (lower-case letters, digits and '-', at most 63, starting and ending alphanumeric)", ns)
	}
	conf := filepath.Join(*out, meshnats.ServerDir, meshnats.ConfigFile)
	// Idempotent: a restarted compose project keeps the identities its
	// running processes hold.
	if b, err := os.ReadFile(conf); err == nil && !*force {
		fmt.Fprintf(e.stdout, "nats-identities: %s exists; keeping it (--force replaces it)\n", conf)
		if *secretsNS != "" {
			if err := writeSecrets(e, *out, *secretsNS); err != nil {
				return err
			}
		}
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
	if *secretsNS != "" {
		return writeSecrets(e, *out, *secretsNS)
	}
	return nil
}

// namespaceName is a Kubernetes namespace name (an RFC 1123 label).
var namespaceName = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)

// secretsFile holds the identities as Kubernetes Secrets.
const secretsFile = "kubernetes-secrets.json"

// writeSecrets writes the identities under dir as Kubernetes Secrets in
// namespace ns: recmesh-nats-server holding auth.conf, and
// recmesh-nats-<role> holding that role's seed alone, so that each
// container mounts its own (deploy/k8s). A v1 List in JSON, which kubectl
// applies as is; the file is as secret as the seeds (0600).
func writeSecrets(e *env, dir, ns string) error {
	type secret struct {
		APIVersion string            `json:"apiVersion"`
		Kind       string            `json:"kind"`
		Metadata   map[string]any    `json:"metadata"`
		Type       string            `json:"type"`
		Data       map[string][]byte `json:"data"` // base64, as the API has it
	}
	add := func(items []secret, name, file string) ([]secret, error) {
		b, err := os.ReadFile(file)
		if err != nil {
			return nil, fmt.Errorf("nats-identities: %w", err)
		}
		return append(items, secret{
			APIVersion: "v1", Kind: "Secret", Type: "Opaque",
			Metadata: map[string]any{"name": name, "namespace": ns, "labels": map[string]string{"app.kubernetes.io/part-of": "recmesh"}},
			Data:     map[string][]byte{filepath.Base(file): b},
		}), nil
	}
	items, err := add(nil, "recmesh-nats-server", filepath.Join(dir, meshnats.ServerDir, meshnats.ConfigFile))
	if err != nil {
		return err
	}
	for _, r := range control.Roles {
		if items, err = add(items, "recmesh-nats-"+string(r), filepath.Join(dir, string(r), string(r)+".nk")); err != nil {
			return err
		}
	}
	b, err := json.MarshalIndent(map[string]any{"apiVersion": "v1", "kind": "List", "items": items}, "", "  ")
	if err != nil {
		return fmt.Errorf("nats-identities: %w", err)
	}
	path := filepath.Join(dir, secretsFile)
	if err := os.WriteFile(path, append(b, '\n'), 0o600); err != nil {
		return fmt.Errorf("nats-identities: %w", err)
	}
	fmt.Fprintf(e.stdout, "nats-identities: wrote %s; kubectl apply -f %s\n", path, path)
	return nil
}
