package report

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"

	"github.com/recmesh/recmesh/bench/loadgen"
)

// Charts draws a workload's charts from its points into dir and returns
// their file names, relative to dir: per request size, ThroughputChart
// and LatencyChart. The benchrun command's draws them with gonum/plot,
// which its own module keeps out of the workspace (bench/cmd/benchrun);
// nil draws none.
type Charts func(dir string, points []*loadgen.Point) ([]string, error)

// Chart file names, by request size.
func ThroughputChart(b int) string { return fmt.Sprintf("throughput-vs-clients-b%d.svg", b) }
func LatencyChart(b int) string    { return fmt.Sprintf("p99-vs-throughput-b%d.svg", b) }

// chartTitle is a chart's alt text, from its file name.
func chartTitle(file string) string {
	name := strings.TrimSuffix(filepath.Base(file), ".svg")
	i := strings.LastIndex(name, "-b")
	b := name[i+2:]
	if strings.HasPrefix(name, "throughput") {
		return "Throughput vs concurrent clients, B_req " + b
	}
	return "p99 latency vs throughput, B_req " + b
}

// draw runs charts (when there are any) on dir.
func (charts Charts) draw(dir string, points []*loadgen.Point) ([]string, error) {
	if charts == nil {
		return nil, nil
	}
	return charts(dir, points)
}

// Series is one arm's closed-loop points at one request size, by C: one
// line of a chart.
func Series(points []*loadgen.Point, arm string, b int) []*loadgen.Point {
	var s []*loadgen.Point
	for _, p := range points {
		if p.Arm == arm && p.BatchSize == b && closed(p) && p.Summary.Repeats > 0 {
			s = append(s, p)
		}
	}
	slices.SortFunc(s, func(x, y *loadgen.Point) int { return x.Concurrency - y.Concurrency })
	return s
}
