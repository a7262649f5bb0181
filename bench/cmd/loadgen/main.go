// Command loadgen drives an Open Inference Protocol v2 server (recmesh, or
// any benchmark arm that serves the same DLRM model) and measures it.
//
//	loadgen [run] [flags]   measure one point: closed loop (-concurrency C)
//	                        or open loop (-mode open -rate R), warm-up then
//	                        -repeats measured windows, one JSON file (-out)
//	loadgen parity [flags]  compare the server's scores with the plain-Go
//	                        reference on the same bundle; exit 1 unless
//	                        max|Δ| ≤ -tolerance
//	loadgen stall-probe -cpu N
//	                        watch CPU N for stalls (package stall) until
//	                        stdin closes, then print the report as JSON;
//	                        run -stall-cpus starts one per CPU and window
//
// -cpus pins the whole load generator (every thread) to a CPU list before
// it starts any goroutine, as `taskset -a` would; see package cpuset.
// -monitor-pids samples the server's CPU time and memory (package monitor)
// over exactly each measured window. -stall-cpus watches CPUs (the
// server's, the load generator's) for stalls that no process causes
// (package stall) over the same window, so a tail that moved with the
// machine can be told from one that moved with the server;
// -memory-probe-mib adds the host's memory latency to the last CPU's.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/recmesh/recmesh/bench/cpuset"
	"github.com/recmesh/recmesh/bench/internal/command"
	"github.com/recmesh/recmesh/bench/loadgen"
	"github.com/recmesh/recmesh/bench/monitor"
	"github.com/recmesh/recmesh/bench/parity"
	"github.com/recmesh/recmesh/bench/stall"
	"github.com/recmesh/recmesh/model"
	"github.com/recmesh/recmesh/proto/oip"
)

func main() { command.Main("loadgen", run) }

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cmd := "run"
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		cmd, args = args[0], args[1:]
	}
	switch cmd {
	case "run":
		return runLoad(ctx, args, stdout, stderr)
	case "parity":
		return runParity(ctx, args, stdout, stderr)
	case stall.ProbeCommand:
		return stall.Command("loadgen", args, os.Stdin, stdout, stderr)
	default:
		return fmt.Errorf("unknown command %q (want run, parity or stall-probe)", cmd)
	}
}

// common holds the flags both commands take.
type common struct {
	target       string
	modelName    string
	bundle       string
	maxVocab     int
	sparseType   string
	cpus         string
	readyTimeout time.Duration
}

func (c *common) register(fs *flag.FlagSet) {
	fs.StringVar(&c.target, "target", "127.0.0.1:8001", "server address `host:port`")
	fs.StringVar(&c.modelName, "model", oip.DefaultModelName, "model name")
	fs.StringVar(&c.bundle, "bundle", model.DefaultDevBundle, "bundle `dir` whose config.json gives the vocabulary sizes (parity also reads its weights)")
	fs.StringVar(&c.sparseType, "sparse-dtype", oip.TypeINT32, "datatype of the ids: INT32 or INT64")
	fs.StringVar(&c.cpus, "cpus", "", "pin the whole process to this CPU `list` (for example 8-23) before starting")
	fs.DurationVar(&c.readyTimeout, "ready-timeout", 2*time.Minute, "how long to wait for ServerReady and ModelReady on every connection")
}

// pin applies -cpus, first thing after flag parsing: no goroutine of ours
// runs yet, so only the runtime's own threads exist.
func (c *common) pin() (string, error) {
	if c.cpus == "" {
		return "", nil
	}
	set, err := cpuset.Parse(c.cpus)
	if err != nil {
		return "", err
	}
	if err := cpuset.PinProcess(set); err != nil {
		return "", err
	}
	return cpuset.Format(set), nil
}

// config returns the model config: from -max-vocab when given, else from
// the bundle's config.json (the weights are not needed to send requests).
func (c *common) config() (model.Config, string, error) {
	if c.maxVocab > 0 {
		return model.DLRMv2(c.maxVocab), fmt.Sprintf("max-vocab=%d", c.maxVocab), nil
	}
	cfg, err := loadgen.ReadConfig(c.bundle)
	if err != nil {
		return model.Config{}, "", err
	}
	return cfg, c.bundle, nil
}

func dial(ctx context.Context, c *common, conns int) (*oip.Pool, error) {
	rctx, cancel := context.WithTimeout(ctx, c.readyTimeout)
	defer cancel()
	return loadgen.DialReady(rctx, c.target, c.modelName, conns)
}

func usage(fs *flag.FlagSet, head string) {
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), head)
		fs.PrintDefaults()
	}
}

func runLoad(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var (
		c              common
		mode           string
		batch          int
		concurrency    int
		rate           float64
		maxOutstanding int
		connections    int
		warmup         time.Duration
		duration       time.Duration
		timeout        time.Duration
		repeats        int
		pool           int
		poolBytes      int64
		seed           uint64
		out            string
		arm, label     string
		monPIDs        string
		monDescendants bool
		monInterval    time.Duration
		stallCPUList   string
		memoryProbeMiB int
		clientKind     string
	)
	fs := flag.NewFlagSet("loadgen run", flag.ContinueOnError)
	fs.SetOutput(stderr)
	usage(fs, "usage: loadgen [run] [flags]: measure one point (closed or open loop) against an OIP v2 server")
	c.register(fs)
	fs.IntVar(&c.maxVocab, "max-vocab", 0, "take the config from model.DLRMv2(`N`) instead of -bundle")
	fs.StringVar(&mode, "mode", string(loadgen.Closed), "closed (C back-to-back clients) or open (Poisson arrivals)")
	fs.IntVar(&batch, "batch", 16, "examples per request (B_req)")
	fs.IntVar(&concurrency, "concurrency", 4, "closed loop: concurrent clients (C)")
	fs.Float64Var(&rate, "rate", 0, "open loop: mean arrival rate in requests/s")
	fs.IntVar(&maxOutstanding, "max-outstanding", loadgen.DefaultMaxOutstanding, "open loop: most requests in flight; arrivals beyond it are dropped and counted")
	fs.IntVar(&connections, "connections", 0, "persistent gRPC connections (default min(C, 64) closed, 64 open)")
	fs.StringVar(&clientKind, "client", loadgen.ClientLean, "gRPC client: lean (bench/h2client: little client time in the latencies) or grpc (grpc-go's)")
	fs.DurationVar(&warmup, "warmup", 5*time.Second, "discarded warm-up before each measured window")
	fs.DurationVar(&duration, "duration", 30*time.Second, "measured window")
	fs.DurationVar(&timeout, "timeout", loadgen.DefaultTimeout, "per-request deadline")
	fs.IntVar(&repeats, "repeats", 1, "measured runs (each with its own warm-up)")
	fs.IntVar(&pool, "pool", loadgen.DefaultPoolRequests, "distinct pre-encoded requests, reused round-robin")
	fs.Int64Var(&poolBytes, "pool-bytes", loadgen.DefaultPoolBytes, "cap on the request pool's memory (shrinks -pool for big B_req)")
	fs.Uint64Var(&seed, "seed", 1, "input seed (model.RandomInputs); open-loop arrivals use seed+repeat")
	fs.StringVar(&out, "out", "", "write the point as JSON to this `file`")
	fs.StringVar(&arm, "arm", "", "arm name recorded in the JSON")
	fs.StringVar(&label, "label", "", "free-form label recorded in the JSON")
	fs.StringVar(&monPIDs, "monitor-pids", "", "comma-separated server `pids` to sample during each measured window")
	fs.BoolVar(&monDescendants, "monitor-descendants", true, "also sample every descendant of -monitor-pids")
	fs.DurationVar(&monInterval, "monitor-interval", monitor.DefaultInterval, "monitor sampling period")
	fs.StringVar(&stallCPUList, "stall-cpus", "", "during each measured window, watch these CPUs (`list`: the server's, the load generator's) for stalls no process causes: a real-time thread pinned on each reports how late its 1 ms wake-ups come, beside the CPU's steal time")
	fs.IntVar(&memoryProbeMiB, "memory-probe-mib", 0, "with -stall-cpus, the probe of the last CPU listed (the load generator's) also times dependent loads through a buffer of this many `MiB`, every 100 ms: the memory latency the host gives at the moment, which a neighbour's traffic moves without taking a CPU (0: not)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	stallCPUs, err := stall.ParseCPUs(stallCPUList)
	if err != nil {
		return err
	}
	switch {
	case memoryProbeMiB < 0:
		return fmt.Errorf("-memory-probe-mib %d: want 0 (none) or a buffer size in MiB", memoryProbeMiB)
	case memoryProbeMiB > 0 && len(stallCPUs) == 0:
		return fmt.Errorf("-memory-probe-mib %d runs in a stall probe: give -stall-cpus too", memoryProbeMiB)
	}
	pinned, err := c.pin()
	if err != nil {
		return err
	}
	m := loadgen.Mode(mode)
	switch {
	case m != loadgen.Closed && m != loadgen.Open:
		return fmt.Errorf("-mode %q, want closed or open", mode)
	case m == loadgen.Open && !(rate > 0):
		return fmt.Errorf("-mode open needs -rate > 0")
	case m == loadgen.Closed && concurrency < 1:
		return fmt.Errorf("-concurrency %d, want at least 1", concurrency)
	case repeats < 1:
		return fmt.Errorf("-repeats %d, want at least 1", repeats)
	}
	if connections <= 0 {
		connections = 64
		if m == loadgen.Closed {
			connections = min(max(concurrency, 1), 64)
		}
	}
	pids, err := parsePIDs(monPIDs)
	if err != nil {
		return err
	}
	cfg, source, err := c.config()
	if err != nil {
		return err
	}
	w, err := loadgen.NewWorkload(cfg, loadgen.WorkloadOptions{
		ModelName: c.modelName, BatchSize: batch, PoolRequests: pool, PoolBytes: poolBytes, Seed: seed, SparseType: c.sparseType,
	})
	if err != nil {
		return err
	}
	rctx, cancel := context.WithTimeout(ctx, c.readyTimeout)
	conns, err := loadgen.Dial(rctx, clientKind, c.target, c.modelName, connections)
	cancel()
	if err != nil {
		return err
	}
	defer conns.Close()

	rc := loadgen.Config{
		Mode: m, Concurrency: concurrency, Rate: rate, MaxOutstanding: maxOutstanding,
		Warmup: warmup, Duration: duration, Timeout: timeout,
	}
	p := loadgen.NewPoint(conns, w, rc, repeats)
	p.Arm, p.Label, p.Target, p.Model = arm, label, c.target, c.modelName
	p.Seed, p.Bundle, p.ClientCPUs, p.MonitorPIDs = seed, source, pinned, pids
	watch := loadgen.Watch{PIDs: pids, Descendants: monDescendants, Interval: monInterval, StallCPUs: stallCPUs, MemoryProbeMiB: memoryProbeMiB}
	for i := range repeats {
		rc.Seed = seed + uint64(i)
		rec, err := loadgen.Measure(ctx, conns, w, rc, watch)
		if err != nil {
			return fmt.Errorf("repeat %d: %w", i+1, err)
		}
		rec.Repeat = i + 1
		p.Runs = append(p.Runs, rec)
		fmt.Fprintf(stdout, "run %d/%d: %s\n", i+1, repeats, describe(p, rec))
	}
	p.Summarize()
	s := p.Summary
	fmt.Fprintf(stdout, "median of %d: %.1f req/s %.0f examples/s; p50 %.3f p99 %.3f ms; %d errors\n",
		s.Repeats, s.RequestsPerS, s.ExamplesPerS, s.P50Ms, s.P99Ms, s.Errors)
	if out != "" {
		if err := p.WriteFile(out); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "wrote %s\n", out)
	}
	return nil
}

func describe(p *loadgen.Point, r loadgen.RunRecord) string {
	load := fmt.Sprintf("C=%d", p.Concurrency)
	if p.Mode == loadgen.Open {
		load = fmt.Sprintf("rate=%.0f/s (offered %.1f/s)", p.RateRPS, r.OfferedRPS)
	}
	l := r.Latency
	s := fmt.Sprintf("%s B=%d %s conns=%d: %.1f req/s %.0f examples/s; latency ms p50 %.3f p90 %.3f p99 %.3f p999 %.3f max %.3f; ok %d errors %d",
		p.Mode, p.BatchSize, load, p.Connections, r.RequestsPerS, r.ExamplesPerS, l.P50, l.P90, l.P99, l.P999, l.Max, r.OK, r.Errors)
	if r.Errors > 0 {
		s += fmt.Sprintf(" %v (first: %s)", r.ErrorsByCode, r.FirstError)
	}
	if m := r.Monitor; m != nil {
		s += fmt.Sprintf("\n  server: %.2f cores, %.3f CPU-s per 1k examples, peak RSS %.1f MiB, peak PSS %.1f MiB (%d processes)",
			m.CPUCores, m.CPUSecondsPer1kExamples, float64(m.PeakRSSBytes)/(1<<20), float64(m.PeakPSSBytes)/(1<<20), len(m.Processes))
	}
	for _, st := range r.Stalls {
		s += "\n  host: " + st.String()
	}
	return s
}

func parsePIDs(s string) ([]int, error) {
	if s == "" {
		return nil, nil
	}
	var pids []int
	for f := range strings.SplitSeq(s, ",") {
		pid, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || pid <= 0 {
			return nil, fmt.Errorf("-monitor-pids: bad pid %q", f)
		}
		pids = append(pids, pid)
	}
	return pids, nil
}

func runParity(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var (
		c          common
		examples   int
		sizes      string
		seed       uint64
		tolerance  float64
		timeout    time.Duration
		jsonOut    string
		batchSizes []int
	)
	fs := flag.NewFlagSet("loadgen parity", flag.ContinueOnError)
	fs.SetOutput(stderr)
	usage(fs, "usage: loadgen parity [flags]: compare a server's scores with the plain-Go reference; exit 1 on a mismatch")
	c.register(fs)
	fs.IntVar(&examples, "examples", parity.DefaultExamples, "examples to compare")
	fs.StringVar(&sizes, "batch-sizes", joinInts(parity.DefaultBatchSizes), "request sizes, cycled (comma-separated)")
	fs.Uint64Var(&seed, "seed", parity.DefaultSeed, "input seed")
	fs.Float64Var(&tolerance, "tolerance", parity.DefaultTolerance, "largest allowed |score − reference|")
	fs.DurationVar(&timeout, "timeout", time.Minute, "per-request deadline")
	fs.StringVar(&jsonOut, "json", "", "also write the result as JSON to this `file`")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if _, err := c.pin(); err != nil {
		return err
	}
	for f := range strings.SplitSeq(sizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			return fmt.Errorf("-batch-sizes: bad size %q", f)
		}
		batchSizes = append(batchSizes, n)
	}
	b, ref, err := parity.OpenReference(c.bundle)
	if err != nil {
		return err
	}
	defer b.Close()
	conns, err := dial(ctx, &c, 1)
	if err != nil {
		return err
	}
	defer conns.Close()
	res, err := parity.Check(ctx, conns.Client(0), b.Config, ref, parity.Options{
		ModelName: c.modelName, Examples: examples, BatchSizes: batchSizes, Seed: seed,
		Tolerance: tolerance, SparseType: c.sparseType, Timeout: timeout,
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%s: %s\n", c.target, res)
	if jsonOut != "" {
		enc, err := json.MarshalIndent(res, "", "  ")
		if err != nil {
			return fmt.Errorf("encode parity result: %w", err)
		}
		if err := os.WriteFile(jsonOut, append(enc, '\n'), 0o644); err != nil {
			return fmt.Errorf("write parity result: %w", err)
		}
	}
	if !res.Pass {
		return fmt.Errorf("parity failed against %s: max|Δ| %.3g > %.3g", c.target, res.MaxAbsDiff, res.Tolerance)
	}
	return nil
}

func joinInts(v []int) string {
	s := make([]string, len(v))
	for i, n := range v {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ",")
}
