package report

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"github.com/recmesh/recmesh/bench/loadgen"
)

// Budgets are the p99 ceilings of the budget table, in ms; 0 is unbounded.
var Budgets = []float64{10, 20, 50, 0}

// HeadlineBudgetMs is the budget of the headline comparison and of the
// `bench:` lines.
const HeadlineBudgetMs = 20

// closed reports whether p belongs to the closed-loop sweep.
func closed(p *loadgen.Point) bool {
	return p.Mode == loadgen.Closed && (p.Label == "" || p.Label == LabelClosed)
}

// eligible reports whether a closed-loop point may stand for its arm under
// the budget: every repeat error-free (the study reports runs with zero
// errors only), something completed in the window, and the median p99
// within budgetMs (0: any).
func eligible(p *loadgen.Point, budgetMs float64) bool {
	// A point whose window saw no completed request (every client still
	// busy with a warm-up request) measured nothing, whatever its p99.
	if !closed(p) || p.Summary.Errors != 0 || p.Summary.Repeats == 0 || !(p.Summary.ExamplesPerS > 0) {
		return false
	}
	// A point whose load generator ran out of CPU measured the client.
	if p.Summary.ClientSaturated {
		return false
	}
	return budgetMs <= 0 || p.Summary.P99Ms <= budgetMs
}

// Best returns the closed-loop point of arm at request size b with the
// highest median throughput among those eligible under budgetMs (0:
// unbounded), or nil when none is.
func Best(points []*loadgen.Point, arm string, b int, budgetMs float64) *loadgen.Point {
	var best *loadgen.Point
	for _, p := range points {
		if p.Arm != arm || p.BatchSize != b || !eligible(p, budgetMs) {
			continue
		}
		if best == nil || p.Summary.ExamplesPerS > best.Summary.ExamplesPerS {
			best = p
		}
	}
	return best
}

// BestOfKind is Best over every arm of one kind (recmesh or python).
func BestOfKind(points []*loadgen.Point, kind string, b int, budgetMs float64) *loadgen.Point {
	var best *loadgen.Point
	for _, arm := range ArmNames(points) {
		if KindOf(arm) != kind {
			continue
		}
		p := Best(points, arm, b, budgetMs)
		if p != nil && (best == nil || p.Summary.ExamplesPerS > best.Summary.ExamplesPerS) {
			best = p
		}
	}
	return best
}

// Ratio is recmesh's throughput over the best Python throughput, and
// false when either side has no eligible point.
func Ratio(rec, py *loadgen.Point) (float64, bool) {
	if rec == nil || py == nil || py.Summary.ExamplesPerS <= 0 {
		return 0, false
	}
	return rec.Summary.ExamplesPerS / py.Summary.ExamplesPerS, true
}

// Find returns the point of arm at b with the given label and (closed
// loop) concurrency, or nil.
func Find(points []*loadgen.Point, arm string, b int, label string, c int) *loadgen.Point {
	for _, p := range points {
		if p.Arm != arm || p.BatchSize != b {
			continue
		}
		if label == LabelClosed {
			if closed(p) && p.Concurrency == c {
				return p
			}
		} else if p.Label == label {
			return p
		}
	}
	return nil
}

// armOrder sorts recmesh arms first (slo, full, model, none, then the
// same on the lean transport), then the Python designs from the study's
// strongest down, then anything else by name.
func armOrder(a string) int {
	if i := slices.Index([]string{"recmesh-slo", "recmesh-full", "recmesh-model", "recmesh-none"}, a); i >= 0 {
		return i
	}
	if i := slices.Index([]string{"py-mp-batch", "py-batch", "py-mp", "py-mp-local", "py"}, a); i >= 0 {
		return 10 + i
	}
	if i := slices.Index([]string{"recmesh-slo-lean", "recmesh-full-lean", "recmesh-model-lean", "recmesh-none-lean"}, a); i >= 0 {
		return 4 + i
	}
	if KindOf(a) == KindRecmesh {
		return 8
	}
	return 20
}

// ArmNames lists the arms present in points, in report order.
func ArmNames(points []*loadgen.Point) []string {
	var names []string
	for _, p := range points {
		if !slices.Contains(names, p.Arm) {
			names = append(names, p.Arm)
		}
	}
	SortArms(names)
	return names
}

// SortArms sorts arm names in report order.
func SortArms(names []string) {
	slices.SortStableFunc(names, func(a, b string) int {
		return cmp.Or(cmp.Compare(armOrder(a), armOrder(b)), strings.Compare(a, b))
	})
}

// Batches lists the request sizes present in points, ascending.
func Batches(points []*loadgen.Point) []int {
	var bs []int
	for _, p := range points {
		if !slices.Contains(bs, p.BatchSize) {
			bs = append(bs, p.BatchSize)
		}
	}
	slices.Sort(bs)
	return bs
}

// Clients lists the closed-loop concurrencies present in points, ascending.
func Clients(points []*loadgen.Point) []int {
	var cs []int
	for _, p := range points {
		if closed(p) && !slices.Contains(cs, p.Concurrency) {
			cs = append(cs, p.Concurrency)
		}
	}
	slices.Sort(cs)
	return cs
}

// PeakRSS is the largest server RSS seen over every point of arm at b
// (0 when no point was monitored).
func PeakRSS(points []*loadgen.Point, arm string, b int) (rss, pss int64) {
	for _, p := range points {
		if p.Arm == arm && p.BatchSize == b {
			rss = max(rss, p.Summary.ServerPeakRSSBytes)
			pss = max(pss, p.Summary.ServerPeakPSSBytes)
		}
	}
	return rss, pss
}

// Line is one `bench:` summary line's values.
type Line struct {
	Workload string
	Arm      string
	B        int
	// BestP99_20 is the highest median examples/s with p99 ≤ 20 ms (0
	// when no point met the budget).
	BestP99_20 float64
	// CPUPer1k is the server CPU-seconds per 1,000 examples at that point,
	// or at the unbounded peak when no point met the budget.
	CPUPer1k float64
	// PeakPSSMiB is the largest server PSS (the whole process tree,
	// shared memory once) over the arm's points at B.
	PeakPSSMiB float64
}

func (l Line) String() string {
	return fmt.Sprintf("bench: workload=%s arm=%s b_req=%d best_examples_per_s_p99_20ms=%.0f cpu_s_per_1k=%.3f peak_pss_mib=%.1f",
		orDash(l.Workload), l.Arm, l.B, l.BestP99_20, l.CPUPer1k, l.PeakPSSMiB)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// Lines returns one Line per arm and request size, arms in report order
// (every arm of arms, even one without points, so a failed arm still
// shows up as zeros).
func Lines(workload string, points []*loadgen.Point, arms []string, batches []int) []Line {
	var out []Line
	for _, arm := range arms {
		for _, b := range batches {
			l := Line{Workload: workload, Arm: arm, B: b}
			p := Best(points, arm, b, HeadlineBudgetMs)
			if p != nil {
				l.BestP99_20 = p.Summary.ExamplesPerS
			} else {
				p = Best(points, arm, b, 0)
			}
			if p != nil {
				l.CPUPer1k = p.Summary.ServerCPUSPer1kExamples
			}
			_, pss := PeakRSS(points, arm, b)
			l.PeakPSSMiB = float64(pss) / (1 << 20)
			out = append(out, l)
		}
	}
	return out
}

// MemoryVerdict judges the memory check: every mesh row must stay within
// TableBytes + BaseBytes + N·PerInstanceBytes, and py-mp's PSS must grow
// with each added process. ok is false when either fails or data is
// missing; text explains.
func MemoryVerdict(m *MemoryCheck) (ok bool, text string) {
	if m == nil || len(m.Rows) == 0 {
		return false, "memory check: not run"
	}
	var mesh, py []MemoryRow
	for _, r := range m.Rows {
		if r.Error != "" || r.PSSBytes == 0 {
			continue
		}
		if r.Kind == KindRecmesh {
			mesh = append(mesh, r)
		} else {
			py = append(py, r)
		}
	}
	byN := func(a, b MemoryRow) int { return cmp.Compare(a.Instances, b.Instances) }
	slices.SortFunc(mesh, byN)
	slices.SortFunc(py, byN)
	var why []string
	meshOK := len(mesh) >= 2
	if !meshOK {
		why = append(why, "mesh: fewer than two frontend counts measured")
	}
	for _, r := range mesh {
		bound := m.TableBytes + m.BaseBytes + int64(r.Instances)*m.PerInstanceBytes
		if r.PSSBytes > bound {
			meshOK = false
			why = append(why, fmt.Sprintf("mesh with %d frontends: PSS %s > bound %s", r.Instances, mib(r.PSSBytes), mib(bound)))
		}
	}
	pyName := "python arm"
	if len(py) > 0 {
		pyName = py[0].Arm
	}
	pyGrows := len(py) >= 2
	if !pyGrows {
		why = append(why, pyName+": fewer than two process counts measured")
	}
	for i := 1; i < len(py); i++ {
		if py[i].PSSBytes <= py[i-1].PSSBytes {
			pyGrows = false
			why = append(why, fmt.Sprintf("%s: PSS did not grow from %d to %d processes", pyName, py[i-1].Instances, py[i].Instances))
		}
	}
	ok = meshOK && pyGrows
	verdict := "PASS"
	if !ok {
		verdict = "FAIL"
	}
	text = fmt.Sprintf("memory check: %s — mesh PSS within table (%s) + %s + %s per frontend: %v; %s PSS grows with each process: %v",
		verdict, mib(m.TableBytes), mib(m.BaseBytes), mib(m.PerInstanceBytes), meshOK, pyName, pyGrows)
	if len(mesh) >= 2 {
		first, last := mesh[0], mesh[len(mesh)-1]
		text += fmt.Sprintf("; mesh +%s per added frontend", mib((last.PSSBytes-first.PSSBytes)/int64(max(1, last.Instances-first.Instances))))
	}
	if len(py) >= 2 {
		first, last := py[0], py[len(py)-1]
		text += fmt.Sprintf(", %s +%s per added process", pyName, mib((last.PSSBytes-first.PSSBytes)/int64(max(1, last.Instances-first.Instances))))
	}
	if len(why) > 0 {
		text += " (" + strings.Join(why, "; ") + ")"
	}
	return ok, text
}

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }
