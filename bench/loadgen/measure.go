package loadgen

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"syscall"
	"time"

	"github.com/recmesh/recmesh/bench/monitor"
	"github.com/recmesh/recmesh/bench/stall"
	"github.com/recmesh/recmesh/proto/oip"
)

// Watch is what watches each measured window besides the load generator
// itself (Measure).
type Watch struct {
	// PIDs are the server processes the resource monitor samples (package
	// monitor), with every descendant when Descendants is set, every
	// Interval (0: monitor.DefaultInterval); no monitor when empty.
	PIDs        []int
	Descendants bool
	Interval    time.Duration
	// StallCPUs are watched for stalls no process causes, one probe per
	// CPU (package stall); the probe of the last also times the host's
	// memory through a buffer of MemoryProbeMiB when that is above 0.
	StallCPUs      []int
	MemoryProbeMiB int
	// ClientCPUs, when above 0, has this process's own CPU use over the
	// window recorded (RunRecord.Client) against that many CPUs: the load
	// generator's, with whatever else this process runs.
	ClientCPUs int
}

// Measure runs one repeat of rc with what watch names watching exactly
// its measured window.
func Measure(ctx context.Context, c Client, w *Workload, rc Config, watch Watch) (RunRecord, error) {
	var (
		mon          *monitor.Monitor
		rep          *monitor.Report
		monErr       error
		cpu0, cpu1   float64
		wall0, wall1 time.Time
		stalls       []*stall.Report
		stallErr     error
	)
	// The probes are set up before the warm-up, so that they watch from
	// the window's first instant and their start-up is not in the load
	// generator's CPU time. A cancelled run never reaches WindowEnd; they
	// end anyway.
	probes, err := stall.StartProbes(watch.StallCPUs, watch.MemoryProbeMiB)
	if err != nil {
		return RunRecord{}, fmt.Errorf("stall probe: %w", err)
	}
	defer func() { _, _ = probes.Stop() }()
	hooks := Hooks{
		WindowStart: func() {
			stallErr = probes.Begin()
			if watch.ClientCPUs > 0 {
				wall0, cpu0 = time.Now(), selfCPU()
			}
			if len(watch.PIDs) > 0 {
				mon, monErr = monitor.Start(monitor.Options{PIDs: watch.PIDs, Descendants: watch.Descendants, Interval: watch.Interval})
			}
		},
		WindowEnd: func() {
			if watch.ClientCPUs > 0 {
				wall1, cpu1 = time.Now(), selfCPU()
			}
			if mon != nil {
				rep, monErr = mon.Stop()
			}
			if stallErr == nil {
				stalls, stallErr = probes.Stop()
			}
		},
	}
	res, err := Run(ctx, c, w, rc, hooks)
	if err != nil {
		return RunRecord{}, err
	}
	if monErr != nil {
		return RunRecord{}, fmt.Errorf("monitor: %w", monErr)
	}
	if stallErr != nil {
		return RunRecord{}, fmt.Errorf("stall probe: %w", stallErr)
	}
	if rep != nil {
		rep.SetExamples(res.CompletedInWindow * int64(w.BatchSize))
	}
	rec := RunRecord{Result: res, Monitor: rep, Stalls: stalls}
	if !wall0.IsZero() && wall1.After(wall0) {
		rec.Client = NewClientUsage(cpu1-cpu0, wall1.Sub(wall0).Seconds(), watch.ClientCPUs)
	}
	return rec, nil
}

// selfCPU is this process's user+system CPU time in seconds.
func selfCPU() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
}

// NewPoint starts the record of a point: rc's load of w's requests over
// c's connections, repeats times, from this host. The caller names it
// (Arm, Label), says where the load went and what it came from (Target,
// Model, Seed, Bundle, ClientCPUs, MonitorPIDs) and appends the runs.
func NewPoint(c Client, w *Workload, rc Config, repeats int) *Point {
	host, _ := os.Hostname()
	p := &Point{
		Schema: PointSchema, Mode: rc.Mode, BatchSize: w.BatchSize, Connections: c.Len(),
		WarmupS: rc.Warmup.Seconds(), DurationS: rc.Duration.Seconds(), TimeoutS: rc.Timeout.Seconds(), Repeats: repeats,
		PoolRequests: len(w.Requests), RequestBytes: w.RequestBytes, SparseType: w.SparseType,
		Client: c.Kind(), GOMAXPROCS: runtime.GOMAXPROCS(0), GoVersion: runtime.Version(), Host: host, StartedAt: time.Now().UTC(),
	}
	if rc.Mode == Closed {
		p.Concurrency = rc.Concurrency
	} else {
		p.RateRPS, p.MaxOutstanding = rc.Rate, rc.MaxOutstanding
	}
	return p
}

// DialReady opens n grpc-go connections to target and waits, within ctx,
// until the server and modelName are ready.
func DialReady(ctx context.Context, target, modelName string, n int) (*oip.Pool, error) {
	pool, err := oip.Dial(ctx, target, n)
	if err != nil {
		return nil, err
	}
	if err := pool.WaitReady(ctx, modelName); err != nil {
		pool.Close()
		return nil, err
	}
	return pool, nil
}
