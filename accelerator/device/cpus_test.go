package device

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/recmesh/recmesh/shm/sched"
)

func TestThreadCount(t *testing.T) {
	usable := func() sched.CPUs { return sched.CPUs{Usable: 3, Affinity: 6, Quota: 3} }
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	for _, tc := range []struct {
		explicit int
		env      map[string]string
		want     int
		from     string
	}{
		{0, nil, 3, "usable cores"},
		{2, map[string]string{"PJRT_NPROC": "5"}, 2, "option"},
		{0, map[string]string{"PJRT_NPROC": "5", "NPROC": "7"}, 5, "PJRT_NPROC"},
		{0, map[string]string{"NPROC": "7"}, 7, "NPROC"},
		{0, map[string]string{"PJRT_NPROC": "x", "NPROC": "0"}, 3, "usable cores"},
	} {
		n, from := threadCount(tc.explicit, env(tc.env), usable)
		if n != tc.want || !strings.HasPrefix(from, tc.from) {
			t.Errorf("threadCount(%d, %v) = %d (%s), want %d (%s)", tc.explicit, tc.env, n, from, tc.want, tc.from)
		}
	}
}

func TestIsCPUPlugin(t *testing.T) {
	for path, want := range map[string]bool{
		"cpu": true,
		"/x/.deps/pjrt/xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so": true,
		"/usr/lib/pjrt_c_api_cpu_plugin.so":                      true,
		"/usr/lib/xla_cuda_plugin.so":                            false,
		"cuda":                                                   false,
	} {
		if got := IsCPUPlugin(path); got != want {
			t.Errorf("IsCPUPlugin(%q) = %v, want %v", path, got, want)
		}
	}
}

// TestOpenSizesXLAThreads opens the CPU plugin and counts XLA's intra-op
// threads (named tf_XLAEigen): they must match the usable cores, or the
// explicit option, and PJRT_NPROC must be left as it was.
func TestOpenSizesXLAThreads(t *testing.T) {
	if _, err := FindPlugin(""); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI needs the PJRT plugin: %v", err)
		}
		t.Skipf("no PJRT plugin (run make deps): %v", err)
	}
	t.Setenv(envPJRTNProc, "")
	os.Unsetenv(envPJRTNProc)
	t.Setenv(envNProc, "")
	os.Unsetenv(envNProc)
	for _, threads := range []int{0, 3} {
		before := countThreads(t, "tf_XLAEigen")
		rt, err := OpenWith("", nil, Options{Threads: threads})
		if err != nil {
			t.Fatal(err)
		}
		want := threads
		if want == 0 {
			want = sched.UsableCPUs().Usable
		}
		got := countThreads(t, "tf_XLAEigen") - before
		if rt.Threads != want || got != want {
			t.Errorf("Options{Threads: %d}: runtime says %d threads, %d tf_XLAEigen threads started; want %d",
				threads, rt.Threads, got, want)
		}
		if rt.CPUDeviceCount != 1 || len(rt.Client.AddressableDevices()) != 1 {
			t.Errorf("cpu_device_count %d, %d devices; want 1", rt.CPUDeviceCount, len(rt.Client.AddressableDevices()))
		}
		if _, set := os.LookupEnv(envPJRTNProc); set {
			t.Errorf("Open left %s set", envPJRTNProc)
		}
		t.Logf("Options{Threads: %d}: %d threads (%s)", threads, rt.Threads, rt.ThreadsFrom)
		if err := rt.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// countThreads counts this process's threads called name.
func countThreads(t *testing.T, name string) int {
	t.Helper()
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Skipf("no /proc: %v", err)
	}
	n := 0
	for _, task := range tasks {
		comm, err := os.ReadFile(filepath.Join("/proc/self/task", task.Name(), "comm"))
		if err == nil && strings.TrimSpace(string(comm)) == name {
			n++
		}
	}
	return n
}
