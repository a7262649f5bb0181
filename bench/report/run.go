// Package report turns a benchmark sweep (the point files of
// recmesh.bench.point/v1 plus the run's manifest) into the tables of the
// published DLRM serving study: throughput under p99 budgets with a
// recmesh-vs-best-Python column, the unbounded peak per arm, C = 1 latency,
// server CPU-seconds per 1,000 examples, peak memory, open-loop p99 per
// repeat, the memory-scaling check, and SVG charts referenced from
// REPORT.md. It also prints the one-line-per-arm summary `make bench` ends
// with.
package report

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/recmesh/recmesh/bench/loadgen"
)

// RunSchema names the manifest layout; bump it on an incompatible change.
const RunSchema = "recmesh.bench.run/v1"

// ManifestFile is the manifest's name inside the results directory.
const ManifestFile = "run.json"

// Labels of the points the runner writes, so the report can tell the
// closed-loop sweep from the open-loop and memory points.
const (
	LabelClosed = "closed"
	LabelMemory = "memory"
	// An open-loop point is labelled "open" followed by its percentage of
	// the closed-loop peak, e.g. "open80".
	LabelOpenPrefix = "open"
	// An open-loop point at a fraction of the arm's peak under the
	// headline budget is labelled "budget" and its percentage, e.g.
	// "budget80".
	LabelBudgetPrefix = "budget"
)

// OpenLabel is the label of the open-loop point at fraction f of the peak.
func OpenLabel(f float64) string { return fmt.Sprintf("%s%.0f", LabelOpenPrefix, f*100) }

// BudgetLabel is the label of the open-loop point at fraction f of the
// arm's peak under the headline budget.
func BudgetLabel(f float64) string { return fmt.Sprintf("%s%.0f", LabelBudgetPrefix, f*100) }

// Run is the manifest of one sweep: what ran where, and which point files
// it wrote.
type Run struct {
	Schema string `json:"schema"`
	// Workload names the model the sweep served ("mlperf", "hostbound");
	// a suite holds one Run per workload.
	Workload   string    `json:"workload,omitempty"`
	StartedAt  time.Time `json:"started_at"`
	FinishedAt time.Time `json:"finished_at"`
	Env        Env       `json:"env"`
	Sweep      Sweep     `json:"sweep"`
	Arms       []Arm     `json:"arms"`
	// Memory is the memory-scaling check, when it ran.
	Memory *MemoryCheck `json:"memory,omitempty"`
	// DenseCost compares, on one server core, the dense network's time
	// per example with the lookups' (what makes a workload host-bound),
	// when it was measured.
	DenseCost *DenseCost `json:"dense_cost,omitempty"`
	// PointFiles are the closed- and open-loop points, relative to the
	// results directory.
	PointFiles []string `json:"point_files"`

	// Points are the loaded PointFiles (not serialised: the files are the
	// record).
	Points []*loadgen.Point `json:"-"`
}

// Env describes the machine and software the sweep ran on.
type Env struct {
	Host          string `json:"host"`
	CPUModel      string `json:"cpu_model"`
	CPUs          int    `json:"cpus"`
	MemTotalBytes int64  `json:"mem_total_bytes"`
	Kernel        string `json:"kernel"`
	// ServerCPUs and ClientCPUs are the pinning of the arms and of the
	// load generator ("" when not pinned).
	ServerCPUs string `json:"server_cpus"`
	// ServerSched is the scheduling policy of every arm's processes
	// (batch or other; empty in runs from before it was recorded).
	ServerSched string `json:"server_sched,omitempty"`
	ClientCPUs  string `json:"client_cpus"`
	// Versions: Go of the runner and the mesh, the Python arms' stack and
	// the PJRT plugin the accelerator loads.
	GoVersion  string            `json:"go_version"`
	Versions   map[string]string `json:"versions,omitempty"`
	PJRTPlugin string            `json:"pjrt_plugin,omitempty"`
	Bundle     string            `json:"bundle"`
	TableBytes int64             `json:"table_bytes"`
	MaxVocab   int               `json:"max_vocab"`
	Notes      []string          `json:"notes,omitempty"`
}

// Sweep holds the methodology's parameters as run.
type Sweep struct {
	Batches       []int     `json:"batches"`
	Clients       []int     `json:"clients"`
	OpenFractions []float64 `json:"open_fractions"`
	// BudgetFractions are open-loop rates as fractions of each arm's
	// peak under the headline budget: the throughput it claims, MLPerf's
	// server scenario checks that Poisson arrivals can be served at it.
	BudgetFractions []float64 `json:"budget_fractions,omitempty"`
	WarmupS         float64   `json:"warmup_s"`
	DurationS       float64   `json:"duration_s"`
	Repeats         int       `json:"repeats"`
	Connections     int       `json:"connections"`
	// Client is the load generator's gRPC client (loadgen.ClientLean,
	// loadgen.ClientGRPC); empty in runs from before it was recorded.
	Client      string `json:"client,omitempty"`
	Frontends   int    `json:"frontends"`
	PyProcesses int    `json:"py_processes"`
	PyWorkers   int    `json:"py_workers"`
}

// Arm kinds.
const (
	KindRecmesh = "recmesh"
	KindPython  = "python"
)

// Arm is one server set-up.
type Arm struct {
	Name   string `json:"name"`
	Kind   string `json:"kind"`
	Detail string `json:"detail"`
	// Parity is the pre-load check; an arm without a pass is not measured.
	Parity *Parity `json:"parity,omitempty"`
	// Error says why the arm was not (fully) measured.
	Error string `json:"error,omitempty"`
}

// Parity is the outcome of the parity check.
type Parity struct {
	Pass       bool    `json:"pass"`
	MaxAbsDiff float64 `json:"max_abs_diff"`
	Tolerance  float64 `json:"tolerance"`
	Examples   int     `json:"examples"`
}

// MemoryCheck is the memory-scaling experiment: each arm at 1, 2, 4, …
// frontends (recmesh) or processes (py-mp), its peak PSS under light load.
type MemoryCheck struct {
	TableBytes int64 `json:"table_bytes"`
	// The mesh passes when its peak PSS with N frontends is at most
	// TableBytes + BaseBytes + N·PerInstanceBytes.
	BaseBytes        int64       `json:"base_bytes"`
	PerInstanceBytes int64       `json:"per_instance_bytes"`
	BatchSize        int         `json:"batch_size"`
	Concurrency      int         `json:"concurrency"`
	Rows             []MemoryRow `json:"rows"`
}

// MemoryRow is one arm at one instance count.
type MemoryRow struct {
	Arm       string  `json:"arm"`
	Kind      string  `json:"kind"`
	Instances int     `json:"instances"`
	PSSBytes  int64   `json:"pss_bytes"`
	RSSBytes  int64   `json:"rss_bytes"`
	Parity    *Parity `json:"parity,omitempty"`
	Error     string  `json:"error,omitempty"`
}

// DenseCost is the dense network's cost against the embedding lookups
// per example on one core, at a few batch sizes.
type DenseCost struct {
	// CPUs is the core list both were measured on.
	CPUs string `json:"cpus"`
	// LookupExamplesPerS is the lookup kernel's examples per core-second
	// over the bundle's tables (214 scattered row reads per example).
	LookupExamplesPerS float64           `json:"lookup_examples_per_s"`
	Buckets            []DenseCostBucket `json:"buckets"`
}

// DenseCostBucket is the dense network at one batch size.
type DenseCostBucket struct {
	Bucket            int     `json:"bucket"`
	DenseExamplesPerS float64 `json:"dense_examples_per_s"`
}

// Ratio is the dense network's time per example over the lookups' (≤ 0.1
// makes the workload host-bound), 0 when either is unknown.
func (c *DenseCost) Ratio(b DenseCostBucket) float64 {
	if c == nil || b.DenseExamplesPerS <= 0 || c.LookupExamplesPerS <= 0 {
		return 0
	}
	return c.LookupExamplesPerS / b.DenseExamplesPerS
}

// KindOf classifies an arm by name: recmesh-* arms are the mesh,
// everything else a Python baseline.
func KindOf(arm string) string {
	if strings.HasPrefix(arm, "recmesh") {
		return KindRecmesh
	}
	return KindPython
}

// WriteManifest writes r as dir/run.json.
func (r *Run) WriteManifest(dir string) error {
	r.Schema = RunSchema
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return fmt.Errorf("report: encode manifest: %w", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("report: write manifest: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, ManifestFile), append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("report: write manifest: %w", err)
	}
	return nil
}

// Load reads dir/run.json and every point file it lists.
func Load(dir string) (*Run, error) {
	b, err := os.ReadFile(filepath.Join(dir, ManifestFile))
	if err != nil {
		return nil, fmt.Errorf("report: %w", err)
	}
	var r Run
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("report: manifest %s: %w", dir, err)
	}
	if r.Schema != RunSchema {
		return nil, fmt.Errorf("report: manifest %s: schema %q, want %q", dir, r.Schema, RunSchema)
	}
	for _, f := range r.PointFiles {
		p, err := loadgen.ReadPoint(filepath.Join(dir, f))
		if err != nil {
			return nil, err
		}
		r.Points = append(r.Points, p)
	}
	return &r, nil
}
