package dcn

import (
	"strings"
	"testing"

	"github.com/recmesh/recmesh/model"
)

func configs(t *testing.T) []model.Config {
	t.Helper()
	hostbound, err := model.Preset(model.PresetHostbound, model.DevVocabCap)
	if err != nil {
		t.Fatal(err)
	}
	small := model.DLRMv2(model.DevVocabCap)
	small.Name, small.CrossLayers, small.CrossRank = "small", 2, 3
	small.BottomMLP, small.TopMLP = []int{32, 64, 128}, []int{16, 1}
	return []model.Config{model.DLRMv2(model.DevVocabCap), hostbound, small}
}

// TestParamsCoverTheBundle checks that the program's weight arguments are
// the bundle's dense tensors, the split one as two row blocks that tile it.
func TestParamsCoverTheBundle(t *testing.T) {
	for _, cfg := range configs(t) {
		specs := cfg.DenseParams()
		plain := Params(cfg, PlainOptions())
		if len(plain) != len(specs) {
			t.Fatalf("%s: plain program has %d weights, bundle %d", cfg.Name, len(plain), len(specs))
		}
		for i, p := range plain {
			if p.Name != specs[i].Name || p.Tensor != specs[i].Name || int64(p.Elements()) != specs[i].Elements() {
				t.Errorf("%s: plain weight %d = %+v, want all of %+v", cfg.Name, i, p, specs[i])
			}
		}
		split := Params(cfg, DefaultOptions())
		want := len(specs) + 1
		if cfg.CrossLayers > 0 {
			want = len(specs) // cross layers keep the plain formulation
		}
		if len(split) != want {
			t.Fatalf("%s: split program has %d weights, want %d", cfg.Name, len(split), want)
		}
		first := firstProduct(cfg)
		covered := map[string]int64{}
		for _, p := range split {
			covered[p.Tensor] += int64(p.Elements())
			if strings.HasSuffix(p.Name, SplitBottom) || strings.HasSuffix(p.Name, SplitPooled) {
				if p.Tensor != first {
					t.Errorf("%s: split %s, want only %s split", cfg.Name, p.Tensor, first)
				}
			}
		}
		for _, s := range specs {
			if covered[s.Name] != s.Elements() {
				t.Errorf("%s: %s covered by %d values, has %d", cfg.Name, s.Name, covered[s.Name], s.Elements())
			}
		}
	}
}

func TestParamSlice(t *testing.T) {
	w := make([]float32, 5*3) // 5 rows, 3 columns
	for i := range w {
		w[i] = float32(i)
	}
	top := Param{Name: "w.bottom", Tensor: "w", RowFrom: 0, RowTo: 2, Shape: []int{2, 3}}
	rest := Param{Name: "w.pooled", Tensor: "w", RowFrom: 2, RowTo: 5, Shape: []int{3, 3}}
	a, err := top.Slice(w)
	if err != nil || len(a) != 6 || a[0] != 0 || a[5] != 5 {
		t.Fatalf("rows 0..2 = %v, %v", a, err)
	}
	b, err := rest.Slice(w)
	if err != nil || len(b) != 9 || b[0] != 6 || b[8] != 14 {
		t.Fatalf("rows 2..5 = %v, %v", b, err)
	}
	if _, err := rest.Slice(w[:10]); err == nil {
		t.Fatal("rows past the tensor: no error")
	}
	if _, err := (Param{Name: "x", RowFrom: 2, RowTo: 2, Shape: []int{0, 3}}).Slice(w); err == nil {
		t.Fatal("empty row range: no error")
	}
}

// TestBuild builds every formulation for a few buckets and checks what it
// must and must not contain: the split one never concatenates x0 when
// nothing but the first product needs it (no cross layer), and with cross
// layers it is the plain one, weights and all.
func TestBuild(t *testing.T) {
	for _, cfg := range configs(t) {
		for _, opts := range []Options{PlainOptions(), DefaultOptions()} {
			for _, bucket := range []int{1, 16, 128} {
				text, err := Build(cfg, bucket, opts)
				if err != nil {
					t.Fatalf("%s split=%v bucket %d: %v", cfg.Name, opts.SplitFirstProduct, bucket, err)
				}
				s := string(text)
				concat := strings.Contains(s, "stablehlo.concatenate")
				wantConcat := cfg.CrossLayers > 0 || !opts.SplitFirstProduct
				if concat != wantConcat {
					t.Errorf("%s split=%v: concatenate in program = %v, want %v", cfg.Name, opts.SplitFirstProduct, concat, wantConcat)
				}
				if cfg.CrossLayers > 0 && opts.SplitFirstProduct {
					if plain, _ := Build(cfg, bucket, PlainOptions()); string(plain) != s {
						t.Errorf("%s bucket %d: the split program differs from the plain one despite cross layers", cfg.Name, bucket)
					}
				}
				for _, p := range Params(cfg, opts) {
					if !strings.Contains(s, "%"+strings.ReplaceAll(p.Name, ".", "_")+":") {
						t.Errorf("%s split=%v: no argument for %s", cfg.Name, opts.SplitFirstProduct, p.Name)
					}
				}
			}
		}
	}
	if _, err := Build(model.DLRMv2(model.DevVocabCap), 0, DefaultOptions()); err == nil {
		t.Fatal("bucket 0 built")
	}
}
