// Command benchrun runs the serving benchmark end to end, once per
// workload (a model bundle: -workloads mlperf=DIR,hostbound=DIR): for each
// arm (recmesh-<mode> for every batching mode, and the Python designs of
// the published study: py, py-mp, py-mp-local, py-batch, py-mp-batch) it
// starts the server pinned to the server CPUs, checks parity against the
// plain-Go reference (an arm that fails is not measured), sweeps the closed
// loop over every request size B_req and client count C, then the open
// loop at fractions of that arm's own closed-loop peak, with the resource
// monitor on the arm's process tree, the load generator's own CPU use and
// a host-stall probe per watched CPU (package stall) over each measured
// window; it writes one point JSON per configuration
// under <results>/<workload>/<arm>/ and stops the arm. Before the arms it
// times the workload's dense network against its lookups on one server
// core. With the first workload it runs the memory-scaling check (the mesh
// and a multi-process Python arm at 1, 4, … frontends or processes).
// Finally it writes <results>/suite.json, REPORT.md and the SVG charts,
// and prints the `bench:`, `bench-ratio:` and `bench-memory:` lines.
//
// It builds nothing: `make bench` / `make bench-full` build the binaries,
// the Python venv and the bundles first. The load generator runs in this
// process, pinned (every thread) to the client CPUs before anything else.
//
//	benchrun [flags]          the sweep, then the report
//	benchrun -report-only     re-render the report from <results>/suite.json
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"

	"github.com/recmesh/recmesh/bench/cpuset"
	"github.com/recmesh/recmesh/bench/loadgen"
	"github.com/recmesh/recmesh/bench/monitor"
	"github.com/recmesh/recmesh/bench/parity"
	"github.com/recmesh/recmesh/bench/report"
	"github.com/recmesh/recmesh/bench/stall"
	"github.com/recmesh/recmesh/model"
	"github.com/recmesh/recmesh/proto/oip"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	switch {
	case err == nil:
	case errors.Is(err, flag.ErrHelp):
		os.Exit(2)
	default:
		fmt.Fprintln(os.Stderr, "benchrun:", err)
		os.Exit(1)
	}
}

type config struct {
	root, bin, bundle, results string
	// python and pyStubs override where the Python arms' interpreter and
	// generated stubs are (default: the bench venv and stubs under root).
	python, pyStubs string
	// workloads are the bundles swept one after the other; bundle and
	// results above are the current workload's while it runs.
	workloads              []workload
	strict                 bool
	denseCost              bool
	arms                   []string
	batches, clients       []int
	openFractions          []float64
	budgetFractions        []float64
	warmup, duration       time.Duration
	repeats                int
	connections            int
	client                 string
	frontends              int
	pyProcesses, pyWorkers int
	serverCPUs, clientCPUs string
	// serverSched is the scheduling policy every arm's processes run
	// under: batch or other (see pinPrefix).
	serverSched string
	// stallCPUs are watched for host stalls over every measured window
	// (package stall); none when empty.
	stallCPUs []int
	// stallRemeasure: a repeat during which a watched CPU stalled longer
	// than this is set aside and measured again, at most maxRemeasures
	// times (0: never).
	stallRemeasure        time.Duration
	timeout, readyTimeout time.Duration
	parityExamples        int

	memArms                []string
	memInstances           []int
	memBatch, memClients   int
	memWarmup, memDuration time.Duration
	memBaseMiB, memPerMiB  int

	reportOnly bool
	out        io.Writer
}

// defaultCPUs splits the machine between server and load generator: on
// two CPUs, one each (the server loses half the machine, but the two never
// compete, which the methodology requires); on more, the load generator
// gets a quarter (at least one) at the top and the server the rest; on
// one, nothing is pinned.
func defaultCPUs(n int) (server, client string) {
	switch {
	case n <= 1:
		return "", ""
	case n == 2:
		return "0", "1"
	}
	c := max(1, n/4)
	return fmt.Sprintf("0-%d", n-c-1), fmt.Sprintf("%d-%d", n-c, n-1)
}

// defaultStallCPUs is the first CPU of each of server and client (CPU
// lists): a probe costs a wake-up a millisecond, and one per side shows
// a stall of the host that either suffered.
func defaultStallCPUs(server, client string) string {
	var firsts []string
	for _, list := range []string{server, client} {
		if set, err := cpuset.Parse(list); err == nil && set.Count() > 0 {
			firsts = append(firsts, strconv.Itoa(cpuset.CPUs(set)[0]))
		}
	}
	return strings.Join(firsts, ",")
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == stall.ProbeCommand {
		return stall.Command("benchrun", args[1:], os.Stdin, stdout, stderr)
	}
	c := &config{out: stdout}
	var arms, batches, clients, fracs, budgetFracs, memArms, memInst, workloads, workloadName, stallCPUs string
	defServer, defClient := defaultCPUs(runtime.NumCPU())
	fs := flag.NewFlagSet("benchrun", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.root, "root", ".", "repository root `dir` (bench/python, .deps)")
	fs.StringVar(&c.bin, "bin", "bin", "`dir` of recmesh, embedder, accelerator and frontend")
	fs.StringVar(&c.python, "python", "", "`interpreter` of the Python arms, with jax, numpy, grpcio and protobuf (default: <root>/.deps/bench-venv)")
	fs.StringVar(&c.pyStubs, "py-stubs", "", "`dir` of the generated grpc_service_pb2*.py (default: <root>/.deps/bench-pygen)")
	fs.StringVar(&c.bundle, "bundle", "data/dlrm-cap1000", "model bundle `dir` of a single workload (see -workloads)")
	fs.StringVar(&workloadName, "workload", "", "name of the -bundle workload (default: from its config, mlperf or hostbound)")
	fs.StringVar(&workloads, "workloads", "", "`name=dir,…`: workloads swept one after the other, each into <results>/<name>/ (overrides -bundle)")
	fs.BoolVar(&c.strict, "strict", false, "exit non-zero when any arm fails to start, fails parity or any request fails")
	fs.BoolVar(&c.denseCost, "dense-cost", true, "measure each workload's dense network against its lookups on one server core")
	fs.StringVar(&c.results, "results", "bench/results", "results `dir` (point JSONs per arm, run.json, REPORT.md, SVGs)")
	fs.StringVar(&arms, "arms", strings.Join(armNames(), ","), "arms to run, comma-separated")
	fs.StringVar(&batches, "batches", "1,16,128", "request sizes B_req")
	fs.StringVar(&clients, "clients", "1,4,16,64,256", "closed-loop concurrent clients C")
	fs.StringVar(&fracs, "open", "0.5,0.8", "open-loop rates as fractions of each arm's closed-loop peak (empty: none)")
	fs.StringVar(&budgetFracs, "open-budget", "0.8", "open-loop rates as fractions of each arm's closed-loop peak under the p99 ≤ 20 ms budget, the throughput it claims (empty: none)")
	fs.DurationVar(&c.warmup, "warmup", 5*time.Second, "discarded warm-up before each measured window")
	fs.DurationVar(&c.duration, "duration", 30*time.Second, "measured window")
	fs.IntVar(&c.repeats, "repeats", 3, "measured repeats per point (medians are reported)")
	fs.IntVar(&c.connections, "connections", 64, "persistent gRPC connections per arm, shared by every point")
	fs.StringVar(&c.client, "client", loadgen.ClientLean, "the load generator's gRPC client: lean (bench/h2client: little client time in the latencies) or grpc (grpc-go's)")
	fs.IntVar(&c.frontends, "frontends", 0, "frontend processes of the recmesh arms (0: one per server CPU)")
	fs.IntVar(&c.pyProcesses, "py-processes", 0, "frontend processes of the multi-process Python arms (0: one per server CPU)")
	fs.IntVar(&c.pyWorkers, "py-workers", 8, "gRPC worker threads per Python process")
	fs.StringVar(&c.serverCPUs, "server-cpus", defServer, "CPU `list` every arm is pinned to (empty: not pinned)")
	fs.StringVar(&c.serverSched, "server-sched", "batch", "scheduling `policy` of every arm's processes: batch (SCHED_BATCH, what recmesh's services choose by default: no wake-up preemption) or other (SCHED_OTHER: the mesh is run with RECMESH_SCHED_BATCH=false); the Python arms run under `chrt` with the same policy")
	fs.StringVar(&c.clientCPUs, "client-cpus", defClient, "CPU `list` the load generator and monitor are pinned to (empty: not pinned)")
	fs.StringVar(&stallCPUs, "stall-cpus", defaultStallCPUs(defServer, defClient), "CPU `list` watched for host stalls over every measured window, recorded with each run and printed per point: a real-time thread pinned on each reports how late its 1 ms wake-ups come, beside the CPU's steal time (empty: none)")
	fs.DurationVar(&c.stallRemeasure, "stall-remeasure", 10*time.Millisecond, "set aside and measure again (at most twice) a repeat during which a watched CPU stalled longer than this: a window the host froze says nothing about the server (0: never)")
	fs.DurationVar(&c.timeout, "timeout", loadgen.DefaultTimeout, "per-request deadline")
	fs.DurationVar(&c.readyTimeout, "ready-timeout", 5*time.Minute, "how long an arm may take to start")
	fs.IntVar(&c.parityExamples, "parity-examples", parity.DefaultExamples, "examples compared by the parity check")
	fs.StringVar(&memArms, "memory-arms", "recmesh-full,py-mp-batch", "arms of the memory-scaling check, run on the first workload (empty: skip it)")
	fs.StringVar(&memInst, "memory-instances", "1,4", "frontend (mesh) or process (Python) counts of the memory check")
	fs.IntVar(&c.memBatch, "memory-batch", 16, "B_req of the memory check's light load")
	fs.IntVar(&c.memClients, "memory-clients", 4, "C of the memory check's light load")
	fs.DurationVar(&c.memWarmup, "memory-warmup", time.Second, "memory check: warm-up")
	fs.DurationVar(&c.memDuration, "memory-duration", 2*time.Second, "memory check: measured window")
	fs.IntVar(&c.memBaseMiB, "memory-base-mib", 768, "memory check: the mesh's allowance beyond the tables, MiB (embedder, accelerator with XLA, NATS)")
	fs.IntVar(&c.memPerMiB, "memory-per-frontend-mib", 64, "memory check: the mesh's allowance per frontend, MiB")
	fs.BoolVar(&c.reportOnly, "report-only", false, "only re-render REPORT.md and the charts from <results>/run.json")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if c.reportOnly {
		runs, err := report.LoadSuite(c.results)
		if err != nil {
			return err
		}
		return finish(c, runs)
	}
	// The server's CPUs: -server-cpus, or, unpinned, what this process may
	// use before it pins itself to the load generator's.
	serverSet, err := cpuset.Current()
	if err != nil {
		return fmt.Errorf("benchrun: CPUs allowed: %w", err)
	}
	if c.serverCPUs != "" {
		if serverSet, err = cpuset.Parse(c.serverCPUs); err != nil {
			return fmt.Errorf("-server-cpus: %w", err)
		}
	}
	// Pin first, before any goroutine of ours exists; the arms are pinned
	// separately through taskset.
	if c.clientCPUs != "" {
		set, err := cpuset.Parse(c.clientCPUs)
		if err != nil {
			return fmt.Errorf("-client-cpus: %w", err)
		}
		if err := cpuset.PinProcess(set); err != nil {
			return fmt.Errorf("-client-cpus: %w", err)
		}
	}
	// Frontend processes default to one per server CPU, for recmesh and
	// Python alike: a second frontend on one core only adds a process to
	// wake (recmesh's hostbound B_req 1 peak on one core, C=64: 22.2k and
	// 22.8k examples/s with two frontends, 24.5k and 24.8k with one).
	c.frontends = perCPU(c.frontends, serverSet)
	c.pyProcesses = perCPU(c.pyProcesses, serverSet)
	if c.serverSched != "batch" && c.serverSched != "other" {
		return fmt.Errorf("-server-sched %q: want batch or other", c.serverSched)
	}
	if c.stallCPUs, err = stall.ParseCPUs(stallCPUs); err != nil {
		return err
	}
	if c.arms, err = splitList(arms); err != nil {
		return err
	}
	for _, a := range c.arms {
		if _, err := parseArm(a); err != nil {
			return fmt.Errorf("-arms: %w", err)
		}
	}
	if c.memArms, err = splitList(memArms); err != nil {
		return err
	}
	for _, a := range c.memArms {
		if s, err := parseArm(a); err != nil || !(s.mesh || s.multi()) {
			return fmt.Errorf("-memory-arms: %q: want a recmesh arm or a multi-process Python arm", a)
		}
	}
	if c.batches, err = intList("-batches", batches); err != nil {
		return err
	}
	if c.clients, err = intList("-clients", clients); err != nil {
		return err
	}
	if c.memInstances, err = intList("-memory-instances", memInst); err != nil {
		return err
	}
	if c.openFractions, err = floatList("-open", fracs); err != nil {
		return err
	}
	if c.budgetFractions, err = floatList("-open-budget", budgetFracs); err != nil {
		return err
	}
	switch {
	case len(c.batches) == 0 || len(c.clients) == 0:
		return errors.New("-batches and -clients need at least one value each")
	case c.repeats < 1 || c.duration <= 0 || c.warmup < 0 || c.connections < 1:
		return errors.New("want -repeats ≥ 1, -duration > 0, -warmup ≥ 0 and -connections ≥ 1")
	case c.frontends < 1 || c.pyProcesses < 1 || c.pyWorkers < 1:
		return errors.New("want -frontends and -py-processes ≥ 0 (0: one per server CPU) and -py-workers ≥ 1")
	}
	for _, p := range []*string{&c.root, &c.bin, &c.bundle, &c.results} {
		if *p, err = filepath.Abs(*p); err != nil {
			return err
		}
	}
	if c.workloads, err = parseWorkloads(workloads, c.bundle, workloadName); err != nil {
		return err
	}
	return sweepAll(ctx, c)
}

// count writes n things, in the plural unless n is 1.
func count(n int, thing string) string {
	switch {
	case n == 1:
		return "1 " + thing
	case strings.HasSuffix(thing, "s"):
		return fmt.Sprintf("%d %ses", n, thing)
	}
	return fmt.Sprintf("%d %ss", n, thing)
}

// perCPU resolves a process count flag: 0 means one per CPU of set.
func perCPU(n int, set unix.CPUSet) int {
	if n == 0 {
		return max(set.Count(), 1)
	}
	return n
}

// workload is one bundle the sweep runs every arm on.
type workload struct {
	name, bundle string
}

// parseWorkloads reads -workloads, or makes the one workload of -bundle,
// named by -workload or else after its config (see workloadOf).
func parseWorkloads(list, bundle, name string) ([]workload, error) {
	if strings.TrimSpace(list) == "" {
		if name == "" {
			cfg, err := readConfig(bundle)
			if err != nil {
				return nil, err
			}
			name = workloadOf(cfg)
		}
		return []workload{{name: name, bundle: bundle}}, nil
	}
	items, _ := splitList(list)
	var out []workload
	for _, it := range items {
		n, dir, ok := strings.Cut(it, "=")
		if !ok || n == "" || dir == "" || strings.ContainsAny(n, "/ ") {
			return nil, fmt.Errorf("-workloads: %q: want name=dir (a name without / or spaces)", it)
		}
		for _, w := range out {
			if w.name == n {
				return nil, fmt.Errorf("-workloads: %q named twice", n)
			}
		}
		abs, err := filepath.Abs(dir)
		if err != nil {
			return nil, err
		}
		out = append(out, workload{name: n, bundle: abs})
	}
	return out, nil
}

// workloadOf names a bundle's workload: "hostbound" for the exporter's
// host-bound preset, "mlperf" for anything else.
func workloadOf(cfg model.Config) string {
	if strings.HasSuffix(cfg.Name, "-hostbound") {
		return "hostbound"
	}
	return "mlperf"
}

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
			wc.memArms = nil
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

// strictCheck fails a run in which any arm failed to start or to pass
// parity, or any measured request failed.
func strictCheck(runs []*report.Run) error {
	var bad []string
	for _, r := range runs {
		for _, a := range r.Arms {
			if a.Error != "" {
				bad = append(bad, fmt.Sprintf("%s/%s: %s", r.Workload, a.Name, firstLine(a.Error)))
			} else if a.Parity == nil || !a.Parity.Pass {
				bad = append(bad, fmt.Sprintf("%s/%s: no parity pass", r.Workload, a.Name))
			}
		}
		for _, p := range r.Points {
			if n := failures(p); n > 0 {
				bad = append(bad, fmt.Sprintf("%s/%s B_req %d %s C=%d: %d failed requests", r.Workload, p.Arm, p.BatchSize, p.Label, p.Concurrency, n))
			}
		}
		if r.Memory != nil {
			for _, row := range r.Memory.Rows {
				if row.Error != "" {
					bad = append(bad, fmt.Sprintf("%s/memory %s × %d: %s", r.Workload, row.Arm, row.Instances, firstLine(row.Error)))
				}
			}
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("-strict: %d problem(s):\n  %s", len(bad), strings.Join(bad, "\n  "))
	}
	return nil
}

// failures counts a point's failed requests, less those refused with
// RESOURCE_EXHAUSTED: shedding load it cannot serve within the latency
// target is what an SLO-aware server is meant to do, and the report
// already keeps such points out of the budget tables.
func failures(p *loadgen.Point) int64 {
	var n int64
	for _, r := range p.Runs {
		if r.Result == nil {
			continue
		}
		n += r.Errors - r.ErrorsByCode[oip.CodeName(codes.ResourceExhausted)]
	}
	return n
}

func firstLine(s string) string {
	first, _, _ := strings.Cut(s, "\n")
	return first
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
		Sweep: report.Sweep{
			Batches: c.batches, Clients: c.clients, OpenFractions: c.openFractions, BudgetFractions: c.budgetFractions,
			WarmupS: c.warmup.Seconds(), DurationS: c.duration.Seconds(), Repeats: c.repeats,
			Connections: c.connections, Client: c.client, Frontends: c.frontends, PyProcesses: c.pyProcesses, PyWorkers: c.pyWorkers,
		},
	}
	// Results of an earlier run of the same arms would mix into the
	// report; other subdirectories (smoke/, lookup/) are left alone.
	for _, d := range append(slices.Clone(c.arms), "memory") {
		if err := os.RemoveAll(filepath.Join(c.results, d)); err != nil {
			return nil, fmt.Errorf("clean results: %w", err)
		}
	}
	workloads := map[int]*loadgen.Workload{}
	for _, b := range append(slices.Clone(c.batches), c.memBatch) {
		if workloads[b] != nil {
			continue
		}
		w, err := loadgen.NewWorkload(cfg, loadgen.WorkloadOptions{BatchSize: b, Seed: 1})
		if err != nil {
			return nil, fmt.Errorf("workload B_req %d: %w", b, err)
		}
		workloads[b] = w
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
		files, perr, err := c.runArm(ctx, spec, cfg, workloads)
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
	if len(c.memArms) > 0 {
		r.Memory = c.memoryCheck(ctx, cfg, workloads[c.memBatch])
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

// finish writes the report and prints the summary lines, last.
func finish(c *config, runs []*report.Run) error {
	if err := report.WriteSuite(c.results, runs); err != nil {
		return err
	}
	fmt.Fprintf(c.out, "benchrun: wrote %s\n", filepath.Join(c.results, report.ReportFile))
	for _, r := range runs {
		if r.Memory != nil {
			_, v := report.MemoryVerdict(r.Memory)
			fmt.Fprintln(c.out, v)
		}
	}
	for _, l := range report.SuiteLines(runs) {
		fmt.Fprintln(c.out, l)
	}
	return nil
}

func (c *config) detail(spec armSpec, n int) string {
	if spec.mesh {
		if n == 0 {
			n = c.frontends
		}
		return fmt.Sprintf("recmesh run --batch-mode %s, %s (--transport %s)", spec.mode, count(n, "frontend"), spec.transport)
	}
	threads := strconv.Itoa(c.pyWorkers)
	if spec.batching() {
		threads = "256"
	}
	if spec.multi() {
		if n == 0 {
			n = c.pyProcesses
		}
		return fmt.Sprintf("server.py --mode %s, %s × %s gRPC threads", spec.py, count(n, "frontend process"), threads)
	}
	return fmt.Sprintf("server.py --mode %s, 1 process × %s gRPC threads", spec.py, threads)
}

// runArm starts one arm, checks parity and sweeps it. It returns the point
// files written (relative to the results directory) and the parity result.
func (c *config) runArm(ctx context.Context, spec armSpec, cfg model.Config, workloads map[int]*loadgen.Workload) ([]string, *report.Parity, error) {
	n := c.frontends
	if spec.multi() {
		n = c.pyProcesses
	}
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
	pool, err := c.dialLoad(ctx, srv.addr, c.connections)
	if err != nil {
		return nil, par, fmt.Errorf("arm %s: %w", spec.name, err)
	}
	defer pool.Close()

	var files []string
	for _, b := range c.batches {
		var peak float64 // requests/s, over error-free closed-loop points
		var swept []*loadgen.Point
		for _, cc := range c.clients {
			rc := loadgen.Config{Mode: loadgen.Closed, Concurrency: cc, Warmup: c.warmup, Duration: c.duration, Timeout: c.timeout}
			p, err := c.point(ctx, spec.name, report.LabelClosed, srv, pool, workloads[b], rc, c.repeats)
			if err != nil {
				return files, par, err
			}
			f := filepath.Join(spec.name, fmt.Sprintf("b%d-c%d.json", b, cc))
			if err := p.WriteFile(filepath.Join(c.results, f)); err != nil {
				return files, par, err
			}
			files = append(files, f)
			swept = append(swept, p)
			if p.Summary.Errors == 0 {
				peak = max(peak, p.Summary.RequestsPerS)
			}
		}
		// The budget peak is the point the arm's bench line claims: the
		// best closed-loop throughput whose p99 met the headline budget.
		var budgetPeak float64
		if best := report.Best(swept, spec.name, b, report.HeadlineBudgetMs); best != nil {
			budgetPeak = best.Summary.RequestsPerS
		}
		opens := []struct {
			fracs []float64
			peak  float64
			label func(float64) string
			what  string
		}{
			{c.openFractions, peak, report.OpenLabel, "no error-free closed-loop point"},
			{c.budgetFractions, budgetPeak, report.BudgetLabel, fmt.Sprintf("no closed-loop point within p99 %d ms", report.HeadlineBudgetMs)},
		}
		for _, o := range opens {
			for _, frac := range o.fracs {
				if o.peak <= 0 {
					fmt.Fprintf(c.out, "benchrun: arm %s B_req %d: %s, no open loop at %s\n", spec.name, b, o.what, o.label(frac))
					break
				}
				rc := loadgen.Config{Mode: loadgen.Open, Rate: frac * o.peak, Warmup: c.warmup, Duration: c.duration, Timeout: c.timeout}
				p, err := c.point(ctx, spec.name, o.label(frac), srv, pool, workloads[b], rc, c.repeats)
				if err != nil {
					return files, par, err
				}
				f := filepath.Join(spec.name, fmt.Sprintf("b%d-%s.json", b, o.label(frac)))
				if err := p.WriteFile(filepath.Join(c.results, f)); err != nil {
					return files, par, err
				}
				files = append(files, f)
			}
		}
	}
	return files, par, nil
}

// parity compares the arm's scores with the plain-Go reference. The
// bundle is opened for the check only, so the runner does not hold the
// tables while the arm is measured.
func (c *config) parity(ctx context.Context, addr string) (*report.Parity, error) {
	b, err := model.Open(c.bundle)
	if err != nil {
		return nil, err
	}
	defer b.Close()
	ref, err := model.NewReference(b)
	if err != nil {
		return nil, err
	}
	pool, err := dial(ctx, addr, 1, c.readyTimeout)
	if err != nil {
		return nil, fmt.Errorf("parity: %w", err)
	}
	defer pool.Close()
	res, err := parity.Check(ctx, pool.Client(0), b.Config, ref, parity.Options{Examples: c.parityExamples})
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

func dial(ctx context.Context, addr string, n int, timeout time.Duration) (*oip.Pool, error) {
	rctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	pool, err := oip.Dial(rctx, addr, n)
	if err != nil {
		return nil, err
	}
	if err := pool.WaitReady(rctx, oip.DefaultModelName); err != nil {
		pool.Close()
		return nil, err
	}
	return pool, nil
}

// dialLoad opens n connections of the configured client to addr, once
// the server and the model are ready.
func (c *config) dialLoad(ctx context.Context, addr string, n int) (loadgen.Client, error) {
	rctx, cancel := context.WithTimeout(ctx, c.readyTimeout)
	defer cancel()
	return loadgen.Dial(rctx, c.client, addr, oip.DefaultModelName, n)
}

// point measures one configuration: repeats of warm-up plus window, the
// monitor on the arm's process tree over each window.
func (c *config) point(ctx context.Context, arm, label string, srv *server, pool loadgen.Client, w *loadgen.Workload,
	rc loadgen.Config, repeats int) (*loadgen.Point, error) {
	host, _ := os.Hostname()
	p := &loadgen.Point{
		Schema: loadgen.PointSchema, Arm: arm, Label: label,
		Target: srv.addr, Model: oip.DefaultModelName, Mode: rc.Mode, BatchSize: w.BatchSize,
		Connections: pool.Len(), WarmupS: rc.Warmup.Seconds(), DurationS: rc.Duration.Seconds(), TimeoutS: rc.Timeout.Seconds(),
		Repeats: repeats, PoolRequests: len(w.Requests), RequestBytes: w.RequestBytes, SparseType: w.SparseType, Seed: 1,
		Bundle: c.bundle, Client: pool.Kind(), ClientCPUs: c.clientCPUs, GOMAXPROCS: runtime.GOMAXPROCS(0), GoVersion: runtime.Version(),
		Host: host, StartedAt: time.Now().UTC(), MonitorPIDs: []int{srv.pid},
	}
	if rc.Mode == loadgen.Closed {
		p.Concurrency = rc.Concurrency
	} else {
		rc.MaxOutstanding = loadgen.DefaultMaxOutstanding
		p.RateRPS, p.MaxOutstanding = rc.Rate, rc.MaxOutstanding
	}
	load := fmt.Sprintf("C=%d", p.Concurrency)
	if rc.Mode == loadgen.Open {
		load = fmt.Sprintf("%s rate=%.0f/s", label, p.RateRPS)
	}
	for i := range repeats {
		rc.Seed = 1 + uint64(i)
		for try := 0; ; try++ {
			rec, err := measure(ctx, pool, w, rc, srv.pid, c.clientCPUCount(), c.stallCPUs)
			if err != nil {
				return nil, fmt.Errorf("%s %s B_req %d: %w", arm, label, w.BatchSize, err)
			}
			rec.Repeat = i + 1
			worst := stall.Worst(rec.Stalls)
			if c.stallRemeasure <= 0 || worst == nil || worst.MaxDelayMs <= ms(c.stallRemeasure) || try == maxRemeasures {
				p.Runs = append(p.Runs, rec)
				break
			}
			fmt.Fprintf(c.out, "benchrun:   %s B_req=%d %s: repeat %d set aside, host stall %.1f ms (CPU %d) over %v; measuring again\n",
				arm, p.BatchSize, load, i+1, worst.MaxDelayMs, worst.CPU, c.stallRemeasure)
			p.SetAside = append(p.SetAside, rec)
		}
	}
	p.Summarize()
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
		arm, p.BatchSize, load, s.ExamplesPerS, s.P50Ms, s.P99Ms, s.Errors, s.ServerCPUCores, s.ServerCPUSPer1kExamples, float64(s.ServerPeakPSSBytes)/(1<<20), s.ClientCPUCores, stall.Summary(stalls), sat)
	return p, nil
}

// maxRemeasures is how many times one repeat is measured again after host
// stalls: a host that keeps stalling gets its stalls reported, not hidden.
const maxRemeasures = 2

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// clientCPUCount is how many CPUs the load generator may use.
func (c *config) clientCPUCount() int {
	if c.clientCPUs != "" {
		if set, err := cpuset.Parse(c.clientCPUs); err == nil && set.Count() > 0 {
			return set.Count()
		}
	}
	return runtime.NumCPU()
}

// selfCPU is this process's user+system CPU time in seconds: the load
// generator, the monitor and the runner, all of which share the client
// CPUs.
func selfCPU() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
}

// measure runs one repeat with the monitor over exactly its window, and
// the load generator's own CPU use over the same window.
func measure(ctx context.Context, pool loadgen.Client, w *loadgen.Workload, rc loadgen.Config, pid, clientCPUs int, stallCPUs []int) (loadgen.RunRecord, error) {
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
	probes, err := stall.StartProbes(stallCPUs, 0)
	if err != nil {
		return loadgen.RunRecord{}, fmt.Errorf("stall probe: %w", err)
	}
	defer func() { _, _ = probes.Stop() }()
	hooks := loadgen.Hooks{
		WindowStart: func() {
			stallErr = probes.Begin()
			wall0, cpu0 = time.Now(), selfCPU()
			mon, monErr = monitor.Start(monitor.Options{PIDs: []int{pid}, Descendants: true})
		},
		WindowEnd: func() {
			wall1, cpu1 = time.Now(), selfCPU()
			if mon != nil {
				rep, monErr = mon.Stop()
			}
			if stallErr == nil {
				stalls, stallErr = probes.Stop()
			}
		},
	}
	res, err := loadgen.Run(ctx, pool, w, rc, hooks)
	if err != nil {
		return loadgen.RunRecord{}, err
	}
	if monErr != nil {
		return loadgen.RunRecord{}, fmt.Errorf("monitor: %w", monErr)
	}
	if stallErr != nil {
		return loadgen.RunRecord{}, fmt.Errorf("stall probe: %w", stallErr)
	}
	if rep != nil {
		rep.SetExamples(res.CompletedInWindow * int64(w.BatchSize))
	}
	rec := loadgen.RunRecord{Result: res, Monitor: rep, Stalls: stalls}
	if !wall0.IsZero() && wall1.After(wall0) {
		rec.Client = loadgen.NewClientUsage(cpu1-cpu0, wall1.Sub(wall0).Seconds(), clientCPUs)
	}
	return rec, nil
}

// memoryCheck starts each memory arm at each instance count, checks
// parity, drives it lightly and records its peak PSS and RSS.
func (c *config) memoryCheck(ctx context.Context, cfg model.Config, w *loadgen.Workload) *report.MemoryCheck {
	m := &report.MemoryCheck{
		TableBytes: tableBytes(cfg), BaseBytes: int64(c.memBaseMiB) << 20, PerInstanceBytes: int64(c.memPerMiB) << 20,
		BatchSize: c.memBatch, Concurrency: c.memClients,
	}
	for _, name := range c.memArms {
		spec, _ := parseArm(name)
		for _, n := range c.memInstances {
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

func (c *config) memoryPoint(ctx context.Context, spec armSpec, n int, w *loadgen.Workload) (*loadgen.Point, *report.Parity, error) {
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
	pool, err := c.dialLoad(ctx, srv.addr, min(c.memClients, c.connections))
	if err != nil {
		return nil, par, err
	}
	defer pool.Close()
	rc := loadgen.Config{Mode: loadgen.Closed, Concurrency: c.memClients, Warmup: c.memWarmup, Duration: c.memDuration, Timeout: c.timeout}
	p, err := c.point(ctx, spec.name, report.LabelMemory, srv, pool, w, rc, 1)
	if err != nil {
		return nil, par, err
	}
	if err := p.WriteFile(filepath.Join(dir, fmt.Sprintf("%s-n%d.json", spec.name, n))); err != nil {
		return nil, par, err
	}
	return p, par, nil
}

// tableBytes is the size of the float32 embedding tables.
func tableBytes(cfg model.Config) int64 {
	var rows int64
	for _, v := range cfg.VocabSizes {
		rows += int64(v)
	}
	return rows * int64(cfg.EmbeddingDim) * 4
}

// readConfig reads the bundle's config.json (the weights are opened only
// for parity).
func readConfig(bundle string) (model.Config, error) {
	path := filepath.Join(bundle, model.ConfigFile)
	b, err := os.ReadFile(path)
	if err != nil {
		return model.Config{}, fmt.Errorf("model config: %w (make exports the bundle)", err)
	}
	var cfg model.Config
	if err := json.Unmarshal(b, &cfg); err != nil {
		return model.Config{}, fmt.Errorf("model config %s: %w", path, err)
	}
	if err := cfg.Validate(); err != nil {
		return model.Config{}, fmt.Errorf("model config %s: %w", path, err)
	}
	return cfg, nil
}

func splitList(s string) ([]string, error) {
	var out []string
	for f := range strings.SplitSeq(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out, nil
}

func intList(name, s string) ([]int, error) {
	fs, _ := splitList(s)
	var out []int
	for _, f := range fs {
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%s: bad value %q, want integers ≥ 1", name, f)
		}
		out = append(out, n)
	}
	return out, nil
}

func floatList(name, s string) ([]float64, error) {
	fs, _ := splitList(s)
	var out []float64
	for _, f := range fs {
		v, err := strconv.ParseFloat(f, 64)
		if err != nil || !(v > 0) || v > 1.5 {
			return nil, fmt.Errorf("%s: bad fraction %q, want 0 < f ≤ 1.5", name, f)
		}
		out = append(out, v)
	}
	return out, nil
}
