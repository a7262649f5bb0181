package benchrun

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/recmesh/recmesh/bench/loadgen"
	"github.com/recmesh/recmesh/bench/report"
)

// sweepAll sweeps every workload into its own results subdirectory (the
// memory check with the first), then writes the report of them all.
func sweepAll(ctx context.Context, c *config) error {
	var runs []*report.Run
	var names []string
	for i, wl := range c.workloads {
		wc := *c
		wc.bundle = wl.bundle
		wc.results = filepath.Join(c.results, wl.name)
		if i > 0 {
			wc.memory.arms = nil
		}
		fmt.Fprintf(c.out, "benchrun: workload %s (%s)\n", wl.name, wl.bundle)
		r, err := sweep(ctx, &wc, wl.name)
		if err != nil {
			return fmt.Errorf("workload %s: %w", wl.name, err)
		}
		runs = append(runs, r)
		names = append(names, wl.name)
	}
	if err := report.WriteSuiteManifest(c.results, names); err != nil {
		return err
	}
	// Reload, so the report is rendered exactly as -report-only would.
	loaded, err := report.LoadSuite(c.results)
	if err != nil {
		return err
	}
	if err := finish(c, loaded); err != nil {
		return err
	}
	if c.strict {
		return strictCheck(loaded)
	}
	return nil
}

// sweep runs every arm on the current workload (c.bundle) into
// c.results and returns its manifest.
func sweep(ctx context.Context, c *config, name string) (*report.Run, error) {
	cfg, err := readConfig(c.bundle)
	if err != nil {
		return nil, err
	}
	r := &report.Run{
		Workload:  name,
		StartedAt: time.Now().UTC(),
		Env:       environment(c, cfg),
		Sweep:     c.sweepManifest(),
	}
	// Results of an earlier run of the same arms would mix into the
	// report; other subdirectories (smoke/, lookup/) are left alone.
	for _, d := range append(slices.Clone(c.arms), "memory") {
		if err := os.RemoveAll(filepath.Join(c.results, d)); err != nil {
			return nil, fmt.Errorf("clean results: %w", err)
		}
	}
	pools, err := c.requestPools(cfg)
	if err != nil {
		return nil, err
	}

	if c.denseCost {
		r.DenseCost = c.measureDenseCost(ctx)
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
	}
	for _, name := range c.arms {
		spec, _ := parseArm(name)
		arm := report.Arm{Name: name, Kind: report.KindOf(name), Detail: c.detail(spec, 0)}
		files, perr, err := c.runArm(ctx, spec, pools)
		arm.Parity = perr
		r.PointFiles = append(r.PointFiles, files...)
		if err != nil {
			if ctx.Err() != nil {
				return nil, err
			}
			arm.Error = err.Error()
			fmt.Fprintf(c.out, "benchrun: arm %s: %v\n", name, err)
		}
		r.Arms = append(r.Arms, arm)
	}
	if len(c.memory.arms) > 0 {
		r.Memory = c.memoryCheck(ctx, cfg, pools[c.memory.batch])
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
	}
	r.FinishedAt = time.Now().UTC()
	if err := r.WriteManifest(c.results); err != nil {
		return nil, err
	}
	return r, nil
}

// sweepManifest is the sweep's settings as the report records them.
func (c *config) sweepManifest() report.Sweep {
	lc := &c.load
	return report.Sweep{
		Batches: lc.batches, Clients: lc.clients, OpenFractions: lc.openFractions, BudgetFractions: lc.budgetFractions,
		WarmupS: lc.warmup.Seconds(), DurationS: lc.duration.Seconds(), Repeats: lc.repeats,
		Connections: lc.connections, Client: lc.client,
		Frontends: c.server.frontends, PyProcesses: c.server.pyProcesses, PyWorkers: c.server.pyWorkers,
	}
}

// runArm starts one arm, checks parity and sweeps it over the request
// pools, by B_req. It returns the point files written (relative to the
// results directory) and the parity result.
func (c *config) runArm(ctx context.Context, spec armSpec, pools map[int]*loadgen.Workload) ([]string, *report.Parity, error) {
	n := c.instances(spec)
	fmt.Fprintf(c.out, "benchrun: arm %s: starting (%s)\n", spec.name, c.detail(spec, n))
	srv, err := c.startArm(ctx, spec, n, filepath.Join(c.results, spec.name, "server.log"))
	if err != nil {
		return nil, nil, err
	}
	defer func() {
		if err := srv.stop(); err != nil {
			fmt.Fprintf(c.out, "benchrun: arm %s: stop: %v\n", spec.name, err)
		}
	}()
	par, err := c.parity(ctx, srv.addr)
	if err != nil {
		return nil, par, err
	}
	pool, err := c.dialLoad(ctx, srv.addr, c.load.connections)
	if err != nil {
		return nil, par, fmt.Errorf("arm %s: %w", spec.name, err)
	}
	defer pool.Close()

	a := &armSweep{c: c, arm: spec.name, srv: srv, pool: pool}
	for _, b := range c.load.batches {
		swept, err := a.closedLoop(ctx, pools[b])
		if err == nil {
			err = a.openLoop(ctx, pools[b], swept)
		}
		if err != nil {
			return a.files, par, err
		}
	}
	return a.files, par, nil
}

// armSweep measures the points of one started arm and keeps the names of
// the files it writes.
type armSweep struct {
	c     *config
	arm   string
	srv   *server
	pool  loadgen.Client
	files []string
}

// closedLoop measures w at every C and returns the points.
func (a *armSweep) closedLoop(ctx context.Context, w *loadgen.Workload) ([]*loadgen.Point, error) {
	lc := &a.c.load
	var swept []*loadgen.Point
	for _, cc := range lc.clients {
		rc := loadgen.Config{Mode: loadgen.Closed, Concurrency: cc, Warmup: lc.warmup, Duration: lc.duration, Timeout: lc.timeout}
		p, err := a.measure(ctx, report.LabelClosed, w, rc, fmt.Sprintf("b%d-c%d.json", w.BatchSize, cc))
		if err != nil {
			return nil, err
		}
		swept = append(swept, p)
	}
	return swept, nil
}

// openLoop measures w at every open-loop rate: fractions of the best
// error-free closed-loop throughput in swept, and of the best within the
// headline p99 budget (the point the arm's bench line claims).
func (a *armSweep) openLoop(ctx context.Context, w *loadgen.Workload, swept []*loadgen.Point) error {
	lc, b := &a.c.load, w.BatchSize
	var peak, budgetPeak float64 // requests/s
	for _, p := range swept {
		if p.Summary.Errors == 0 {
			peak = max(peak, p.Summary.RequestsPerS)
		}
	}
	if best := report.Best(swept, a.arm, b, report.HeadlineBudgetMs); best != nil {
		budgetPeak = best.Summary.RequestsPerS
	}
	opens := []struct {
		fracs []float64
		peak  float64
		label func(float64) string
		what  string
	}{
		{lc.openFractions, peak, report.OpenLabel, "no error-free closed-loop point"},
		{lc.budgetFractions, budgetPeak, report.BudgetLabel, fmt.Sprintf("no closed-loop point within p99 %d ms", report.HeadlineBudgetMs)},
	}
	for _, o := range opens {
		for _, frac := range o.fracs {
			if o.peak <= 0 {
				fmt.Fprintf(a.c.out, "benchrun: arm %s B_req %d: %s, no open loop at %s\n", a.arm, b, o.what, o.label(frac))
				break
			}
			rc := loadgen.Config{Mode: loadgen.Open, Rate: frac * o.peak, Warmup: lc.warmup, Duration: lc.duration, Timeout: lc.timeout}
			if _, err := a.measure(ctx, o.label(frac), w, rc, fmt.Sprintf("b%d-%s.json", b, o.label(frac))); err != nil {
				return err
			}
		}
	}
	return nil
}

// measure measures one point and writes it to file in the arm's results.
func (a *armSweep) measure(ctx context.Context, label string, w *loadgen.Workload, rc loadgen.Config, file string) (*loadgen.Point, error) {
	p, err := a.c.point(ctx, a.arm, label, a.srv, a.pool, w, rc, a.c.load.repeats)
	if err != nil {
		return nil, err
	}
	f := filepath.Join(a.arm, file)
	if err := p.WriteFile(filepath.Join(a.c.results, f)); err != nil {
		return nil, err
	}
	a.files = append(a.files, f)
	return p, nil
}
