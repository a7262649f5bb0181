package benchrun

import (
	"context"
	"fmt"
	"runtime"
	"time"

	"github.com/recmesh/recmesh/bench/cpuset"
	"github.com/recmesh/recmesh/bench/loadgen"
	"github.com/recmesh/recmesh/bench/parity"
	"github.com/recmesh/recmesh/bench/report"
	"github.com/recmesh/recmesh/bench/stall"
	"github.com/recmesh/recmesh/model"
	"github.com/recmesh/recmesh/proto/oip"
)

// maxRemeasures is how many times one repeat is measured again after host
// stalls: a host that keeps stalling gets its stalls reported, not hidden.
const maxRemeasures = 2

// point measures one configuration: repeats of warm-up plus window, the
// monitor on the arm's process tree over each window.
func (c *config) point(ctx context.Context, arm, label string, srv *server, pool loadgen.Client, w *loadgen.Workload,
	rc loadgen.Config, repeats int) (*loadgen.Point, error) {
	if rc.Mode == loadgen.Open {
		rc.MaxOutstanding = loadgen.DefaultMaxOutstanding
	}
	p := loadgen.NewPoint(pool, w, rc, repeats)
	p.Arm, p.Label, p.Target, p.Model = arm, label, srv.addr, oip.DefaultModelName
	p.Seed, p.Bundle, p.ClientCPUs, p.MonitorPIDs = 1, c.bundle, c.load.cpus, []int{srv.pid}
	load := fmt.Sprintf("C=%d", p.Concurrency)
	if rc.Mode == loadgen.Open {
		load = fmt.Sprintf("%s rate=%.0f/s", label, p.RateRPS)
	}
	watch := loadgen.Watch{PIDs: []int{srv.pid}, Descendants: true, StallCPUs: c.stalls.cpus, ClientCPUs: c.clientCPUCount()}
	for i := range repeats {
		rc.Seed = 1 + uint64(i)
		for try := 0; ; try++ {
			rec, err := loadgen.Measure(ctx, pool, w, rc, watch)
			if err != nil {
				return nil, fmt.Errorf("%s %s B_req %d: %w", arm, label, w.BatchSize, err)
			}
			rec.Repeat = i + 1
			worst := stall.Worst(rec.Stalls)
			if c.stalls.remeasure <= 0 || worst == nil || worst.MaxDelayMs <= ms(c.stalls.remeasure) || try == maxRemeasures {
				p.Runs = append(p.Runs, rec)
				break
			}
			fmt.Fprintf(c.out, "benchrun:   %s B_req=%d %s: repeat %d set aside, host stall %.1f ms (CPU %d) over %v; measuring again\n",
				arm, p.BatchSize, load, i+1, worst.MaxDelayMs, worst.CPU, c.stalls.remeasure)
			p.SetAside = append(p.SetAside, rec)
		}
	}
	p.Summarize()
	c.printPoint(p, load)
	return p, nil
}

// printPoint prints the line of a measured point.
func (c *config) printPoint(p *loadgen.Point, load string) {
	s := p.Summary
	sat := ""
	if s.ClientSaturated {
		sat = " (client saturated: not a headline point)"
	}
	var stalls []*stall.Report
	for _, r := range p.Runs {
		stalls = append(stalls, r.Stalls...)
	}
	fmt.Fprintf(c.out, "benchrun:   %s B_req=%d %s: %.0f examples/s, p50 %.2f p99 %.2f ms, %d errors, server %.2f cores %.3f CPU-s/1k, PSS %.0f MiB, client %.2f cores%s%s\n",
		p.Arm, p.BatchSize, load, s.ExamplesPerS, s.P50Ms, s.P99Ms, s.Errors, s.ServerCPUCores, s.ServerCPUSPer1kExamples, float64(s.ServerPeakPSSBytes)/(1<<20), s.ClientCPUCores, stall.Summary(stalls), sat)
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// clientCPUCount is how many CPUs the load generator may use.
func (c *config) clientCPUCount() int {
	if c.load.cpus != "" {
		if set, err := cpuset.Parse(c.load.cpus); err == nil && set.Count() > 0 {
			return set.Count()
		}
	}
	return runtime.NumCPU()
}

// parity compares the arm's scores with the plain-Go reference. The
// bundle is opened for the check only, so the runner does not hold the
// tables while the arm is measured.
func (c *config) parity(ctx context.Context, addr string) (*report.Parity, error) {
	cfg, ref, done, err := c.reference()
	if err != nil {
		return nil, err
	}
	defer done()
	rctx, cancel := context.WithTimeout(ctx, c.server.readyTimeout)
	pool, err := loadgen.DialReady(rctx, addr, oip.DefaultModelName, 1)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("parity: %w", err)
	}
	defer pool.Close()
	res, err := parity.Check(ctx, pool.Client(0), cfg, ref, parity.Options{Examples: c.server.parityExamples})
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(c.out, "benchrun:   %s\n", res)
	p := &report.Parity{Pass: res.Pass, MaxAbsDiff: res.MaxAbsDiff, Tolerance: res.Tolerance, Examples: res.Examples}
	if !res.Pass {
		return p, fmt.Errorf("parity failed (max|Δ| %.3g > %.3g): not measured", res.MaxAbsDiff, res.Tolerance)
	}
	return p, nil
}

// dialLoad opens n connections of the configured client to addr, once
// the server and the model are ready.
func (c *config) dialLoad(ctx context.Context, addr string, n int) (loadgen.Client, error) {
	rctx, cancel := context.WithTimeout(ctx, c.server.readyTimeout)
	defer cancel()
	return loadgen.Dial(rctx, c.load.client, addr, oip.DefaultModelName, n)
}

// generatedTableMemory is how much of the regenerated reference's tables
// it keeps in memory (the smallest tables, read most often per row); the
// rest are drawn again on every read.
const generatedTableMemory = 256 << 20

// reference is the parity check's reference over the current bundle and a
// func that releases it: the bundle's own tables, or with
// -generated-reference every weight drawn again from the bundle's seed.
func (c *config) reference() (model.Config, *model.Reference, func(), error) {
	if c.server.generatedReference {
		cfg, err := readConfig(c.bundle)
		if err != nil {
			return model.Config{}, nil, nil, err
		}
		ref, err := model.NewGeneratedReference(cfg, cfg.Seed, generatedTableMemory)
		if err != nil {
			return model.Config{}, nil, nil, fmt.Errorf("parity: %w", err)
		}
		return cfg, ref, func() {}, nil
	}
	b, ref, err := parity.OpenReference(c.bundle)
	if err != nil {
		return model.Config{}, nil, nil, err
	}
	return b.Config, ref, func() { b.Close() }, nil
}
