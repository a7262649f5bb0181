// Command benchrun runs the serving benchmark end to end (package
// bench/internal/benchrun: every arm started, parity-checked, swept,
// monitored and stopped, then the report and its closing lines) and draws
// the report's SVG charts (charts.go).
//
//	benchrun [flags]          the sweep, then the report
//	benchrun -report-only     re-render the report from <results>/suite.json
//
// It is a module of its own, outside the workspace (go.work), because of
// the charts: gonum/plot's optional GUI backend requires a 2019 build of
// the monolithic genproto module, which in the workspace's one module
// graph clashes with the split googleapis/rpc module grpc imports
// ("ambiguous import") in every module's build. `make bench-benchrun`
// builds it with GOWORK=off.
package main

import (
	"context"
	"io"

	"github.com/recmesh/recmesh/bench/internal/benchrun"
	"github.com/recmesh/recmesh/bench/internal/command"
)

func main() {
	command.Main("benchrun", func(ctx context.Context, args []string, stdout, stderr io.Writer) error {
		return benchrun.Run(ctx, args, stdout, stderr, writeCharts)
	})
}
