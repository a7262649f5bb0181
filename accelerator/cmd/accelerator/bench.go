package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/recmesh/recmesh/accelerator/dcn"
	"github.com/recmesh/recmesh/accelerator/executor"
	"github.com/recmesh/recmesh/model"
)

func runBench(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	var c commonFlags
	c.register(fs)
	perBucket := fs.Duration("duration", 500*time.Millisecond, "measured time per bucket")
	copyMiB := fs.Int("copy-mib", 256, "size of the buffer whose single-threaded copy measures the memory bandwidth the dense: lines compare with (0: skip)")
	dump := fs.String("dump-program", "", "write the StableHLO of every measured bucket to `dir`/recmesh_b<n>.mlir (for hlobench)")
	var only bucketList
	fs.Var(&only, "buckets", "comma-separated `buckets` to measure, powers of two such as 1,16,128\n"+
		"(default every bucket up to --max-batch; when given, --max-batch defaults to the largest)")
	if err := c.parse(fs, args); err != nil {
		return err
	}
	if err := only.fit(fs, &c); err != nil {
		return err
	}
	l, err := load(ctx, c, slog.New(slog.NewTextHandler(os.Stderr, nil)))
	if err != nil {
		return err
	}
	defer l.Close()
	ex, rt := l.ex, l.rt
	cfg := ex.Config()
	fmt.Printf("model: cpu=%q cores=%d plugin=%s api=%s compile_s=%.2f xla_threads=%d cpu_device_count=%d\n",
		cpuModel(), runtime.NumCPU(), rt.PluginFile(), rt.APIVersion(), ex.CompileTime.Seconds(), rt.Threads, rt.CPUDeviceCount)
	fmt.Printf("model: name=%s bottom_mlp=%s cross_layers=%d cross_rank=%d top_mlp=%s dense_params=%d\n",
		cfg.Name, joinInts(cfg.BottomMLP), cfg.CrossLayers, cfg.CrossRank, joinInts(cfg.TopMLP), cfg.DenseParamCount())
	in, err := ex.NewHostInputs(ex.MaxBucket())
	if err != nil {
		return err
	}
	defer in.Close()
	dense, _ := model.RandomInputs(cfg, 1, ex.MaxBucket())
	copy(in.Dense(), dense)
	pooled := in.Pooled()
	for i := range pooled {
		pooled[i] = float32(i%97) * 1e-3
	}
	scores := make([]float32, ex.MaxBucket())
	buckets := ex.Buckets()
	if only.set {
		buckets = only.buckets
	}
	if *dump != "" {
		if err := dumpPrograms(*dump, ex, buckets); err != nil {
			return err
		}
	}
	copyGBs := 0.0
	if *copyMiB > 0 {
		copyGBs = copyBandwidth(*copyMiB << 20)
	}
	for _, b := range buckets {
		if err := ex.Run(in, b, scores); err != nil { // warm-up
			return err
		}
		runs := 0
		cpu0, err := processCPU()
		if err != nil {
			return err
		}
		start := time.Now()
		for time.Since(start) < *perBucket || runs < 3 {
			if err := ctx.Err(); err != nil {
				return err
			}
			if err := ex.Run(in, b, scores); err != nil {
				return err
			}
			runs++
		}
		el := time.Since(start).Seconds()
		cpu1, err := processCPU()
		if err != nil {
			return err
		}
		// examples_per_core_s divides by the CPU time of the whole process
		// (every PJRT thread), so it compares with lookupbench's
		// examples_per_core_s however many cores the plugin used.
		perCore := 0.0
		if cpu := (cpu1 - cpu0).Seconds(); cpu > 0 {
			perCore = float64(runs*b) / cpu
		}
		fmt.Printf("model: bucket=%d examples_per_s=%.0f examples_per_core_s=%.0f\n", b, float64(runs*b)/el, perCore)
		prog := ex.Program(b)
		bytes := dcn.WeightBytes(cfg, prog)
		stream := float64(bytes) * float64(runs) / el / 1e9
		line := fmt.Sprintf("dense: bucket=%d dense_dtype=%s strip_dot=%t weight_mib=%.1f calls_per_s=%.1f weight_gb_s=%.2f",
			b, cfg.DenseDtype, prog.StripDot, float64(bytes)/(1<<20), float64(runs)/el, stream)
		if copyGBs > 0 {
			line += fmt.Sprintf(" copy_gb_s=%.2f of_copy_pct=%.0f", copyGBs, 100*stream/copyGBs)
		}
		fmt.Println(line)
	}
	return nil
}

// copyBandwidth measures this thread's memory bandwidth as STREAM's Copy
// does: the bytes read plus the bytes written per second by copies of a
// buffer of size bytes (bigger than any cache), the best of five. It is
// what one core can move, the ceiling a weight stream is compared with.
func copyBandwidth(size int) float64 {
	src, dst := make([]byte, size), make([]byte, size)
	for i := range src {
		src[i] = byte(i)
	}
	copy(dst, src) // fault both in
	best := 0.0
	for range 5 {
		start := time.Now()
		copy(dst, src)
		if gbs := 2 * float64(size) / time.Since(start).Seconds() / 1e9; gbs > best {
			best = gbs
		}
	}
	return best
}

// dumpPrograms writes the program of every bucket, as the executor
// compiled it (with the strip kernel where it chose it), to
// dir/recmesh_b<n>.mlir.
func dumpPrograms(dir string, ex *executor.Executor, buckets []int) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("--dump-program: %w", err)
	}
	for _, b := range buckets {
		text, err := dcn.Build(ex.Config(), b, ex.Program(b))
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("recmesh_b%d.mlir", b)), text, 0o644); err != nil {
			return fmt.Errorf("--dump-program: %w", err)
		}
	}
	return nil
}

// bucketList is the --buckets flag of bench.
type bucketList struct {
	buckets []int
	set     bool
}

func (l *bucketList) String() string {
	if l == nil || !l.set {
		return ""
	}
	return joinInts(l.buckets)
}

func (l *bucketList) Set(v string) error {
	var bs []int
	for _, f := range strings.Split(v, ",") {
		b, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || b < 1 || b&(b-1) != 0 {
			return fmt.Errorf("bucket %q is not a power of two", f)
		}
		if !slices.Contains(bs, b) {
			bs = append(bs, b)
		}
	}
	slices.Sort(bs)
	l.buckets, l.set = bs, true
	return nil
}

// fit makes --max-batch cover the buckets asked for: it defaults to the
// largest of them (so only the buckets needed are compiled), and a
// --max-batch given too small is an error.
func (l *bucketList) fit(fs *flag.FlagSet, c *commonFlags) error {
	if !l.set {
		return nil
	}
	largest := l.buckets[len(l.buckets)-1]
	given := false
	fs.Visit(func(f *flag.Flag) { given = given || f.Name == "max-batch" }) // env twins count as given
	switch {
	case !given:
		c.maxBatch = largest
	case slices.Max(executor.Buckets(c.maxBatch)) < largest:
		return fmt.Errorf("--buckets %s: bucket %d is above --max-batch %d", l, largest, c.maxBatch)
	}
	return c.validate()
}

// processCPU is the user+system CPU time of the whole process so far.
func processCPU() (time.Duration, error) {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		return 0, fmt.Errorf("getrusage: %w", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), nil
}

func joinInts(v []int) string {
	s := make([]string, len(v))
	for i, n := range v {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ",")
}

func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return "unknown"
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "unknown"
}
