package main

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/recmesh/recmesh/model"
)

// TestExportTableDtype exports a tiny bundle at every precision, by flag
// and by the environment twin, and reads the precision back.
func TestExportTableDtype(t *testing.T) {
	for _, tc := range []struct {
		vars map[string]string
		args []string
		want model.Dtype
	}{
		{nil, nil, model.DtypeFP32},
		{nil, []string{"--table-dtype", "fp16"}, model.DtypeFP16},
		{nil, []string{"--table-dtype", "int8"}, model.DtypeInt8},
		{map[string]string{"RECMESH_TABLE_DTYPE": "int4"}, nil, model.DtypeInt4},
		// The command line wins over the environment.
		{map[string]string{"RECMESH_TABLE_DTYPE": "int4"}, []string{"--table-dtype", "int8"}, model.DtypeInt8},
	} {
		out := filepath.Join(t.TempDir(), "bundle")
		args := append([]string{"export", "--preset", "hostbound", "--max-vocab", "50", "--out", out}, tc.args...)
		code, _, stderr := runT(t, tc.vars, args...)
		if code != exitOK {
			t.Errorf("export %v env %v: exit %d: %s", tc.args, tc.vars, code, stderr)
			continue
		}
		if want := "table_dtype=" + string(tc.want) + ","; !strings.Contains(stderr, want) {
			t.Errorf("export %v env %v: summary %q lacks %s", tc.args, tc.vars, stderr, want)
		}
		b, err := model.Open(out)
		if err != nil {
			t.Fatal(err)
		}
		if got := b.Config.TableDtype; got != tc.want {
			t.Errorf("export %v env %v: bundle table_dtype %s, want %s", tc.args, tc.vars, got, tc.want)
		}
		if got, want := len(b.TableData(0)), 50*tc.want.RowBytes(model.EmbeddingDim); got != want {
			t.Errorf("export %v env %v: table 0 holds %d bytes, want %d", tc.args, tc.vars, got, want)
		}
		b.Close()
	}
}

// TestExportDenseDtype exports a tiny bundle at every dense precision, by
// flag and by the environment twin, alone and beside a table precision,
// and reads the precisions back.
func TestExportDenseDtype(t *testing.T) {
	for _, tc := range []struct {
		vars  map[string]string
		args  []string
		want  model.DenseDtype
		table model.Dtype
	}{
		{nil, nil, model.DenseFP32, model.DtypeFP32},
		{nil, []string{"--dense-dtype", "fp16"}, model.DenseFP16, model.DtypeFP32},
		{nil, []string{"--dense-dtype", "bf16", "--table-dtype", "int4"}, model.DenseBF16, model.DtypeInt4},
		{map[string]string{"RECMESH_DENSE_DTYPE": "bf16"}, nil, model.DenseBF16, model.DtypeFP32},
		// The command line wins over the environment.
		{map[string]string{"RECMESH_DENSE_DTYPE": "bf16", "RECMESH_TABLE_DTYPE": "int8"}, []string{"--dense-dtype", "fp16"}, model.DenseFP16, model.DtypeInt8},
	} {
		out := filepath.Join(t.TempDir(), "bundle")
		args := append([]string{"export", "--preset", "hostbound", "--max-vocab", "50", "--out", out}, tc.args...)
		code, _, stderr := runT(t, tc.vars, args...)
		if code != exitOK {
			t.Errorf("export %v env %v: exit %d: %s", tc.args, tc.vars, code, stderr)
			continue
		}
		if want := "table_dtype=" + string(tc.table) + ", dense_dtype=" + string(tc.want) + ","; !strings.Contains(stderr, want) {
			t.Errorf("export %v env %v: summary %q lacks %s", tc.args, tc.vars, stderr, want)
		}
		b, err := model.Open(out)
		if err != nil {
			t.Fatal(err)
		}
		if got := b.Config.DenseDtype; got != tc.want || b.Config.TableDtype != tc.table {
			t.Errorf("export %v env %v: bundle dense_dtype %s table_dtype %s, want %s and %s",
				tc.args, tc.vars, got, b.Config.TableDtype, tc.want, tc.table)
		}
		bits := b.ParamBits("bottom_mlp.0.kernel")
		if half := tc.want != model.DenseFP32; (bits != nil) != half || half && len(bits) != len(b.Param("bottom_mlp.0.kernel")) {
			t.Errorf("export %v env %v: %d stored halves of bottom_mlp.0.kernel at %s", tc.args, tc.vars, len(bits), tc.want)
		}
		b.Close()
	}
}
