package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"

	"github.com/recmesh/recmesh/accelerator/dcn"
	"github.com/recmesh/recmesh/accelerator/device"
	"github.com/recmesh/recmesh/accelerator/executor"
	"github.com/recmesh/recmesh/accelerator/stripdot"
	"github.com/recmesh/recmesh/model"
	"github.com/recmesh/recmesh/telemetry/flagenv"
)

// deviceFlags choose the PJRT plugin and its client: every subcommand that
// opens the device has them.
type deviceFlags struct {
	plugin     string
	xlaThreads int
	allowNewer bool
}

func (d *deviceFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&d.plugin, "pjrt-plugin", "", "PJRT plugin .so path or name; default: PJRT_PLUGIN_LIBRARY_PATH, then .deps/pjrt")
	fs.BoolVar(&d.allowNewer, "pjrt-allow-newer", false, "try a plugin of a newer PJRT C API minor version than the binding's (0.81) instead of refusing it")
	fs.IntVar(&d.xlaThreads, "xla-threads", 0, "threads of the CPU plugin's XLA pools; 0: the usable cores\n"+
		"(affinity mask capped by the cgroup CPU quota), or PJRT_NPROC/NPROC when set")
}

func (d *deviceFlags) validate() error {
	if d.xlaThreads < 0 || d.xlaThreads > 1024 {
		return fmt.Errorf("--xla-threads %d: want 0 (the usable cores) or 1..1024", d.xlaThreads)
	}
	return nil
}

// openDevice loads the plugin with the flags' client options.
func (d deviceFlags) openDevice(log *slog.Logger) (*device.Runtime, error) {
	return device.OpenWith(d.plugin, log, device.Options{Threads: d.xlaThreads, AllowNewer: d.allowNewer})
}

// commonFlags are shared by every subcommand that loads the model.
type commonFlags struct {
	deviceFlags
	bundle   string
	maxBatch int
	program  string
	// stripDot and stripDotMax choose the buckets that run the strip kernel,
	// stripDotPrefetch how far ahead it reads.
	stripDot         string
	stripDotMax      int
	stripDotPrefetch int
}

func (c *commonFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&c.bundle, "bundle", model.DefaultDevBundle, "model bundle directory")
	c.deviceFlags.register(fs)
	fs.IntVar(&c.maxBatch, "max-batch", executor.DefaultMaxBatch, "largest batch bucket")
	fs.StringVar(&c.program, "program", "default", "StableHLO formulation: default, or plain (the model's math\n"+
		"transcribed op for op, the yardstick of the default one)")
	fs.StringVar(&c.stripDot, "strip-dot", "auto", "small-batch products by recmesh's strip kernel (CPU plugin; AVX-512F, or AVX2 and FMA):\n"+
		"auto (time both programs of each bucket at start-up, keep the faster), on, or off")
	fs.IntVar(&c.stripDotMax, "strip-dot-max-bucket", executor.DefaultStripDotMaxBucket,
		"largest bucket that may use the strip kernel")
	fs.IntVar(&c.stripDotPrefetch, "strip-dot-prefetch-bytes", 0, fmt.Sprintf(
		"bytes of weights the AVX-512 strip kernel fetches ahead of use, a multiple of 64 up to %d;\n"+
			"0: this CPU's default (%d here)", stripdot.MaxPrefetch, stripdot.DefaultPrefetch()))
	fs.Usage = func() { flagenv.Usage(fs) }
}

// parse reads the command line, then the environment twins (RECMESH_<FLAG>;
// a malformed value is an error naming the variable), then checks c.
func (c *commonFlags) parse(fs *flag.FlagSet, args []string) error {
	if fs.Lookup(flagenv.PrintConfigFlag) == nil {
		flagenv.DefinePrintConfig(fs)
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := flagenv.Apply(fs, os.Getenv); err != nil {
		return err
	}
	if err := c.validate(); err != nil {
		return err
	}
	// The kernel's distance is the process's: set once, before any program
	// is compiled or run.
	if err := stripdot.SetPrefetch(c.stripDotPrefetch); err != nil {
		return fmt.Errorf("--strip-dot-prefetch-bytes: %w", err)
	}
	return nil
}

func (c *commonFlags) validate() error {
	if c.maxBatch < 1 || c.maxBatch > model.MaxBatchLimit {
		return fmt.Errorf("--max-batch %d: want 1..%d", c.maxBatch, model.MaxBatchLimit)
	}
	if err := c.deviceFlags.validate(); err != nil {
		return err
	}
	if _, err := c.programOptions(); err != nil {
		return err
	}
	if _, err := executor.ParseStripDotMode(c.stripDot); err != nil {
		return fmt.Errorf("--strip-dot: %w", err)
	}
	if c.stripDotMax < 1 || c.stripDotMax > model.MaxBatchLimit {
		return fmt.Errorf("--strip-dot-max-bucket %d: want 1..%d", c.stripDotMax, model.MaxBatchLimit)
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
	rt, err := c.openDevice(log)
	if err != nil {
		bundle.Close()
		return nil, err
	}
	ex, err := executor.New(ctx, rt, bundle, c.executorOptions(log))
	if err != nil {
		rt.Close()
		bundle.Close()
		return nil, err
	}
	return &loaded{ex: ex, rt: rt, bundle: bundle}, nil
}

// programOptions are the dcn options --program names.
func (c commonFlags) programOptions() (*dcn.Options, error) {
	switch c.program {
	case "", "default":
		o := dcn.DefaultOptions()
		return &o, nil
	case "plain":
		o := dcn.PlainOptions()
		return &o, nil
	}
	return nil, fmt.Errorf("--program %q: want default or plain", c.program)
}

// executorOptions are the executor options the flags give.
func (c commonFlags) executorOptions(log *slog.Logger) executor.Options {
	prog, _ := c.programOptions()                      // checked by validate
	strip, _ := executor.ParseStripDotMode(c.stripDot) // checked by validate
	return executor.Options{MaxBatch: c.maxBatch, Log: log, Program: prog, StripDot: strip, StripDotMaxBucket: c.stripDotMax}
}

func (l *loaded) Close() {
	l.ex.Close()
	l.rt.Close()
	l.bundle.Close()
}
