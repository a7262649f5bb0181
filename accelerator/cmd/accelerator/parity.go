package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"

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
	if err := c.parse(fs, args); err != nil {
		return err
	}
	l, err := load(ctx, c, slog.New(slog.NewTextHandler(os.Stderr, nil)))
	if err != nil {
		return err
	}
	defer l.Close()
	ex, rt := l.ex, l.rt
	ref, err := model.NewReference(l.bundle)
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
