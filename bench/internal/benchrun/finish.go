package benchrun

import (
	"fmt"
	"path/filepath"
	"strings"

	"google.golang.org/grpc/codes"

	"github.com/recmesh/recmesh/bench/loadgen"
	"github.com/recmesh/recmesh/bench/report"
	"github.com/recmesh/recmesh/proto/oip"
)

// finish writes the report and prints the summary lines, last.
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
	for _, l := range report.SuiteLines(runs) {
		fmt.Fprintln(c.out, l)
	}
	return nil
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
