package main

import (
	"flag"
	"fmt"
	"os"
	"strconv"
)

// envString and envInt give every flag an environment twin: the flag's
// default is the variable's value when set.
func envString(name, def string) string {
	if v, ok := os.LookupEnv(name); ok {
		return v
	}
	return def
}

func envInt(fs *flag.FlagSet, name string, def int) int {
	v, ok := os.LookupEnv(name)
	if !ok {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		fmt.Fprintf(fs.Output(), "%s=%q is not an integer; using %d\n", name, v, def)
		return def
	}
	return n
}

// commonFlags are shared by every subcommand that loads the model.
type commonFlags struct {
	bundle   string
	plugin   string
	maxBatch int
}

func (c *commonFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&c.bundle, "bundle", envString("RECMESH_BUNDLE", "data/dlrm-cap1000"), "model bundle directory (env RECMESH_BUNDLE)")
	fs.StringVar(&c.plugin, "pjrt-plugin", envString("RECMESH_PJRT_PLUGIN", ""), "PJRT plugin .so path or name; default: PJRT_PLUGIN_LIBRARY_PATH, then .deps/pjrt (env RECMESH_PJRT_PLUGIN)")
	fs.IntVar(&c.maxBatch, "max-batch", envInt(fs, "RECMESH_MAX_BATCH", 4096), "largest batch bucket (env RECMESH_MAX_BATCH)")
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
