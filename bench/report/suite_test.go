package report

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/recmesh/recmesh/bench/loadgen"
	"github.com/recmesh/recmesh/bench/monitor"
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

// TestOpenLines: only SLO arms get a line, a repeat past the budget or an
// error fails it, and the worst repeat's p99 is the one printed.
func TestOpenLines(t *testing.T) {
	budget := func(arm string, b int, errs int64, p99s ...float64) *loadgen.Point {
		p := open(arm, b, 0.8, p99s...)
		p.Label = BudgetLabel(0.8)
		for i := range p.Runs {
			p.Runs[i].Errors = errs
		}
		p.Summarize()
		return p
	}
	r := &Run{Workload: "hostbound", Sweep: Sweep{Batches: []int{1, 16, 128}, BudgetFractions: []float64{0.8}}, Points: []*loadgen.Point{
		budget("recmesh-slo", 1, 0, 12, 19.5),
		budget("recmesh-slo", 16, 0, 12, 20.5, 11), // median within, one repeat past
		budget("recmesh-slo-lean", 1, 2, 5),
		budget("recmesh-full", 1, 0, 5),  // not an SLO arm
		open("recmesh-slo", 128, 0.8, 5), // the closed-loop peak's fraction, not the budget's
	}}
	var got []string
	for _, l := range OpenLines(r) {
		got = append(got, l.String())
	}
	want := []string{
		"bench-open: workload=hostbound arm=recmesh-slo b_req=1 load=budget80 rate=100 achieved=99 p99_ms_max=19.50 errors=0 target_ms=20 met=true",
		"bench-open: workload=hostbound arm=recmesh-slo b_req=16 load=budget80 rate=100 achieved=99 p99_ms_max=20.50 errors=0 target_ms=20 met=false",
		"bench-open: workload=hostbound arm=recmesh-slo-lean b_req=1 load=budget80 rate=100 achieved=99 p99_ms_max=5.00 errors=2 target_ms=20 met=false",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("open lines:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
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
			Sweep: Sweep{Batches: []int{1, 16}, Clients: []int{1, 4}, Repeats: 1, BudgetFractions: []float64{0.8}},
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
		slo := open("recmesh-slo", 16, 0.8, 9)
		slo.Label = BudgetLabel(0.8)
		// 0.8 cores at 99 calls/s: 8.1 ms of the core per call, a floor
		// of 11.4 of them, 92 ms (M/D/1).
		slo.Runs[0].Monitor = &monitor.Report{CPUCores: 0.8}
		slo.Summarize()
		for j, p := range append(synthetic(), slo) {
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
	if err := WriteSuite(dir, runs, placeholderCharts); err != nil {
		t.Fatal(err)
	}
	md, err := os.ReadFile(filepath.Join(dir, ReportFile))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"## Workload `mlperf`", "## Workload `hostbound`", "### Throughput under p99 ≤ 20 ms",
		"(mlperf/throughput-vs-clients-b16.svg)", "(hostbound/p99-vs-throughput-b1.svg)", "| 16 | 400,000 | 2.50 | 25.00 | 0.100 |",
		"bench-memory: tables_mib=100", "Open-loop Poisson traffic at 80% of each arm's peak within p99 20 ms",
		"| **16** | 99/s, 9.00 ms (9.00); floor 9"} {
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
	if strings.Join(kinds, ",") != "bench:,bench-ratio:,bench-open:,bench-memory:" {
		t.Errorf("line kinds in order %v, want bench:, bench-ratio:, bench-open:, then bench-memory: last", kinds)
	}
	// The manifest names two arms; the points add recmesh-none, py-mp and
	// recmesh-slo.
	if n := len(lines); n != 2*5*2+2*2+2+1 {
		t.Errorf("%d lines, want 27 (2 workloads × 5 arms × 2 B_req, 2 × 2 ratios, 2 open, memory)", n)
	}
}
