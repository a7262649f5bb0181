// Package device owns the PJRT plugin of the accelerator process: finding
// the plugin file, loading it, checking that the gopjrt binding and the
// plugin can work together, and the client that every executable shares.
package device

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/gomlx/gopjrt/pjrt"

	"github.com/recmesh/recmesh/shm/sched"
)

// BindingAPI is the PJRT C API version of the header gopjrt v0.10.0 was
// built against.
const (
	BindingAPIMajor = 0
	BindingAPIMinor = 81
)

// Environment variables that locate the plugin.
const (
	// EnvPlugin names the plugin file (or a registered plugin name such as
	// "cpu"); it is the twin of the --pjrt-plugin flag.
	EnvPlugin = "RECMESH_PJRT_PLUGIN"
	// EnvLibraryPath is gopjrt's own search path (":"-separated folders).
	EnvLibraryPath = "PJRT_PLUGIN_LIBRARY_PATH"
)

// cpuPluginRel is where `make deps` installs the CPU plugin, relative to the
// checkout: pip --target .deps/pjrt xla-cpu-pjrt==0.0.1.
var cpuPluginRel = filepath.Join(".deps", "pjrt", "xla_plugins", "xla_cpu_pjrt", "xla_cpu_pjrt.so")

// pluginFileNames are the file names searched for in EnvLibraryPath.
var pluginFileNames = []string{"xla_cpu_pjrt.so", "pjrt_c_api_cpu_plugin.so", "xla_gpu_pjrt.so", "xla_cuda_plugin.so"}

// ErrPluginNotFound is returned by FindPlugin when no plugin file exists.
var ErrPluginNotFound = errors.New("PJRT plugin not found")

// FindPlugin resolves the plugin to load. An explicit value (flag or
// EnvPlugin) wins; then the folders of EnvLibraryPath; then the checkout's
// .deps folder found from the working directory or the executable upwards.
func FindPlugin(explicit string) (string, error) {
	if explicit == "" {
		explicit = os.Getenv(EnvPlugin)
	}
	if explicit != "" {
		if !strings.ContainsRune(explicit, os.PathSeparator) && !strings.HasSuffix(explicit, ".so") {
			return explicit, nil // a name such as "cpu", resolved by gopjrt
		}
		if _, err := os.Stat(explicit); err != nil {
			return "", fmt.Errorf("%w: %s=%q: %v", ErrPluginNotFound, EnvPlugin, explicit, err)
		}
		return explicit, nil
	}
	var looked []string
	for _, dir := range filepath.SplitList(os.Getenv(EnvLibraryPath)) {
		if dir == "" {
			continue
		}
		for _, name := range pluginFileNames {
			p := filepath.Join(dir, name)
			looked = append(looked, p)
			if fileExists(p) {
				return p, nil
			}
		}
	}
	var starts []string
	if wd, err := os.Getwd(); err == nil {
		starts = append(starts, wd)
	}
	if exe, err := os.Executable(); err == nil {
		starts = append(starts, filepath.Dir(exe))
	}
	for _, start := range starts {
		for dir := start; ; dir = filepath.Dir(dir) {
			p := filepath.Join(dir, cpuPluginRel)
			looked = append(looked, p)
			if fileExists(p) {
				return p, nil
			}
			if filepath.Dir(dir) == dir {
				break
			}
		}
	}
	return "", fmt.Errorf("%w (looked in %d places, e.g. %s): run `make deps` to install the CPU plugin from PyPI (xla-cpu-pjrt==0.0.1), or set %s to the plugin's .so",
		ErrPluginNotFound, len(looked), filepath.Join("<checkout>", cpuPluginRel), EnvPlugin)
}

func fileExists(p string) bool {
	st, err := os.Stat(p)
	return err == nil && !st.IsDir()
}

// Runtime is a loaded plugin and its client.
type Runtime struct {
	Plugin *pjrt.Plugin
	Client *pjrt.Client
	// Path is the plugin file (or name) that was loaded.
	Path string
	// APIMajor and APIMinor are the plugin's PJRT C API version.
	APIMajor, APIMinor int
	// Threads is the size XLA's CPU thread pools were given (its intra-op
	// Eigen pool and the pool that runs executions), and ThreadsFrom what
	// decided it; 0 and "" for a plugin that is not the CPU one.
	Threads     int
	ThreadsFrom string
	// CPUDeviceCount is the cpu_device_count create option the CPU client
	// got (0 when none was passed).
	CPUDeviceCount int
}

// Options tune the client Open creates.
type Options struct {
	// Threads sizes the CPU plugin's thread pools. Default (0): the usable
	// cores (sched.UsableCPUs: the affinity mask capped by the cgroup quota),
	// unless PJRT_NPROC or NPROC is set in the environment, which XLA then
	// reads itself.
	Threads int
	// AllowNewer tries a plugin whose PJRT C API minor version is newer
	// than the binding's instead of refusing it (CheckVersion).
	AllowNewer bool
}

// Environment variables XLA's CPU client sizes its thread pools by
// (xla/pjrt/utils.cc DefaultThreadPoolSize: the first one set wins, else
// the affinity mask).
const (
	envPJRTNProc = "PJRT_NPROC"
	envNProc     = "NPROC"
)

// cpuDeviceCount is the cpu_device_count create option given to the CPU
// plugin. The plugin's default of 4 CPU devices also makes XLA's thread
// pools at least 4 threads (cpu_client.cc: max(DefaultThreadPoolSize(),
// cpu_device_count)), whatever the cores: on one core the extra threads spin
// against the one doing the work. The executor uses a single device.
const cpuDeviceCount = 1

// Open loads the plugin found by FindPlugin(explicit), checks its API
// version against the binding and creates a client, with default Options.
func Open(explicit string, log *slog.Logger) (*Runtime, error) {
	return OpenWith(explicit, log, Options{})
}

// OpenWith is Open with options. Both API versions are logged, and a
// plugin CheckVersion refuses is an error naming them.
func OpenWith(explicit string, log *slog.Logger, opts Options) (*Runtime, error) {
	path, err := FindPlugin(explicit)
	if err != nil {
		return nil, fmt.Errorf("device: %w", err)
	}
	plugin, err := pjrt.GetPlugin(path)
	if err != nil {
		return nil, fmt.Errorf("device: load plugin %s: %w", path, err)
	}
	major, minor := plugin.Version()
	if log != nil {
		log.Info("pjrt plugin loaded", "path", path, "api", fmt.Sprintf("%d.%d", major, minor),
			"binding_api", fmt.Sprintf("%d.%d", BindingAPIMajor, BindingAPIMinor))
	}
	if err := CheckVersion(path, major, minor, opts.AllowNewer); err != nil {
		return nil, fmt.Errorf("device: %w", err)
	}
	if minor > BindingAPIMinor && log != nil {
		log.Warn("pjrt plugin is newer than the binding; trying it as asked ("+EnvAllowNewer+")",
			"plugin_api", fmt.Sprintf("%d.%d", major, minor), "binding_api", fmt.Sprintf("%d.%d", BindingAPIMajor, BindingAPIMinor))
	}
	rt := &Runtime{Plugin: plugin, Path: path, APIMajor: major, APIMinor: minor}
	if IsCPUPlugin(path) {
		rt.Threads, rt.ThreadsFrom = threadCount(opts.Threads, os.Getenv, sched.UsableCPUs)
		rt.CPUDeviceCount = cpuDeviceCount
		restore := setEnv(envPJRTNProc, strconv.Itoa(rt.Threads))
		rt.Client, err = plugin.NewClient(pjrt.NamedValuesMap{"cpu_device_count": int64(cpuDeviceCount)})
		restore()
		if err != nil {
			// A CPU plugin of another lineage may refuse the option: fall
			// back to its defaults rather than not serve.
			if log != nil {
				log.Warn("pjrt CPU plugin refused cpu_device_count; using its defaults", "err", err)
			}
			rt.CPUDeviceCount, rt.Threads, rt.ThreadsFrom = 0, 0, ""
			rt.Client, err = plugin.NewClient(nil)
		}
	} else {
		rt.Client, err = plugin.NewClient(nil)
	}
	if err != nil {
		return nil, fmt.Errorf("device: plugin %s (PJRT API %d.%d, binding %d.%d): create client: %w",
			path, major, minor, BindingAPIMajor, BindingAPIMinor, err)
	}
	if log != nil && rt.Threads > 0 {
		log.Info("pjrt CPU client", "xla_threads", rt.Threads, "threads_from", rt.ThreadsFrom,
			"cpu_device_count", rt.CPUDeviceCount)
	}
	return rt, nil
}

// IsCPUPlugin tells from its file (or registered) name whether a plugin is
// XLA's CPU plugin, whose client takes cpu_device_count and PJRT_NPROC.
func IsCPUPlugin(path string) bool {
	return strings.Contains(strings.ToLower(filepath.Base(path)), "cpu")
}

// threadCount decides the size of XLA's CPU thread pools: explicit when
// positive, else what the environment already tells XLA (PJRT_NPROC, then
// NPROC, XLA's own order), else the usable cores.
func threadCount(explicit int, getenv func(string) string, usable func() sched.CPUs) (int, string) {
	if explicit > 0 {
		return explicit, "option"
	}
	for _, name := range []string{envPJRTNProc, envNProc} {
		if n, err := strconv.Atoi(strings.TrimSpace(getenv(name))); err == nil && n > 0 {
			return n, name
		}
	}
	c := usable()
	return c.Usable, "usable cores: " + c.String()
}

// setEnv sets name to value (in the C environment too: the Go runtime
// forwards os.Setenv to setenv(3) in a cgo program, which is where XLA
// reads it) and returns a function that puts the old value back.
func setEnv(name, value string) (restore func()) {
	old, had := os.LookupEnv(name)
	_ = os.Setenv(name, value)
	return func() {
		if had {
			_ = os.Setenv(name, old)
		} else {
			_ = os.Unsetenv(name)
		}
	}
}

// ErrIncompatible reports a plugin the binding cannot drive.
var ErrIncompatible = errors.New("PJRT plugin and binding are incompatible")

// CheckVersion refuses plugins the gopjrt binding cannot work with: another
// major version, a minor version older than the binding's header (the
// binding would fill struct fields the plugin does not know), or, unless
// allowNewer, a newer one: such plugins check every argument struct's size
// and reject the binding's smaller ones ("Unexpected PJRT_…_Args size …
// built with a later version than the framework") somewhere past start-up.
// The error names both versions and the plugin to install instead.
func CheckVersion(path string, major, minor int, allowNewer bool) error {
	have := fmt.Sprintf("plugin %s is PJRT C API %d.%d, the binding (gopjrt v0.10.0) %d.%d", filepath.Base(path), major, minor, BindingAPIMajor, BindingAPIMinor)
	switch {
	case major != BindingAPIMajor:
		return fmt.Errorf("%w: %s (major versions differ): install %s", ErrIncompatible, have, matchingPlugin(path))
	case minor < BindingAPIMinor:
		return fmt.Errorf("%w: %s (the plugin is older): install %s", ErrIncompatible, have, matchingPlugin(path))
	case minor > BindingAPIMinor && !allowNewer:
		return fmt.Errorf("%w: %s (the plugin is newer and would reject the binding's calls): install %s, or set %s=true to try it anyway",
			ErrIncompatible, have, matchingPlugin(path), EnvAllowNewer)
	}
	return nil
}

// EnvAllowNewer is the environment twin of the accelerator's
// --pjrt-allow-newer: try a plugin with a newer PJRT C API minor version.
const EnvAllowNewer = "RECMESH_PJRT_ALLOW_NEWER"

// matchingPlugin names the PyPI wheel built for the binding's API version.
func matchingPlugin(path string) string {
	if strings.Contains(strings.ToLower(filepath.Base(path)), "cuda") || strings.Contains(strings.ToLower(filepath.Base(path)), "gpu") {
		return fmt.Sprintf("the CUDA plugin of PJRT C API %d.%d: pip install xla-cuda13-pjrt==0.0.1 (xla_plugins/xla_cuda13_pjrt/xla_gpu_pjrt.so)", BindingAPIMajor, BindingAPIMinor)
	}
	return fmt.Sprintf("the CPU plugin of PJRT C API %d.%d: pip install xla-cpu-pjrt==0.0.1 (make deps does)", BindingAPIMajor, BindingAPIMinor)
}

// APIVersion formats the plugin's API version as "major.minor".
func (r *Runtime) APIVersion() string { return fmt.Sprintf("%d.%d", r.APIMajor, r.APIMinor) }

// PluginFile is the plugin's file name (for reports).
func (r *Runtime) PluginFile() string { return filepath.Base(r.Path) }

// Close destroys the client. The plugin itself stays loaded for the life of
// the process, as dlopen-ed libraries do.
func (r *Runtime) Close() error {
	if r.Client == nil {
		return nil
	}
	err := r.Client.Destroy()
	r.Client = nil
	if err != nil {
		return fmt.Errorf("device: destroy client: %w", err)
	}
	return nil
}
