package report

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// SuiteFile lists a suite's workloads inside its results directory; each
// workload's Run (run.json, point files, charts) is in a subdirectory
// named after it, and REPORT.md beside SuiteFile covers them all.
const SuiteFile = "suite.json"

// SuiteSchema names SuiteFile's layout.
const SuiteSchema = "recmesh.bench.suite/v1"

// Suite is the manifest of a benchmark over several workloads.
type Suite struct {
	Schema    string   `json:"schema"`
	Workloads []string `json:"workloads"`
}

// WriteSuiteManifest writes dir/suite.json naming the workloads in order.
func WriteSuiteManifest(dir string, workloads []string) error {
	b, err := json.MarshalIndent(Suite{Schema: SuiteSchema, Workloads: workloads}, "", "  ")
	if err != nil {
		return fmt.Errorf("report: encode suite: %w", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("report: write suite: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, SuiteFile), append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("report: write suite: %w", err)
	}
	return nil
}

// LoadSuite reads dir/suite.json and every workload's Run.
func LoadSuite(dir string) ([]*Run, error) {
	b, err := os.ReadFile(filepath.Join(dir, SuiteFile))
	if err != nil {
		return nil, fmt.Errorf("report: %w", err)
	}
	var s Suite
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("report: suite %s: %w", dir, err)
	}
	if s.Schema != SuiteSchema {
		return nil, fmt.Errorf("report: suite %s: schema %q, want %q", dir, s.Schema, SuiteSchema)
	}
	var runs []*Run
	for _, w := range s.Workloads {
		r, err := Load(filepath.Join(dir, w))
		if err != nil {
			return nil, err
		}
		runs = append(runs, r)
	}
	return runs, nil
}

// WriteSuite renders every workload's charts (drawn by charts) into its
// subdirectory and one REPORT.md for all of them into dir.
func WriteSuite(dir string, runs []*Run, charts Charts) error {
	links := map[string][]string{}
	for _, r := range runs {
		files, err := charts.draw(filepath.Join(dir, r.Workload), r.Points)
		if err != nil {
			return err
		}
		for _, f := range files {
			links[r.Workload] = append(links[r.Workload], r.Workload+"/"+f)
		}
	}
	md := SuiteMarkdown(runs, links)
	if err := os.WriteFile(filepath.Join(dir, ReportFile), []byte(md), 0o644); err != nil {
		return fmt.Errorf("report: %w", err)
	}
	return nil
}

// SuiteMarkdown renders the report of a suite: the comparison lines, then
// one section per workload.
func SuiteMarkdown(runs []*Run, charts map[string][]string) string {
	var b strings.Builder
	b.WriteString("# recmesh serving benchmark\n\n")
	b.WriteString("DLRM-DCNv2 over the Open Inference Protocol v2, recmesh against the Python designs of " +
		"`shared/reference/published-dlrm-benchmark.md`, on each workload below. " +
		"`mlperf` is the MLPerf DLRMv2 dense network; `hostbound` keeps the same 26 tables, vocabularies and 214 ids per example " +
		"but shrinks the dense network until the host's work (lookups, serving) dominates, as in the study, where the dense network ran on an accelerator that was never the bottleneck.\n\n")
	b.WriteString("## Summary: best recmesh vs best Python under p99 ≤ 20 ms\n\n")
	t := newTable(&b, "workload", "B_req", "recmesh", "best Python", "ratio", "dense / lookup time per example")
	for _, r := range runs {
		for _, rl := range RatioLines(r) {
			t.row(code(r.Workload), strconv.Itoa(rl.B), armRate(rl.Recmesh, rl.RecmeshArm), armRate(rl.Python, rl.PythonArm),
				ratioText(rl), denseCostCell(r.DenseCost, rl.B))
		}
	}
	b.WriteString("\nA ratio of `inf` means no Python arm had an eligible point where recmesh did; 0 that recmesh had none.\n\n")
	var open []string
	for _, r := range runs {
		for _, l := range OpenLines(r) {
			open = append(open, l.String())
		}
	}
	if len(open) > 0 {
		fmt.Fprintf(&b, "Open loop at a fraction of the SLO arms' own peak within p99 %d ms:\n\n```\n%s\n```\n\n", HeadlineBudgetMs, strings.Join(open, "\n"))
	}
	for _, r := range runs {
		if r.Memory != nil {
			line, _ := MemoryLine(r.Memory)
			fmt.Fprintf(&b, "Memory (workload `%s`): `%s`\n\n", r.Workload, line)
		}
	}
	for _, r := range runs {
		fmt.Fprintf(&b, "## Workload `%s`\n\n", r.Workload)
		writeWorkload(&b, "###", r, charts[r.Workload])
	}
	return b.String()
}

func armRate(v float64, arm string) string {
	if arm == "" {
		return "—"
	}
	return fmt.Sprintf("%s (`%s`)", num(v), arm)
}

func ratioText(rl RatioLine) string {
	switch {
	case rl.RecmeshArm == "":
		return "—"
	case rl.PythonArm == "":
		return "∞"
	}
	return fmt.Sprintf("**%.2f×**", rl.Ratio)
}

// denseCostCell is the dense/lookup time ratio at the bucket of B_req b.
func denseCostCell(c *DenseCost, b int) string {
	if c == nil {
		return "—"
	}
	for _, cb := range c.Buckets {
		if cb.Bucket == b {
			return fmt.Sprintf("%.3f", c.Ratio(cb))
		}
	}
	return "—"
}

func writeDenseCost(b *strings.Builder, c *DenseCost) {
	if len(c.Buckets) == 0 {
		b.WriteString("Dense network vs lookups: not measured.\n\n")
		return
	}
	fmt.Fprintf(b, "Dense network vs embedding lookups per example, each on one core (CPUs %s): the lookup kernel does %s examples/s over these tables. "+
		"A ratio ≤ 0.1 means the host's lookups, not the dense network, bound the workload.\n\n", orNone(c.CPUs), num(c.LookupExamplesPerS))
	t := newTable(b, "batch", "dense examples/s", "dense µs / example", "lookup µs / example", "dense / lookup")
	for _, cb := range c.Buckets {
		dense, lookup := "—", "—"
		if cb.DenseExamplesPerS > 0 {
			dense = fmt.Sprintf("%.2f", 1e6/cb.DenseExamplesPerS)
		}
		if c.LookupExamplesPerS > 0 {
			lookup = fmt.Sprintf("%.2f", 1e6/c.LookupExamplesPerS)
		}
		t.row(strconv.Itoa(cb.Bucket), num(cb.DenseExamplesPerS), dense, lookup, fmt.Sprintf("%.3f", c.Ratio(cb)))
	}
	b.WriteString("\n")
}

// SuiteLines are what `make bench` ends with: every workload's `bench:`
// lines, then every workload's `bench-ratio:` lines, then its
// `bench-open:` lines, then the `bench-memory:` line of the first
// workload whose memory check ran.
func SuiteLines(runs []*Run) []string {
	var out []string
	for _, r := range runs {
		for _, l := range Lines(r.Workload, r.Points, reportArms(r), runBatches(r)) {
			out = append(out, l.String())
		}
	}
	for _, r := range runs {
		for _, l := range RatioLines(r) {
			out = append(out, l.String())
		}
	}
	for _, r := range runs {
		for _, l := range OpenLines(r) {
			out = append(out, l.String())
		}
	}
	for _, r := range runs {
		if r.Memory != nil {
			line, _ := MemoryLine(r.Memory)
			out = append(out, line)
			break
		}
	}
	return out
}

func runBatches(r *Run) []int {
	if len(r.Sweep.Batches) > 0 {
		return r.Sweep.Batches
	}
	return Batches(r.Points)
}

// RatioLine compares, at one request size, the best recmesh arm with the
// best Python arm under the headline budget.
type RatioLine struct {
	Workload              string
	B                     int
	Recmesh, Python       float64
	RecmeshArm, PythonArm string
	// Ratio is Recmesh/Python; +Inf when only recmesh has a point, 0 when
	// recmesh has none.
	Ratio float64
}

func (l RatioLine) String() string {
	ratio := "0"
	switch {
	case math.IsInf(l.Ratio, 1):
		ratio = "inf"
	case l.Ratio > 0:
		ratio = fmt.Sprintf("%.3f", l.Ratio)
	}
	return fmt.Sprintf("bench-ratio: workload=%s b_req=%d recmesh=%.0f recmesh_arm=%s best_python=%.0f python_arm=%s ratio=%s",
		orDash(l.Workload), l.B, l.Recmesh, armOrNone(l.RecmeshArm), l.Python, armOrNone(l.PythonArm), ratio)
}

func armOrNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

// RatioLines gives one RatioLine per request size of the run.
func RatioLines(r *Run) []RatioLine {
	var out []RatioLine
	for _, b := range runBatches(r) {
		l := RatioLine{Workload: r.Workload, B: b}
		rec := BestOfKind(r.Points, KindRecmesh, b, HeadlineBudgetMs)
		py := BestOfKind(r.Points, KindPython, b, HeadlineBudgetMs)
		if rec != nil {
			l.Recmesh, l.RecmeshArm = rec.Summary.ExamplesPerS, rec.Arm
		}
		if py != nil {
			l.Python, l.PythonArm = py.Summary.ExamplesPerS, py.Arm
		}
		switch {
		case rec == nil:
		case py == nil:
			l.Ratio = math.Inf(1)
		default:
			l.Ratio = l.Recmesh / l.Python
		}
		out = append(out, l)
	}
	return out
}

// OpenLine is one `bench-open:` line: an SLO arm's open-loop point at a
// fraction of its peak within the headline budget, and whether every
// repeat kept p99 within the budget with no errors.
type OpenLine struct {
	Workload, Arm, Label string
	B                    int
	Rate, Achieved       float64 // requests/s offered and served
	P99Ms                float64 // the worst repeat's
	Errors               int64
	Met                  bool
}

func (l OpenLine) String() string {
	return fmt.Sprintf("bench-open: workload=%s arm=%s b_req=%d load=%s rate=%.0f achieved=%.0f p99_ms_max=%.2f errors=%d target_ms=%d met=%t",
		orDash(l.Workload), l.Arm, l.B, l.Label, l.Rate, l.Achieved, l.P99Ms, l.Errors, HeadlineBudgetMs, l.Met)
}

// sloArm reports whether arm batches by the latency budget (the mesh's
// default mode, on either transport): the arms the budget-peak open loop
// is a target for.
func sloArm(arm string) bool { return arm == "recmesh-slo" || strings.HasPrefix(arm, "recmesh-slo-") }

// OpenLines gives one OpenLine per SLO arm, request size and budget
// fraction that has a point.
func OpenLines(r *Run) []OpenLine {
	var out []OpenLine
	for _, arm := range ArmNames(r.Points) {
		if !sloArm(arm) {
			continue
		}
		for _, b := range runBatches(r) {
			for _, f := range r.Sweep.BudgetFractions {
				p := Find(r.Points, arm, b, BudgetLabel(f), 0)
				if p == nil || p.Summary.Repeats == 0 {
					continue
				}
				l := OpenLine{Workload: r.Workload, Arm: arm, Label: BudgetLabel(f), B: b,
					Rate: p.RateRPS, Achieved: p.Summary.RequestsPerS, Errors: p.Summary.Errors}
				for _, run := range p.Runs {
					l.P99Ms = max(l.P99Ms, run.Latency.P99)
				}
				l.Met = l.Errors == 0 && l.P99Ms <= HeadlineBudgetMs
				out = append(out, l)
			}
		}
	}
	return out
}

// MemoryLine is the `bench-memory:` line: the mesh at its largest
// frontend count against the Python arm at its largest process count,
// and whether both sides were measured.
func MemoryLine(m *MemoryCheck) (string, bool) {
	var mesh, py *MemoryRow
	for i := range m.Rows {
		row := &m.Rows[i]
		if row.Error != "" || row.PSSBytes == 0 {
			continue
		}
		if row.Kind == KindRecmesh {
			if mesh == nil || row.Instances > mesh.Instances {
				mesh = row
			}
		} else if py == nil || row.Instances > py.Instances {
			py = row
		}
	}
	meshN, meshPSS, pyArm, pyN, pyPSS, ratio := 0, 0.0, "none", 0, 0.0, 0.0
	if mesh != nil {
		meshN, meshPSS = mesh.Instances, float64(mesh.PSSBytes)/(1<<20)
	}
	if py != nil {
		pyArm, pyN, pyPSS = py.Arm, py.Instances, float64(py.PSSBytes)/(1<<20)
	}
	if meshPSS > 0 {
		ratio = pyPSS / meshPSS
	}
	return fmt.Sprintf("bench-memory: tables_mib=%.0f recmesh_frontends=%d recmesh_pss_mib=%.0f python_arm=%s python_processes=%d python_pss_mib=%.0f ratio=%.2f",
		float64(m.TableBytes)/(1<<20), meshN, meshPSS, pyArm, pyN, pyPSS, ratio), mesh != nil && py != nil
}
