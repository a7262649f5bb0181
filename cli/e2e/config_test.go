package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// configLine is one line of -print-config: "-name=value (ENV)".
var configLine = regexp.MustCompile(`^-([a-z0-9-]+)=(.*) \((RECMESH_[A-Z0-9_]+)\)$`)

// printConfig runs a binary with -print-config under env and returns what
// it printed, flag by flag: value and variable.
func printConfig(t *testing.T, path string, args []string, env []string) map[string][2]string {
	t.Helper()
	cmd := exec.Command(path, append(args, "-print-config")...)
	cmd.Env = env
	cmd.Dir = t.TempDir()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %v -print-config: %v\n%s", filepath.Base(path), args, err, out)
	}
	got := map[string][2]string{}
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if m := configLine.FindStringSubmatch(l); m != nil {
			got[m[1]] = [2]string{m[2], m[3]}
		}
	}
	if len(got) == 0 {
		t.Fatalf("%s %v -print-config printed no flag:\n%s", filepath.Base(path), args, out)
	}
	return got
}

// otherValue is a value of the same kind as def that differs from it.
func otherValue(name, def string) string {
	switch {
	case def == "true":
		return "false"
	case def == "false":
		return "true"
	case def == "INFO" || def == "DEBUG" || def == "WARN" || def == "ERROR":
		if def == "DEBUG" {
			return "WARN"
		}
		return "DEBUG"
	}
	if _, err := strconv.Atoi(def); err == nil {
		return "7"
	}
	if _, err := strconv.ParseFloat(def, 64); err == nil {
		return "0.25"
	}
	if _, err := time.ParseDuration(def); err == nil {
		return "7s"
	}
	return "from-env-" + name
}

// TestEveryVariableTakesEffect starts each binary once per flag with that
// flag's environment twin (RECMESH_<FLAG>, as -h documents it) set, and
// checks with -print-config that the flag took the value: one
// configuration scheme, every variable live.
func TestEveryVariableTakesEffect(t *testing.T) {
	bin := buildBinaries(t)
	// Only PATH and HOME from the environment: no RECMESH_* of the caller's.
	base := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}
	for _, b := range []struct {
		name string
		args []string
	}{
		{"embedder", nil},
		{"accelerator", []string{"serve"}},
		{"frontend", nil},
	} {
		t.Run(b.name, func(t *testing.T) {
			path := filepath.Join(bin, b.name)
			help, _ := exec.Command(path, append(b.args, "-h")...).CombinedOutput()
			defaults := printConfig(t, path, b.args, base)
			for name, d := range defaults {
				if !strings.Contains(string(help), "environment: "+d[1]) {
					t.Errorf("-h does not document -%s's variable %s", name, d[1])
				}
				want := otherValue(name, d[0])
				got := printConfig(t, path, b.args, append(append([]string{}, base...), d[1]+"="+want))
				if got[name][0] != want {
					t.Errorf("%s=%s: -%s is %q", d[1], want, name, got[name][0])
				}
			}
		})
	}
}
