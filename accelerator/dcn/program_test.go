package dcn

import (
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/recmesh/recmesh/accelerator/stripdot"
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

// TestStripDotProgram checks the packed twins and the custom calls: one
// twin per matrix whose width is a whole number of strips, placed after
// the plain weights (so every program keeps the same argument order), each
// packing its own rows, and one custom call per product that has a twin.
func TestStripDotProgram(t *testing.T) {
	for _, cfg := range configs(t) {
		opts := DefaultOptions()
		opts.PackedWeights = true
		plain := Params(cfg, DefaultOptions())
		withTwins := Params(cfg, opts)
		if !slices.EqualFunc(plain, withTwins[:len(plain)], func(a, b Param) bool { return a.Name == b.Name }) {
			t.Fatalf("%s: packed twins changed the plain weights' order", cfg.Name)
		}
		twins := 0
		for _, p := range plain {
			if len(p.Shape) == 2 && p.Shape[1]%stripdot.Width == 0 {
				twins++
			}
		}
		if got := len(withTwins) - len(plain); got != twins || twins == 0 {
			t.Fatalf("%s: %d packed twins, want %d (> 0)", cfg.Name, got, twins)
		}
		for _, p := range withTwins[len(plain):] {
			if !p.Packed || !strings.HasSuffix(p.Name, Strips) || len(p.Shape) != 3 || p.Shape[2] != stripdot.Width {
				t.Errorf("%s: twin %+v", cfg.Name, p)
			}
		}
		opts.StripDot = true
		text, err := Build(cfg, 4, opts)
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Count(string(text), `call_target_name = "`+stripdot.Target+`"`); got != twins {
			t.Errorf("%s: %d custom calls, want one per twin (%d)", cfg.Name, got, twins)
		}
		opts.PackedWeights = false
		if _, err := Build(cfg, 4, opts); err == nil || !strings.Contains(err.Error(), "PackedWeights") {
			t.Errorf("%s: StripDot without PackedWeights: %v, want an error naming PackedWeights", cfg.Name, err)
		}
	}
}

// TestPackedValues checks that a packed parameter holds its rows of the
// tensor in strip order.
func TestPackedValues(t *testing.T) {
	const rows, cols = 5, 64
	w := make([]float32, rows*cols)
	for i := range w {
		w[i] = float32(i)
	}
	p := Param{Name: "w.pooled" + Strips, Tensor: "w", RowFrom: 2, RowTo: 5, Shape: stripdot.PackedShape(3, cols), Packed: true}
	got, err := p.Values(w)
	if err != nil {
		t.Fatal(err)
	}
	for s := 0; s < cols/stripdot.Width; s++ {
		for i := 0; i < 3; i++ {
			for j := 0; j < stripdot.Width; j++ {
				if v, want := got[(s*3+i)*stripdot.Width+j], w[(2+i)*cols+s*stripdot.Width+j]; v != want {
					t.Fatalf("strip %d row %d col %d = %v, want %v", s, i, j, v, want)
				}
			}
		}
	}
}

// TestHalfStrips checks a program over half strips: its twins are
// arguments of the half type, each custom call reads one directly (the
// convert that stands in for it during shape inference is gone), and its
// values are the stored halves packed as the float32 ones are.
func TestHalfStrips(t *testing.T) {
	for _, elem := range []stripdot.Element{stripdot.Float16, stripdot.BFloat16} {
		for _, cfg := range configs(t) {
			opts := DefaultOptions()
			opts.PackedWeights, opts.StripDot, opts.PackedElement = true, true, elem
			text, err := Build(cfg, 2, opts)
			if err != nil {
				t.Fatal(err)
			}
			prog := string(text)
			if strings.Contains(prog, "stablehlo.convert") {
				t.Errorf("%s %s: the stand-in convert is still in the program", cfg.Name, elem)
			}
			calls := strings.Count(prog, `call_target_name = "`+stripdot.Target+`"`)
			reads := regexp.MustCompile(`\} : \(tensor<[0-9x]+xf32>, tensor<[0-9]+x[0-9]+x32x`+elem.String()+`>\) -> `).FindAllString(prog, -1)
			if calls == 0 || len(reads) != calls {
				t.Errorf("%s %s: %d custom calls, %d of them reading half strips", cfg.Name, elem, calls, len(reads))
			}
			all := Params(cfg, opts)
			var f32Bytes, halfBytes int64
			for _, p := range all {
				if p.Packed != (p.Element == elem) {
					t.Errorf("%s %s: %s is packed %t with element %s", cfg.Name, elem, p.Name, p.Packed, p.Element)
				}
				if p.Packed {
					halfBytes += int64(p.Bytes())
					if p.Bytes() != 2*p.Elements() {
						t.Errorf("%s %s: %s has %d bytes for %d halves", cfg.Name, elem, p.Name, p.Bytes(), p.Elements())
					}
				}
			}
			plain := opts
			plain.StripDot = false
			for _, p := range Params(cfg, plain) {
				if !p.Packed {
					f32Bytes += int64(p.Bytes())
				}
			}
			if got := WeightBytes(cfg, plain); got != f32Bytes {
				t.Errorf("%s %s: plain program reads %d bytes, want %d", cfg.Name, elem, got, f32Bytes)
			}
			if got := WeightBytes(cfg, opts); got >= f32Bytes || got < halfBytes {
				t.Errorf("%s %s: strip program reads %d bytes, want the %d of the half strips and less than float32's %d", cfg.Name, elem, got, halfBytes, f32Bytes)
			}
		}
	}
	const rows, cols = 3, 64
	bits := make([]uint16, 5*cols)
	for i := range bits {
		bits[i] = uint16(i)
	}
	p := Param{Name: "w.strips", Tensor: "w", RowFrom: 2, RowTo: 5, Shape: stripdot.PackedShape(rows, cols), Packed: true, Element: stripdot.Float16}
	got, err := p.HalfValues(bits)
	if err != nil {
		t.Fatal(err)
	}
	for s := 0; s < cols/stripdot.Width; s++ {
		for i := 0; i < rows; i++ {
			for j := 0; j < stripdot.Width; j++ {
				if v, want := got[(s*rows+i)*stripdot.Width+j], bits[(2+i)*cols+s*stripdot.Width+j]; v != want {
					t.Fatalf("strip %d row %d col %d = %v, want %v", s, i, j, v, want)
				}
			}
		}
	}
	if _, err := p.Values(make([]float32, 5*cols)); err == nil {
		t.Error("Values of a half twin: no error")
	}
}
