package benchrun

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/recmesh/recmesh/bench/cpuset"
	"github.com/recmesh/recmesh/bench/loadgen"
	"github.com/recmesh/recmesh/bench/parity"
	"github.com/recmesh/recmesh/bench/report"
	"github.com/recmesh/recmesh/bench/stall"
	"github.com/recmesh/recmesh/model"
)

// config is the flags, resolved.
type config struct {
	root, bin, bundle, results string
	// python and pyStubs override where the Python arms' interpreter and
	// generated stubs are (default: the bench venv and stubs under root).
	python, pyStubs string
	// workloads are the bundles swept one after the other; bundle and
	// results above are the current workload's while it runs.
	workloads []workload
	arms      []string

	load   loadConfig
	server serverConfig
	stalls stallConfig
	memory memoryConfig

	strict     bool
	denseCost  bool
	reportOnly bool
	// fullSize adds the `full-size:` line of every workload (fullsize.go).
	fullSize bool

	charts report.Charts
	out    io.Writer
}

// loadConfig is the load every arm is swept with, and where the load
// generator runs.
type loadConfig struct {
	batches, clients []int
	// openFractions and budgetFractions are the open loop's rates, as
	// fractions of the arm's closed-loop peak and of its peak within the
	// headline p99 budget.
	openFractions, budgetFractions []float64
	warmup, duration               time.Duration
	repeats                        int
	connections                    int
	// client is the gRPC client (loadgen.ClientLean or ClientGRPC).
	client  string
	timeout time.Duration
	// cpus is the load generator's CPU list ("": not pinned).
	cpus string
}

// serverConfig is how every arm is started and checked.
type serverConfig struct {
	// frontends and pyProcesses are the instance counts of the recmesh
	// and the multi-process Python arms; pyWorkers is the gRPC threads
	// per Python process.
	frontends, pyProcesses, pyWorkers int
	// cpus is the CPU list every arm is pinned to ("": not pinned).
	cpus string
	// sched is the scheduling policy every arm's processes run under:
	// batch or other (see pinPrefix).
	sched          string
	readyTimeout   time.Duration
	parityExamples int
	// generatedReference: parity against the reference regenerated from
	// the bundle's seed (model.NewGeneratedReference) rather than one
	// reading the bundle's tables.
	generatedReference bool
}

// stallConfig is the watch for host stalls (package stall).
type stallConfig struct {
	// cpus are watched over every measured window; none when empty.
	cpus []int
	// remeasure: a repeat during which a watched CPU stalled longer than
	// this is set aside and measured again, at most maxRemeasures times
	// (0: never).
	remeasure time.Duration
}

// memoryConfig is the memory-scaling check.
type memoryConfig struct {
	arms             []string
	instances        []int
	batch, clients   int
	warmup, duration time.Duration
	// baseMiB and perFrontendMiB are the mesh's allowance beyond the
	// tables, and per frontend.
	baseMiB, perFrontendMiB int
}

// lists are the flags that are lists, as given; resolve parses them.
type lists struct {
	arms, batches, clients, open, openBudget string
	memArms, memInstances                    string
	workloads, workload                      string
	stallCPUs                                string
}

// parseFlags reads args into a config and the list flags, which resolve
// checks.
func parseFlags(args []string, stderr io.Writer) (*config, *lists, error) {
	c, l := &config{}, &lists{}
	defServer, defClient := defaultCPUs(runtime.NumCPU())
	fs := flag.NewFlagSet("benchrun", flag.ContinueOnError)
	fs.SetOutput(stderr)
	c.register(fs, l)
	c.load.register(fs, l, defClient)
	c.server.register(fs, defServer)
	c.stalls.register(fs, l, defaultStallCPUs(defServer, defClient))
	c.memory.register(fs, l)
	if err := fs.Parse(args); err != nil {
		return nil, nil, err
	}
	if fs.NArg() > 0 {
		return nil, nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	return c, l, nil
}

func (c *config) register(fs *flag.FlagSet, l *lists) {
	fs.StringVar(&c.root, "root", ".", "repository root `dir` (bench/python, .deps)")
	fs.StringVar(&c.bin, "bin", "bin", "`dir` of recmesh, embedder, accelerator and frontend")
	fs.StringVar(&c.python, "python", "", "`interpreter` of the Python arms, with jax, numpy, grpcio and protobuf (default: <root>/.deps/bench-venv)")
	fs.StringVar(&c.pyStubs, "py-stubs", "", "`dir` of the generated grpc_service_pb2*.py (default: <root>/.deps/bench-pygen)")
	fs.StringVar(&c.bundle, "bundle", model.DefaultDevBundle, "model bundle `dir` of a single workload (see -workloads)")
	fs.StringVar(&l.workload, "workload", "", "name of the -bundle workload (default: from its config, mlperf or hostbound)")
	fs.StringVar(&l.workloads, "workloads", "", "`name=dir,…`: workloads swept one after the other, each into <results>/<name>/ (overrides -bundle)")
	fs.BoolVar(&c.strict, "strict", false, "exit non-zero when any arm fails to start, fails parity or any request fails")
	fs.BoolVar(&c.denseCost, "dense-cost", true, "measure each workload's dense network against its lookups on one server core")
	fs.StringVar(&c.results, "results", "bench/results", "results `dir` (point JSONs per arm, run.json, REPORT.md, SVGs)")
	fs.StringVar(&l.arms, "arms", strings.Join(armNames(), ","), "arms to run, comma-separated")
	fs.BoolVar(&c.reportOnly, "report-only", false, "only re-render REPORT.md and the charts from <results>/run.json")
	fs.BoolVar(&c.fullSize, "full-size", false, "end with a `full-size:` line per workload (make bench-full-size): the mesh's throughput, memory and parity and the best Python arm's, or did-not-fit")
}

func (lc *loadConfig) register(fs *flag.FlagSet, l *lists, defClient string) {
	fs.StringVar(&l.batches, "batches", "1,16,128", "request sizes B_req")
	fs.StringVar(&l.clients, "clients", "1,4,16,64,256", "closed-loop concurrent clients C")
	fs.StringVar(&l.open, "open", "0.5,0.8", "open-loop rates as fractions of each arm's closed-loop peak (empty: none)")
	fs.StringVar(&l.openBudget, "open-budget", "0.8", "open-loop rates as fractions of each arm's closed-loop peak under the p99 ≤ 20 ms budget, the throughput it claims (empty: none)")
	fs.DurationVar(&lc.warmup, "warmup", 5*time.Second, "discarded warm-up before each measured window")
	fs.DurationVar(&lc.duration, "duration", 30*time.Second, "measured window")
	fs.IntVar(&lc.repeats, "repeats", 3, "measured repeats per point (medians are reported)")
	fs.IntVar(&lc.connections, "connections", 64, "persistent gRPC connections per arm, shared by every point")
	fs.StringVar(&lc.client, "client", loadgen.ClientLean, "the load generator's gRPC client: lean (bench/h2client: little client time in the latencies) or grpc (grpc-go's)")
	fs.StringVar(&lc.cpus, "client-cpus", defClient, "CPU `list` the load generator and monitor are pinned to (empty: not pinned)")
	fs.DurationVar(&lc.timeout, "timeout", loadgen.DefaultTimeout, "per-request deadline")
}

func (sc *serverConfig) register(fs *flag.FlagSet, defServer string) {
	fs.IntVar(&sc.frontends, "frontends", 0, "frontend processes of the recmesh arms (0: one per server CPU)")
	fs.IntVar(&sc.pyProcesses, "py-processes", 0, "frontend processes of the multi-process Python arms (0: one per server CPU)")
	fs.IntVar(&sc.pyWorkers, "py-workers", 8, "gRPC worker threads per Python process")
	fs.StringVar(&sc.cpus, "server-cpus", defServer, "CPU `list` every arm is pinned to (empty: not pinned)")
	fs.StringVar(&sc.sched, "server-sched", "batch", "scheduling `policy` of every arm's processes: batch (SCHED_BATCH, what recmesh's services choose by default: no wake-up preemption) or other (SCHED_OTHER: the mesh is run with RECMESH_SCHED_BATCH=false); the Python arms run under `chrt` with the same policy")
	fs.DurationVar(&sc.readyTimeout, "ready-timeout", 5*time.Minute, "how long an arm may take to start")
	fs.IntVar(&sc.parityExamples, "parity-examples", parity.DefaultExamples, "examples compared by the parity check")
	fs.BoolVar(&sc.generatedReference, "generated-reference", false, "check parity against the reference regenerated from the bundle's seed, every row drawn as the exporter drew it (for tables too big to read twice), rather than against the bundle's own tables")
}

func (sc *stallConfig) register(fs *flag.FlagSet, l *lists, defCPUs string) {
	fs.StringVar(&l.stallCPUs, "stall-cpus", defCPUs, "CPU `list` watched for host stalls over every measured window, recorded with each run and printed per point: a real-time thread pinned on each reports how late its 1 ms wake-ups come, beside the CPU's steal time (empty: none)")
	fs.DurationVar(&sc.remeasure, "stall-remeasure", 10*time.Millisecond, "set aside and measure again (at most twice) a repeat during which a watched CPU stalled longer than this: a window the host froze says nothing about the server (0: never)")
}

func (mc *memoryConfig) register(fs *flag.FlagSet, l *lists) {
	fs.StringVar(&l.memArms, "memory-arms", "recmesh-full,py-mp-batch", "arms of the memory-scaling check, run on the first workload (empty: skip it)")
	fs.StringVar(&l.memInstances, "memory-instances", "1,4", "frontend (mesh) or process (Python) counts of the memory check")
	fs.IntVar(&mc.batch, "memory-batch", 16, "B_req of the memory check's light load")
	fs.IntVar(&mc.clients, "memory-clients", 4, "C of the memory check's light load")
	fs.DurationVar(&mc.warmup, "memory-warmup", time.Second, "memory check: warm-up")
	fs.DurationVar(&mc.duration, "memory-duration", 2*time.Second, "memory check: measured window")
	fs.IntVar(&mc.baseMiB, "memory-base-mib", 768, "memory check: the mesh's allowance beyond the tables, MiB (embedder, accelerator with XLA, NATS)")
	fs.IntVar(&mc.perFrontendMiB, "memory-per-frontend-mib", 64, "memory check: the mesh's allowance per frontend, MiB")
}

// resolve pins this process to the client CPUs, parses and checks the
// list flags and the rest, and makes the paths absolute: everything the
// sweep needs before it starts.
func (c *config) resolve(l *lists) (err error) {
	if err := c.pin(); err != nil {
		return err
	}
	if c.server.sched != "batch" && c.server.sched != "other" {
		return fmt.Errorf("-server-sched %q: want batch or other", c.server.sched)
	}
	if err := c.parseLists(l); err != nil {
		return err
	}
	if err := c.check(); err != nil {
		return err
	}
	for _, p := range []*string{&c.root, &c.bin, &c.bundle, &c.results} {
		if *p, err = filepath.Abs(*p); err != nil {
			return err
		}
	}
	c.workloads, err = parseWorkloads(l.workloads, c.bundle, l.workload)
	return err
}

// pin pins this process to the client CPUs and resolves the instance
// counts against the server's.
func (c *config) pin() error {
	// The server's CPUs: -server-cpus, or, unpinned, what this process may
	// use before it pins itself to the load generator's.
	serverSet, err := cpuset.Current()
	if err != nil {
		return fmt.Errorf("benchrun: CPUs allowed: %w", err)
	}
	if c.server.cpus != "" {
		if serverSet, err = cpuset.Parse(c.server.cpus); err != nil {
			return fmt.Errorf("-server-cpus: %w", err)
		}
	}
	// Pin first, before any goroutine of ours exists; the arms are pinned
	// separately through taskset.
	if c.load.cpus != "" {
		set, err := cpuset.Parse(c.load.cpus)
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
	c.server.frontends = perCPU(c.server.frontends, serverSet)
	c.server.pyProcesses = perCPU(c.server.pyProcesses, serverSet)
	return nil
}

// parseLists parses the list flags, in the order they are checked.
func (c *config) parseLists(l *lists) error {
	var err error
	if c.stalls.cpus, err = stall.ParseCPUs(l.stallCPUs); err != nil {
		return err
	}
	c.arms = splitList(l.arms)
	for _, a := range c.arms {
		if _, err := parseArm(a); err != nil {
			return fmt.Errorf("-arms: %w", err)
		}
	}
	c.memory.arms = splitList(l.memArms)
	for _, a := range c.memory.arms {
		if s, err := parseArm(a); err != nil || !(s.mesh || s.multi()) {
			return fmt.Errorf("-memory-arms: %q: want a recmesh arm or a multi-process Python arm", a)
		}
	}
	if c.load.batches, err = intList("-batches", l.batches); err != nil {
		return err
	}
	if c.load.clients, err = intList("-clients", l.clients); err != nil {
		return err
	}
	if c.memory.instances, err = intList("-memory-instances", l.memInstances); err != nil {
		return err
	}
	if c.load.openFractions, err = floatList("-open", l.open); err != nil {
		return err
	}
	c.load.budgetFractions, err = floatList("-open-budget", l.openBudget)
	return err
}

// check checks the numbers.
func (c *config) check() error {
	lc, sc := &c.load, &c.server
	switch {
	case len(lc.batches) == 0 || len(lc.clients) == 0:
		return errors.New("-batches and -clients need at least one value each")
	case lc.repeats < 1 || lc.duration <= 0 || lc.warmup < 0 || lc.connections < 1:
		return errors.New("want -repeats ≥ 1, -duration > 0, -warmup ≥ 0 and -connections ≥ 1")
	case sc.frontends < 1 || sc.pyProcesses < 1 || sc.pyWorkers < 1:
		return errors.New("want -frontends and -py-processes ≥ 0 (0: one per server CPU) and -py-workers ≥ 1")
	}
	return nil
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

// perCPU resolves a process count flag: 0 means one per CPU of set.
func perCPU(n int, set unix.CPUSet) int {
	if n == 0 {
		return max(set.Count(), 1)
	}
	return n
}

// splitList splits a comma-separated list, dropping empty items.
func splitList(s string) []string {
	var out []string
	for f := range strings.SplitSeq(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// intList parses a list flag of integers ≥ 1.
func intList(name, s string) ([]int, error) {
	return numList(name, s, "value", "integers ≥ 1", func(f string) (int, bool) {
		n, err := strconv.Atoi(f)
		return n, err == nil && n >= 1
	})
}

// floatList parses a list flag of fractions, 0 < f ≤ 1.5.
func floatList(name, s string) ([]float64, error) {
	return numList(name, s, "fraction", "0 < f ≤ 1.5", func(f string) (float64, bool) {
		v, err := strconv.ParseFloat(f, 64)
		return v, err == nil && v > 0 && v <= 1.5
	})
}

// numList parses the list flag name, each item with parse, which says
// whether it is valid; a bad one is named as a `what`, followed by want.
func numList[T int | float64](name, s, what, want string, parse func(string) (T, bool)) ([]T, error) {
	var out []T
	for _, f := range splitList(s) {
		v, ok := parse(f)
		if !ok {
			return nil, fmt.Errorf("%s: bad %s %q, want %s", name, what, f, want)
		}
		out = append(out, v)
	}
	return out, nil
}
