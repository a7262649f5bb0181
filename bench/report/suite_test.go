package report

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/recmesh/recmesh/bench/loadgen"
)

// TestSaturatedClientNeverHeadlines: a point whose load generator ran out
// of CPU is the fastest but must not stand for its arm.
func TestSaturatedClientNeverHeadlines(t *testing.T) {
	pts := synthetic()
	fast := pt("py", 16, 64, 0, [2]float64{8000, 5})
	fast.Runs[0].Client = loadgen.NewClientUsage(0.99, 1, 1)
	fast.Summarize()
	pts = append(pts, fast)
	if p := Best(pts, "py", 16, 20); p == nil || p.Concurrency != 4 {
		t.Fatalf("best py at B 16 = %+v, want the unsaturated C=4 point", p)
	}
	fast.Runs[0].Client = loadgen.NewClientUsage(0.5, 1, 1)
	fast.Summarize()
	if p := Best(pts, "py", 16, 20); p == nil || p.Concurrency != 64 {
		t.Fatalf("best py at B 16 = %+v, want C=64 once the client had room", p)
	}
}

func TestRatioLines(t *testing.T) {
	r := &Run{Workload: "hostbound", Points: synthetic(), Sweep: Sweep{Batches: []int{1, 16, 128}}}
	var got []string
	for _, l := range RatioLines(r) {
		got = append(got, l.String())
	}
	want := []string{
		// py at B 1 has p99 25 ms: recmesh alone is eligible.
		"bench-ratio: workload=hostbound b_req=1 recmesh=400 recmesh_arm=recmesh-full best_python=0 python_arm=none ratio=inf",
		"bench-ratio: workload=hostbound b_req=16 recmesh=3200 recmesh_arm=recmesh-full best_python=1600 python_arm=py-mp ratio=2.000",
		"bench-ratio: workload=hostbound b_req=128 recmesh=0 recmesh_arm=none best_python=0 python_arm=none ratio=0",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("ratio lines:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestMemoryLine(t *testing.T) {
	m := &MemoryCheck{TableBytes: 3000 << 20, Rows: []MemoryRow{
		{Arm: "recmesh-full", Kind: KindRecmesh, Instances: 1, PSSBytes: 3500 << 20},
		{Arm: "recmesh-full", Kind: KindRecmesh, Instances: 4, PSSBytes: 3600 << 20},
		{Arm: "py-mp-batch", Kind: KindPython, Instances: 1, PSSBytes: 3400 << 20},
		{Arm: "py-mp-batch", Kind: KindPython, Instances: 4, PSSBytes: 12600 << 20},
		{Arm: "py-mp-batch", Kind: KindPython, Instances: 8, Error: "out of memory"},
	}}
	line, ok := MemoryLine(m)
	want := "bench-memory: tables_mib=3000 recmesh_frontends=4 recmesh_pss_mib=3600 python_arm=py-mp-batch python_processes=4 python_pss_mib=12600 ratio=3.50"
	if !ok || line != want {
		t.Errorf("memory line %v\n %s\nwant\n %s", ok, line, want)
	}
	m.Rows = m.Rows[:2]
	if line, ok := MemoryLine(m); ok || !strings.Contains(line, "python_arm=none") {
		t.Errorf("without a Python row: %v %s", ok, line)
	}
}

// TestSuite writes two workloads, reloads them as -report-only would and
// checks the report's sections and the order of the closing lines.
func TestSuite(t *testing.T) {
	dir := t.TempDir()
	var names []string
	for i, w := range []string{"mlperf", "hostbound"} {
		r := &Run{
			Workload: w, StartedAt: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), FinishedAt: time.Date(2026, 1, 2, 3, 14, 5, 0, time.UTC),
			Sweep: Sweep{Batches: []int{1, 16}, Clients: []int{1, 4}, Repeats: 1},
			Arms:  []Arm{{Name: "recmesh-full", Kind: KindRecmesh}, {Name: "py", Kind: KindPython}},
			DenseCost: &DenseCost{CPUs: "0", LookupExamplesPerS: 40000,
				Buckets: []DenseCostBucket{{Bucket: 1, DenseExamplesPerS: 2000}, {Bucket: 16, DenseExamplesPerS: 400000}}},
		}
		if i == 0 {
			r.Memory = &MemoryCheck{TableBytes: 100 << 20, Rows: []MemoryRow{
				{Arm: "recmesh-full", Kind: KindRecmesh, Instances: 4, PSSBytes: 200 << 20},
				{Arm: "py-mp-batch", Kind: KindPython, Instances: 4, PSSBytes: 700 << 20},
			}}
		}
		sub := filepath.Join(dir, w)
		for j, p := range synthetic() {
			f := filepath.Join(p.Arm, "p"+strings.Repeat("x", j)+".json")
			if err := p.WriteFile(filepath.Join(sub, f)); err != nil {
				t.Fatal(err)
			}
			r.PointFiles = append(r.PointFiles, f)
		}
		if err := r.WriteManifest(sub); err != nil {
			t.Fatal(err)
		}
		names = append(names, w)
	}
	if err := WriteSuiteManifest(dir, names); err != nil {
		t.Fatal(err)
	}
	runs, err := LoadSuite(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := WriteSuite(dir, runs); err != nil {
		t.Fatal(err)
	}
	md, err := os.ReadFile(filepath.Join(dir, ReportFile))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"## Workload `mlperf`", "## Workload `hostbound`", "### Throughput under p99 ≤ 20 ms",
		"(mlperf/throughput-vs-clients-b16.svg)", "(hostbound/p99-vs-throughput-b1.svg)", "| 16 | 400,000 | 2.50 | 25.00 | 0.100 |",
		"bench-memory: tables_mib=100"} {
		if !strings.Contains(string(md), want) {
			t.Errorf("report lacks %q", want)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "hostbound", "throughput-vs-clients-b16.svg")); err != nil {
		t.Error(err)
	}
	lines := SuiteLines(runs)
	var kinds []string
	for _, l := range lines {
		k, _, _ := strings.Cut(l, " ")
		if len(kinds) == 0 || kinds[len(kinds)-1] != k {
			kinds = append(kinds, k)
		}
	}
	if strings.Join(kinds, ",") != "bench:,bench-ratio:,bench-memory:" {
		t.Errorf("line kinds in order %v, want bench:, bench-ratio:, then bench-memory: last", kinds)
	}
	// The manifest names two arms; the points add recmesh-none and py-mp.
	if n := len(lines); n != 2*4*2+2*2+1 {
		t.Errorf("%d lines, want 21 (2 workloads × 4 arms × 2 B_req, 2 × 2 ratios, memory)", n)
	}
}
