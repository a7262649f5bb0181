package report

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/recmesh/recmesh/bench/loadgen"
	"github.com/recmesh/recmesh/bench/monitor"
	"github.com/recmesh/recmesh/bench/stall"
)

// pt builds a closed-loop point from per-repeat (examples/s, p99 ms)
// pairs, summarised as the runner does.
func pt(arm string, b, c int, errs int64, runs ...[2]float64) *loadgen.Point {
	p := &loadgen.Point{Schema: loadgen.PointSchema, Arm: arm, Label: LabelClosed, Mode: loadgen.Closed, BatchSize: b, Concurrency: c}
	for i, r := range runs {
		per1k := 0.0
		if r[0] > 0 {
			per1k = 1000 / r[0]
		}
		p.Runs = append(p.Runs, loadgen.RunRecord{
			Repeat: i + 1,
			Result: &loadgen.Result{
				ExamplesPerS: r[0], RequestsPerS: r[0] / float64(b), Errors: errs,
				Latency: loadgen.LatencySummary{P50: r[1] / 2, P99: r[1]},
			},
			Monitor: &monitor.Report{CPUCores: 1, CPUSecondsPer1kExamples: per1k, PeakRSSBytes: int64(b) << 20, PeakPSSBytes: int64(b) << 19},
		})
	}
	p.Summarize()
	return p
}

func open(arm string, b int, frac float64, p99s ...float64) *loadgen.Point {
	p := &loadgen.Point{Schema: loadgen.PointSchema, Arm: arm, Label: OpenLabel(frac), Mode: loadgen.Open, BatchSize: b, RateRPS: 100}
	for i, v := range p99s {
		p.Runs = append(p.Runs, loadgen.RunRecord{Repeat: i + 1, Result: &loadgen.Result{RequestsPerS: 99, ExamplesPerS: 99 * float64(b), Latency: loadgen.LatencySummary{P99: v}}})
	}
	p.Summarize()
	return p
}

func synthetic() []*loadgen.Point {
	return []*loadgen.Point{
		// recmesh-full at B 16: the median of three repeats decides.
		pt("recmesh-full", 16, 1, 0, [2]float64{900, 2}, [2]float64{1000, 3}, [2]float64{1100, 4}),
		pt("recmesh-full", 16, 4, 0, [2]float64{3000, 15}, [2]float64{3200, 19}, [2]float64{9000, 30}), // median p99 19 ≤ 20
		pt("recmesh-full", 16, 16, 0, [2]float64{6000, 40}, [2]float64{6000, 45}, [2]float64{6000, 50}),
		// Fastest of all but with errors: never eligible.
		pt("recmesh-full", 16, 64, 3, [2]float64{9000, 5}, [2]float64{9000, 5}, [2]float64{9000, 5}),
		// Nothing completed in the window: never eligible, though its p99
		// reads 0.
		pt("recmesh-none", 16, 16, 0, [2]float64{0, 0}),
		pt("recmesh-none", 16, 4, 0, [2]float64{2000, 8}, [2]float64{2000, 8}, [2]float64{2000, 8}),
		pt("py", 16, 4, 0, [2]float64{500, 9}, [2]float64{500, 9}, [2]float64{500, 9}),
		pt("py-mp", 16, 4, 0, [2]float64{1600, 12}, [2]float64{1600, 12}, [2]float64{1600, 12}),
		pt("py-mp", 16, 16, 0, [2]float64{2500, 60}, [2]float64{2500, 60}, [2]float64{2500, 60}),
		pt("recmesh-full", 1, 1, 0, [2]float64{400, 1}),
		pt("py", 1, 1, 0, [2]float64{200, 25}),
		open("recmesh-full", 16, 0.8, 9.6, 9.5, 9.7),
		open("py-mp", 16, 0.8, 583, 112, 106),
	}
}

func TestBudgetSelectionAndMedians(t *testing.T) {
	pts := synthetic()
	cases := []struct {
		arm    string
		b      int
		budget float64
		want   float64 // median examples/s, 0 = none
		wantC  int
	}{
		{"recmesh-full", 16, 10, 1000, 1},
		{"recmesh-full", 16, 20, 3200, 4}, // median of 3000/3200/9000, p99 median 19
		{"recmesh-full", 16, 50, 6000, 16},
		{"recmesh-full", 16, 0, 6000, 16}, // C=64 had errors
		{"py", 1, 20, 0, 0},
		{"recmesh-none", 16, 20, 2000, 4},
		{"py", 1, 0, 200, 1},
	}
	for _, c := range cases {
		p := Best(pts, c.arm, c.b, c.budget)
		if c.want == 0 {
			if p != nil {
				t.Errorf("Best(%s, B %d, %g ms) = C=%d, want none", c.arm, c.b, c.budget, p.Concurrency)
			}
			continue
		}
		if p == nil || p.Summary.ExamplesPerS != c.want || p.Concurrency != c.wantC {
			t.Errorf("Best(%s, B %d, %g ms) = %+v, want %g at C=%d", c.arm, c.b, c.budget, p, c.want, c.wantC)
		}
	}
}

func TestRecmeshVsBestPython(t *testing.T) {
	pts := synthetic()
	rec := BestOfKind(pts, KindRecmesh, 16, 20)
	py := BestOfKind(pts, KindPython, 16, 20)
	if rec == nil || rec.Arm != "recmesh-full" || py == nil || py.Arm != "py-mp" {
		t.Fatalf("best recmesh %v, best Python %v", rec, py)
	}
	r, ok := Ratio(rec, py)
	if !ok || r != 2 { // 3200 / 1600
		t.Errorf("ratio %v %v, want 2", r, ok)
	}
	if _, ok := Ratio(rec, nil); ok {
		t.Error("ratio against no Python point should be undefined")
	}
}

func TestLines(t *testing.T) {
	lines := Lines("mlperf", synthetic(), []string{"recmesh-full", "py"}, []int{1, 16})
	want := []string{
		"bench: workload=mlperf arm=recmesh-full b_req=1 best_examples_per_s_p99_20ms=400 cpu_s_per_1k=2.500 peak_pss_mib=0.5",
		"bench: workload=mlperf arm=recmesh-full b_req=16 best_examples_per_s_p99_20ms=3200 cpu_s_per_1k=0.312 peak_pss_mib=8.0",
		// No point within 20 ms: 0, with the CPU cost of the unbounded peak.
		"bench: workload=mlperf arm=py b_req=1 best_examples_per_s_p99_20ms=0 cpu_s_per_1k=5.000 peak_pss_mib=0.5",
		"bench: workload=mlperf arm=py b_req=16 best_examples_per_s_p99_20ms=500 cpu_s_per_1k=2.000 peak_pss_mib=8.0",
	}
	if len(lines) != len(want) {
		t.Fatalf("%d lines, want %d", len(lines), len(want))
	}
	for i, l := range lines {
		if l.String() != want[i] {
			t.Errorf("line %d:\n got %s\nwant %s", i, l, want[i])
		}
	}
}

func TestMemoryVerdict(t *testing.T) {
	m := &MemoryCheck{TableBytes: 100 << 20, BaseBytes: 50 << 20, PerInstanceBytes: 20 << 20, Rows: []MemoryRow{
		{Arm: "recmesh-full", Kind: KindRecmesh, Instances: 1, PSSBytes: 160 << 20},
		{Arm: "recmesh-full", Kind: KindRecmesh, Instances: 2, PSSBytes: 175 << 20},
		{Arm: "recmesh-full", Kind: KindRecmesh, Instances: 4, PSSBytes: 200 << 20},
		{Arm: "py-mp", Kind: KindPython, Instances: 1, PSSBytes: 300 << 20},
		{Arm: "py-mp", Kind: KindPython, Instances: 2, PSSBytes: 600 << 20},
		{Arm: "py-mp", Kind: KindPython, Instances: 4, PSSBytes: 1200 << 20},
	}}
	if ok, text := MemoryVerdict(m); !ok || !strings.HasPrefix(text, "memory check: PASS") {
		t.Errorf("verdict %v %q, want PASS", ok, text)
	}
	m.Rows[2].PSSBytes = 300 << 20 // over 100+50+4·20 = 230 MiB
	if ok, text := MemoryVerdict(m); ok || !strings.Contains(text, "4 frontends") {
		t.Errorf("verdict %v %q, want FAIL naming 4 frontends", ok, text)
	}
	m.Rows[2].PSSBytes = 200 << 20
	m.Rows[5].PSSBytes = 500 << 20 // py-mp shrank from 2 to 4
	if ok, _ := MemoryVerdict(m); ok {
		t.Error("verdict PASS although py-mp did not grow")
	}
}

func TestWriteReportAndCharts(t *testing.T) {
	dir := t.TempDir()
	r := &Run{
		StartedAt: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), FinishedAt: time.Date(2026, 1, 2, 3, 14, 5, 0, time.UTC),
		Env:   Env{Host: "h", CPUModel: "cpu", CPUs: 2, ServerCPUs: "0", ClientCPUs: "1", GoVersion: "go1.26", Versions: map[string]string{"jax": "0.10.2"}},
		Sweep: Sweep{Batches: []int{1, 16}, Clients: []int{1, 4, 16, 64}, OpenFractions: []float64{0.8}, Repeats: 3, DurationS: 1, Connections: 64},
		Arms: []Arm{{Name: "recmesh-full", Kind: KindRecmesh, Parity: &Parity{Pass: true, MaxAbsDiff: 1e-7, Tolerance: 1e-4, Examples: 256}},
			{Name: "py-mp", Kind: KindPython, Parity: &Parity{Pass: true}}, {Name: "py", Kind: KindPython}, {Name: "recmesh-none", Kind: KindRecmesh}},
		Memory: &MemoryCheck{TableBytes: 1 << 20, BaseBytes: 1 << 30, PerInstanceBytes: 1 << 26, Rows: []MemoryRow{
			{Arm: "recmesh-full", Kind: KindRecmesh, Instances: 1, PSSBytes: 400 << 20, RSSBytes: 500 << 20},
			{Arm: "py-mp", Kind: KindPython, Instances: 1, Error: "boom"},
		}},
		Points: synthetic(),
	}
	// Probes watched one point's second repeat: its sweep row shows the
	// worst, the others a dash.
	r.Points[0].Runs[1].Stalls = []*stall.Report{{CPU: 0, MaxDelayMs: 3}, {CPU: 1, MaxDelayMs: 12.5}}
	for i, p := range r.Points {
		f := filepath.Join(p.Arm, strings.ReplaceAll(p.Label, ".", "_")+"-"+string(rune('a'+i))+".json")
		if err := p.WriteFile(filepath.Join(dir, f)); err != nil {
			t.Fatal(err)
		}
		r.PointFiles = append(r.PointFiles, f)
	}
	if err := r.WriteManifest(dir); err != nil {
		t.Fatal(err)
	}
	loaded, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(loaded.Points) != len(r.Points) {
		t.Fatalf("loaded %d points, want %d", len(loaded.Points), len(r.Points))
	}
	if err := Write(dir, loaded, placeholderCharts); err != nil {
		t.Fatal(err)
	}
	md, err := os.ReadFile(filepath.Join(dir, ReportFile))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"## Throughput under p99 ≤ 20 ms",
		"| **16** | 3,200 (`recmesh-full`, C=4) | 1,600 (`py-mp`, C=4) | **2.00×** |",
		"## Unbounded peak throughput per arm",
		"## Single-client latency at C = 1",
		"| **1** | 0.50 / 1.00 |",
		"CPU-seconds per 1,000 examples",
		"peak RSS (all B_req)",
		"(583 / 112 / 106)",
		"**Verdict:** memory check: FAIL",
		"not measured: boom",
		"![Throughput vs concurrent clients, B_req 16](throughput-vs-clients-b16.svg)",
		"![p99 latency vs throughput, B_req 1](p99-vs-throughput-b1.svg)",
		"| CPU | cpu (2 logical CPUs) |",
		"| jax | 0.10.2 |",
		"| host stall ms |",
		"| 1.000 | 8.0 MiB | — | 12.5 |",
		"| 5.000 | 0.5 MiB | — | — |",
	} {
		if !strings.Contains(string(md), want) {
			t.Errorf("REPORT.md lacks %q", want)
		}
	}
	if t.Failed() {
		t.Logf("REPORT.md:\n%s", md)
	}
	for _, f := range []string{"throughput-vs-clients-b1.svg", "throughput-vs-clients-b16.svg", "p99-vs-throughput-b1.svg", "p99-vs-throughput-b16.svg"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Error(err)
		}
	}
}

// placeholderCharts stands in for the benchrun command's charts (drawn
// with gonum/plot in its own module, and tested there): a placeholder
// file for each chart, under the names the report links to.
func placeholderCharts(dir string, points []*loadgen.Point) ([]string, error) {
	var files []string
	for _, b := range Batches(points) {
		for _, f := range []string{ThroughputChart(b), LatencyChart(b)} {
			if err := os.WriteFile(filepath.Join(dir, f), []byte("<svg/>\n"), 0o644); err != nil {
				return nil, err
			}
			files = append(files, f)
		}
	}
	return files, nil
}

// TestWithoutCharts: nil Charts draws none, and the report links none.
func TestWithoutCharts(t *testing.T) {
	dir := t.TempDir()
	if err := Write(dir, &Run{Points: synthetic()}, nil); err != nil {
		t.Fatal(err)
	}
	md, err := os.ReadFile(filepath.Join(dir, ReportFile))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(md), "Charts") || strings.Contains(string(md), ".svg") {
		t.Errorf("REPORT.md links charts that were never drawn:\n%s", md)
	}
}

func TestNum(t *testing.T) {
	for in, want := range map[float64]string{0: "0", 999.6: "1,000", 30126: "30,126", 1234567: "1,234,567", -4200: "-4,200"} {
		if got := num(in); got != want {
			t.Errorf("num(%v) = %q, want %q", in, got, want)
		}
	}
}
