package shm

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// TestAttachRefusesSymlink: a symbolic link at the segment path, even to a
// valid segment of ours, is refused rather than followed.
func TestAttachRefusesSymlink(t *testing.T) {
	s := newTestSegment(t, testGeometry())
	link := filepath.Join(t.TempDir(), "seg")
	if err := os.Symlink(s.Path(), link); err != nil {
		t.Fatal(err)
	}
	a, err := Attach(link, AttachOptions{})
	if err == nil {
		a.Close()
		t.Fatal("attached through a symbolic link")
	}
	if !errors.Is(err, ErrUnsafeFile) || !strings.Contains(err.Error(), "symbolic link") || !strings.Contains(err.Error(), link) {
		t.Fatalf("attach through a symlink: %v; want ErrUnsafeFile naming the link", err)
	}
}

// TestCreateReplacesSymlink: Create never writes through a symbolic link at
// the path (its target is left alone); the segment replaces the link.
func TestCreateReplacesSymlink(t *testing.T) {
	dir := t.TempDir()
	victim := filepath.Join(dir, "victim")
	if err := os.WriteFile(victim, []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(victim, filepath.Join(dir, "seg")); err != nil {
		t.Fatal(err)
	}
	s, err := Create(Options{Name: "seg", Dir: dir, Geometry: testGeometry()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if b, _ := os.ReadFile(victim); string(b) != "keep" {
		t.Fatalf("the link's target was written: %q", b)
	}
	fi, err := os.Lstat(s.Path())
	if err != nil || fi.Mode()&os.ModeSocket == 0 {
		t.Fatalf("segment path after Create: %v, %v; want a socket", fi, err)
	}
}

// TestAttachRefusesWorldWritable: a segment file any user could write is
// refused, naming the path and the fix.
func TestAttachRefusesWorldWritable(t *testing.T) {
	s := newTestSegment(t, testGeometry())
	if err := os.Chmod(s.Path(), 0o666); err != nil {
		t.Fatal(err)
	}
	a, err := Attach(s.Path(), AttachOptions{})
	if err == nil {
		a.Close()
		t.Fatal("attached a world-writable segment")
	}
	if !errors.Is(err, ErrUnsafeFile) || !strings.Contains(err.Error(), s.Path()) || !strings.Contains(err.Error(), "writable by every user") {
		t.Fatalf("attach world-writable: %v", err)
	}
}

// TestAttachRefusesNonRegular: a FIFO or a regular file at the path is
// refused without blocking.
func TestAttachRefusesNonRegular(t *testing.T) {
	path := filepath.Join(t.TempDir(), "seg")
	if err := unix.Mkfifo(path, 0o600); err != nil {
		t.Skipf("mkfifo: %v", err)
	}
	if _, err := Attach(path, AttachOptions{}); !errors.Is(err, ErrUnsafeFile) || !strings.Contains(err.Error(), "not a socket") {
		t.Fatalf("attach a FIFO: %v", err)
	}
	file := filepath.Join(t.TempDir(), "seg")
	if err := os.WriteFile(file, make([]byte, PageSize), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Attach(file, AttachOptions{}); !errors.Is(err, ErrUnsafeFile) || !strings.Contains(err.Error(), "not a socket") {
		t.Fatalf("attach a regular file: %v", err)
	}
}

func TestCreateRefusesWorldWritableMode(t *testing.T) {
	_, err := Create(Options{Name: "seg", Dir: t.TempDir(), Mode: 0o666, Geometry: testGeometry()})
	if !errors.Is(err, ErrUnsafeFile) {
		t.Fatalf("Create with mode 0666: %v; want ErrUnsafeFile", err)
	}
}

// TestCreateMakesItsDirectory: a segment directory that does not exist is
// made, writable by this user alone (searchable by the group when the
// socket admits it), and attachers reach the segment in it; a directory
// under a missing parent, or a file, is refused.
func TestCreateMakesItsDirectory(t *testing.T) {
	parent := t.TempDir()
	for _, tc := range []struct {
		mode, want os.FileMode
	}{{0o600, 0o700}, {0o660, 0o710}} {
		dir := filepath.Join(parent, fmt.Sprintf("seg-%o", tc.mode))
		s, err := Create(Options{Name: "seg", Dir: dir, Mode: tc.mode, Geometry: testGeometry()})
		if err != nil {
			t.Fatalf("mode %#o: %v", tc.mode, err)
		}
		st, err := os.Lstat(dir)
		if err != nil || !st.IsDir() || st.Mode().Perm() != tc.want {
			t.Errorf("socket mode %#o: directory %v, %v; want a directory of mode %#o", tc.mode, st.Mode(), err, tc.want)
		}
		a, err := Attach(filepath.Join(dir, "seg"), AttachOptions{})
		if err != nil {
			t.Errorf("attach in the new directory: %v", err)
		} else {
			a.Close()
		}
		s.Close()
		// A second generation uses the directory as it is.
		s, err = Create(Options{Name: "seg", Dir: dir, Mode: tc.mode, Geometry: testGeometry()})
		if err != nil {
			t.Fatalf("mode %#o, again: %v", tc.mode, err)
		}
		s.Close()
	}
	_, err := Create(Options{Name: "seg", Dir: filepath.Join(parent, "missing", "seg"), Geometry: testGeometry()})
	if err == nil || !strings.Contains(err.Error(), "parent must exist") {
		t.Errorf("a directory under a missing parent: %v", err)
	}
	file := filepath.Join(parent, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Create(Options{Name: "seg", Dir: file, Geometry: testGeometry()}); err == nil || !strings.Contains(err.Error(), "not a directory") {
		t.Errorf("a file as the directory: %v", err)
	}
	// A link to a directory is followed, as /dev/shm → /run/shm is.
	link := filepath.Join(parent, "link")
	if err := os.Symlink(filepath.Join(parent, "seg-600"), link); err != nil {
		t.Fatal(err)
	}
	s, err := Create(Options{Name: "seg", Dir: link, Geometry: testGeometry()})
	if err != nil {
		t.Fatalf("a link to a directory: %v", err)
	}
	s.Close()
}

// TestCheckSegmentFileOwner: another user's file is refused with both uids
// in the message, unless this process is root; ours is accepted. (The tests
// may run as root, so the owner rule is checked on the stat directly.)
func TestCheckSegmentFileOwner(t *testing.T) {
	reg := func(uid uint32, mode uint32) *unix.Stat_t {
		return &unix.Stat_t{Uid: uid, Mode: syscall.S_IFSOCK | mode}
	}
	if err := checkSegmentFile("/dev/shm/x", reg(1000, 0o600), 1000, 0); err != nil {
		t.Errorf("own 0600 file refused: %v", err)
	}
	if err := checkSegmentFile("/dev/shm/x", reg(1000, 0o660), 1000, 0); err != nil {
		t.Errorf("own 0660 file refused: %v", err)
	}
	err := checkSegmentFile("/dev/shm/x", reg(1001, 0o600), 1000, 0)
	if !errors.Is(err, ErrUnsafeFile) || !strings.Contains(err.Error(), "uid 1001") || !strings.Contains(err.Error(), "uid 1000") || !strings.Contains(err.Error(), "/dev/shm/x") {
		t.Errorf("another user's file: %v; want ErrUnsafeFile naming the path and both uids", err)
	}
	if err := checkSegmentFile("/dev/shm/x", reg(1001, 0o600), 0, 0); err != nil {
		t.Errorf("root refused another user's file: %v", err)
	}
	if err := checkSegmentFile("/dev/shm/x", reg(0, 0o602), 0, 0); !errors.Is(err, ErrUnsafeFile) {
		t.Errorf("root accepted a world-writable file: %v", err)
	}
	if err := checkSegmentFile("/dev/shm/x", &unix.Stat_t{Uid: 1000, Mode: syscall.S_IFDIR | 0o700}, 1000, 0); !errors.Is(err, ErrUnsafeFile) {
		t.Errorf("a directory accepted: %v", err)
	}
	// A frontend of another user names the embedder's: that user's file
	// is accepted, its own and everybody else's refused, root's rule too.
	if err := checkSegmentFile("/dev/shm/x", reg(1000, 0o660), 1001, 1000); err != nil {
		t.Errorf("the named owner's 0660 file refused: %v", err)
	}
	for _, c := range []struct{ uid, euid uint32 }{{1001, 1001}, {1002, 1001}, {1002, 0}} {
		err := checkSegmentFile("/dev/shm/x", reg(c.uid, 0o660), int(c.euid), 1000)
		if !errors.Is(err, ErrUnsafeFile) || !strings.Contains(err.Error(), "want uid 1000") || !strings.Contains(err.Error(), "--segment-owner-uid") {
			t.Errorf("uid %d's file, euid %d naming owner 1000: %v; want ErrUnsafeFile naming uid 1000 and the flag", c.uid, c.euid, err)
		}
	}
}
