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
	for _, role := range []string{"embedder", "accelerator", "frontend", "admin"} {
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
}
