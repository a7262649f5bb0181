package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"strings"
	"time"

	"github.com/recmesh/recmesh/model"
)

func runBench(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	var c commonFlags
	c.register(fs)
	perBucket := fs.Duration("duration", 500*time.Millisecond, "measured time per bucket")
	if err := c.parse(fs, args); err != nil {
		return err
	}
	l, err := load(ctx, c, slog.New(slog.NewTextHandler(os.Stderr, nil)))
	if err != nil {
		return err
	}
	defer l.Close()
	ex, rt := l.ex, l.rt
	fmt.Printf("model: cpu=%q cores=%d plugin=%s api=%s compile_s=%.2f\n",
		cpuModel(), runtime.NumCPU(), rt.PluginFile(), rt.APIVersion(), ex.CompileTime.Seconds())
	in, err := ex.NewHostInputs(ex.MaxBucket())
	if err != nil {
		return err
	}
	defer in.Close()
	cfg := ex.Config()
	dense, _ := model.RandomInputs(cfg, 1, ex.MaxBucket())
	copy(in.Dense(), dense)
	pooled := in.Pooled()
	for i := range pooled {
		pooled[i] = float32(i%97) * 1e-3
	}
	scores := make([]float32, ex.MaxBucket())
	for _, b := range ex.Buckets() {
		if err := ex.Run(in, b, scores); err != nil { // warm-up
			return err
		}
		runs := 0
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
		fmt.Printf("model: bucket=%d examples_per_s=%.0f\n", b, float64(runs*b)/el)
	}
	return nil
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
