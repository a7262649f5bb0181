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

// TestPrintConfig: -print-config prints what the environment made of each
// flag and stops the command as -h does; RECMESH_PRINT_CONFIG does not
// turn it on.
func TestPrintConfig(t *testing.T) {
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	var out bytes.Buffer
	fs.SetOutput(&out)
	fs.Int("max-batch", 4096, "")
	fs.String("bundle", "data/b", "")
	DefinePrintConfig(fs)
	env := map[string]string{"RECMESH_MAX_BATCH": "512", "RECMESH_PRINT_CONFIG": "true"}
	if err := fs.Parse(nil); err != nil {
		t.Fatal(err)
	}
	if err := Apply(fs, func(k string) string { return env[k] }); err != nil {
		t.Fatalf("RECMESH_PRINT_CONFIG alone printed the config: %v", err)
	}
	fs2 := flag.NewFlagSet("x", flag.ContinueOnError)
	fs2.SetOutput(&out)
	fs2.Int("max-batch", 4096, "")
	fs2.String("bundle", "data/b", "")
	DefinePrintConfig(fs2)
	if err := fs2.Parse([]string{"-print-config", "-bundle=/m"}); err != nil {
		t.Fatal(err)
	}
	if err := Apply(fs2, func(k string) string { return env[k] }); err != flag.ErrHelp {
		t.Fatalf("Apply = %v, want flag.ErrHelp", err)
	}
	for _, want := range []string{"-max-batch=512 (RECMESH_MAX_BATCH)\n", "-bundle=/m (RECMESH_BUNDLE)\n"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("printed %q, want %q", out.String(), want)
		}
	}
}
