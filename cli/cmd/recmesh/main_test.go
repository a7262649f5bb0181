package main

import (
	"bytes"
	"context"
	"io"
	"path/filepath"
	"regexp"
	"slices"
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
		{[]string{"version"}, exitOK, "recmesh devel"},
		{[]string{"version", "extra"}, exitUsage, "extra"},
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
		{nil, []string{"--preset", "huge"}, `-preset "huge": want mlperf or hostbound`},
		{map[string]string{"RECMESH_PRESET": "tiny"}, nil, `-preset "tiny"`},
		{nil, []string{"--table-dtype", "int2"}, `-table-dtype: table dtype "int2" is not one of fp32, fp16, int8, int4`},
		{nil, []string{"--table-dtype", ""}, `-table-dtype: table dtype ""`},
		{map[string]string{"RECMESH_TABLE_DTYPE": "bf16"}, nil, `table dtype "bf16"`},
		{nil, []string{"--dense-dtype", "x"}, `-dense-dtype: dense dtype "x" is not one of fp32, fp16, bf16`},
		{nil, []string{"--dense-dtype", ""}, `-dense-dtype: dense dtype ""`},
		{nil, []string{"--dense-dtype", "int8"}, `-dense-dtype: dense dtype "int8" is not one of fp32, fp16, bf16`},
		{map[string]string{"RECMESH_DENSE_DTYPE": "fp8"}, nil, `dense dtype "fp8"`},
		{nil, []string{"--bottom-mlp", "512,x,128"}, `invalid value "512,x,128" for flag -bottom-mlp: width 1 is "x"`},
		{nil, []string{"--bottom-mlp", ""}, `flag -bottom-mlp: width 0 is ""`},
		{nil, []string{"--bottom-mlp", "512,0,128"}, `flag -bottom-mlp: width 1 is "0"`},
		{nil, []string{"--bottom-mlp", "512,256"}, "-bottom-mlp 512,256: invalid model config: bottom_mlp ends at width 256"},
		{nil, []string{"--bottom-mlp", "70000,128"}, "-bottom-mlp 70000,128: invalid model config: bottom_mlp[0] is 70000"},
		{map[string]string{"RECMESH_BOTTOM_MLP": "64,-1"}, nil, "RECMESH_BOTTOM_MLP (flag -bottom-mlp)"},
		{nil, []string{"--top-mlp", "1024,1,"}, `flag -top-mlp: width 2 is ""`},
		{nil, []string{"--top-mlp", "8,2"}, "-top-mlp 8,2: invalid model config: top_mlp ends at width 2 (top_mlp[1]), want 1"},
		{map[string]string{"RECMESH_TOP_MLP": "8"}, nil, "-top-mlp 8: invalid model config: top_mlp ends at width 8"},
		{nil, []string{"--cross-layers", "two"}, `invalid value "two" for flag -cross-layers`},
		{nil, []string{"--cross-layers", "-1"}, "flag -cross-layers: -1 is negative"},
		{nil, []string{"--cross-layers", "65"}, "-cross-layers 65: invalid model config: cross_layers is 65, want 0..64"},
		{map[string]string{"RECMESH_CROSS_LAYERS": "x"}, nil, "RECMESH_CROSS_LAYERS (flag -cross-layers)"},
		{nil, []string{"--cross-rank", "1.5"}, `invalid value "1.5" for flag -cross-rank`},
		{nil, []string{"--cross-rank", "0"}, "-cross-rank 0: invalid model config: cross_rank is 0, want 1..65536 with 3 cross layers"},
		{nil, []string{"--cross-rank", "65537"}, "-cross-rank 65537: invalid model config: cross_rank is 65537"},
		{nil, []string{"--preset", "hostbound", "--cross-layers", "1"}, "-cross-rank (the -preset hostbound default): invalid model config: cross_rank is 0, want 1..65536 with 1 cross layers"},
		{map[string]string{"RECMESH_CROSS_RANK": "-2"}, nil, "RECMESH_CROSS_RANK (flag -cross-rank): -2 is negative"},
		{nil, []string{"--cross-layers", "64", "--cross-rank", "65536"}, "-bottom-mlp, -top-mlp, -cross-layers, -cross-rank: invalid model config: bottom_mlp, cross_layers, cross_rank and top_mlp give"},
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
	summary := regexp.MustCompile(`^export: wrote \S+/bundle \(model=dlrm-dcnv2, table_dtype=fp32, dense_dtype=fp32, rows=\d+, bytes=\d+, \d+\.\ds\)\n$`)
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
	if want := model.DLRMv2(1000); !sameShape(b.Config, want) || b.Config.Name != want.Name {
		t.Errorf("default export is %+v, want the mlperf preset %+v", b.Config, want)
	}
}

func sameShape(a, b model.Config) bool {
	return slices.Equal(a.BottomMLP, b.BottomMLP) && slices.Equal(a.TopMLP, b.TopMLP) &&
		a.CrossLayers == b.CrossLayers && a.CrossRank == b.CrossRank &&
		slices.Equal(a.VocabSizes, b.VocabSizes) && slices.Equal(a.Hotness, b.Hotness)
}

// TestExportShapes exports presets and explicit widths and reads back the
// shape and the name each bundle records.
func TestExportShapes(t *testing.T) {
	hostbound, err := model.Preset(model.PresetHostbound, 1000)
	if err != nil {
		t.Fatal(err)
	}
	custom := func(c model.Config, bottom, top []int, layers, rank int) model.Config {
		c.Name += "-custom"
		if bottom != nil {
			c.BottomMLP = bottom
		}
		if top != nil {
			c.TopMLP = top
		}
		c.CrossLayers, c.CrossRank = layers, rank
		return c
	}
	mlperf := model.DLRMv2(1000)
	for _, tc := range []struct {
		vars map[string]string
		args []string
		want model.Config
	}{
		{nil, []string{"--preset", "mlperf"}, mlperf},
		{nil, []string{"--preset", "hostbound"}, hostbound},
		{map[string]string{"RECMESH_PRESET": "hostbound"}, nil, hostbound},
		// Overrides equal to the preset's leave the name alone.
		{nil, []string{"--cross-layers", "3", "--top-mlp", "1024,1024,512,256,1"}, mlperf},
		{nil, []string{"--bottom-mlp", "64,128", "--top-mlp", "16, 1", "--cross-layers", "2", "--cross-rank", "8"},
			custom(mlperf, []int{64, 128}, []int{16, 1}, 2, 8)},
		{map[string]string{"RECMESH_CROSS_LAYERS": "1", "RECMESH_CROSS_RANK": "4", "RECMESH_TOP_MLP": "8,1"}, []string{"--preset", "hostbound"},
			custom(hostbound, nil, []int{8, 1}, 1, 4)},
		// No cross layers: the unused rank is written as 0 unless given.
		{nil, []string{"--cross-layers", "0"}, custom(mlperf, nil, nil, 0, 0)},
		{nil, []string{"--cross-layers", "0", "--cross-rank", "7"}, custom(mlperf, nil, nil, 0, 7)},
		// Cross layers on hostbound need a rank: its own is 0.
		{nil, []string{"--preset", "hostbound", "--cross-layers", "2", "--cross-rank", "3"}, custom(hostbound, nil, nil, 2, 3)},
	} {
		out := filepath.Join(t.TempDir(), "bundle")
		code, _, stderr := runT(t, tc.vars, append([]string{"export", "--out", out}, tc.args...)...)
		if code != exitOK {
			t.Errorf("export %v env %v: exit %d: %s", tc.args, tc.vars, code, stderr)
			continue
		}
		if want := "(model=" + tc.want.Name + ","; !strings.Contains(stderr, want) {
			t.Errorf("export %v env %v: summary %q lacks %s", tc.args, tc.vars, stderr, want)
		}
		b, err := model.Open(out)
		if err != nil {
			t.Fatal(err)
		}
		if got := b.Config; got.Name != tc.want.Name || !sameShape(got, tc.want) {
			t.Errorf("export %v env %v: bundle config %+v, want %+v", tc.args, tc.vars, got, tc.want)
		}
		b.Close()
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
