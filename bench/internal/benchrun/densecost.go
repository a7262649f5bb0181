package benchrun

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/recmesh/recmesh/bench/cpuset"
	"github.com/recmesh/recmesh/bench/report"
)

// denseCostBuckets are the batch sizes the dense network is timed at:
// the request sizes of the study.
var denseCostBuckets = []int{1, 16, 128}

// measureDenseCost times, on the first server CPU, the lookup kernel over
// the workload's tables (bin/lookupbench) and the compiled dense network
// (bin/accelerator bench), one after the other so neither disturbs the
// other. It returns nil, after saying why, when either cannot run: the
// report then shows the ratio as not measured.
func (c *config) measureDenseCost(ctx context.Context) *report.DenseCost {
	cpu := 0
	if c.server.cpus != "" {
		if set, err := cpuset.Parse(c.server.cpus); err == nil {
			for i := range 1 << 12 {
				if set.IsSet(i) {
					cpu = i
					break
				}
			}
		}
	}
	cost := &report.DenseCost{CPUs: strconv.Itoa(cpu)}
	lookup, err := c.lookupRate(ctx, cpu)
	if err != nil {
		fmt.Fprintf(c.out, "benchrun: dense cost: lookups: %v\n", err)
		return nil
	}
	cost.LookupExamplesPerS = lookup
	dense, err := c.denseRates(ctx, cpu)
	if err != nil {
		fmt.Fprintf(c.out, "benchrun: dense cost: dense network: %v\n", err)
		return nil
	}
	for _, b := range denseCostBuckets {
		cb := report.DenseCostBucket{Bucket: b, DenseExamplesPerS: dense[b]}
		cost.Buckets = append(cost.Buckets, cb)
		fmt.Fprintf(c.out, "benchrun:   dense cost: bucket %d: dense %.0f examples/s, lookups %.0f examples/s, dense/lookup time %.3f\n",
			b, cb.DenseExamplesPerS, lookup, cost.Ratio(cb))
	}
	return cost
}

// lookupRate runs bin/lookupbench pinned to cpu and returns its examples
// per core-second.
func (c *config) lookupRate(ctx context.Context, cpu int) (float64, error) {
	f, err := os.CreateTemp("", "benchrun-lookup-*.json")
	if err != nil {
		return 0, err
	}
	f.Close()
	defer os.Remove(f.Name())
	// taskset first: this process is pinned to the client CPUs, and a
	// child inherits that affinity, which -cpu may only narrow.
	cmd := exec.CommandContext(ctx, "taskset", "-c", strconv.Itoa(cpu), filepath.Join(c.bin, "lookupbench"),
		"-bundle", c.bundle, "-cpu", strconv.Itoa(cpu), "-warmup", "500ms", "-duration", "2s", "-json", f.Name())
	if out, err := cmd.CombinedOutput(); err != nil {
		return 0, fmt.Errorf("%s: %w\n%s", cmd, err, tail(out, 10))
	}
	b, err := os.ReadFile(f.Name())
	if err != nil {
		return 0, err
	}
	var res struct {
		ExamplesPerCoreSec float64 `json:"examples_per_core_s"`
	}
	if err := json.Unmarshal(b, &res); err != nil || res.ExamplesPerCoreSec <= 0 {
		return 0, fmt.Errorf("lookupbench result %q: %v", b, err)
	}
	return res.ExamplesPerCoreSec, nil
}

// denseRates runs `accelerator bench` pinned to cpu and returns examples/s
// by bucket.
func (c *config) denseRates(ctx context.Context, cpu int) (map[int]float64, error) {
	var buckets []string
	for _, b := range denseCostBuckets {
		buckets = append(buckets, strconv.Itoa(b))
	}
	args := []string{"-c", strconv.Itoa(cpu), filepath.Join(c.bin, "accelerator"), "bench", "--bundle", c.bundle,
		"--buckets", strings.Join(buckets, ","), "--duration", "1s"}
	cmd := exec.CommandContext(ctx, "taskset", args...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("%s: %w\n%s", cmd, err, tail(out, 10))
	}
	rates, err := parseModelLines(out)
	if err != nil {
		return nil, err
	}
	for _, b := range denseCostBuckets {
		if rates[b] <= 0 {
			return nil, fmt.Errorf("accelerator bench printed no rate for bucket %d:\n%s", b, tail(out, 10))
		}
	}
	return rates, nil
}

// parseModelLines reads `model: bucket=<b> examples_per_s=<x> …` lines.
func parseModelLines(out []byte) (map[int]float64, error) {
	rates := map[int]float64{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), "model: bucket=")
		if !ok {
			continue
		}
		fields := strings.Fields(rest)
		if len(fields) < 2 {
			continue
		}
		b, err := strconv.Atoi(fields[0])
		if err != nil {
			return nil, fmt.Errorf("model line %q: %w", sc.Text(), err)
		}
		v, ok := strings.CutPrefix(fields[1], "examples_per_s=")
		if !ok {
			continue
		}
		x, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return nil, fmt.Errorf("model line %q: %w", sc.Text(), err)
		}
		rates[b] = x
	}
	return rates, nil
}

// tail is the last n lines of out.
func tail(out []byte, n int) string {
	lines := strings.Split(strings.TrimRight(string(out), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
