// Command lookupbench measures the embedding lookup kernel the way the
// embedder runs it: every table of a bundle copied into one huge page
// region, batches of uniform random ids sum-pooled on one pinned core. It
// prints examples per core-second and can write them as JSON for
// bench/numpy/lookup_bench.py, which runs the NumPy baseline and prints the
// comparison (see `make bench-lookup`).
//
// Every flag has an environment twin, RECMESH_LOOKUPBENCH_<FLAG> (upper
// case, '-' as '_'), read when the flag is not given.
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/recmesh/recmesh/embedder/lookup"
)

func main() {
	var o Options
	fs := flag.NewFlagSet("lookupbench", flag.ExitOnError)
	fs.StringVar(&o.Bundle, "bundle", "", "bundle directory (required)")
	fs.IntVar(&o.Batch, "batch", defaultBatch, "examples per Pool call")
	fs.DurationVar(&o.Duration, "duration", defaultDuration, "measured time")
	fs.DurationVar(&o.Warmup, "warmup", defaultWarmup, "unmeasured time before it")
	fs.IntVar(&o.Batches, "batches", defaultBatches, "distinct random id batches cycled through")
	fs.Uint64Var(&o.Seed, "seed", defaultSeed, "seed of the random ids")
	fs.IntVar(&o.CPU, "cpu", -1, "CPU to pin the benchmark thread to (-1: the last allowed)")
	fs.StringVar(&o.Kernel, "kernel", "", "kernel: "+strings.Join(lookup.Kernels(), ", ")+" (default the first)")
	fs.IntVar(&o.Prefetch, "prefetch", -1, fmt.Sprintf("rows prefetched ahead (-1: the kernel's default, %d; %d for avx2 at fp32, %d for avx512 at int8 and int4)",
		lookup.DefaultPrefetchRows, lookup.AVX2FP32PrefetchRows, lookup.AVX512NarrowPrefetchRows))
	fs.StringVar(&o.JSON, "json", "", "write the result as JSON to this file")
	fs.StringVar(&o.CPUProfile, "cpuprofile", "", "write a CPU profile of the measured loop to this file")
	if err := parse(fs, os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "lookupbench:", err)
		os.Exit(2)
	}
	if o.Bundle == "" || o.Batch <= 0 || o.Batches <= 0 || o.Duration <= 0 {
		fmt.Fprintln(os.Stderr, "lookupbench: -bundle is required; -batch, -batches and -duration must be positive")
		os.Exit(2)
	}
	if _, err := Run(o, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "lookupbench:", err)
		os.Exit(1)
	}
}

// parse fills every flag not given on the command line from its
// environment twin, then parses the command line.
func parse(fs *flag.FlagSet, args []string) error {
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		env := "RECMESH_LOOKUPBENCH_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		if v, ok := os.LookupEnv(env); ok && err == nil {
			if e := f.Value.Set(v); e != nil {
				err = fmt.Errorf("%s=%q: %w", env, v, e)
			}
		}
	})
	if err != nil {
		return err
	}
	return fs.Parse(args)
}
