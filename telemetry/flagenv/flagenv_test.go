package flagenv

import (
	"bytes"
	"flag"
	"strings"
	"testing"
)

func TestApply(t *testing.T) {
	env := map[string]string{
		"RECMESH_MAX_VOCAB": "50",
		"RECMESH_SEED":      "9",
		"RECMESH_OUT":       "",
	}
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	vocab := fs.Int("max-vocab", 1, "")
	seed := fs.Uint64("seed", 1, "")
	out := fs.String("out", "def", "")
	if err := fs.Parse([]string{"-seed", "3"}); err != nil {
		t.Fatal(err)
	}
	if err := Apply(fs, func(k string) string { return env[k] }); err != nil {
		t.Fatal(err)
	}
	// The environment fills what the command line left; the command line
	// wins; an empty variable is unset.
	if *vocab != 50 || *seed != 3 || *out != "def" {
		t.Errorf("max-vocab %d seed %d out %q", *vocab, *seed, *out)
	}
}

func TestApplyBadValue(t *testing.T) {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.Int("max-vocab", 1, "")
	err := Apply(fs, func(k string) string {
		if k == "RECMESH_MAX_VOCAB" {
			return "lots"
		}
		return ""
	})
	if err == nil || !strings.Contains(err.Error(), "RECMESH_MAX_VOCAB") || !strings.Contains(err.Error(), "-max-vocab") {
		t.Fatalf("Apply = %v", err)
	}
}

func TestUsage(t *testing.T) {
	var buf bytes.Buffer
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(&buf)
	fs.Int("max-vocab", 1000, "cap every `rows` count")
	fs.String("out", "data", "bundle `dir`")
	Usage(fs)
	want := "  -max-vocab rows\n    \tcap every rows count (default 1000)\n    \tenvironment: RECMESH_MAX_VOCAB\n" +
		"  -out dir\n    \tbundle dir (default \"data\")\n    \tenvironment: RECMESH_OUT\n"
	if buf.String() != want {
		t.Errorf("Usage printed\n%q\nwant\n%q", buf.String(), want)
	}
}
