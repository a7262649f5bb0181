package benchrun

import (
	"fmt"
	"path/filepath"
	"strings"

	"google.golang.org/grpc/codes"

	"github.com/recmesh/recmesh/bench/loadgen"
	"github.com/recmesh/recmesh/bench/report"
	"github.com/recmesh/recmesh/model"
	"github.com/recmesh/recmesh/proto/oip"
)

// finish writes the report and prints the summary lines, last: the
// `bench:`, `bench-ratio:`, `bench-open:` and `bench-memory:` lines of
// report.SuiteLines, each with dtype=<d> dense_dtype=<d> appended.
func finish(c *config, runs []*report.Run) error {
	if err := report.WriteSuite(c.results, runs, c.charts); err != nil {
		return err
	}
	fmt.Fprintf(c.out, "benchrun: wrote %s\n", filepath.Join(c.results, report.ReportFile))
	for _, r := range runs {
		if r.Memory != nil {
			_, v := report.MemoryVerdict(r.Memory)
			fmt.Fprintln(c.out, v)
		}
	}
	for _, l := range suiteLines(runs) {
		fmt.Fprintln(c.out, l)
	}
	if c.fullSize {
		for _, r := range runs {
			cfg, err := readConfig(r.Env.Bundle)
			if err != nil {
				return fmt.Errorf("full-size line of workload %s: %w", r.Workload, err)
			}
			fmt.Fprintln(c.out, fullSizeLine(r, cfg))
		}
	}
	return nil
}

// linePrefixes are the kinds of summary line, in the order
// report.SuiteLines gives them.
var linePrefixes = []string{"bench: ", "bench-ratio: ", "bench-open: ", "bench-memory: "}

// suiteLines are report.SuiteLines, in the same order, each ending with
// the dtype=<d> of the tables its workload served and the dense_dtype=<d>
// of its dense weights (see runDtype).
func suiteLines(runs []*report.Run) []string {
	byRun := make([][]string, len(runs))
	for i, r := range runs {
		d, dd := runDtype(r), runDenseDtype(r)
		for _, l := range report.SuiteLines([]*report.Run{r}) {
			byRun[i] = append(byRun[i], l+" dtype="+d+" dense_dtype="+dd)
		}
	}
	var out []string
	for _, prefix := range linePrefixes {
		for _, lines := range byRun {
			n := 0
			for _, l := range lines {
				if strings.HasPrefix(l, prefix) {
					out = append(out, l)
					n++
				}
			}
			// One bench-memory: line in all, the first workload's that
			// has one (report.SuiteLines).
			if prefix == "bench-memory: " && n > 0 {
				break
			}
		}
	}
	return out
}

// dtypeNotePrefix starts the run's note on its table precision, which
// environment writes and runDtype reads back.
const dtypeNotePrefix = "Embedding tables: "

// dtypeNote is the run's note on the precision of its tables.
func dtypeNote(cfg model.Config) string {
	how := "."
	if cfg.TableDtype.String() != model.DtypeFP32.String() {
		how = ", the mesh's embedder and the Python arms' NumPy gather each dequantizing the rows it pools."
	}
	return fmt.Sprintf("%s%s (config.json table_dtype), %.1f MiB: every arm serves them at that precision%s",
		dtypeNotePrefix, cfg.TableDtype, float64(cfg.TableBytes())/(1<<20), how)
}

// runDtype is the precision of the tables a run served: from its note
// (runs since precisions were recorded), else from its bundle's
// config.json, else fp32 (the only precision before there were others).
func runDtype(r *report.Run) string {
	for _, n := range r.Env.Notes {
		if rest, ok := strings.CutPrefix(n, dtypeNotePrefix); ok {
			if d, _, _ := strings.Cut(rest, " "); d != "" {
				return d
			}
		}
	}
	if r.Env.Bundle != "" {
		if cfg, err := loadgen.ReadConfig(r.Env.Bundle); err == nil {
			return cfg.TableDtype.String()
		}
	}
	return model.DtypeFP32.String()
}

// denseNotePrefix starts the run's note on its dense weights' precision.
const denseNotePrefix = "Dense weights: "

// denseNote is the run's note on the precision of its dense weights.
func denseNote(cfg model.Config) string {
	how := "."
	if cfg.DenseDtype.String() != model.DenseFP32.String() {
		how = ", the mesh's strip kernel and the Python arms' JAX programs each reading the stored halves as the model defines them (widened exactly to float32)."
	}
	return fmt.Sprintf("%s%s (config.json dense_dtype), %.1f MiB: every arm serves them at that precision%s",
		denseNotePrefix, cfg.DenseDtype, float64(cfg.DenseBytes())/(1<<20), how)
}

// runDenseDtype is the precision of the dense weights a run served, read
// as runDtype reads the tables'.
func runDenseDtype(r *report.Run) string {
	for _, n := range r.Env.Notes {
		if rest, ok := strings.CutPrefix(n, denseNotePrefix); ok {
			if d, _, _ := strings.Cut(rest, " "); d != "" {
				return d
			}
		}
	}
	if r.Env.Bundle != "" {
		if cfg, err := loadgen.ReadConfig(r.Env.Bundle); err == nil {
			return cfg.DenseDtype.String()
		}
	}
	return model.DenseFP32.String()
}

// strictCheck fails a run in which any arm failed to start or to pass
// parity, or any measured request failed.
func strictCheck(runs []*report.Run) error {
	var bad []string
	for _, r := range runs {
		for _, a := range r.Arms {
			if a.Error != "" {
				bad = append(bad, fmt.Sprintf("%s/%s: %s", r.Workload, a.Name, firstLine(a.Error)))
			} else if a.Parity == nil || !a.Parity.Pass {
				bad = append(bad, fmt.Sprintf("%s/%s: no parity pass", r.Workload, a.Name))
			}
		}
		for _, p := range r.Points {
			if n := failures(p); n > 0 {
				bad = append(bad, fmt.Sprintf("%s/%s B_req %d %s C=%d: %d failed requests", r.Workload, p.Arm, p.BatchSize, p.Label, p.Concurrency, n))
			}
		}
		if r.Memory != nil {
			for _, row := range r.Memory.Rows {
				if row.Error != "" {
					bad = append(bad, fmt.Sprintf("%s/memory %s × %d: %s", r.Workload, row.Arm, row.Instances, firstLine(row.Error)))
				}
			}
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("-strict: %d problem(s):\n  %s", len(bad), strings.Join(bad, "\n  "))
	}
	return nil
}

// failures counts a point's failed requests, less those refused with
// RESOURCE_EXHAUSTED: shedding load it cannot serve within the latency
// target is what an SLO-aware server is meant to do, and the report
// already keeps such points out of the budget tables.
func failures(p *loadgen.Point) int64 {
	var n int64
	for _, r := range p.Runs {
		if r.Result == nil {
			continue
		}
		n += r.Errors - r.ErrorsByCode[oip.CodeName(codes.ResourceExhausted)]
	}
	return n
}

func firstLine(s string) string {
	first, _, _ := strings.Cut(s, "\n")
	return first
}
