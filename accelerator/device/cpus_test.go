package device

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestUsableCPUs(t *testing.T) {
	for _, tc := range []struct {
		affinity int
		quota    float64
		want     int
	}{
		{8, 0, 8},   // no quota
		{8, 2, 2},   // quota below the mask
		{8, 1.5, 2}, // a part core counts
		{8, 0.2, 1}, // never below one
		{2, 4, 2},   // mask below the quota
		{0, 0, 1},   // unknown mask
	} {
		got := usableCPUs(tc.affinity, tc.quota)
		if got.Usable != tc.want {
			t.Errorf("usableCPUs(%d, %g) = %d, want %d", tc.affinity, tc.quota, got.Usable, tc.want)
		}
	}
	c := UsableCPUs()
	if c.Usable < 1 || c.Usable > c.Affinity {
		t.Fatalf("UsableCPUs() = %+v: usable must be 1..affinity", c)
	}
	t.Logf("this process: %v", c)
}

// writeFiles creates every path (relative to root) with its content.
func writeFiles(t *testing.T, root string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func TestCgroupQuota(t *testing.T) {
	for _, tc := range []struct {
		name  string
		proc  string
		files map[string]string
		want  float64
	}{
		{
			name:  "v2 unlimited",
			proc:  "0::/user.slice/session-1.scope\n",
			files: map[string]string{"fs/user.slice/session-1.scope/cpu.max": "max 100000\n"},
			want:  0,
		},
		{
			name: "v2 nested: the tightest ancestor wins",
			proc: "0::/kubepods/pod1/ctr\n",
			files: map[string]string{
				"fs/kubepods/pod1/ctr/cpu.max": "max 100000\n",
				"fs/kubepods/pod1/cpu.max":     "150000 100000\n",
				"fs/kubepods/cpu.max":          "400000 100000\n",
			},
			want: 1.5,
		},
		{
			name:  "v2 namespaced: the path is the mount's root",
			proc:  "0::/\n",
			files: map[string]string{"fs/cpu.max": "200000 100000\n"},
			want:  2,
		},
		{
			name: "v1 cpu,cpuacct",
			proc: "12:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n",
			files: map[string]string{
				"fs/cpu,cpuacct/docker/abc/cpu.cfs_quota_us":  "50000\n",
				"fs/cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000\n",
				"fs/cpu,cpuacct/cpu.cfs_quota_us":             "-1\n",
				"fs/cpu,cpuacct/cpu.cfs_period_us":            "100000\n",
			},
			want: 0.5,
		},
		{
			name:  "v1 without a quota",
			proc:  "4:cpu,cpuacct:/\n",
			files: map[string]string{"fs/cpu,cpuacct/cpu.cfs_quota_us": "-1\n", "fs/cpu,cpuacct/cpu.cfs_period_us": "100000\n"},
			want:  0,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			writeFiles(t, root, tc.files)
			writeFiles(t, root, map[string]string{"cgroup": tc.proc})
			if got := cgroupQuota(filepath.Join(root, "cgroup"), filepath.Join(root, "fs")); got != tc.want {
				t.Fatalf("cgroupQuota = %g, want %g", got, tc.want)
			}
		})
	}
	if got := cgroupQuota("/nonexistent/cgroup", "/nonexistent"); got != 0 {
		t.Fatalf("no cgroup file: %g, want 0", got)
	}
}

func TestThreadCount(t *testing.T) {
	usable := func() CPUs { return usableCPUs(6, 3) }
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
			want = UsableCPUs().Usable
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
