package executor

import (
	"bytes"
	"context"
	"testing"

	"github.com/recmesh/recmesh/accelerator/dcn"
	"github.com/recmesh/recmesh/model"
)

// TestSwapGivesTheBundlesBytes: the weight arguments a swap makes from
// float32 values are, byte for byte, those New makes from a bundle
// exported with those values, at every dense precision, with and without
// packed twins and the split first product.
func TestSwapGivesTheBundlesBytes(t *testing.T) {
	cross := model.DLRMv2(model.DevVocabCap)
	cross.Name, cross.CrossLayers, cross.CrossRank = "small", 1, 3
	cross.BottomMLP, cross.TopMLP = []int{32, 128}, []int{64, 1}
	noCross := cross
	noCross.Name, noCross.CrossLayers, noCross.CrossRank = "small-nocross", 0, 0
	const seed = 9
	for _, base := range []model.Config{cross, noCross} {
		draw := map[string][]float32{}
		for _, s := range base.DenseParams() {
			v, err := model.GenerateTensor(base, seed, s.Name)
			if err != nil {
				t.Fatal(err)
			}
			draw[s.Name] = v
		}
		for _, dd := range model.DenseDtypes() {
			cfg := base
			cfg.DenseDtype = dd
			dir := t.TempDir()
			if err := model.Export(context.Background(), dir, cfg, seed, nil); err != nil {
				t.Fatal(err)
			}
			b, err := model.Open(dir)
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			src, err := swapSource(b.Config, draw)
			if err != nil {
				t.Fatal(err)
			}
			for _, packed := range []bool{false, true} {
				prog := dcn.DefaultOptions()
				prog.PackedWeights, prog.PackedElement = packed, dcn.ElementOf(dd)
				specs := dcn.Params(b.Config, prog)
				want, err := paramValues(b.Config, specs, bundleSource(b))
				if err != nil {
					t.Fatal(err)
				}
				got, err := paramValues(b.Config, specs, src)
				if err != nil {
					t.Fatal(err)
				}
				for i, p := range specs {
					if !bytes.Equal(got[i], want[i]) {
						t.Errorf("%s %s packed=%t: argument %s differs from the bundle's", cfg.Name, dd, packed, p.Name)
					}
				}
			}
		}
	}
}
