// Package benchrun is the benchmark driver behind the benchrun command
// (bench/cmd/benchrun, which adds the report's charts). It runs the
// serving benchmark end to end, once per workload (a model bundle:
// -workloads mlperf=DIR,hostbound=DIR): for each arm (recmesh-<mode> for
// every batching mode, and the Python designs of the published study: py,
// py-mp, py-mp-local, py-batch, py-mp-batch) it starts the server pinned
// to the server CPUs, checks parity against the plain-Go reference (an
// arm that fails is not measured), sweeps the closed loop over every
// request size B_req and client count C, then the open loop at fractions
// of that arm's own closed-loop peak, with the resource monitor on the
// arm's process tree, the load generator's own CPU use and a host-stall
// probe per watched CPU (package stall) over each measured window; it
// writes one point JSON per configuration under <results>/<workload>/<arm>/
// and stops the arm. Before the arms it times the workload's dense network
// against its lookups on one server core. With the first workload it runs
// the memory-scaling check (the mesh and a multi-process Python arm at 1,
// 4, … frontends or processes). Finally it writes <results>/suite.json,
// REPORT.md and the charts, and prints the `bench:`, `bench-ratio:`,
// `bench-open:` and `bench-memory:` lines.
//
// It builds nothing: `make bench` / `make bench-full` build the binaries,
// the Python venv and the bundles first. The load generator runs in this
// process, pinned (every thread) to the client CPUs before anything else.
//
// The files follow the run: flags.go (the flags and their checks),
// workload.go (the bundles), sweep.go (a workload's arms and each arm's
// points), arms.go (starting and stopping an arm), point.go (measuring one
// configuration), densecost.go, memory.go (the memory check), env.go (the
// machine) and finish.go (the report and the closing lines).
package benchrun

import (
	"context"
	"io"
	"os"

	"github.com/recmesh/recmesh/bench/report"
	"github.com/recmesh/recmesh/bench/stall"
)

// Run is the benchrun command on args (without the program name),
// printing to stdout and stderr; charts draws the report's charts (nil:
// none). It returns flag.ErrHelp after -h.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer, charts report.Charts) error {
	// The stall probes (package stall) are this executable run again.
	if len(args) > 0 && args[0] == stall.ProbeCommand {
		return stall.Command("benchrun", args[1:], os.Stdin, stdout, stderr)
	}
	c, lists, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	c.out, c.charts = stdout, charts
	if c.reportOnly {
		runs, err := report.LoadSuite(c.results)
		if err != nil {
			return err
		}
		return finish(c, runs)
	}
	if err := c.resolve(lists); err != nil {
		return err
	}
	return sweepAll(ctx, c)
}
