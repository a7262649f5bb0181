package model

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestRootResolve(t *testing.T) {
	base := t.TempDir()
	rootDir := filepath.Join(base, "models")
	outside := filepath.Join(base, "elsewhere")
	for _, d := range []string{filepath.Join(rootDir, "v1"), filepath.Join(rootDir, "v2"), outside} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(outside, WeightsFile), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	// v2 holds a weights file that is a link out of the root.
	if err := os.Symlink(filepath.Join(outside, WeightsFile), filepath.Join(rootDir, "v2", WeightsFile)); err != nil {
		t.Fatal(err)
	}
	// "escape" is a bundle directory that is itself a link out.
	if err := os.Symlink(outside, filepath.Join(rootDir, "escape")); err != nil {
		t.Fatal(err)
	}
	// "alias" links to v1, inside the root: allowed.
	if err := os.Symlink(filepath.Join(rootDir, "v1"), filepath.Join(rootDir, "alias")); err != nil {
		t.Fatal(err)
	}
	r, err := OpenRoot(rootDir)
	if err != nil {
		t.Fatal(err)
	}
	v1 := filepath.Join(r.Dir(), "v1")
	for _, tc := range []struct {
		name    string
		want    string
		outside bool
		errHas  string
	}{
		{name: "v1", want: v1},
		{name: filepath.Join(rootDir, "v1"), want: v1},
		{name: "alias", want: v1},
		{name: "../elsewhere", outside: true},
		{name: outside, outside: true},
		{name: "v1/../../elsewhere", outside: true},
		{name: "escape", outside: true},
		{name: "v2", outside: true},
		{name: "missing", errHas: "no such file"},
		{name: ".", errHas: "model root itself"},
		{name: "", errHas: "empty"},
	} {
		got, err := r.Resolve(tc.name)
		switch {
		case tc.want != "":
			if err != nil || got != tc.want {
				t.Errorf("Resolve(%q) = %q, %v; want %q", tc.name, got, err, tc.want)
			}
		case tc.outside:
			if !errors.Is(err, ErrOutsideRoot) {
				t.Errorf("Resolve(%q) = %q, %v; want an outside-the-root error", tc.name, got, err)
			}
		default:
			if err == nil || !strings.Contains(err.Error(), tc.errHas) {
				t.Errorf("Resolve(%q) = %q, %v; want an error containing %q", tc.name, got, err, tc.errHas)
			}
		}
	}
	if _, err := OpenRoot(filepath.Join(base, "nope")); err == nil {
		t.Error("OpenRoot of a missing directory succeeded")
	}
}

func TestRootServing(t *testing.T) {
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "v2"), 0o755); err != nil {
		t.Fatal(err)
	}
	r, err := OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	// No record: the flag's bundle.
	got, resumed, err := r.StartBundle("/flag/bundle")
	if err != nil || resumed || got != "/flag/bundle" {
		t.Fatalf("StartBundle without a record = %q, %v, %v", got, resumed, err)
	}
	want := filepath.Join(r.Dir(), "v2")
	if err := r.SetServing(Serving{Bundle: want, ModelID: "m2"}); err != nil {
		t.Fatal(err)
	}
	s, ok, err := r.Serving()
	if err != nil || !ok || s.Bundle != want || s.ModelID != "m2" {
		t.Fatalf("Serving() = %+v, %v, %v", s, ok, err)
	}
	got, resumed, err = r.StartBundle("/flag/bundle")
	if err != nil || !resumed || got != want {
		t.Fatalf("StartBundle after a rollout = %q, %v, %v; want %q", got, resumed, err, want)
	}
	// No temporary file is left beside the record.
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".serving-") {
			t.Errorf("temporary file %s left behind", e.Name())
		}
	}
	// A record whose bundle is gone is an error naming the file to delete.
	if err := os.Remove(want); err != nil {
		t.Fatal(err)
	}
	if _, _, err := r.StartBundle("/flag/bundle"); err == nil || !strings.Contains(err.Error(), ServingFile) {
		t.Errorf("StartBundle with a vanished bundle: %v; want an error naming %s", err, ServingFile)
	}
	// A corrupt record is an error too, not a silent fallback.
	if err := os.WriteFile(filepath.Join(dir, ServingFile), []byte("{"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := r.StartBundle("/flag/bundle"); err == nil || !strings.Contains(err.Error(), "corrupt") {
		t.Errorf("StartBundle with a corrupt record: %v", err)
	}
}

// TestStartBundleIgnoresUpdatesOnlyRecords: a record the row updates
// wrote does not pin its bundle; a rollout's does.
func TestStartBundleIgnoresUpdatesOnlyRecords(t *testing.T) {
	r, err := OpenRoot(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	b := filepath.Join(r.Dir(), "b")
	if err := os.Mkdir(b, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := r.SetServing(Serving{Bundle: b, ModelID: "m", UpdatesApplied: 9, UpdatesOnly: true}); err != nil {
		t.Fatal(err)
	}
	if dir, resumed, err := r.StartBundle("flag"); err != nil || resumed || dir != "flag" {
		t.Fatalf("StartBundle with an updates-only record = %q, %v, %v; want the flag's bundle", dir, resumed, err)
	}
	if err := r.SetServing(Serving{Bundle: b, ModelID: "m"}); err != nil {
		t.Fatal(err)
	}
	if dir, resumed, err := r.StartBundle("flag"); err != nil || !resumed || dir != b {
		t.Fatalf("StartBundle with a rollout's record = %q, %v, %v; want %s", dir, resumed, err, b)
	}
	if _, err := r.NewBundle("b"); err == nil {
		t.Error("NewBundle of an existing bundle succeeded")
	}
	if _, err := r.NewBundle("../x"); err == nil {
		t.Error("NewBundle outside the root succeeded")
	}
	if p, err := r.NewBundle("snap"); err != nil || p != filepath.Join(r.Dir(), "snap") {
		t.Errorf("NewBundle(snap) = %q, %v", p, err)
	}
}
