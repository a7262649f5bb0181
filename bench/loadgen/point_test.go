package loadgen

import (
	"path/filepath"
	"testing"

	"github.com/recmesh/recmesh/bench/monitor"
)

func TestPointSummaryRoundTrip(t *testing.T) {
	run := func(rps, p99 float64, errs int64, cpu float64) RunRecord {
		return RunRecord{
			Result:  &Result{RequestsPerS: rps, ExamplesPerS: 16 * rps, Errors: errs, Latency: LatencySummary{P50: p99 / 2, P99: p99, Max: 2 * p99}},
			Monitor: &monitor.Report{CPUCores: cpu, CPUSecondsPer1kExamples: cpu / 10, PeakRSSBytes: int64(cpu * 1e9)},
		}
	}
	p := &Point{Schema: PointSchema, Mode: Closed, BatchSize: 16, Runs: []RunRecord{run(100, 9, 0, 1), run(300, 3, 1, 3), run(200, 5, 2, 2)}}
	p.Summarize()
	s := p.Summary
	if s.Repeats != 3 || s.RequestsPerS != 200 || s.ExamplesPerS != 3200 || s.P99Ms != 5 || s.P50Ms != 2.5 ||
		s.MaxMs != 18 || s.Errors != 3 || s.ServerCPUCores != 2 || s.ServerCPUSPer1kExamples != 0.2 || s.ServerPeakRSSBytes != 3e9 {
		t.Errorf("summary %+v", s)
	}
	if m := median([]float64{4, 1, 3, 2}); m != 2.5 {
		t.Errorf("median of 1..4 = %v", m)
	}

	path := filepath.Join(t.TempDir(), "sub", "point.json")
	if err := p.WriteFile(path); err != nil {
		t.Fatal(err)
	}
	q, err := ReadPoint(path)
	if err != nil {
		t.Fatal(err)
	}
	if q.Summary != p.Summary || len(q.Runs) != 3 || q.Runs[1].RequestsPerS != 300 || q.Runs[1].Monitor.CPUCores != 3 {
		t.Errorf("round trip: %+v", q)
	}
}

// TestClientSaturation: one saturated repeat marks the point, and the
// median client cores come from every repeat that measured itself.
func TestClientSaturation(t *testing.T) {
	if u := NewClientUsage(0.5, 1, 1); u.Saturated || u.CPUCores != 0.5 {
		t.Errorf("half a core of one: %+v", u)
	}
	if u := NewClientUsage(1.9, 2, 1); !u.Saturated {
		t.Errorf("0.95 cores of one not saturated: %+v", u)
	}
	if u := NewClientUsage(1.9, 2, 2); u.Saturated {
		t.Errorf("0.95 cores of two saturated: %+v", u)
	}
	rec := func(cpu float64) RunRecord {
		return RunRecord{Result: &Result{RequestsPerS: 1}, Client: NewClientUsage(cpu, 1, 1)}
	}
	p := &Point{Schema: PointSchema, Mode: Closed, BatchSize: 1, Runs: []RunRecord{rec(0.2), rec(0.95), rec(0.4)}}
	p.Summarize()
	if !p.Summary.ClientSaturated || p.Summary.ClientCPUCores != 0.4 {
		t.Errorf("summary %+v, want saturated with median 0.4 cores", p.Summary)
	}
	p.Runs = p.Runs[:1]
	p.Summarize()
	if p.Summary.ClientSaturated {
		t.Error("a point with no saturated repeat is marked saturated")
	}
}
