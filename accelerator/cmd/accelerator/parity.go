package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"

	"github.com/recmesh/recmesh/accelerator/device"
	"github.com/recmesh/recmesh/accelerator/executor"
	"github.com/recmesh/recmesh/accelerator/parity"
	"github.com/recmesh/recmesh/model"
)

// parityTolerance is the project-wide parity bound: every serving path
// must match the reference to max|Δ| ≤ 1e-4.
const parityTolerance = 1e-4

func runParity(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("parity", flag.ContinueOnError)
	var c commonFlags
	c.register(fs)
	seed := fs.Uint64("seed", 7, "input seed")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := c.validate(); err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	ex, rt, bundle, err := load(ctx, c, log)
	if err != nil {
		return err
	}
	defer bundle.Close()
	defer rt.Close()
	defer ex.Close()
	ref, err := model.NewReference(bundle)
	if err != nil {
		return err
	}
	in, err := ex.NewHostInputs(ex.MaxBucket())
	if err != nil {
		return err
	}
	defer in.Close()
	worst := 0.0
	for i, b := range ex.Buckets() {
		res, err := parity.Bucket(ex, ref, in, b, *seed+uint64(i))
		if err != nil {
			return err
		}
		fmt.Printf("parity: bucket=%d rows=%d checked=%d max_abs_diff=%.3g\n", res.Bucket, res.Rows, res.CheckedRows, res.MaxAbsDiff)
		worst = max(worst, res.MaxAbsDiff)
	}
	if worst > parityTolerance {
		fmt.Printf("parity FAILED: backend=pjrt plugin=%s api=%s buckets=%d max_abs_diff=%.3g > %g\n",
			rt.PluginFile(), rt.APIVersion(), len(ex.Buckets()), worst, parityTolerance)
		return fmt.Errorf("max_abs_diff %.3g exceeds %g", worst, parityTolerance)
	}
	fmt.Printf("parity ok: backend=pjrt plugin=%s api=%s buckets=%d max_abs_diff=%.3g\n",
		rt.PluginFile(), rt.APIVersion(), len(ex.Buckets()), worst)
	return nil
}

// load opens the bundle and the plugin and compiles every bucket.
func load(ctx context.Context, c commonFlags, log *slog.Logger) (*executor.Executor, *device.Runtime, *model.Bundle, error) {
	bundle, err := model.Open(c.bundle)
	if err != nil {
		return nil, nil, nil, err
	}
	rt, err := device.Open(c.plugin, log)
	if err != nil {
		bundle.Close()
		return nil, nil, nil, err
	}
	ex, err := executor.New(ctx, rt, bundle, executor.Options{MaxBatch: c.maxBatch, Log: log})
	if err != nil {
		rt.Close()
		bundle.Close()
		return nil, nil, nil, err
	}
	return ex, rt, bundle, nil
}
