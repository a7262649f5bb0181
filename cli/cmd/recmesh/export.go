package main

import (
	"context"
	"flag"
	"fmt"
	"time"

	"github.com/recmesh/recmesh/cli/internal/progress"
	"github.com/recmesh/recmesh/model"
)

// Defaults of recmesh export: the small bundle that make run and the tests
// use.
const (
	defaultExportMaxVocab = model.DevVocabCap
	defaultExportSeed     = 1
	defaultExportOut      = "data/dlrm-cap1000"
)

func init() {
	register(&command{
		name:    "export",
		summary: "write a seeded DLRM-DCNv2 weights bundle",
		run:     runExport,
	})
}

func runExport(ctx context.Context, e *env, args []string) error {
	fs := flag.NewFlagSet("export", flag.ContinueOnError)
	maxVocab := fs.Int("max-vocab", defaultExportMaxVocab,
		"cap on every embedding table's `rows`; 0 means uncapped (about 104 GB)")
	seed := fs.Uint64("seed", defaultExportSeed, "`seed` the weights are drawn from")
	out := fs.String("out", defaultExportOut, "bundle `directory` to write (replaced if it holds a bundle)")
	if err := parseFlags(fs, args, e); err != nil {
		return err
	}
	if *maxVocab < 0 {
		return usagef("-max-vocab is %d; want 0 (uncapped) or more", *maxVocab)
	}
	if *out == "" {
		return usagef("-out is empty; want a directory")
	}

	cfg := model.DLRMv2(*maxVocab)
	var bar *progress.Bar
	if e.isTerminal(e.stderr) {
		bar = progress.New(e.stderr, "export")
	}
	var written int64
	start := time.Now()
	err := model.Export(ctx, *out, cfg, *seed, func(done, total int64) {
		written = total
		if bar != nil {
			bar.Update(done, total)
		}
	})
	if bar != nil {
		bar.Finish()
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(e.stderr, "export: wrote %s (rows=%d, bytes=%d, %.1fs)\n",
		*out, cfg.TotalRows(), written, time.Since(start).Seconds())
	return nil
}
