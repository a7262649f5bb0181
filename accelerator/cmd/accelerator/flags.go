package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"

	"github.com/recmesh/recmesh/accelerator/device"
	"github.com/recmesh/recmesh/accelerator/executor"
	"github.com/recmesh/recmesh/model"
	"github.com/recmesh/recmesh/telemetry/flagenv"
)

// commonFlags are shared by every subcommand that loads the model.
type commonFlags struct {
	bundle   string
	plugin   string
	maxBatch int
}

func (c *commonFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&c.bundle, "bundle", "data/dlrm-cap1000", "model bundle directory")
	fs.StringVar(&c.plugin, "pjrt-plugin", "", "PJRT plugin .so path or name; default: PJRT_PLUGIN_LIBRARY_PATH, then .deps/pjrt")
	fs.IntVar(&c.maxBatch, "max-batch", executor.DefaultMaxBatch, "largest batch bucket")
	fs.Usage = func() { flagenv.Usage(fs) }
}

// parse reads the command line, then the environment twins (RECMESH_<FLAG>;
// a malformed value is an error naming the variable), then checks c.
func (c *commonFlags) parse(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := flagenv.Apply(fs, os.Getenv); err != nil {
		return err
	}
	return c.validate()
}

func (c *commonFlags) validate() error {
	if c.maxBatch < 1 || c.maxBatch > 1<<16 {
		return fmt.Errorf("--max-batch %d: want 1..65536", c.maxBatch)
	}
	if c.bundle == "" {
		return fmt.Errorf("--bundle is empty: give a bundle directory (make run exports data/dlrm-cap1000)")
	}
	return nil
}

// loaded is the model compiled for a one-shot subcommand (parity, bench).
type loaded struct {
	ex     *executor.Executor
	rt     *device.Runtime
	bundle *model.Bundle
}

// load opens the bundle and the plugin and compiles every bucket.
func load(ctx context.Context, c commonFlags, log *slog.Logger) (*loaded, error) {
	bundle, err := model.Open(c.bundle)
	if err != nil {
		return nil, err
	}
	rt, err := device.Open(c.plugin, log)
	if err != nil {
		bundle.Close()
		return nil, err
	}
	ex, err := executor.New(ctx, rt, bundle, executor.Options{MaxBatch: c.maxBatch, Log: log})
	if err != nil {
		rt.Close()
		bundle.Close()
		return nil, err
	}
	return &loaded{ex: ex, rt: rt, bundle: bundle}, nil
}

func (l *loaded) Close() {
	l.ex.Close()
	l.rt.Close()
	l.bundle.Close()
}
