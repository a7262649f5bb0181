package sched

import (
	"os"
	"path/filepath"
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
