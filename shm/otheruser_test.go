package shm

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Frontends running as another user than the embedder (docs/security.md,
// "Frontends as another user"): the embedder creates the segment socket
// 0660 for a group the frontends belong to, and the frontends name the
// embedder's uid (AttachOptions.OwnerUID). What a frontend of the same user
// could still do outside shared memory is then refused by the kernel or the
// broker.

const (
	dirEnv      = "RECMESH_SHM_DIR"
	ownerUIDEnv = "RECMESH_SHM_OWNER_UID"
)

// The users of the test: the embedder's, and a frontend's in the
// embedder's group. Unassigned in the images and on this machine.
const (
	meshUID     = 65532
	frontendUID = 65533
)

// helperSharedOwner is an embedder sharing its segment with its group.
func helperSharedOwner() error {
	g := testGeometry()
	g.Lanes = 1
	return serveAsOwner(Options{Name: os.Getenv(pathEnv), Dir: os.Getenv(dirEnv), Mode: 0o660, Geometry: g})
}

// helperStranger is a frontend of another user: it is served, and every
// way to reach past its lane that the same user would have is refused. It
// prints "served", "breach <what>" for an attempt that was not refused,
// and "refused <n>".
func helperStranger() error {
	path := os.Getenv(pathEnv)
	owner, _ := strconv.Atoi(os.Getenv(ownerEnv))
	ownerUID, _ := strconv.Atoi(os.Getenv(ownerUIDEnv))
	refused := 0
	check := func(what string, err error, want ...error) {
		for _, w := range want {
			if err != nil && errors.Is(err, w) {
				refused++
				return
			}
		}
		fmt.Printf("breach %s: %v\n", what, err)
	}
	// Not naming the owner, it trusts only its own user's segments.
	if s, err := Attach(path, AttachOptions{}); err == nil {
		s.Close()
		check("attach without naming the owner", nil, ErrUnsafeFile)
	} else {
		check("attach without naming the owner", err, ErrUnsafeFile)
	}
	s, err := Attach(path, AttachOptions{OwnerUID: ownerUID})
	if err != nil {
		return err
	}
	l, err := s.ClaimLane(os.Getpid())
	if err != nil {
		return err
	}
	slot, payload, err := l.Claim(1, 8)
	if err != nil {
		return err
	}
	put64(payload, 0, 7)
	if err := l.Commit(slot, RequestMeta{ID: 7}); err != nil {
		return err
	}
	if err := reapCompletions(l, true); err != nil {
		return err
	}
	fmt.Println("served")

	check("signal the embedder", unix.Kill(owner, unix.SIGTERM), unix.EPERM)
	// In a sticky directory the kernel refuses with EPERM; in the
	// embedder's own directory, which only it may write, with EACCES.
	check("remove the segment socket", unix.Unlink(path), unix.EPERM, unix.EACCES)
	// A socket of its own renamed over the path, which later attachers
	// would reach: made beside it, or, where it may not write, in the
	// directory above.
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	planted := filepath.Join(filepath.Dir(path), ".planted.sock")
	err = unix.Bind(fd, &unix.SockaddrUnix{Name: planted})
	if errors.Is(err, unix.EACCES) {
		planted = filepath.Join(filepath.Dir(filepath.Dir(path)), ".planted.sock")
		err = unix.Bind(fd, &unix.SockaddrUnix{Name: planted})
	}
	if err != nil {
		return err
	}
	defer unix.Unlink(planted)
	check("replace the segment socket", unix.Rename(planted, path), unix.EPERM, unix.EACCES)
	// No accelerator is attached: only the user check stands between a
	// frontend and the accelerator's memory.
	check("become the accelerator", s.SetAccelerator(os.Getpid()), ErrNotOwner)
	fmt.Println("refused", refused)
	return nil
}

// A frontend running as another user, in the embedder's group, attaches to
// a 0660 segment when it names the embedder's uid, is served through it,
// and cannot signal the embedder, remove or replace its socket, or be given
// the accelerator's memory while none is attached; a user outside the
// group cannot connect at all. Twice: in a sticky world-writable directory,
// as /dev/shm is, and in a directory the embedder makes inside one that is
// writable by all and not sticky, as a Kubernetes emptyDir is. Needs root
// (to start processes as other users).
func TestFrontendOfAnotherUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("starts processes as other users: needs root")
	}
	for _, tc := range []struct {
		name      string
		parent    os.FileMode // of the directory the segment directory is in
		made      bool        // the embedder makes the segment directory
		wantMode  os.FileMode // of the segment directory
		wantOwner uint32
	}{
		{name: "sticky", parent: 0o755, wantMode: os.ModeSticky | 0o777, wantOwner: 0},
		{name: "own directory in an emptyDir", parent: 0o777, made: true, wantMode: 0o710, wantOwner: meshUID},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Helpers of other users need a test binary and a segment
			// directory they can reach: a copy of the binary in a 0755
			// directory, and the segment directory in one of tc.parent.
			dir := t.TempDir()
			for _, d := range []string{filepath.Dir(dir), dir} {
				if err := os.Chmod(d, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			bin := copyTestBinary(t, dir)
			parent := filepath.Join(dir, "volume")
			if err := os.Mkdir(parent, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(parent, tc.parent); err != nil {
				t.Fatal(err)
			}
			segDir := filepath.Join(parent, "shm")
			if !tc.made {
				if err := os.Mkdir(segDir, 0o755); err != nil {
					t.Fatal(err)
				}
				// os.ModeSticky, not 0o1000: os.Chmod takes Go's mode bits.
				if err := os.Chmod(segDir, tc.wantMode); err != nil {
					t.Fatal(err)
				}
			}
			name := testName(t)
			owner := startChildAs(t, &syscall.Credential{Uid: meshUID, Gid: meshUID}, bin, "owner-shared",
				pathEnv+"="+name, dirEnv+"="+segDir)
			path := owner.expect(t, "ready", 20*time.Second)

			var st unix.Stat_t
			if err := unix.Lstat(segDir, &st); err != nil {
				t.Fatal(err)
			}
			mode := os.FileMode(st.Mode & 0o777)
			if st.Mode&unix.S_ISVTX != 0 {
				mode |= os.ModeSticky
			}
			if mode != tc.wantMode || st.Uid != tc.wantOwner {
				t.Fatalf("segment directory uid %d mode %v, want uid %d mode %v", st.Uid, mode, tc.wantOwner, tc.wantMode)
			}
			if err := unix.Lstat(path, &st); err != nil {
				t.Fatal(err)
			}
			if st.Uid != meshUID || st.Mode&0o777 != 0o660 {
				t.Fatalf("segment socket uid %d mode %#o, want uid %d mode 0660", st.Uid, st.Mode&0o777, meshUID)
			}

			fe := startChildAs(t, &syscall.Credential{Uid: frontendUID, Gid: frontendUID, Groups: []uint32{meshUID}}, bin, "stranger",
				pathEnv+"="+path, fmt.Sprintf("%s=%d", ownerEnv, owner.pid()), fmt.Sprintf("%s=%d", ownerUIDEnv, meshUID))
			if n := fe.refusals(t, "frontend of another user", 20*time.Second); n != 5 {
				t.Errorf("%d of 5 attempts refused", n)
			}
			select {
			case <-owner.exited:
				t.Fatalf("the embedder exited: %v", owner.err)
			default:
			}
			if err := unix.Lstat(path, &st); err != nil || st.Uid != meshUID {
				t.Fatalf("the segment socket changed: uid %d, %v", st.Uid, err)
			}

			// A user outside the group cannot connect to the 0660 socket.
			if out := asUser(t, 65534, 65534, bin, path); !strings.Contains(out, "permission denied") {
				t.Errorf("a user outside the embedder's group: %q; want the connection refused with permission denied", out)
			}
		})
	}
}

// copyTestBinary copies the test binary into dir, where other users can
// run it: go test builds it in a directory only this user may enter.
func copyTestBinary(t *testing.T, dir string) string {
	t.Helper()
	src, err := os.Open(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	bin := filepath.Join(dir, "shm.test")
	dst, err := os.OpenFile(bin, os.O_CREATE|os.O_WRONLY, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		t.Fatal(err)
	}
	if err := dst.Close(); err != nil {
		t.Fatal(err)
	}
	return bin
}

// asUser runs the "dial" helper as uid:gid against path and returns what
// it printed.
func asUser(t *testing.T, uid, gid uint32, bin, path string) string {
	t.Helper()
	c := startChildAs(t, &syscall.Credential{Uid: uid, Gid: gid}, bin, "dial", pathEnv+"="+path)
	var lines []string
	for line := range c.lines {
		lines = append(lines, line)
	}
	<-c.exited
	return strings.Join(lines, "\n")
}

// helperDial attaches to the segment at the path naming its owner, and
// prints the outcome.
func helperDial() error {
	path := os.Getenv(pathEnv)
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		// The embedder's own directory does not even let it look.
		fmt.Println("lstat:", strings.ToLower(err.Error()))
		return nil
	}
	s, err := Attach(path, AttachOptions{OwnerUID: int(st.Uid)})
	if err != nil {
		fmt.Println("attach:", strings.ToLower(err.Error()))
		return nil
	}
	s.Close()
	fmt.Println("attached")
	return nil
}
