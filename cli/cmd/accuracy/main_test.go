package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

func TestRunPrintsALinePerPrecision(t *testing.T) {
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), []string{"-max-vocab", "1000", "-examples", "3000"}, &stdout, &stderr)
	if code != 0 {
		t.Fatalf("exit %d\n%s%s", code, stdout.String(), stderr.String())
	}
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	if len(lines) != 4 {
		t.Fatalf("stdout has %d lines, want 4:\n%s", len(lines), stdout.String())
	}
	for i, d := range []string{"fp32", "fp16", "int8", "int4"} {
		if !strings.HasPrefix(lines[i], "accuracy: dtype="+d+" examples=3000 auc=") {
			t.Errorf("line %d is %q, want dtype=%s's", i, lines[i], d)
		}
	}
	if !strings.Contains(lines[0], "auc_ratio=1.000000 max_abs_diff=0.000e+00 mean_abs_diff=0.000e+00") {
		t.Errorf("fp32's line %q is not its own baseline", lines[0])
	}
}

func TestBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"-examples", "1"}, {"-max-vocab", "-1"}, {"-dtypes", "fp8"}, {"-preset", "huge"},
		{"-table-memory-mib", "-3"}, {"extra"}, {"-no-such-flag"},
	} {
		var stdout, stderr bytes.Buffer
		if code := run(context.Background(), args, &stdout, &stderr); code != 2 {
			t.Errorf("%v: exit %d, want 2 (%s)", args, code, stderr.String())
		}
	}
}
