package shm

import (
	"os"
	"path/filepath"
	"testing"
)

func TestAcceleratorKeyFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "accelerator.key")
	if _, err := AcceleratorKeyFile(path, false); err == nil {
		t.Fatal("reading a missing key succeeded")
	}
	k1, err := AcceleratorKeyFile(path, true)
	if err != nil {
		t.Fatal(err)
	}
	k2, err := AcceleratorKeyFile(path, true) // exists: read, not replaced
	if err != nil || string(k1) != string(k2) {
		t.Fatalf("second create = %q, %v; want the first key %q", k2, err, k1)
	}
	k3, err := AcceleratorKeyFile(path, false)
	if err != nil || string(k3) != string(k1) {
		t.Fatalf("read = %q, %v; want %q", k3, err, k1)
	}
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := AcceleratorKeyFile(path, false); err == nil {
		t.Fatal("a key readable by others was accepted")
	}
	short := filepath.Join(t.TempDir(), "short.key")
	if err := os.WriteFile(short, []byte("abc\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := AcceleratorKeyFile(short, false); err == nil {
		t.Fatal("a 3-character key was accepted")
	}
}
