package shm

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// The segment directory (/dev/shm) is usually writable by every user, so the
// file at the segment path cannot be trusted just because it has the right
// name: another user could plant a symbolic link there (making the owner
// write through it), or a file of their own that every process of the mesh
// would then map and trust. Segment files are therefore opened with
// O_NOFOLLOW, created with O_EXCL, and checked on the open descriptor
// (fstat, so nothing can be swapped in between the check and the mapping).

// createSegmentFile makes a new file dir/.name.<random>.tmp with mode perm
// (umask notwithstanding), never following or reusing anything at the name.
func createSegmentFile(dir, name string, perm os.FileMode) (*os.File, error) {
	var rnd [8]byte
	for try := 0; ; try++ {
		if _, err := rand.Read(rnd[:]); err != nil {
			return nil, err
		}
		path := filepath.Join(dir, "."+name+"."+hex.EncodeToString(rnd[:])+".tmp")
		fd, err := unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if errors.Is(err, unix.EEXIST) && try < 100 {
			continue
		}
		if err != nil {
			return nil, &os.PathError{Op: "create", Path: path, Err: err}
		}
		// Open applies the umask; the mode asked for (say 0660, to share the
		// segment with a group) is set explicitly.
		if err := unix.Fchmod(fd, uint32(perm.Perm())); err != nil {
			unix.Close(fd)
			unix.Unlink(path)
			return nil, &os.PathError{Op: "chmod", Path: path, Err: err}
		}
		return os.NewFile(uintptr(fd), path), nil
	}
}

// openSegmentFile opens the existing segment file at path (flags O_RDONLY or
// O_RDWR) without following a symbolic link, and refuses it unless
// checkSegmentFile accepts it.
func openSegmentFile(path string, flags int) (*os.File, error) {
	// O_NONBLOCK: a FIFO planted at the path must not block the open; it is
	// refused below as not a regular file.
	fd, err := unix.Open(path, flags|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.ELOOP) {
			return nil, fmt.Errorf("%w: %s is a symbolic link; segment files are never opened through one (remove it: the embedder creates the segment itself)", ErrUnsafeFile, path)
		}
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, &os.PathError{Op: "fstat", Path: path, Err: err}
	}
	if err := checkSegmentFile(path, &st, os.Geteuid()); err != nil {
		unix.Close(fd)
		return nil, err
	}
	if err := unix.SetNonblock(fd, false); err != nil {
		unix.Close(fd)
		return nil, &os.PathError{Op: "fcntl", Path: path, Err: err}
	}
	return os.NewFile(uintptr(fd), path), nil
}

// checkSegmentFile decides whether a process running as euid may trust the
// file st describes as a segment: a regular file, owned by euid (any owner
// when euid is root), and not writable by other users.
func checkSegmentFile(path string, st *unix.Stat_t, euid int) error {
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return fmt.Errorf("%w: %s is not a regular file (mode %#o); remove it, the embedder creates the segment itself", ErrUnsafeFile, path, st.Mode)
	}
	if euid != 0 && int(st.Uid) != euid {
		return fmt.Errorf("%w: %s is owned by uid %d, want uid %d (this process's): run the embedder, the accelerator and the frontends as the same user, or remove the file", ErrUnsafeFile, path, st.Uid, euid)
	}
	if st.Mode&0o002 != 0 {
		return fmt.Errorf("%w: %s is writable by every user (mode %#o): remove it, or chmod o-w it (the segment is created 0600, or 0660 to share it with a group)", ErrUnsafeFile, path, st.Mode&0o7777)
	}
	return nil
}
