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
	if len(lines) != 12 {
		t.Fatalf("stdout has %d lines, want 12:\n%s", len(lines), stdout.String())
	}
	i := 0
	for _, d := range []string{"fp32", "fp16", "int8", "int4"} {
		for _, dd := range []string{"fp32", "fp16", "bf16"} {
			if want := "accuracy: dtype=" + d + " dense_dtype=" + dd + " examples=3000 auc="; !strings.HasPrefix(lines[i], want) {
				t.Errorf("line %d is %q, want %s…", i, lines[i], want)
			}
			i++
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
		{"-dense-dtypes", "fp8"}, {"-dense-dtypes", "fp16,int8"}, {"-dense-dtypes", ""},
	} {
		var stdout, stderr bytes.Buffer
		if code := run(context.Background(), args, &stdout, &stderr); code != 2 {
			t.Errorf("%v: exit %d, want 2 (%s)", args, code, stderr.String())
		}
	}
}

// TestRunDenseDtypes: -dense-dtypes picks the dense precisions, fp32 first
// whether listed or not, each with every table precision listed.
func TestRunDenseDtypes(t *testing.T) {
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), []string{"-max-vocab", "1000", "-examples", "2000", "-dtypes", "int8", "-dense-dtypes", "bf16"}, &stdout, &stderr)
	if code != 0 {
		t.Fatalf("exit %d\n%s%s", code, stdout.String(), stderr.String())
	}
	var got []string
	for _, l := range strings.Split(strings.TrimSpace(stdout.String()), "\n") {
		f := strings.Fields(l)
		got = append(got, f[1]+" "+f[2])
	}
	want := []string{"dtype=fp32 dense_dtype=fp32", "dtype=fp32 dense_dtype=bf16", "dtype=int8 dense_dtype=fp32", "dtype=int8 dense_dtype=bf16"}
	if strings.Join(got, "; ") != strings.Join(want, "; ") {
		t.Errorf("lines for %v, want %v:\n%s", got, want, stdout.String())
	}
	if !strings.Contains(stderr.String(), "int8: 2000 examples scored at dense fp32, bf16 in ") {
		t.Errorf("stderr does not say which dense precisions were scored:\n%s", stderr.String())
	}
}
