package main

import (
	"encoding/json"
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

// TestNATSIdentitiesKubernetesSecrets: each role's seed in a Secret of its
// own, byte for byte, and the server's configuration in another.
func TestNATSIdentitiesKubernetesSecrets(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "nats")
	if code, _, stderr := runT(t, nil, "nats-identities", "--out", dir, "--kubernetes-secrets", "Not_A_Namespace"); code != exitUsage || !strings.Contains(stderr, "not a namespace name") {
		t.Errorf("bad namespace: exit %d, %q", code, stderr)
	}
	if _, err := os.Stat(dir); err == nil {
		t.Error("a refused namespace still generated identities")
	}
	code, stdout, stderr := runT(t, nil, "nats-identities", "--out", dir, "--kubernetes-secrets", "recmesh")
	if code != exitOK || !strings.Contains(stdout, "kubectl apply -f") {
		t.Fatalf("exit %d: %s%s", code, stdout, stderr)
	}
	path := filepath.Join(dir, "kubernetes-secrets.json")
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("%s is %v; want 0600", path, fi.Mode().Perm())
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var list struct {
		Kind  string
		Items []struct {
			APIVersion string `json:"apiVersion"`
			Kind       string
			Metadata   struct{ Name, Namespace string }
			Data       map[string][]byte
		}
	}
	if err := json.Unmarshal(b, &list); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"recmesh-nats-server": filepath.Join(dir, "server", "auth.conf")}
	for _, role := range []string{"embedder", "accelerator", "frontend", "trainer", "admin"} {
		want["recmesh-nats-"+role] = filepath.Join(dir, role, role+".nk")
	}
	if list.Kind != "List" || len(list.Items) != len(want) {
		t.Fatalf("kind %q with %d items; want a List of %d", list.Kind, len(list.Items), len(want))
	}
	for _, it := range list.Items {
		file, ok := want[it.Metadata.Name]
		if !ok || it.APIVersion != "v1" || it.Kind != "Secret" || it.Metadata.Namespace != "recmesh" {
			t.Errorf("unexpected %s %s/%s %s", it.APIVersion, it.Metadata.Namespace, it.Metadata.Name, it.Kind)
			continue
		}
		src, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		if len(it.Data) != 1 || string(it.Data[filepath.Base(file)]) != string(src) {
			t.Errorf("%s holds %d keys; want %s alone, equal to the file", it.Metadata.Name, len(it.Data), filepath.Base(file))
		}
		delete(want, it.Metadata.Name)
	}
	// A second run keeps the identities and writes the same Secrets.
	if code, _, _ := runT(t, nil, "nats-identities", "--out", dir, "--kubernetes-secrets", "recmesh"); code != exitOK {
		t.Fatalf("second run: exit %d", code)
	}
	if again, _ := os.ReadFile(path); string(again) != string(b) {
		t.Error("a second run wrote other Secrets")
	}
}
