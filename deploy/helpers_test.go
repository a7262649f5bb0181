package deploy

import (
	"bufio"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/cli"
	"github.com/compose-spec/compose-go/v2/types"
)

// repoRoot is the repository root: the compose project directory and the
// build context of every image.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.work")); err != nil {
		t.Fatalf("repository root %s has no go.work: %v", root, err)
	}
	return root
}

// loadCompose loads compose files (relative to the repository root) with
// the compose-spec loader, as `docker compose` does, in an empty
// environment so that every ${VAR:-default} takes its default.
func loadCompose(t *testing.T, env map[string]string, files ...string) *types.Project {
	t.Helper()
	root := repoRoot(t)
	var paths, environ []string
	for _, f := range files {
		paths = append(paths, filepath.Join(root, f))
	}
	for k, v := range env {
		environ = append(environ, k+"="+v)
	}
	opts, err := cli.NewProjectOptions(paths,
		cli.WithWorkingDirectory(root),
		cli.WithEnv(environ),
		cli.WithInterpolation(true),
		cli.WithResolvedPaths(true),
	)
	if err != nil {
		t.Fatal(err)
	}
	p, err := opts.LoadProject(context.Background())
	if err != nil {
		t.Fatalf("load %v: %v", files, err)
	}
	return p
}

// workspaceModules lists the directories root/go.work uses.
func workspaceModules(t *testing.T, root string) []string {
	t.Helper()
	f, err := os.Open(filepath.Join(root, "go.work"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var dirs []string
	inUse := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if i := strings.Index(line, "//"); i >= 0 {
			line = strings.TrimSpace(line[:i])
		}
		switch {
		case line == "use (":
			inUse = true
		case inUse && line == ")":
			inUse = false
		case inUse && line != "":
			dirs = append(dirs, filepath.Clean(line))
		case strings.HasPrefix(line, "use "):
			dirs = append(dirs, filepath.Clean(strings.TrimSpace(strings.TrimPrefix(line, "use "))))
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(dirs) == 0 {
		t.Fatal("go.work uses no module")
	}
	return dirs
}
