package benchrun

import (
	"fmt"
	"strings"

	"github.com/recmesh/recmesh/bench/report"
	"github.com/recmesh/recmesh/model"
)

// fullSizeArm is the mesh arm the full-size line reports.
const fullSizeArm = "recmesh-slo"

// pyProcessOverhead is what a Python arm process needs beyond its table
// copy (interpreter, NumPy, JAX and its compiled buckets, gRPC), measured
// on the small bundle: about 400 MiB, rounded up.
const pyProcessOverhead = 512 << 20

// tableCopies is how many private copies of the tables a Python arm
// started with n processes holds: one per process that gathers (every
// frontend process of the py-mp arms, the one process of py and
// py-batch), as bench/python/server.py documents.
func tableCopies(spec armSpec, n int) int {
	if spec.multi() {
		return n
	}
	return 1
}

// errDoesNotFit starts the error of an arm that was not started because
// its tables would not fit in the machine's memory; the full-size line
// reports such an arm as did-not-fit.
const errDoesNotFit = "does not fit in memory"

// checkFits refuses a Python arm whose table copies, with its processes'
// overhead, exceed what the machine has available now: started anyway it
// would be killed by the kernel part-way through loading (or take the
// host down with it), which says nothing about the design.
func checkFits(spec armSpec, n int, tableBytes, availableBytes int64) error {
	copies := tableCopies(spec, n)
	procs := max(n, 1)
	if !spec.multi() {
		procs = 1
	}
	need := int64(copies)*tableBytes + int64(procs)*pyProcessOverhead
	if need <= availableBytes {
		return nil
	}
	return fmt.Errorf("%s: %d private table copies × %.1f GiB + %d × %.1f GiB per process = %.1f GiB, MemAvailable is %.1f GiB: not started",
		errDoesNotFit, copies, gib(tableBytes), procs, gib(pyProcessOverhead), gib(need), gib(availableBytes))
}

func gib(b int64) float64 { return float64(b) / (1 << 30) }

// fullSizeLine is the `full-size:` line of a run on the full-size tables:
//
//	full-size: dtype=<d> rows=<n> table_gib=<t> mesh_pss_gib=<p> parity_max_abs_diff=<d> b1=<ex/s> b16=<ex/s> b128=<ex/s> python=<ex/s or did-not-fit>
//
// b<N> are recmesh-slo's best closed-loop examples/s at B_req N with p99
// within the headline 20 ms budget (0: no point met it), mesh_pss_gib its
// largest PSS (the whole process tree, shared memory once) over the sweep,
// parity_max_abs_diff its parity check's, and python the best of every
// Python arm at B_req 16 under the same budget, or did-not-fit when every
// Python arm was refused for lack of memory.
func fullSizeLine(r *report.Run, cfg model.Config) string {
	var rows int64
	for _, v := range cfg.VocabSizes {
		rows += int64(v)
	}
	var pss int64
	for _, b := range report.Batches(r.Points) {
		_, p := report.PeakRSS(r.Points, fullSizeArm, b)
		pss = max(pss, p)
	}
	parity := "-"
	for _, a := range r.Arms {
		if a.Name == fullSizeArm && a.Parity != nil {
			parity = fmt.Sprintf("%.3g", a.Parity.MaxAbsDiff)
		}
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "full-size: dtype=%s rows=%d table_gib=%.2f mesh_pss_gib=%.2f parity_max_abs_diff=%s",
		cfg.TableDtype, rows, gib(cfg.TableBytes()), gib(pss), parity)
	for _, b := range []int{1, 16, 128} {
		v := 0.0
		if p := report.Best(r.Points, fullSizeArm, b, report.HeadlineBudgetMs); p != nil {
			v = p.Summary.ExamplesPerS
		}
		fmt.Fprintf(&sb, " b%d=%.0f", b, v)
	}
	fmt.Fprintf(&sb, " python=%s", pythonFullSize(r))
	return sb.String()
}

// pythonFullSize is the full-size line's python field (see fullSizeLine).
func pythonFullSize(r *report.Run) string {
	if p := report.BestOfKind(r.Points, report.KindPython, 16, report.HeadlineBudgetMs); p != nil {
		return fmt.Sprintf("%.0f", p.Summary.ExamplesPerS)
	}
	tried, refused := 0, 0
	for _, a := range r.Arms {
		if a.Kind != report.KindPython {
			continue
		}
		tried++
		if strings.Contains(a.Error, errDoesNotFit) {
			refused++
		}
	}
	if tried > 0 && refused == tried {
		return "did-not-fit"
	}
	return "0"
}
