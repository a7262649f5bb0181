package main

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gomlx/gopjrt/dtypes"

	"github.com/recmesh/recmesh/accelerator/dcn"
	"github.com/recmesh/recmesh/accelerator/device"
	"github.com/recmesh/recmesh/model"
)

func TestMainArgShapes(t *testing.T) {
	f32 := func(dims ...int) argType { return argType{dims, dtypes.Float32} }
	for _, tc := range []struct {
		name, text string
		want       []argType
		err        string
	}{
		{"jax", `module @jit_forward attributes {mhlo.num_partitions = 1 : i32} {
  func.func public @main(%arg0: tensor<13x512xf32> {sdy.sharding = #sdy.sharding<@empty_mesh, [{}, {}]>}, %arg1: tensor<512xf32> {sdy.sharding = #sdy.sharding<@empty_mesh, [{}]>}) -> (tensor<16xf32> {jax.result_info = "result"}) {`,
			[]argType{f32(13, 512), f32(512)}, ""},
		{"dcn", `module @dcnv2_b2 {
  func.func @main(%dense: tensor<2x13xf32>, %pooled: tensor<2x26x128xf32>, %cross_0_bias: tensor<3456xf32>) -> tensor<2xf32> {`,
			[]argType{f32(2, 13), f32(2, 26, 128), f32(3456)}, ""},
		{"half", `func.func @main(%x: tensor<2x13xf32>, %w: tensor<13x512xf16>, %v: tensor<512xbf16>, %bits: tensor<512x256xui16>) -> tensor<2xf32> {`,
			[]argType{f32(2, 13), {[]int{13, 512}, dtypes.Float16}, {[]int{512}, dtypes.BFloat16}, {[]int{512, 256}, dtypes.Uint16}}, ""},
		{"scalar", `func.func @main(%x: tensor<f32>) -> tensor<f32> {`, []argType{f32()}, ""},
		{"int argument", `func.func @main(%ids: tensor<2x26xi32>) -> tensor<2xf32> {`, nil, "argument 0 is tensor<2x26xi32>: only f32, f16, bf16 and ui16"},
		{"dynamic", `func.func @main(%x: tensor<?x13xf32>) -> tensor<f32> {`, nil, "only static shapes"},
		{"no main", `func.func @forward(%x: tensor<2xf32>) -> tensor<2xf32> {`, nil, "no main function"},
		{"unterminated", `func.func @main(%x: tensor<2xf32>`, nil, "does not end"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := mainArgShapes(tc.text)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("got %v, %v; want an error containing %q", got, err, tc.err)
				}
				return
			}
			same := func(a, b argType) bool { return a.dtype == b.dtype && slices.Equal(a.dims, b.dims) }
			if err != nil || !slices.EqualFunc(got, tc.want, same) {
				t.Fatalf("got %v, %v; want %v", got, err, tc.want)
			}
		})
	}
}

// TestHLOBench times two programs (the model's at buckets 1 and 2) for two
// rounds: one line per program per round, the second round in reverse
// order, then one median line per program.
func TestHLOBench(t *testing.T) {
	if _, err := device.FindPlugin(""); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI needs the PJRT plugin: %v", err)
		}
		t.Skipf("no PJRT plugin (run make deps): %v", err)
	}
	dir := t.TempDir()
	cfg := model.DLRMv2(model.DevVocabCap)
	var files []string
	for _, b := range []int{1, 2} {
		text, err := dcn.Build(cfg, b, dcn.DefaultOptions())
		if err != nil {
			t.Fatal(err)
		}
		f := filepath.Join(dir, "b"+string(rune('0'+b))+".mlir")
		if err := os.WriteFile(f, text, 0o644); err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	var out strings.Builder
	err := hloBench(context.Background(), []string{"--program", files[0], "--program", files[1],
		"--rounds", "2", "--duration", "1ms", "--xla-threads", "1"}, &out)
	if err != nil {
		t.Fatal(err)
	}
	var order []string
	medians := 0
	for _, line := range strings.Split(out.String(), "\n") {
		f := fields(line)
		switch {
		case f["round"] != "":
			order = append(order, f["round"]+":"+f["program"])
		case f["program"] != "" && f["calls_per_s"] != "":
			medians++
		}
	}
	if want := []string{"1:b1.mlir", "1:b2.mlir", "2:b2.mlir", "2:b1.mlir"}; !slices.Equal(order, want) {
		t.Errorf("rounds ran %v, want %v\n%s", order, want, out.String())
	}
	if medians != 2 {
		t.Errorf("%d median lines, want 2\n%s", medians, out.String())
	}

	// Half arguments, as recmesh's and JAX's programs at a half dense
	// precision take their weights: each gets buffers of its own type.
	half := filepath.Join(dir, "half.mlir")
	if err := os.WriteFile(half, []byte(`module @half {
  func.func @main(%a: tensor<4xf16>, %b: tensor<4xbf16>, %c: tensor<2x4xui16>) -> tensor<4xf32> {
    %0 = stablehlo.convert %a : (tensor<4xf16>) -> tensor<4xf32>
    %1 = stablehlo.convert %b : (tensor<4xbf16>) -> tensor<4xf32>
    %2 = stablehlo.slice %c [0:1, 0:4] : (tensor<2x4xui16>) -> tensor<1x4xui16>
    %3 = stablehlo.reshape %2 : (tensor<1x4xui16>) -> tensor<4xui16>
    %4 = stablehlo.convert %3 : (tensor<4xui16>) -> tensor<4xf32>
    %5 = stablehlo.add %0, %1 : tensor<4xf32>
    %6 = stablehlo.add %5, %4 : tensor<4xf32>
    return %6 : tensor<4xf32>
  }
}`), 0o644); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if err := hloBench(context.Background(), []string{"--program", half, "--rounds", "1", "--duration", "1ms", "--xla-threads", "1"}, &out); err != nil {
		t.Fatalf("a program with half arguments: %v", err)
	}
	if !strings.Contains(out.String(), "hlo: program=half.mlir calls_per_s=") {
		t.Errorf("a program with half arguments was not timed:\n%s", out.String())
	}

	bad := filepath.Join(dir, "ids.mlir")
	if err := os.WriteFile(bad, []byte(`func.func @main(%ids: tensor<2xi32>) -> tensor<2xi32> {`), 0o644); err != nil {
		t.Fatal(err)
	}
	err = hloBench(context.Background(), []string{"--program", bad}, &out)
	if err == nil || !strings.Contains(err.Error(), "ids.mlir") || !strings.Contains(err.Error(), "only f32") {
		t.Errorf("a program with an integer argument: %v", err)
	}
	if err := hloBench(context.Background(), nil, &out); err == nil || !strings.Contains(err.Error(), "--program") {
		t.Errorf("no program: %v", err)
	}
	err = hloBench(context.Background(), []string{"--program", files[0], "--xla-threads", "-1"}, &out)
	if err == nil || !strings.Contains(err.Error(), "--xla-threads -1") {
		t.Errorf("--xla-threads -1: %v", err)
	}
}

// fields splits "hlo: k=v k=v" into its key=value pairs.
func fields(line string) map[string]string {
	m := map[string]string{}
	for _, w := range strings.Fields(line) {
		if k, v, ok := strings.Cut(w, "="); ok {
			m[k] = v
		}
	}
	return m
}
