package benchrun

import (
	"context"
	"fmt"
	"path/filepath"

	"github.com/recmesh/recmesh/bench/loadgen"
	"github.com/recmesh/recmesh/bench/report"
	"github.com/recmesh/recmesh/model"
)

// memoryCheck starts each memory arm at each instance count, checks
// parity, drives it lightly and records its peak PSS and RSS.
func (c *config) memoryCheck(ctx context.Context, cfg model.Config, w *loadgen.Workload) *report.MemoryCheck {
	mc := &c.memory
	m := &report.MemoryCheck{
		TableBytes: cfg.TableBytes(), BaseBytes: int64(mc.baseMiB) << 20, PerInstanceBytes: int64(mc.perFrontendMiB) << 20,
		BatchSize: mc.batch, Concurrency: mc.clients,
	}
	for _, name := range mc.arms {
		spec, _ := parseArm(name)
		for _, n := range mc.instances {
			if ctx.Err() != nil {
				return m
			}
			row := report.MemoryRow{Arm: name, Kind: report.KindOf(name), Instances: n}
			p, par, err := c.memoryPoint(ctx, spec, n, w)
			row.Parity = par
			if err != nil {
				row.Error = err.Error()
				fmt.Fprintf(c.out, "benchrun: memory %s × %d: %v\n", name, n, err)
			} else {
				row.PSSBytes, row.RSSBytes = p.Summary.ServerPeakPSSBytes, p.Summary.ServerPeakRSSBytes
			}
			m.Rows = append(m.Rows, row)
		}
	}
	return m
}

// memoryPoint starts spec with n instances, checks parity and measures
// one light point, written under <results>/memory/.
func (c *config) memoryPoint(ctx context.Context, spec armSpec, n int, w *loadgen.Workload) (*loadgen.Point, *report.Parity, error) {
	mc := &c.memory
	fmt.Fprintf(c.out, "benchrun: memory check: %s\n", c.detail(spec, n))
	dir := filepath.Join(c.results, "memory")
	srv, err := c.startArm(ctx, spec, n, filepath.Join(dir, fmt.Sprintf("%s-n%d.log", spec.name, n)))
	if err != nil {
		return nil, nil, err
	}
	defer srv.stop()
	par, err := c.parity(ctx, srv.addr)
	if err != nil {
		return nil, par, err
	}
	pool, err := c.dialLoad(ctx, srv.addr, min(mc.clients, c.load.connections))
	if err != nil {
		return nil, par, err
	}
	defer pool.Close()
	rc := loadgen.Config{Mode: loadgen.Closed, Concurrency: mc.clients, Warmup: mc.warmup, Duration: mc.duration, Timeout: c.load.timeout}
	p, err := c.point(ctx, spec.name, report.LabelMemory, srv, pool, w, rc, 1)
	if err != nil {
		return nil, par, err
	}
	if err := p.WriteFile(filepath.Join(dir, fmt.Sprintf("%s-n%d.json", spec.name, n))); err != nil {
		return nil, par, err
	}
	return p, par, nil
}
