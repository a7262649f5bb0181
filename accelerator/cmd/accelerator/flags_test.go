package main

import (
	"flag"
	"io"
	"strings"
	"testing"
)

func TestCommonFlagsEnvTwins(t *testing.T) {
	parse := func(args ...string) (commonFlags, error) {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		var c commonFlags
		c.register(fs)
		return c, c.parse(fs, args)
	}
	t.Setenv("RECMESH_BUNDLE", "/b")
	t.Setenv("RECMESH_MAX_BATCH", "256")
	c, err := parse()
	if err != nil || c.bundle != "/b" || c.maxBatch != 256 {
		t.Fatalf("env twins: %+v, %v", c, err)
	}
	if c, err := parse("--max-batch=8"); err != nil || c.maxBatch != 8 {
		t.Fatalf("the command line must win: %+v, %v", c, err)
	}
	t.Setenv("RECMESH_MAX_BATCH", "lots")
	if _, err := parse(); err == nil || !strings.Contains(err.Error(), "RECMESH_MAX_BATCH") {
		t.Fatalf("a malformed twin must fail naming it, got %v", err)
	}
	t.Setenv("RECMESH_MAX_BATCH", "")
	if _, err := parse("--max-batch=0"); err == nil || !strings.Contains(err.Error(), "--max-batch") {
		t.Fatalf("out-of-range --max-batch: %v", err)
	}
}
