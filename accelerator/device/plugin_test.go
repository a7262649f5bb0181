package device

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestCheckVersion(t *testing.T) {
	for _, tc := range []struct {
		path         string
		major, minor int
		allowNewer   bool
		ok           bool
		install      string
	}{
		{"xla_cpu_pjrt.so", 0, 81, false, true, ""},
		{"xla_gpu_pjrt.so", 0, 81, false, true, ""},
		{"xla_cuda_plugin.so", 0, 115, false, false, "xla-cuda13-pjrt==0.0.1"}, // newer: refused by default
		{"xla_cuda_plugin.so", 0, 115, true, true, ""},                         // unless asked to try
		{"xla_cpu_pjrt.so", 0, 80, true, false, "xla-cpu-pjrt==0.0.1"},         // older than the header
		{"xla_cpu_pjrt.so", 1, 81, true, false, "xla-cpu-pjrt==0.0.1"},         // other major
	} {
		err := CheckVersion(tc.path, tc.major, tc.minor, tc.allowNewer)
		if (err == nil) != tc.ok {
			t.Errorf("CheckVersion(%s %d.%d) = %v, want ok=%v", tc.path, tc.major, tc.minor, err, tc.ok)
		}
		if err == nil {
			continue
		}
		if !errors.Is(err, ErrIncompatible) {
			t.Errorf("CheckVersion(%s %d.%d) error %v does not wrap ErrIncompatible", tc.path, tc.major, tc.minor, err)
		}
		msg := err.Error()
		for _, want := range []string{fmt.Sprintf("%d.%d", tc.major, tc.minor), "0.81", tc.install} {
			if !strings.Contains(msg, want) {
				t.Errorf("CheckVersion(%s %d.%d) error %q does not name %q", tc.path, tc.major, tc.minor, msg, want)
			}
		}
	}
}

func TestFindPluginExplicit(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "my_plugin.so")
	if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := FindPlugin(p)
	if err != nil || got != p {
		t.Fatalf("FindPlugin(%q) = %q, %v", p, got, err)
	}
	if got, err := FindPlugin("cpu"); err != nil || got != "cpu" {
		t.Fatalf("FindPlugin(cpu) = %q, %v; a bare name goes to gopjrt", got, err)
	}
	_, err = FindPlugin(filepath.Join(dir, "missing.so"))
	if !errors.Is(err, ErrPluginNotFound) {
		t.Fatalf("missing explicit plugin: err = %v, want ErrPluginNotFound", err)
	}
}

func TestFindPluginLibraryPath(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "xla_cpu_pjrt.so")
	if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv(EnvPlugin, "")
	t.Setenv(EnvLibraryPath, "/nonexistent:"+dir)
	got, err := FindPlugin("")
	if err != nil || got != p {
		t.Fatalf("FindPlugin via %s = %q, %v; want %q", EnvLibraryPath, got, err, p)
	}
}

// TestFindPluginMissingSaysHowToInstall runs from an empty folder with no
// search path, so nothing is found, and checks the message names the fix.
func TestFindPluginMissingSaysHowToInstall(t *testing.T) {
	t.Setenv(EnvPlugin, "")
	t.Setenv(EnvLibraryPath, "")
	t.Chdir(t.TempDir())
	if exe, _ := os.Executable(); strings.Contains(exe, "/work/") {
		// The test binary lives in the build cache, outside any checkout.
		t.Logf("executable at %s", exe)
	}
	_, err := FindPlugin("")
	if err == nil {
		t.Skip("a plugin is reachable from the test executable's folder")
	}
	if !errors.Is(err, ErrPluginNotFound) || !strings.Contains(err.Error(), "make deps") {
		t.Fatalf("error %q should wrap ErrPluginNotFound and say to run make deps", err)
	}
}
