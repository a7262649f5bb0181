package report

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/recmesh/recmesh/bench/loadgen"
)

// ReportFile is the report's name inside the results directory.
const ReportFile = "REPORT.md"

// Write renders REPORT.md and its charts (drawn by charts) into dir (the
// results directory, which the charts' relative links assume).
func Write(dir string, r *Run, charts Charts) error {
	files, err := charts.draw(dir, r.Points)
	if err != nil {
		return err
	}
	md := Markdown(r, files)
	if err := os.WriteFile(filepath.Join(dir, ReportFile), []byte(md), 0o644); err != nil {
		return fmt.Errorf("report: %w", err)
	}
	return nil
}

// table accumulates one Markdown table.
type table struct {
	b *strings.Builder
}

func newTable(b *strings.Builder, head ...string) table {
	fmt.Fprintf(b, "| %s |\n|", strings.Join(head, " | "))
	for range head {
		b.WriteString("---|")
	}
	b.WriteString("\n")
	return table{b}
}

func (t table) row(cells ...string) { fmt.Fprintf(t.b, "| %s |\n", strings.Join(cells, " | ")) }

// Markdown renders the report; charts are the SVG files (relative to the
// report) to reference.
func Markdown(r *Run, charts []string) string {
	var b strings.Builder
	b.WriteString("# recmesh serving benchmark\n\n")
	writeWorkload(&b, "##", r, charts)
	return b.String()
}

// writeWorkload renders one workload's sweep with headings at level h
// ("##" or "###"); charts are relative to the report.
func writeWorkload(b *strings.Builder, h string, r *Run, charts []string) {
	pts := r.Points
	arms := reportArms(r)
	batches := r.Sweep.Batches
	if len(batches) == 0 {
		batches = Batches(pts)
	}

	fmt.Fprintf(b, "Workload `%s`: DLRM-DCNv2 over the Open Inference Protocol v2, recmesh against the Python designs, "+
		"after `shared/reference/published-dlrm-benchmark.md`. Run %s → %s on `%s` (bundle `%s`).\n\n",
		orDash(r.Workload), r.StartedAt.Format("2006-01-02 15:04:05Z07:00"), r.FinishedAt.Format("15:04:05Z07:00"), r.Env.Host, filepath.Base(r.Env.Bundle))
	fmt.Fprintf(b, "Throughput is examples/s (requests/s × B_req), medians of %d repeat(s) of a %gs window after %gs of discarded warm-up; "+
		"latency is client-observed p50/p99 in ms. A point counts under a budget only when every repeat had zero errors. "+
		"Closed loop over a fixed pool of %d persistent gRPC connections per arm%s; open loop is Poisson arrivals at %s of each arm's own closed-loop peak and at %s of its peak within p99 %d ms.\n\n",
		r.Sweep.Repeats, r.Sweep.DurationS, r.Sweep.WarmupS, r.Sweep.Connections, clientNote(r.Sweep.Client), fracList(r.Sweep.OpenFractions), fracList(r.Sweep.BudgetFractions), HeadlineBudgetMs)
	if r.DenseCost != nil {
		writeDenseCost(b, r.DenseCost)
	}

	// Headline.
	fmt.Fprintf(b, h+" Throughput under p99 ≤ %d ms\n\n", HeadlineBudgetMs)
	head := []string{"B_req", "recmesh (examples/s)", "best Python (examples/s)", "recmesh vs best Python"}
	head = append(head, codes(arms)...)
	t := newTable(b, head...)
	for _, bq := range batches {
		rec := BestOfKind(pts, KindRecmesh, bq, HeadlineBudgetMs)
		py := BestOfKind(pts, KindPython, bq, HeadlineBudgetMs)
		cells := []string{bold(strconv.Itoa(bq)), pointCell(rec), pointCell(py), ratioCell(rec, py)}
		for _, a := range arms {
			cells = append(cells, numCell(Best(pts, a, bq, HeadlineBudgetMs)))
		}
		t.row(cells...)
	}
	b.WriteString("\n— : no error-free closed-loop point of that arm (or side) kept its median p99 within the budget.\n\n")

	b.WriteString(h + " Throughput across tail-latency budgets (best recmesh / best Python → recmesh vs best Python)\n\n")
	head = []string{"B_req"}
	for _, bud := range Budgets {
		head = append(head, budgetName(bud))
	}
	t = newTable(b, head...)
	for _, bq := range batches {
		cells := []string{bold(strconv.Itoa(bq))}
		for _, bud := range Budgets {
			rec := BestOfKind(pts, KindRecmesh, bq, bud)
			py := BestOfKind(pts, KindPython, bq, bud)
			cells = append(cells, fmt.Sprintf("%s / %s → %s", pointCell(rec), pointCell(py), ratioCell(rec, py)))
		}
		t.row(cells...)
	}
	b.WriteString("\n")

	b.WriteString(h + " Unbounded peak throughput per arm (examples/s)\n\n")
	t = newTable(b, append([]string{"B_req"}, codes(arms)...)...)
	for _, bq := range batches {
		cells := []string{bold(strconv.Itoa(bq))}
		for _, a := range arms {
			p := Best(pts, a, bq, 0)
			c := numCell(p)
			if p != nil {
				c += fmt.Sprintf(" (C=%d, p99 %s)", p.Concurrency, ms(p.Summary.P99Ms))
			}
			cells = append(cells, c)
		}
		t.row(cells...)
	}
	b.WriteString("\n")

	b.WriteString(h + " Single-client latency at C = 1 (p50 / p99 ms)\n\n")
	t = newTable(b, append([]string{"B_req"}, codes(arms)...)...)
	for _, bq := range batches {
		cells := []string{bold(strconv.Itoa(bq))}
		for _, a := range arms {
			p := Find(pts, a, bq, LabelClosed, 1)
			if p == nil || p.Summary.Repeats == 0 {
				cells = append(cells, "—")
				continue
			}
			cells = append(cells, fmt.Sprintf("%s / %s", ms(p.Summary.P50Ms), ms(p.Summary.P99Ms)))
		}
		t.row(cells...)
	}
	b.WriteString("\n")

	b.WriteString(h + " Server CPU-seconds per 1,000 examples (at each arm's unbounded peak) and peak memory\n\n")
	t = newTable(b, append([]string{"B_req"}, codes(arms)...)...)
	for _, bq := range batches {
		cells := []string{bold(strconv.Itoa(bq))}
		for _, a := range arms {
			p := Best(pts, a, bq, 0)
			if p == nil || p.Summary.ServerCPUSPer1kExamples == 0 {
				cells = append(cells, "—")
				continue
			}
			cells = append(cells, fmt.Sprintf("%.3f (%.2f cores)", p.Summary.ServerCPUSPer1kExamples, p.Summary.ServerCPUCores))
		}
		t.row(cells...)
	}
	for _, m := range []struct {
		name string
		pss  bool
	}{{"peak RSS", false}, {"peak PSS", true}} {
		cells := []string{bold(m.name + " (all B_req)")}
		for _, a := range arms {
			var peak int64
			for _, bq := range batches {
				rss, pss := PeakRSS(pts, a, bq)
				peak = max(peak, map[bool]int64{false: rss, true: pss}[m.pss])
			}
			cells = append(cells, memCell(peak))
		}
		t.row(cells...)
	}
	b.WriteString("\nMemory is summed over every process of the arm (the mesh: `recmesh run` with embedded NATS, embedder, accelerator and frontends; py-mp: the supervisor and its workers) at the largest sample of the measured windows.\n\n")

	writeOpenLoop(b, h, r, arms, batches)
	writeMemory(b, h, r)

	if len(charts) > 0 {
		b.WriteString(h + " Charts\n\n")
		for _, c := range charts {
			fmt.Fprintf(b, "![%s](%s)\n\n", chartTitle(c), c)
		}
	}

	writeSweep(b, h, pts, arms, batches)
	writeArms(b, h, r)
	writeEnv(b, h, r)
}

func writeOpenLoop(b *strings.Builder, h string, r *Run, arms []string, batches []int) {
	type section struct {
		label, title, about string
		floor               bool // show the queueing floor
	}
	var sections []section
	for _, f := range r.Sweep.OpenFractions {
		sections = append(sections, section{OpenLabel(f), fmt.Sprintf("Open-loop Poisson traffic at %.0f%% of each arm's own peak", f*100),
			"The peak is the arm's best error-free closed-loop throughput at any C, whatever its p99: a stress test, since closed-loop clients send in step and merge into batches Poisson arrivals do not form.", false})
	}
	for _, f := range r.Sweep.BudgetFractions {
		sections = append(sections, section{BudgetLabel(f), fmt.Sprintf("Open-loop Poisson traffic at %.0f%% of each arm's peak within p99 %d ms", f*100, HeadlineBudgetMs),
			fmt.Sprintf("The peak is the throughput the arm claims in the headline table (its best closed-loop point within p99 %d ms); MLPerf's server scenario asks that Poisson arrivals be served at it within the same bound. A dash: the arm had no point within the budget. "+
				"The floor after each cell is the p99 an ideal one-core server would show at the same rate if every call kept the core busy for the arm's measured CPU time per call, served in arrival order (the M/D/1 queue, QueueP99): with the core near 80 %% busy it is about eleven such times, so where a call costs more than about 1.8 ms of the core, no one-core design meets the bound at this load; a batching arm whose merged calls cost less under load can beat it.", HeadlineBudgetMs), true})
	}
	for _, sec := range sections {
		label := sec.label
		fmt.Fprintf(b, h+" %s\n\n", sec.title)
		b.WriteString(sec.about + " Achieved requests/s and median p99 (ms) across repeats, per-repeat p99 in parentheses; errors when any.\n\n")
		t := newTable(b, append([]string{"B_req"}, codes(arms)...)...)
		for _, bq := range batches {
			cells := []string{bold(strconv.Itoa(bq))}
			for _, a := range arms {
				p := Find(r.Points, a, bq, label, 0)
				if p == nil || p.Summary.Repeats == 0 {
					cells = append(cells, "—")
					continue
				}
				var per []string
				for _, run := range p.Runs {
					per = append(per, ms(run.Latency.P99))
				}
				c := fmt.Sprintf("%s/s, %s ms (%s)", num(p.Summary.RequestsPerS), ms(p.Summary.P99Ms), strings.Join(per, " / "))
				if p.Summary.Errors > 0 {
					c += fmt.Sprintf(", %d errors", p.Summary.Errors)
				}
				if f := queueFloorMs(p); sec.floor && math.IsInf(f, 1) {
					c += "; floor: the core saturated"
				} else if sec.floor && f > 0 {
					c += "; floor " + ms(f) + " ms"
				}
				cells = append(cells, c)
			}
			t.row(cells...)
		}
		b.WriteString("\n")
	}
}

func writeMemory(b *strings.Builder, h string, r *Run) {
	m := r.Memory
	b.WriteString(h + " Memory scaling: one table copy in the mesh, one per process in the multi-process Python arm\n\n")
	if m == nil || len(m.Rows) == 0 {
		b.WriteString("Not run.\n\n")
		return
	}
	fmt.Fprintf(b, "Peak PSS and RSS of the whole arm under light load (closed loop, B_req %d, C %d), by frontend count (recmesh) or process count (py-mp). Embedding tables: %s. "+
		"The mesh's bound with N frontends is tables + %s + N × %s.\n\n",
		m.BatchSize, m.Concurrency, mib(m.TableBytes), mib(m.BaseBytes), mib(m.PerInstanceBytes))
	t := newTable(b, "arm", "frontends / processes", "peak PSS", "peak RSS", "PSS − tables", "bound (mesh)", "parity")
	for _, row := range m.Rows {
		bound := "—"
		if row.Kind == KindRecmesh {
			bound = mib(m.TableBytes + m.BaseBytes + int64(row.Instances)*m.PerInstanceBytes)
		}
		par := "—"
		if row.Parity != nil {
			par = parityCell(row.Parity)
		}
		if row.Error != "" {
			t.row(code(row.Arm), strconv.Itoa(row.Instances), "not measured: "+oneLine(row.Error), "—", "—", bound, par)
			continue
		}
		t.row(code(row.Arm), strconv.Itoa(row.Instances), mib(row.PSSBytes), mib(row.RSSBytes), mib(row.PSSBytes-m.TableBytes), bound, par)
	}
	_, verdict := MemoryVerdict(m)
	fmt.Fprintf(b, "\n**Verdict:** %s\n\n", verdict)
}

func writeSweep(b *strings.Builder, h string, pts []*loadgen.Point, arms []string, batches []int) {
	b.WriteString(h + " Full closed-loop sweep\n\n")
	b.WriteString("Client cores is the load generator's own CPU use; a point where it reached 90% of its CPUs is marked saturated and never counts under a budget. " +
		"Host stall is the latest wake-up of a real-time probe on the server's and the load generator's first CPU over the point's windows (package `stall`): time the machine did not give the guest, which lands on every request in flight.\n\n")
	t := newTable(b, "arm", "B_req", "C", "requests/s", "examples/s", "p50 ms", "p99 ms", "errors", "server cores", "CPU-s / 1k ex.", "peak PSS", "client cores", "host stall ms")
	for _, a := range arms {
		for _, bq := range batches {
			for _, c := range Clients(pts) {
				p := Find(pts, a, bq, LabelClosed, c)
				if p == nil || p.Summary.Repeats == 0 {
					continue
				}
				s := p.Summary
				t.row(code(a), strconv.Itoa(bq), strconv.Itoa(c), num(s.RequestsPerS), num(s.ExamplesPerS), ms(s.P50Ms), ms(s.P99Ms),
					strconv.FormatInt(s.Errors, 10), fmt.Sprintf("%.2f", s.ServerCPUCores), fmt.Sprintf("%.3f", s.ServerCPUSPer1kExamples), memCell(s.ServerPeakPSSBytes),
					clientCell(s), stallCell(p))
			}
		}
	}
	b.WriteString("\n")
}

// stallCell is the latest probe wake-up over the point's runs, "—" when
// no probe ran.
func stallCell(p *loadgen.Point) string {
	worst := -1.0
	for _, r := range p.Runs {
		for _, st := range r.Stalls {
			if st != nil {
				worst = max(worst, st.MaxDelayMs)
			}
		}
	}
	if worst < 0 {
		return "—"
	}
	return fmt.Sprintf("%.1f", worst)
}

func writeArms(b *strings.Builder, h string, r *Run) {
	b.WriteString(h + " Arms and parity\n\n")
	b.WriteString("Every arm passes a parity check against the plain-Go reference (`model.Reference`) before any load; an arm that fails is not measured.\n\n")
	t := newTable(b, "arm", "set-up", "parity", "note")
	for _, a := range r.Arms {
		par := "not run"
		if a.Parity != nil {
			par = parityCell(a.Parity)
		}
		note := "—"
		if a.Error != "" {
			note = oneLine(a.Error)
		}
		t.row(code(a.Name), a.Detail, par, note)
	}
	b.WriteString("\n")
}

func writeEnv(b *strings.Builder, h string, r *Run) {
	e := r.Env
	b.WriteString(h + " Environment\n\n")
	t := newTable(b, "what", "value")
	t.row("host", e.Host)
	t.row("CPU", fmt.Sprintf("%s (%d logical CPUs)", e.CPUModel, e.CPUs))
	t.row("memory", mib(e.MemTotalBytes))
	t.row("kernel", e.Kernel)
	t.row("server CPUs (every arm)", orNone(e.ServerCPUs))
	if e.ServerSched != "" {
		t.row("server scheduling policy (every arm)", e.ServerSched)
	}
	t.row("load generator + monitor CPUs", orNone(e.ClientCPUs))
	t.row("Go", e.GoVersion)
	keys := make([]string, 0, len(e.Versions))
	for k := range e.Versions {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		t.row(k, e.Versions[k])
	}
	t.row("PJRT plugin", orNone(e.PJRTPlugin))
	t.row("bundle", fmt.Sprintf("`%s` (max vocab %d, tables %s)", e.Bundle, e.MaxVocab, mib(e.TableBytes)))
	s := r.Sweep
	t.row("sweep", fmt.Sprintf("B_req %v, C %v, open loop at %s of peak and %s of the peak within budget, warm-up %gs, window %gs, %d repeat(s), %d connections, %d frontends, py-mp %d processes × %d threads",
		s.Batches, s.Clients, fracList(s.OpenFractions), fracList(s.BudgetFractions), s.WarmupS, s.DurationS, s.Repeats, s.Connections, s.Frontends, s.PyProcesses, s.PyWorkers))
	b.WriteString("\n")
	for _, n := range e.Notes {
		fmt.Fprintf(b, "- %s\n", n)
	}
	if len(e.Notes) > 0 {
		b.WriteString("\n")
	}
}

// reportArms is the manifest's arms (so an arm that failed still gets a
// column), plus any arm found only in the points.
func reportArms(r *Run) []string {
	var arms []string
	for _, a := range r.Arms {
		arms = append(arms, a.Name)
	}
	for _, a := range ArmNames(r.Points) {
		if !slices.Contains(arms, a) {
			arms = append(arms, a)
		}
	}
	SortArms(arms)
	return arms
}

func clientCell(s loadgen.Summary) string {
	if s.ClientCPUCores == 0 {
		return "—"
	}
	c := fmt.Sprintf("%.2f", s.ClientCPUCores)
	if s.ClientSaturated {
		c += " **saturated**"
	}
	return c
}

func pointCell(p *loadgen.Point) string {
	if p == nil {
		return "—"
	}
	return fmt.Sprintf("%s (`%s`, C=%d)", num(p.Summary.ExamplesPerS), p.Arm, p.Concurrency)
}

func numCell(p *loadgen.Point) string {
	if p == nil {
		return "—"
	}
	return num(p.Summary.ExamplesPerS)
}

func ratioCell(rec, py *loadgen.Point) string {
	r, ok := Ratio(rec, py)
	if !ok {
		return "—"
	}
	return fmt.Sprintf("**%.2f×**", r)
}

func parityCell(p *Parity) string {
	v := "FAIL"
	if p.Pass {
		v = "PASS"
	}
	return fmt.Sprintf("%s (max\\|Δ\\| %.2g ≤ %.0e, %d examples)", v, p.MaxAbsDiff, p.Tolerance, p.Examples)
}

func memCell(b int64) string {
	if b <= 0 {
		return "—"
	}
	if b >= 1<<30 {
		return fmt.Sprintf("%.2f GiB", float64(b)/(1<<30))
	}
	return mib(b)
}

func budgetName(ms float64) string {
	if ms <= 0 {
		return "unbounded peak"
	}
	return fmt.Sprintf("p99 ≤ %g ms", ms)
}

// num formats a rate with thousands separators, as the study's tables do.
func num(v float64) string {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return "—"
	}
	s := strconv.FormatInt(int64(math.Round(v)), 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var out []byte
	for i := range len(s) {
		if i > 0 && (len(s)-i)%3 == 0 {
			out = append(out, ',')
		}
		out = append(out, s[i])
	}
	if neg {
		return "-" + string(out)
	}
	return string(out)
}

func ms(v float64) string {
	switch {
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.2f", v)
	}
}

func fracList(fs []float64) string {
	var s []string
	for _, f := range fs {
		s = append(s, fmt.Sprintf("%.0f%%", f*100))
	}
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, " and ")
}

func code(s string) string { return "`" + s + "`" }

func codes(ss []string) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = code(s)
	}
	return out
}

func bold(s string) string { return "**" + s + "**" }

func orNone(s string) string {
	if s == "" {
		return "not pinned"
	}
	return s
}

// oneLine keeps a table cell on one line.
func oneLine(s string) string {
	s = strings.ReplaceAll(s, "\n", " ")
	s = strings.ReplaceAll(s, "|", "\\|")
	if len(s) > 300 {
		s = s[:300] + "…"
	}
	return s
}

// clientNote names the load generator's gRPC client, if the run says.
func clientNote(kind string) string {
	switch kind {
	case "":
		return ""
	case "lean":
		return " (client: `bench/h2client`, which sends each call from the caller and finishes it on the connection's reader, so little of the client's own time is in the latencies)"
	case "grpc":
		return " (client: grpc-go)"
	}
	return " (client: " + kind + ")"
}
