// Package gpu holds the GPU pack's scripts (pack.sh, run.sh,
// portable_stubs.py) and the rehearsal that keeps them working where no GPU
// is: make gpu-rehearsal.
package gpu

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// TestGPURehearsal builds the pack as make gpu-pack does and runs its
// run.sh --cpu, the GPU run's script with the CPU plugin and short
// windows, then checks every standard line and the results folder.
func TestGPURehearsal(t *testing.T) {
	if os.Getenv("RECMESH_GPU_REHEARSAL") == "" {
		t.Skip("make gpu-rehearsal runs this (RECMESH_GPU_REHEARSAL=1)")
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	py := filepath.Join(root, ".deps", "bench-venv", "bin", "python")
	plugin := filepath.Join(root, ".deps", "pjrt", "xla_plugins", "xla_cpu_pjrt", "xla_cpu_pjrt.so")
	for _, p := range []string{py, plugin} {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("%v (make bench-py-deps and make deps install it)", err)
		}
	}
	tmp := t.TempDir()
	pack := filepath.Join(tmp, "gpu-pack")
	out := run(t, root, nil, "bash", filepath.Join(root, "bench", "gpu", "pack.sh"), pack, py)
	m := regexp.MustCompile(`(?m)^gpu-pack ok: bytes=(\d+) files=(\d+)$`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("pack.sh printed no gpu-pack ok line:\n%s", out)
	}
	if n, _ := strconv.Atoi(m[1]); n > 40<<20 {
		t.Errorf("the pack is %d bytes, over 40 MiB", n)
	}

	results := filepath.Join(tmp, "results")
	// Nothing of the checkout may be needed: run from elsewhere, with the
	// pack, the plugin and the Python given explicitly.
	env := []string{"RECMESH_GPU_WORK=" + filepath.Join(tmp, "work")}
	out = run(t, tmp, env, filepath.Join(pack, "run.sh"), "--cpu", "--plugin", plugin, "--python", py, results)
	fmt.Print(out)

	last := regexp.MustCompile(`(?m)^gpu-run ok: backend=cpu plugin=xla_cpu_pjrt\.so parity_max_abs_diff=(\S+) model=(\S+) bench_ratio=(\S+) wall_s=\d+$`).FindStringSubmatch(out)
	if last == nil {
		t.Fatalf("no gpu-run ok line for backend=cpu")
	}
	if d, err := strconv.ParseFloat(last[1], 64); err != nil || d > 1e-4 {
		t.Errorf("parity_max_abs_diff=%s", last[1])
	}
	for _, b := range []string{"b1=", "b16=", "b128="} {
		if !strings.Contains(last[2], b) {
			t.Errorf("model=%s lacks %s", last[2], b)
		}
	}
	for _, w := range []string{"mlperf_b1=", "mlperf_b16=", "mlperf_b128=", "hostbound_b1=", "hostbound_b128="} {
		if !strings.Contains(last[3], w) {
			t.Errorf("bench_ratio=%s lacks %s", last[3], w)
		}
	}
	for _, want := range []string{`(?m)^parity ok: `, `(?m)^model: bucket=128 (dense_dtype=\w+ )?examples_per_s=\d+ jax_examples_per_s=\d+ .* ratio=`,
		`(?m)^bench: workload=hostbound arm=py-mp-batch b_req=128 `, `(?m)^bench-ratio: workload=mlperf b_req=16 `} {
		if !regexp.MustCompile(want).MatchString(out) {
			t.Errorf("run.sh printed no line matching %s", want)
		}
	}
	for _, f := range []string{"run.log", "python.json", "parity-mlperf.log", "bench-model.log", "bench.log",
		filepath.Join("bench", "REPORT.md")} {
		if _, err := os.Stat(filepath.Join(results, f)); err != nil {
			t.Errorf("results: %v", err)
		}
	}
	// The bundles stay out of the results, which travel back from the GPU
	// machine, and are gone afterwards.
	if _, err := os.Stat(filepath.Join(tmp, "work", "recmesh-gpu-run", "data")); !os.IsNotExist(err) {
		t.Errorf("run.sh left its bundles behind: %v", err)
	}
}

func run(t *testing.T, dir string, env []string, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	b, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, tail(string(b)))
	}
	return string(b)
}

func tail(s string) string {
	lines := strings.Split(s, "\n")
	if len(lines) > 80 {
		lines = lines[len(lines)-80:]
	}
	return strings.Join(lines, "\n")
}
