package deploy

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// maxTrackedBytes bounds a tracked file outside testdata: anything larger
// is a build output, a data set or a model, none of which belong in git.
const maxTrackedBytes = 1 << 20

// binaryMagics are the openings of executables and compiled objects.
var binaryMagics = [][]byte{
	[]byte("\x7fELF"),              // Linux executables and shared objects
	{0xcf, 0xfa, 0xed, 0xfe},       // Mach-O, 64-bit
	[]byte("MZ"),                   // Windows PE
	{0x0d, 0x0d, 0x0d, 0x0a},       // CPython 3.11 .pyc (magic 3495)
	[]byte("!<arch>\n"),            // ar archives (Go .a, static libraries)
	{0x00, 0x61, 0x73, 0x6d},       // WebAssembly
	[]byte("\xca\xfe\xba\xbe"),     // Java classes, universal Mach-O
	[]byte("PK\x03\x04"),           // wheels, jars, zips
	{0x1f, 0x8b},                   // gzip (tarballs)
	[]byte("\x89HDF\r\n\x1a\n"),    // HDF5
	[]byte("\x93NUMPY"),            // .npy
	[]byte("\x00\x00\x00\x00\x00"), // zero-filled blobs
}

// TestRepositoryHoldsNoBinaries fails when git tracks a compiled binary,
// a bytecode cache or any file over 1 MiB outside a testdata directory:
// `make build` and `make deps` recreate them, and a clone should not carry
// them.
func TestRepositoryHoldsNoBinaries(t *testing.T) {
	root := repoRoot(t)
	out, err := exec.Command("git", "-C", root, "ls-files", "-z").Output()
	if err != nil {
		t.Skipf("not a git checkout: %v", err)
	}
	for _, name := range strings.Split(strings.TrimRight(string(out), "\x00"), "\x00") {
		if name == "" || strings.Contains("/"+name, "/testdata/") {
			continue
		}
		path := filepath.Join(root, name)
		st, err := os.Lstat(path)
		if err != nil || !st.Mode().IsRegular() {
			continue // deleted in the work tree, or a link
		}
		if st.Size() > maxTrackedBytes {
			t.Errorf("%s: %d bytes tracked (over 1 MiB outside testdata)", name, st.Size())
		}
		if strings.HasSuffix(name, ".pyc") || strings.Contains(name, "__pycache__/") {
			t.Errorf("%s: a Python bytecode cache is tracked", name)
			continue
		}
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		head := make([]byte, 8)
		n, _ := f.Read(head)
		f.Close()
		for _, m := range binaryMagics {
			if n >= len(m) && bytes.Equal(head[:len(m)], m) {
				t.Errorf("%s: a binary is tracked (it opens like %q)", name, m)
				break
			}
		}
	}
}

// TestLicense: the repository carries the Apache License 2.0.
func TestLicense(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(repoRoot(t), "LICENSE"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(b, []byte("Apache License")) || !bytes.Contains(b, []byte("Version 2.0")) {
		t.Fatal("LICENSE is not the Apache License 2.0")
	}
}
