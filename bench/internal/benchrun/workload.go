package benchrun

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"slices"
	"strings"

	"github.com/recmesh/recmesh/bench/loadgen"
	"github.com/recmesh/recmesh/model"
)

// workload is one bundle the sweep runs every arm on.
type workload struct {
	name, bundle string
}

// parseWorkloads reads -workloads, or makes the one workload of -bundle,
// named by -workload or else after its config (see workloadOf).
func parseWorkloads(list, bundle, name string) ([]workload, error) {
	if strings.TrimSpace(list) == "" {
		if name == "" {
			cfg, err := readConfig(bundle)
			if err != nil {
				return nil, err
			}
			name = workloadOf(cfg)
		}
		return []workload{{name: name, bundle: bundle}}, nil
	}
	var out []workload
	for _, it := range splitList(list) {
		n, dir, ok := strings.Cut(it, "=")
		if !ok || n == "" || dir == "" || strings.ContainsAny(n, "/ ") {
			return nil, fmt.Errorf("-workloads: %q: want name=dir (a name without / or spaces)", it)
		}
		for _, w := range out {
			if w.name == n {
				return nil, fmt.Errorf("-workloads: %q named twice", n)
			}
		}
		abs, err := filepath.Abs(dir)
		if err != nil {
			return nil, err
		}
		out = append(out, workload{name: n, bundle: abs})
	}
	return out, nil
}

// workloadOf names a bundle's workload: "hostbound" for the exporter's
// host-bound preset, "mlperf" for anything else.
func workloadOf(cfg model.Config) string {
	if strings.HasSuffix(cfg.Name, "-hostbound") {
		return "hostbound"
	}
	return "mlperf"
}

// readConfig reads the bundle's config.json (the weights are opened only
// for parity).
func readConfig(bundle string) (model.Config, error) {
	cfg, err := loadgen.ReadConfig(bundle)
	if _, missing := errors.AsType[*fs.PathError](err); missing {
		err = fmt.Errorf("%w (make exports the bundle)", err)
	}
	return cfg, err
}

// requestPools builds the requests of every request size the sweep and
// the memory check send, once each.
func (c *config) requestPools(cfg model.Config) (map[int]*loadgen.Workload, error) {
	pools := map[int]*loadgen.Workload{}
	for _, b := range append(slices.Clone(c.load.batches), c.memory.batch) {
		if pools[b] != nil {
			continue
		}
		w, err := loadgen.NewWorkload(cfg, loadgen.WorkloadOptions{BatchSize: b, Seed: 1})
		if err != nil {
			return nil, fmt.Errorf("workload B_req %d: %w", b, err)
		}
		pools[b] = w
	}
	return pools, nil
}
