package benchrun

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/recmesh/recmesh/bench/pyarm"
	"github.com/recmesh/recmesh/bench/report"
	"github.com/recmesh/recmesh/model"
)

// environment records what the report's reader needs to compare runs:
// the machine, the pinning, and the versions of every runtime involved.
func environment(c *config, cfg model.Config) report.Env {
	host, _ := os.Hostname()
	e := report.Env{
		Host:        host,
		CPUModel:    cpuModel(),
		CPUs:        runtime.NumCPU(),
		Kernel:      strings.TrimSpace(readFile("/proc/sys/kernel/osrelease")),
		ServerCPUs:  c.server.cpus,
		ServerSched: c.server.sched,
		ClientCPUs:  c.load.cpus,
		GoVersion:   runtime.Version(),
		Versions:    pythonVersions(c),
		PJRTPlugin:  pjrtPlugin(c.root),
		Bundle:      c.bundle,
		TableBytes:  cfg.TableBytes(),
		MaxVocab:    cfg.MaxVocabSize,
	}
	e.Notes = append(e.Notes, dtypeNote(cfg), denseNote(cfg))
	if kb, ok := meminfo("MemTotal"); ok {
		e.MemTotalBytes = kb << 10
	}
	if runtime.NumCPU() <= 2 && c.server.cpus != "" && c.load.cpus != "" {
		e.Notes = append(e.Notes, fmt.Sprintf("Only %d CPUs: every arm runs on CPU %s and the load generator on CPU %s. "+
			"The two never compete (the methodology's separate CPU sets), at the price of serving on one core; "+
			"pass -server-cpus / -client-cpus (BENCH_SERVER_CPUS / BENCH_CLIENT_CPUS) to trade isolation for cores.",
			runtime.NumCPU(), c.server.cpus, c.load.cpus))
	}
	if p := os.Getenv("RECMESH_BENCH_JAX_PLATFORM"); p != "" && p != "cpu" {
		e.Notes = append(e.Notes, fmt.Sprintf("The accelerator runs the dense network through the PJRT plugin %s; the Python arms run jax.jit on JAX's own %s backend. "+
			"The embedding lookups and serving run on the server CPUs.", e.PJRTPlugin, p))
	} else {
		e.Notes = append(e.Notes, "The accelerator runs the dense network through the PJRT CPU plugin here, so it shares the server CPUs with the embedding lookups; "+
			"the Python arms run jax.jit on the same CPUs.")
	}
	return e
}

func readFile(path string) string {
	b, _ := os.ReadFile(path)
	return string(b)
}

func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return runtime.GOARCH
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return runtime.GOARCH
}

func meminfo(key string) (int64, bool) {
	for line := range strings.SplitSeq(readFile("/proc/meminfo"), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && k == key {
			n, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return n, err == nil
		}
	}
	return 0, false
}

// pythonVersions asks the bench venv's interpreter for the versions of the
// Python arms' stack (empty when the venv is missing).
func pythonVersions(c *config) map[string]string {
	py := c.pyPaths().Python
	const script = `import json, sys, importlib.metadata as m
v = {"python": sys.version.split()[0]}
for d in ("jax", "jaxlib", "numpy", "grpcio", "protobuf"):
    try: v[d] = m.version(d)
    except Exception: pass
print(json.dumps(v))`
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, py, "-c", script).Output()
	v := map[string]string{}
	if err != nil {
		v["python"] = fmt.Sprintf("unknown (%v)", err)
		return v
	}
	if err := json.Unmarshal(out, &v); err != nil {
		v["python"] = fmt.Sprintf("unknown (%v)", err)
	}
	return v
}

// pjrtPlugin names the plugin the accelerator loads: RECMESH_PJRT_PLUGIN
// when set (make exports it), with the version of the xla-cpu-pjrt wheel
// installed under .deps/pjrt.
func pjrtPlugin(root string) string {
	path := os.Getenv("RECMESH_PJRT_PLUGIN")
	dirs, _ := filepath.Glob(filepath.Join(root, ".deps", "pjrt", "*.dist-info"))
	var wheels []string
	for _, d := range dirs {
		wheels = append(wheels, strings.TrimSuffix(filepath.Base(d), ".dist-info"))
	}
	switch {
	case path != "" && len(wheels) > 0:
		return fmt.Sprintf("%s (%s)", path, strings.Join(wheels, ", "))
	case path != "":
		return path
	}
	return strings.Join(wheels, ", ")
}

// pyPaths is where the Python arms' interpreter, script and stubs are:
// under root, unless -python or -py-stubs say otherwise.
func (c *config) pyPaths() pyarm.Paths {
	p := pyarm.DefaultPaths(c.root)
	if c.python != "" {
		p.Python = c.python
	}
	if c.pyStubs != "" {
		p.Stubs = c.pyStubs
	}
	return p
}
