package embedder

import (
	"context"
	"math"
	"path/filepath"
	"testing"

	"github.com/recmesh/recmesh/model"
)

// TestStoreServesEveryPrecision exports a tiny bundle at each table
// precision, loads it as the embedder serves it and checks the pooled rows
// against the model's reference bit for bit: the lookup kernels and
// model.Reference.Pool share one definition (model.Dtype), so parity is
// exact at every precision. It also checks that the served tables take
// their row size's share of the fp32 ones.
func TestStoreServesEveryPrecision(t *testing.T) {
	var fp32Bytes int64
	for _, d := range model.Dtypes() {
		t.Run(string(d), func(t *testing.T) {
			cfg, err := model.Preset(model.PresetHostbound, 64)
			if err != nil {
				t.Fatal(err)
			}
			cfg.TableDtype = d
			dir := filepath.Join(t.TempDir(), "bundle")
			if err := model.Export(context.Background(), dir, cfg, 9, nil); err != nil {
				t.Fatal(err)
			}
			s, err := LoadStore(dir)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			if s.Tables.Dtype() != d || s.Config.TableDtype != d {
				t.Fatalf("store of a %s bundle serves %s (config %s)", d, s.Tables.Dtype(), s.Config.TableDtype)
			}
			if d == model.DtypeFP32 {
				fp32Bytes = s.Bytes()
			} else if want := fp32Bytes / 512 * int64(d.RowBytes(model.EmbeddingDim)); fp32Bytes > 0 && s.Bytes() != want {
				t.Errorf("%s tables take %d bytes, want %d (%d/512 of fp32's %d)", d, s.Bytes(), want, d.RowBytes(model.EmbeddingDim), fp32Bytes)
			}

			b, ref := openReference(t, dir)
			const n = 33
			_, ids := model.RandomInputs(b.Config, 2, n)
			got := make([]float32, s.Tables.OutLen(n))
			if err := s.Tables.Pool(got, ids, n); err != nil {
				t.Fatal(err)
			}
			want := make([]float32, len(got))
			if err := ref.Pool(ids, n, want); err != nil {
				t.Fatal(err)
			}
			for i := range want {
				if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
					t.Fatalf("%s (kernel %s): pooled[%d] = %v, reference %v", d, s.Tables.Kernel(), i, got[i], want[i])
				}
			}
		})
	}
}

// openReference opens the bundle at dir until the test ends and builds its
// reference forward pass.
func openReference(t *testing.T, dir string) (*model.Bundle, *model.Reference) {
	t.Helper()
	b, err := model.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	ref, err := model.NewReference(b)
	if err != nil {
		t.Fatal(err)
	}
	return b, ref
}
