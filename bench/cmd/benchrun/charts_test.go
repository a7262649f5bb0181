package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/recmesh/recmesh/bench/loadgen"
	"github.com/recmesh/recmesh/bench/report"
)

// closedPoint is a summarised closed-loop point of one repeat.
func closedPoint(arm string, b, c int, examplesPerS, p99Ms float64) *loadgen.Point {
	p := &loadgen.Point{Schema: loadgen.PointSchema, Arm: arm, Label: report.LabelClosed, Mode: loadgen.Closed, BatchSize: b, Concurrency: c}
	res := &loadgen.Result{ExamplesPerS: examplesPerS, RequestsPerS: examplesPerS / float64(b), Latency: loadgen.LatencySummary{P50: p99Ms / 2, P99: p99Ms}}
	p.Runs = []loadgen.RunRecord{{Repeat: 1, Result: res}}
	p.Summarize()
	return p
}

// TestChartsInReport renders a report with the command's charts: two SVG
// files per request size, complete, and linked from REPORT.md.
func TestChartsInReport(t *testing.T) {
	var points []*loadgen.Point
	for _, arm := range []string{"recmesh-full", "py-mp"} {
		for _, b := range []int{1, 16} {
			for i, c := range []int{1, 4, 16} {
				points = append(points, closedPoint(arm, b, c, float64(1000*b*(i+1)), float64(5*(i+1))))
			}
		}
	}
	// A p99 of 0 (below the histogram's resolution) must still plot on
	// the log axis.
	points = append(points, closedPoint("py", 1, 1, 300, 0))
	dir := t.TempDir()
	if err := report.Write(dir, &report.Run{Points: points}, writeCharts); err != nil {
		t.Fatal(err)
	}
	md, err := os.ReadFile(filepath.Join(dir, report.ReportFile))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"![Throughput vs concurrent clients, B_req 16](throughput-vs-clients-b16.svg)",
		"![p99 latency vs throughput, B_req 1](p99-vs-throughput-b1.svg)",
	} {
		if !strings.Contains(string(md), want) {
			t.Errorf("REPORT.md lacks %q", want)
		}
	}
	for _, f := range []string{"throughput-vs-clients-b1.svg", "throughput-vs-clients-b16.svg", "p99-vs-throughput-b1.svg", "p99-vs-throughput-b16.svg"} {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		if len(b) < 1000 || !strings.Contains(string(b), "<svg") || !strings.Contains(string(b), "</svg>") {
			t.Errorf("%s: %d bytes, not a complete SVG", f, len(b))
		}
	}
}
