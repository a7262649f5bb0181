package loadgen

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/recmesh/recmesh/bench/monitor"
	"github.com/recmesh/recmesh/bench/stall"
)

// PointSchema names the JSON layout of a Point; bump it on an
// incompatible change so a report can refuse files it does not understand.
const PointSchema = "recmesh.bench.point/v1"

// Point is one measured configuration (an arm at one B_req and one C or
// rate), with every repeat and a summary: what one JSON file holds.
type Point struct {
	Schema string `json:"schema"`
	// Arm and Label are free-form names given by the caller.
	Arm   string `json:"arm,omitempty"`
	Label string `json:"label,omitempty"`

	Target         string  `json:"target"`
	Model          string  `json:"model"`
	Mode           Mode    `json:"mode"`
	BatchSize      int     `json:"batch_size"`
	Concurrency    int     `json:"concurrency,omitempty"`
	RateRPS        float64 `json:"rate_rps,omitempty"`
	MaxOutstanding int     `json:"max_outstanding,omitempty"`
	Connections    int     `json:"connections"`
	WarmupS        float64 `json:"warmup_s"`
	DurationS      float64 `json:"duration_s"`
	TimeoutS       float64 `json:"timeout_s"`
	Repeats        int     `json:"repeats"`

	// The workload: distinct requests cycled, their size, the id type
	// and the input seed.
	PoolRequests int    `json:"pool_requests"`
	RequestBytes int    `json:"request_bytes"`
	SparseType   string `json:"sparse_type"`
	Seed         uint64 `json:"seed"`
	// Bundle is where the model config came from (a directory, or
	// "max-vocab=N").
	Bundle string `json:"bundle"`

	// The client: which gRPC client sent the calls (ClientLean,
	// ClientGRPC), its CPU pinning ("" when not pinned) and GOMAXPROCS.
	Client     string    `json:"client,omitempty"`
	ClientCPUs string    `json:"client_cpus,omitempty"`
	GOMAXPROCS int       `json:"gomaxprocs"`
	GoVersion  string    `json:"go_version"`
	Host       string    `json:"host"`
	StartedAt  time.Time `json:"started_at"`

	// MonitorPIDs are the server processes the monitor watched, if any.
	MonitorPIDs []int `json:"monitor_pids,omitempty"`

	Runs    []RunRecord `json:"runs"`
	Summary Summary     `json:"summary"`
	// SetAside are repeats measured again because the host stalled a
	// watched CPU during them for longer than the caller allows (benchrun
	// -stall-remeasure); they are kept here, not summarised.
	SetAside []RunRecord `json:"set_aside,omitempty"`
}

// RunRecord is one repeat: the load generator's Result and, when server
// processes were watched, the resource monitor's report over the same
// measured window.
type RunRecord struct {
	Repeat int `json:"repeat"`
	*Result
	Monitor *monitor.Report `json:"monitor,omitempty"`
	// Stalls is what the stall probes saw over the window, one per CPU
	// watched (loadgen run -stall-cpus).
	Stalls []*stall.Report `json:"stalls,omitempty"`
	// Client is the load generator's own CPU use over the window, when
	// the caller measured it.
	Client *ClientUsage `json:"client,omitempty"`
}

// SaturationFraction is the share of its CPUs above which the load
// generator counts as saturated: past it, the client rather than the
// server may be what limits the point, so the point says nothing about the
// server and is never used for a headline.
const SaturationFraction = 0.9

// ClientUsage is the load generator's CPU use over one measured window.
type ClientUsage struct {
	CPUSeconds  float64 `json:"cpu_s"`
	WallSeconds float64 `json:"wall_s"`
	// CPUCores is CPUSeconds over WallSeconds, and CPUs how many CPUs the
	// load generator may run on.
	CPUCores float64 `json:"cpu_cores"`
	CPUs     int     `json:"cpus"`
	// Saturated is CPUCores ≥ SaturationFraction × CPUs.
	Saturated bool `json:"saturated"`
}

// NewClientUsage derives the cores used and the saturation verdict.
func NewClientUsage(cpuSeconds, wallSeconds float64, cpus int) *ClientUsage {
	u := &ClientUsage{CPUSeconds: cpuSeconds, WallSeconds: wallSeconds, CPUs: cpus}
	if wallSeconds > 0 {
		u.CPUCores = cpuSeconds / wallSeconds
	}
	u.Saturated = cpus > 0 && u.CPUCores >= SaturationFraction*float64(cpus)
	return u
}

// Summary condenses the repeats: medians of the rates and percentiles
// (the methodology reports medians of repeats), the worst max, the total
// errors, and the monitor's median CPU cost and largest peaks.
type Summary struct {
	Repeats      int     `json:"repeats"`
	RequestsPerS float64 `json:"requests_per_s"`
	ExamplesPerS float64 `json:"examples_per_s"`
	P50Ms        float64 `json:"p50_ms"`
	P90Ms        float64 `json:"p90_ms"`
	P99Ms        float64 `json:"p99_ms"`
	P999Ms       float64 `json:"p999_ms"`
	MaxMs        float64 `json:"max_ms"`
	Errors       int64   `json:"errors"`
	// Present only when a monitor ran.
	ServerCPUCores          float64 `json:"server_cpu_cores,omitempty"`
	ServerCPUSPer1kExamples float64 `json:"server_cpu_s_per_1k_examples,omitempty"`
	ServerPeakRSSBytes      int64   `json:"server_peak_rss_bytes,omitempty"`
	ServerPeakPSSBytes      int64   `json:"server_peak_pss_bytes,omitempty"`
	// Present only when the client measured itself: its median cores and
	// whether any repeat saturated it.
	ClientCPUCores  float64 `json:"client_cpu_cores,omitempty"`
	ClientSaturated bool    `json:"client_saturated,omitempty"`
}

// Summarize fills p.Summary from p.Runs.
func (p *Point) Summarize() {
	s := Summary{Repeats: len(p.Runs)}
	col := func(f func(r RunRecord) float64) float64 {
		var v []float64
		for _, r := range p.Runs {
			v = append(v, f(r))
		}
		return median(v)
	}
	s.RequestsPerS = col(func(r RunRecord) float64 { return r.RequestsPerS })
	s.ExamplesPerS = col(func(r RunRecord) float64 { return r.ExamplesPerS })
	s.P50Ms = col(func(r RunRecord) float64 { return r.Latency.P50 })
	s.P90Ms = col(func(r RunRecord) float64 { return r.Latency.P90 })
	s.P99Ms = col(func(r RunRecord) float64 { return r.Latency.P99 })
	s.P999Ms = col(func(r RunRecord) float64 { return r.Latency.P999 })
	var mons []RunRecord
	var clientCores []float64
	for _, r := range p.Runs {
		if r.Client != nil {
			clientCores = append(clientCores, r.Client.CPUCores)
			s.ClientSaturated = s.ClientSaturated || r.Client.Saturated
		}
		s.MaxMs = max(s.MaxMs, r.Latency.Max)
		s.Errors += r.Errors
		if r.Monitor != nil {
			mons = append(mons, r)
			s.ServerPeakRSSBytes = max(s.ServerPeakRSSBytes, r.Monitor.PeakRSSBytes)
			s.ServerPeakPSSBytes = max(s.ServerPeakPSSBytes, r.Monitor.PeakPSSBytes)
		}
	}
	if len(mons) > 0 {
		var cores, per []float64
		for _, r := range mons {
			cores = append(cores, r.Monitor.CPUCores)
			per = append(per, r.Monitor.CPUSecondsPer1kExamples)
		}
		s.ServerCPUCores = median(cores)
		s.ServerCPUSPer1kExamples = median(per)
	}
	s.ClientCPUCores = median(clientCores)
	p.Summary = s
}

// median of v (the mean of the middle two for an even count; 0 if empty).
func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	v = slices.Clone(v)
	slices.Sort(v)
	m := len(v) / 2
	if len(v)%2 == 1 {
		return v[m]
	}
	return (v[m-1] + v[m]) / 2
}

// WriteFile writes p as indented JSON to path, through a temporary file
// and a rename, so a reader never sees half a point.
func (p *Point) WriteFile(path string) error {
	b, err := json.MarshalIndent(p, "", "  ")
	if err != nil {
		return fmt.Errorf("loadgen: encode point: %w", err)
	}
	if dir := filepath.Dir(path); dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("loadgen: write point: %w", err)
		}
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("loadgen: write point: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("loadgen: write point: %w", err)
	}
	return nil
}

// ReadPoint reads a point file written by WriteFile.
func ReadPoint(path string) (*Point, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("loadgen: read point: %w", err)
	}
	var p Point
	if err := json.Unmarshal(b, &p); err != nil {
		return nil, fmt.Errorf("loadgen: read point %s: %w", path, err)
	}
	if p.Schema != PointSchema {
		return nil, fmt.Errorf("loadgen: read point %s: schema %q, want %q", path, p.Schema, PointSchema)
	}
	return &p, nil
}
