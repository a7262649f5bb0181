package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/pprof"
	"time"

	"golang.org/x/sys/unix"

	"github.com/recmesh/recmesh/embedder/hugepage"
	"github.com/recmesh/recmesh/embedder/lookup"
	"github.com/recmesh/recmesh/model"
)

// Defaults of the benchmark, one per flag.
const (
	defaultBatch    = 128             // examples per Pool call, the batch the embedder serves
	defaultDuration = 5 * time.Second // measured time
	defaultWarmup   = 1 * time.Second // untimed pooling first, to settle caches and TLBs
	defaultBatches  = 256             // distinct id batches cycled through (≈28 MB of ids)
	defaultSeed     = 1
)

// Options configures one benchmark run.
type Options struct {
	Bundle     string        // bundle directory (config.json + model.safetensors)
	Batch      int           // examples per Pool call
	Duration   time.Duration // measured time
	Warmup     time.Duration // unmeasured time before it
	Batches    int           // distinct id batches to cycle through
	Seed       uint64        // seed of the random ids
	CPU        int           // CPU to pin to; -1 picks the last one allowed
	Kernel     string        // kernel name; "" for the best this CPU runs
	Prefetch   int           // rows prefetched ahead; <0 for the default
	JSON       string        // where to write the Result as JSON ("" for nowhere)
	CPUProfile string        // where to write a CPU profile of the measured loop
}

// Result is what one run measured; the NumPy baseline reads it back (JSON)
// to print the comparison line.
type Result struct {
	Dtype              string  `json:"dtype"`
	Kernel             string  `json:"kernel"`
	PrefetchRows       int     `json:"prefetch_rows"`
	Batch              int     `json:"batch"`
	CPU                int     `json:"cpu"`
	Examples           int64   `json:"examples"`
	CPUSeconds         float64 `json:"cpu_seconds"`
	WallSeconds        float64 `json:"wall_seconds"`
	ExamplesPerCoreSec float64 `json:"examples_per_core_s"`
	ExamplesPerWallSec float64 `json:"examples_per_wall_s"`
	TableBytes         int64   `json:"table_bytes"`
	PageMode           string  `json:"page_mode"`
	HugePageFraction   float64 `json:"huge_page_fraction"`
}

// Run loads the bundle's tables into one huge page region and measures
// pooling throughput on one pinned core, writing progress to log.
func Run(opts Options, log io.Writer) (Result, error) {
	var res Result
	tables, region, cfg, err := loadTables(opts.Bundle, log)
	if err != nil {
		return res, err
	}
	defer region.Close()
	res.TableBytes = int64(len(region.Bytes()))
	res.PageMode = region.Mode().String()
	if res.HugePageFraction, err = region.HugePageFraction(); err != nil {
		return res, err
	}
	fmt.Fprintf(log, "lookupbench: %d bytes of tables in %s pages, huge page fraction %.3f\n",
		res.TableBytes, res.PageMode, res.HugePageFraction)
	for _, why := range region.FallbackReasons() {
		fmt.Fprintf(log, "lookupbench: fell back: %v\n", why)
	}

	t, err := lookup.NewTablesOf(cfg.TableDtype, tables, cfg.Hotness)
	if err != nil {
		return res, err
	}
	res.Dtype = cfg.TableDtype.String()
	if opts.Kernel != "" {
		if err := t.SetKernel(opts.Kernel); err != nil {
			return res, err
		}
	}
	if opts.Prefetch >= 0 {
		t.SetPrefetchRows(opts.Prefetch)
	}
	res.PrefetchRows = t.PrefetchRows()
	res.Kernel, res.Batch = t.Kernel(), opts.Batch

	_, ids := model.RandomInputs(cfg, opts.Seed, opts.Batch*opts.Batches)
	if err := t.Validate(ids, opts.Batch*opts.Batches); err != nil {
		return res, fmt.Errorf("random ids: %w", err)
	}
	out := make([]float32, t.OutLen(opts.Batch))

	// Pin the measuring goroutine's thread to one CPU, so the figure is
	// what one core does, and so its CPU time equals its wall time when
	// nothing else runs there.
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		done <- measure(t, out, ids, opts, &res, log)
	}()
	if err := <-done; err != nil {
		return res, err
	}
	if opts.JSON != "" {
		b, err := json.MarshalIndent(res, "", "  ")
		if err != nil {
			return res, err
		}
		if err := os.WriteFile(opts.JSON, append(b, '\n'), 0o644); err != nil {
			return res, fmt.Errorf("write result: %w", err)
		}
	}
	return res, nil
}

// loadTables opens the bundle, copies every table, at the bundle's
// precision, into one huge page region laid out by lookup.LayoutTablesOf,
// and closes the bundle so only the private copy stays mapped.
func loadTables(dir string, log io.Writer) ([][]byte, *hugepage.Region, model.Config, error) {
	b, err := model.Open(dir)
	if err != nil {
		return nil, nil, model.Config{}, err
	}
	defer b.Close()
	cfg := b.Config
	size := lookup.TableBytesOf(cfg.TableDtype, cfg.VocabSizes)
	region, err := hugepage.Map(size, hugepage.Options{Populate: true})
	if err != nil {
		return nil, nil, cfg, err
	}
	tables, err := lookup.LayoutTablesOf(cfg.TableDtype, region.Bytes(), cfg.VocabSizes)
	if err != nil {
		region.Close()
		return nil, nil, cfg, err
	}
	// The copy reads the file once, front to back: ask for read-ahead.
	if err := b.Advise(unix.MADV_SEQUENTIAL); err != nil {
		fmt.Fprintf(log, "lookupbench: %v\n", err)
	}
	start := time.Now()
	for i := range tables {
		copy(tables[i], b.TableData(i))
	}
	fmt.Fprintf(log, "lookupbench: copied %d tables (%d bytes) from %s in %v\n",
		len(tables), size, dir, time.Since(start).Round(time.Millisecond))
	return tables, region, cfg, nil
}

// measure pools batches for opts.Warmup, then counts examples pooled in
// opts.Duration. It runs on a locked OS thread and pins it. Throughput per
// core-second divides by the thread's own CPU time (RUSAGE_THREAD), so time
// the thread spent descheduled does not count against the kernel.
func measure(t *lookup.Tables, out []float32, ids []int32, opts Options, res *Result, log io.Writer) error {
	cpu, err := pin(opts.CPU)
	if err != nil {
		return err
	}
	res.CPU = cpu
	w := opts.Batch * t.Width()
	i := 0
	step := func() error {
		err := t.Pool(out, ids[i*w:(i+1)*w], opts.Batch)
		i = (i + 1) % opts.Batches
		return err
	}
	for start := time.Now(); time.Since(start) < opts.Warmup; {
		if err := step(); err != nil {
			return err
		}
	}
	if opts.CPUProfile != "" {
		f, err := os.Create(opts.CPUProfile)
		if err != nil {
			return fmt.Errorf("cpu profile: %w", err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return fmt.Errorf("cpu profile: %w", err)
		}
		defer pprof.StopCPUProfile()
	}
	cpu0, err := threadCPU()
	if err != nil {
		return err
	}
	start := time.Now()
	var examples int64
	for time.Since(start) < opts.Duration {
		if err := step(); err != nil {
			return err
		}
		examples += int64(opts.Batch)
	}
	wall := time.Since(start)
	cpu1, err := threadCPU()
	if err != nil {
		return err
	}
	res.Examples = examples
	res.WallSeconds = wall.Seconds()
	res.CPUSeconds = (cpu1 - cpu0).Seconds()
	if res.CPUSeconds <= 0 {
		return errors.New("measured no CPU time")
	}
	res.ExamplesPerCoreSec = float64(examples) / res.CPUSeconds
	res.ExamplesPerWallSec = float64(examples) / res.WallSeconds
	fmt.Fprintf(log, "lookupbench: %s tables, %s kernel, prefetch %d rows, B=%d on cpu %d: %d examples in %.2fs cpu / %.2fs wall: %.0f examples per core-second (%.2f µs per example)\n",
		res.Dtype, res.Kernel, res.PrefetchRows, opts.Batch, cpu, examples, res.CPUSeconds, res.WallSeconds,
		res.ExamplesPerCoreSec, 1e6/res.ExamplesPerCoreSec)
	return nil
}

// pin binds the calling thread to one CPU (the last allowed one when cpu
// is negative) and returns it. The caller must hold runtime.LockOSThread.
func pin(cpu int) (int, error) {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return 0, fmt.Errorf("pin: sched_getaffinity: %w", err)
	}
	if cpu < 0 {
		for c := range len(set) * 64 {
			if set.IsSet(c) {
				cpu = c
			}
		}
	}
	if cpu < 0 || !set.IsSet(cpu) {
		return 0, fmt.Errorf("pin: cpu %d is not in this process's affinity set", cpu)
	}
	set.Zero()
	set.Set(cpu)
	// pid 0 is the calling thread, not the whole process.
	if err := unix.SchedSetaffinity(0, &set); err != nil {
		return 0, fmt.Errorf("pin: sched_setaffinity cpu %d: %w", cpu, err)
	}
	return cpu, nil
}

// threadCPU returns the user+system CPU time of the calling thread.
func threadCPU() (time.Duration, error) {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_THREAD, &ru); err != nil {
		return 0, fmt.Errorf("getrusage: %w", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), nil
}
