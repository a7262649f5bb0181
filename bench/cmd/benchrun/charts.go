package main

import (
	"fmt"
	"path/filepath"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"

	"github.com/recmesh/recmesh/bench/loadgen"
	"github.com/recmesh/recmesh/bench/report"
)

// Chart size: wide enough for a legend beside five arms.
const (
	chartWidth  = 7 * vg.Inch
	chartHeight = 4.5 * vg.Inch
)

// writeCharts draws, per request size, throughput against concurrent
// clients and p99 against throughput (one line per arm, closed loop), as
// SVG files in dir. It returns their names, relative to dir: it is the
// report's Charts.
func writeCharts(dir string, points []*loadgen.Point) ([]string, error) {
	var files []string
	for _, b := range report.Batches(points) {
		p, err := throughputVsClients(points, b)
		if err != nil {
			return nil, err
		}
		if err := p.Save(chartWidth, chartHeight, filepath.Join(dir, report.ThroughputChart(b))); err != nil {
			return nil, fmt.Errorf("report: save chart: %w", err)
		}
		files = append(files, report.ThroughputChart(b))
		p, err = latencyVsThroughput(points, b)
		if err != nil {
			return nil, err
		}
		if err := p.Save(chartWidth, chartHeight, filepath.Join(dir, report.LatencyChart(b))); err != nil {
			return nil, fmt.Errorf("report: save chart: %w", err)
		}
		files = append(files, report.LatencyChart(b))
	}
	return files, nil
}

func addArm(p *plot.Plot, i int, name string, xys plotter.XYs) error {
	if len(xys) == 0 {
		return nil
	}
	line, pts, err := plotter.NewLinePoints(xys)
	if err != nil {
		return fmt.Errorf("report: chart %s: %w", name, err)
	}
	line.Color = plotutil.Color(i)
	line.Width = vg.Points(1.5)
	pts.Color = plotutil.Color(i)
	pts.Shape = plotutil.Shape(i)
	p.Add(line, pts)
	p.Legend.Add(name, line, pts)
	return nil
}

func newPlot(title string) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.Legend.Top = true
	p.Legend.Left = true
	p.Add(plotter.NewGrid())
	return p
}

func throughputVsClients(points []*loadgen.Point, b int) (*plot.Plot, error) {
	p := newPlot(fmt.Sprintf("Closed-loop throughput, B_req = %d", b))
	p.X.Label.Text = "concurrent clients (C)"
	p.Y.Label.Text = "examples/s (median of repeats)"
	// C doubles or quadruples per step: a log axis with a tick at each
	// measured C reads best.
	p.X.Scale = plot.LogScale{}
	var ticks []plot.Tick
	for _, c := range report.Clients(points) {
		ticks = append(ticks, plot.Tick{Value: float64(c), Label: strconv.Itoa(c)})
	}
	p.X.Tick.Marker = plot.ConstantTicks(ticks)
	// Fixed ranges: a log axis whose data span one value would otherwise
	// be padded down to 0, which it cannot show.
	if cs := report.Clients(points); len(cs) > 0 {
		p.X.Min, p.X.Max = float64(cs[0])/1.25, float64(cs[len(cs)-1])*1.25
	}
	p.Y.Min = 0
	for i, arm := range report.ArmNames(points) {
		var xys plotter.XYs
		for _, pt := range report.Series(points, arm, b) {
			xys = append(xys, plotter.XY{X: float64(pt.Concurrency), Y: pt.Summary.ExamplesPerS})
		}
		if err := addArm(p, i, arm, xys); err != nil {
			return nil, err
		}
	}
	return p, nil
}

func latencyVsThroughput(points []*loadgen.Point, b int) (*plot.Plot, error) {
	p := newPlot(fmt.Sprintf("p99 latency vs throughput, B_req = %d (lower right is better)", b))
	p.X.Label.Text = "examples/s (median of repeats)"
	p.Y.Label.Text = "p99 latency, ms (log)"
	p.Y.Scale = plot.LogScale{}
	p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	p.X.Min = 0
	maxX, minY, maxY := 0.0, float64(report.HeadlineBudgetMs), float64(report.HeadlineBudgetMs)
	for i, arm := range report.ArmNames(points) {
		var xys plotter.XYs
		for _, pt := range report.Series(points, arm, b) {
			// A log axis cannot show 0; a p99 that rounds to 0 is below
			// the histogram's resolution anyway.
			xys = append(xys, plotter.XY{X: pt.Summary.ExamplesPerS, Y: max(pt.Summary.P99Ms, 0.01)})
			maxX = max(maxX, pt.Summary.ExamplesPerS)
			minY, maxY = min(minY, max(pt.Summary.P99Ms, 0.01)), max(maxY, pt.Summary.P99Ms)
		}
		if err := addArm(p, i, arm, xys); err != nil {
			return nil, err
		}
	}
	p.Y.Min, p.Y.Max = minY/1.5, maxY*1.5
	// The headline budget as a dashed line.
	if maxX > 0 {
		budget, err := plotter.NewLine(plotter.XYs{{X: 0, Y: report.HeadlineBudgetMs}, {X: maxX, Y: report.HeadlineBudgetMs}})
		if err != nil {
			return nil, fmt.Errorf("report: chart budget line: %w", err)
		}
		budget.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		p.Add(budget)
		p.Legend.Add(fmt.Sprintf("p99 = %d ms", report.HeadlineBudgetMs), budget)
	}
	return p, nil
}
