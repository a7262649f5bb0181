package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestNATSIdentities(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "nats")
	if code, _, stderr := runT(t, nil, "nats-identities"); code != exitUsage || !strings.Contains(stderr, "--out") {
		t.Errorf("without --out: exit %d, %q", code, stderr)
	}
	code, stdout, stderr := runT(t, nil, "nats-identities", "--out", dir)
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	conf, err := os.ReadFile(filepath.Join(dir, "server", "auth.conf"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(conf), "jetstream {\n  store_dir: \"/nats/jetstream\"\n}") {
		t.Errorf("auth.conf does not run JetStream in compose's volume:\n%s", conf)
	}
	for _, role := range []string{"embedder", "accelerator", "frontend", "trainer", "admin"} {
		if !strings.Contains(stdout, filepath.Join(dir, role, role+".nk")) {
			t.Errorf("output does not name the %s seed: %s", role, stdout)
		}
	}
	// A second run keeps what is there: running processes hold those keys.
	if code, stdout, _ := runT(t, nil, "nats-identities", "--out", dir); code != exitOK || !strings.Contains(stdout, "keeping it") {
		t.Errorf("second run: exit %d, %q", code, stdout)
	}
	if again, _ := os.ReadFile(filepath.Join(dir, "server", "auth.conf")); string(again) != string(conf) {
		t.Error("a second run replaced the identities")
	}
	if code, _, _ := runT(t, nil, "nats-identities", "--out", dir, "--force"); code != exitOK {
		t.Errorf("--force: exit %d", code)
	}
	if again, _ := os.ReadFile(filepath.Join(dir, "server", "auth.conf")); string(again) == string(conf) {
		t.Error("--force kept the old identities")
	}
	if _, stdout, _ := runT(t, nil, "nats-identities", "--out", dir); strings.Contains(stdout, "predates") {
		t.Errorf("current identities taken for old ones: %s", stdout)
	}
	// Identities from before the trainer and JetStream are kept, with a
	// word on how to get both.
	old := strings.ReplaceAll(string(conf), "# trainer\n", "")
	old = old[strings.Index(old, "authorization {"):]
	if err := os.WriteFile(filepath.Join(dir, "server", "auth.conf"), []byte(old), 0o644); err != nil {
		t.Fatal(err)
	}
	if code, stdout, _ := runT(t, nil, "nats-identities", "--out", dir); code != exitOK || !strings.Contains(stdout, "predates the trainer role or JetStream") {
		t.Errorf("old identities: exit %d, %q", code, stdout)
	}
	// Without a store directory, no JetStream.
	bare := filepath.Join(t.TempDir(), "nats")
	if code, _, stderr := runT(t, map[string]string{"RECMESH_OUT": bare}, "nats-identities", "--jetstream-dir", ""); code != exitOK {
		t.Fatalf("--jetstream-dir '': exit %d: %s", code, stderr)
	}
	if b, _ := os.ReadFile(filepath.Join(bare, "server", "auth.conf")); strings.Contains(string(b), "jetstream") || !strings.Contains(string(b), "# trainer") {
		t.Errorf("--jetstream-dir '': auth.conf\n%s", b)
	}
}
