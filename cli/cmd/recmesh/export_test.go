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
