package e2e

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/recmesh/recmesh/model"
)

// TestE2EQuantized serves the small model with its tables stored at fp16,
// int8 and int4 (the same seed as every other suite, so the same model)
// through the real mesh, two frontends in slo mode, and checks every score
// against the reference of the bundle at that precision. Each precision's
// scores are first checked to differ from float32's where the tolerance
// can see it, so a mesh that served float32 rows, or dequantized with
// another layout, fails here. The tolerance is ten times tighter than the
// other suites' (the mesh's scores are within 1e-6 of the reference's at
// every precision) so that it can tell fp16 from float32.
const quantizedTolerance = 1e-5

func TestE2EQuantized(t *testing.T) {
	fp32 := loadWorkload(t)
	for _, d := range []model.Dtype{model.DtypeFP16, model.DtypeInt8, model.DtypeInt4} {
		t.Run(string(d), func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "bundle-"+string(d))
			cfg := model.DLRMv2(model.DevVocabCap)
			cfg.TableDtype = d
			if err := model.Export(context.Background(), dir, cfg, 11, nil); err != nil {
				t.Fatal(err)
			}
			w, err := buildWorkload(dir)
			if err != nil {
				t.Fatal(err)
			}
			fromFP32 := 0.0
			for i := range w.want {
				fromFP32 = math.Max(fromFP32, maxAbsDiff(w.want[i], fp32.want[i]))
			}
			t.Logf("dtype %s: reference scores differ from float32's by up to %.3g", d, fromFP32)
			if fromFP32 <= quantizedTolerance {
				t.Fatalf("dtype %s: the reference scores are within %g of float32's, so this check could not tell them apart", d, quantizedTolerance)
			}

			c := newCluster(t, "slo")
			c.bundle = dir
			c.segment = fmt.Sprintf("recmesh-e2e-%d-quant-%s", os.Getpid(), d)
			c.latencyTarget = "1m" // every score is checked: nothing may be shed
			c.startMesh(2)
			n, diff := drive(t, c.addr(), w, 4)
			t.Logf("dtype %s: %d requests, max|Δ| %.3g", d, n, diff)
			if diff > quantizedTolerance {
				t.Fatalf("dtype %s: max|Δ| %g > %g against the reference at this precision", d, diff, quantizedTolerance)
			}
		})
	}
}
