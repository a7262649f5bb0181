package main

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/recmesh/recmesh/accelerator/dcn"
	"github.com/recmesh/recmesh/accelerator/device"
	"github.com/recmesh/recmesh/model"
)

func TestMainArgShapes(t *testing.T) {
	for _, tc := range []struct {
		name, text string
		want       [][]int
		err        string
	}{
		{"jax", `module @jit_forward attributes {mhlo.num_partitions = 1 : i32} {
  func.func public @main(%arg0: tensor<13x512xf32> {sdy.sharding = #sdy.sharding<@empty_mesh, [{}, {}]>}, %arg1: tensor<512xf32> {sdy.sharding = #sdy.sharding<@empty_mesh, [{}]>}) -> (tensor<16xf32> {jax.result_info = "result"}) {`,
			[][]int{{13, 512}, {512}}, ""},
		{"dcn", `module @dcnv2_b2 {
  func.func @main(%dense: tensor<2x13xf32>, %pooled: tensor<2x26x128xf32>, %cross_0_bias: tensor<3456xf32>) -> tensor<2xf32> {`,
			[][]int{{2, 13}, {2, 26, 128}, {3456}}, ""},
		{"scalar", `func.func @main(%x: tensor<f32>) -> tensor<f32> {`, [][]int{{}}, ""},
		{"int argument", `func.func @main(%ids: tensor<2x26xi32>) -> tensor<2xf32> {`, nil, "argument 0 is tensor<2x26xi32>: only f32"},
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
			if err != nil || !slices.EqualFunc(got, tc.want, slices.Equal[[]int]) {
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
