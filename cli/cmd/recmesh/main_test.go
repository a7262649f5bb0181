package main

import (
	"bytes"
	"context"
	"io"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/recmesh/recmesh/model"
)

// runT runs recmesh in-process with the given environment variables and
// returns the exit code, stdout and stderr.
func runT(t *testing.T, vars map[string]string, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	e := &env{
		stdout:     &stdout,
		stderr:     &stderr,
		getenv:     func(k string) string { return vars[k] },
		isTerminal: func(io.Writer) bool { return false },
	}
	code := run(context.Background(), args, e)
	return code, stdout.String(), stderr.String()
}

func TestDispatch(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		out  string // substring of stdout+stderr
	}{
		{nil, exitUsage, "Commands:\n  export"},
		{[]string{"help"}, exitOK, "Commands:"},
		{[]string{"frobnicate"}, exitUsage, `unknown command "frobnicate"`},
		{[]string{"export", "-h"}, exitOK, "RECMESH_MAX_VOCAB"},
	} {
		code, stdout, stderr := runT(t, nil, tc.args...)
		if code != tc.code || !strings.Contains(stdout+stderr, tc.out) {
			t.Errorf("recmesh %v: exit %d, output %q; want exit %d and %q", tc.args, code, stdout+stderr, tc.code, tc.out)
		}
	}
}

func TestExportBadInput(t *testing.T) {
	for _, tc := range []struct {
		vars map[string]string
		args []string
		msg  string
	}{
		{nil, []string{"--max-vocab", "many"}, "-max-vocab"},
		{nil, []string{"--max-vocab", "-5"}, "-max-vocab is -5"},
		{nil, []string{"--seed", "-1"}, "-seed"},
		{nil, []string{"--out", ""}, "-out is empty"},
		{nil, []string{"--bogus"}, "-bogus"},
		{nil, []string{"stray"}, `unexpected argument "stray"`},
		{map[string]string{"RECMESH_MAX_VOCAB": "x"}, nil, "RECMESH_MAX_VOCAB (flag -max-vocab)"},
		{map[string]string{"RECMESH_SEED": "1.5"}, nil, "RECMESH_SEED (flag -seed)"},
	} {
		code, _, stderr := runT(t, tc.vars, append([]string{"export"}, tc.args...)...)
		if code != exitUsage || !strings.Contains(stderr, tc.msg) {
			t.Errorf("export %v env %v: exit %d, stderr %q; want exit %d mentioning %q", tc.args, tc.vars, code, stderr, exitUsage, tc.msg)
		}
	}
}

func TestExport(t *testing.T) {
	out := filepath.Join(t.TempDir(), "bundle")
	// The seed comes from the environment, the rest from flags.
	code, stdout, stderr := runT(t, map[string]string{"RECMESH_SEED": "5", "RECMESH_OUT": "/nonexistent/ignored"},
		"export", "--max-vocab", "1000", "--out", out)
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	summary := regexp.MustCompile(`^export: wrote \S+/bundle \(rows=\d+, bytes=\d+, \d+\.\ds\)\n$`)
	if stdout != "" || !summary.MatchString(stderr) {
		t.Errorf("stdout %q, stderr %q; want one summary line on stderr", stdout, stderr)
	}
	b, err := model.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if b.Config.Seed != 5 || b.Config.MaxVocabSize != 1000 {
		t.Errorf("bundle seed %d cap %d, want 5 and 1000", b.Config.Seed, b.Config.MaxVocabSize)
	}
	if want := "rows=" + itoa(b.Config.TotalRows()); !strings.Contains(stderr, want) {
		t.Errorf("summary %q lacks %s", stderr, want)
	}
}

func TestExportFailure(t *testing.T) {
	// A directory holding other files is refused: exit 1, not 2.
	dir := t.TempDir()
	code, _, stderr := runT(t, nil, "export", "--out", filepath.Dir(dir))
	if code != exitFailure || !strings.Contains(stderr, "refusing to replace") {
		t.Errorf("exit %d, stderr %q", code, stderr)
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
