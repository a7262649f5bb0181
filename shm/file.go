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

// The segment path is a unix socket: the owner's broker listens there and
// hands each process the memfds its role may map (broker.go). The segment
// directory (/dev/shm) is usually writable by every user, so what sits at
// the path cannot be trusted just because it has the right name: another
// user could plant a symbolic link or a socket of their own there. The
// path is therefore checked with lstat (no symbolic link, a socket, this
// user's, not writable by every user), and, since a check on a path can be
// raced, the broker is authenticated after connecting by the credentials
// the kernel recorded for it (SO_PEERCRED), and every memfd it hands out
// must be sealed against resizing (checkMemfd).

// ensureDir makes the segment directory dir when it does not exist: only
// its last element, owned by this process, mode dirMode(socket). One that
// exists is used as it is (/dev/shm, which some systems link to /run/shm,
// or a directory made by an earlier run), but it must be a directory.
func ensureDir(dir string, socket os.FileMode) error {
	var st unix.Stat_t
	err := unix.Stat(dir, &st)
	if errors.Is(err, unix.ENOENT) {
		perm := dirMode(socket)
		err = unix.Mkdir(dir, uint32(perm))
		if err == nil {
			// The mode asked for, umask notwithstanding.
			if err := unix.Chmod(dir, uint32(perm)); err != nil {
				return &os.PathError{Op: "chmod", Path: dir, Err: err}
			}
			return nil
		}
		if !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("make the segment directory (its parent must exist): %w", &os.PathError{Op: "mkdir", Path: dir, Err: err})
		}
		err = unix.Stat(dir, &st) // made meanwhile by another process
	}
	if err != nil {
		return &os.PathError{Op: "stat", Path: dir, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return fmt.Errorf("the segment directory is not a directory (mode %#o): give --shm-dir a directory, or a path that does not exist yet: %w",
			st.Mode, &os.PathError{Op: "use", Path: dir, Err: unix.ENOTDIR})
	}
	return nil
}

// dirMode is the permission of a segment directory Create makes for a
// socket of mode socket: writable by the owner alone, and searchable by
// the group when the socket admits the group (so its members can reach
// the socket, but neither list, remove nor replace anything there).
func dirMode(socket os.FileMode) os.FileMode {
	if socket.Perm()&0o060 != 0 {
		return 0o710
	}
	return 0o700
}

// listenSegmentSocket binds a new SOCK_SEQPACKET socket at
// dir/.name.<random>.sock with mode perm (umask notwithstanding) and
// listens on it. The caller renames it over the segment path when the
// segment is ready.
func listenSegmentSocket(dir, name string, perm os.FileMode) (*wireConn, string, error) {
	var rnd [8]byte
	for try := 0; ; try++ {
		if _, err := rand.Read(rnd[:]); err != nil {
			return nil, "", err
		}
		// Short: a socket address holds at most 107 bytes.
		path := filepath.Join(dir, "."+name[:min(len(name), 24)]+"."+hex.EncodeToString(rnd[:])+".sock")
		fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return nil, "", fmt.Errorf("socket: %w", err)
		}
		err = withSockaddr(path, func(sa *unix.SockaddrUnix) error { return unix.Bind(fd, sa) })
		if errors.Is(err, unix.EADDRINUSE) && try < 100 {
			unix.Close(fd)
			continue
		}
		if err != nil {
			unix.Close(fd)
			return nil, "", &os.PathError{Op: "bind", Path: path, Err: err}
		}
		// Connecting needs write permission on the socket file; the mode
		// asked for (say 0660, to serve a group) is set explicitly.
		if err := unix.Chmod(path, uint32(perm.Perm())); err != nil {
			unix.Close(fd)
			unix.Unlink(path)
			return nil, "", &os.PathError{Op: "chmod", Path: path, Err: err}
		}
		if err := unix.Listen(fd, 128); err != nil {
			unix.Close(fd)
			unix.Unlink(path)
			return nil, "", &os.PathError{Op: "listen", Path: path, Err: err}
		}
		c, err := newWireConn(fd, path)
		if err != nil {
			unix.Unlink(path)
			return nil, "", err
		}
		return c, path, nil
	}
}

// dialSegment connects to the broker at path after checking the path, and
// authenticates the broker by its peer credentials: it must run as owner
// (AttachOptions.OwnerUID), or as this process's user when owner is 0.
func dialSegment(path string, owner int) (*wireConn, error) {
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		return nil, &os.PathError{Op: "lstat", Path: path, Err: err}
	}
	euid := os.Geteuid()
	if err := checkSegmentFile(path, &st, euid, owner); err != nil {
		return nil, err
	}
	want, anyUID := trustedOwner(euid, owner)
	// Non-blocking: a unix socket connects at once or not at all, and a
	// broker whose backlog is full (its owner stopped) must not block the
	// attacher.
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("socket: %w", err)
	}
	if err := withSockaddr(path, func(sa *unix.SockaddrUnix) error { return unix.Connect(fd, sa) }); err != nil {
		unix.Close(fd)
		switch {
		case errors.Is(err, unix.ECONNREFUSED):
			return nil, fmt.Errorf("%w: nobody serves %s (the embedder that created it is gone)", ErrOwnerDead, path)
		case errors.Is(err, unix.EAGAIN):
			return nil, fmt.Errorf("connect %s: the broker accepts no connections now (its owner is stalled or overloaded): %w", path, err)
		}
		return nil, &os.PathError{Op: "connect", Path: path, Err: err}
	}
	c, err := newWireConn(fd, path)
	if err != nil {
		return nil, err
	}
	cred, err := c.peer()
	if err != nil {
		c.close()
		return nil, fmt.Errorf("peer credentials of %s: %w", path, err)
	}
	if !anyUID && int(cred.Uid) != want {
		c.close()
		return nil, fmt.Errorf("%w: the broker at %s runs as uid %d, want uid %d (%s)", ErrUnsafeFile, path, cred.Uid, want, ownerSource(owner))
	}
	return c, nil
}

// trustedOwner is the uid whose segment an attacher running as euid
// trusts: owner when named, else its own; any uid (anyUID) when it is root
// and names none.
func trustedOwner(euid, owner int) (want int, anyUID bool) {
	if owner > 0 {
		return owner, false
	}
	return euid, euid == 0
}

func ownerSource(owner int) string {
	if owner > 0 {
		return "the segment owner this frontend was given"
	}
	return "this process's"
}

// checkSegmentFile decides whether a process running as euid, trusting
// segments of owner (0: its own user), may trust the path st describes
// (lstat) as a segment socket: a socket, owned by the trusted user (any
// owner when euid is root and names none), and not writable by other
// users.
func checkSegmentFile(path string, st *unix.Stat_t, euid, owner int) error {
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFSOCK:
	case unix.S_IFLNK:
		return fmt.Errorf("%w: %s is a symbolic link; segment sockets are never reached through one (remove it: the embedder creates the segment itself)", ErrUnsafeFile, path)
	default:
		return fmt.Errorf("%w: %s is not a socket (mode %#o); remove it, the embedder creates the segment itself", ErrUnsafeFile, path, st.Mode)
	}
	if want, anyUID := trustedOwner(euid, owner); !anyUID && int(st.Uid) != want {
		return fmt.Errorf("%w: %s is owned by uid %d, want uid %d (%s): run the embedder and the accelerator as that user, give frontends of another user the embedder's uid (frontend --segment-owner-uid), or remove the file", ErrUnsafeFile, path, st.Uid, want, ownerSource(owner))
	}
	if st.Mode&0o002 != 0 {
		return fmt.Errorf("%w: %s is writable by every user (mode %#o): remove it, or chmod o-w it (the segment is created 0600, or 0660 to share it with a group)", ErrUnsafeFile, path, st.Mode&0o7777)
	}
	return nil
}

// withSockaddr calls fn with the socket address of path. A path longer
// than a socket address can hold (Kubernetes volume paths can be) is
// reached through its directory's descriptor, /proc/self/fd/N/name.
func withSockaddr(path string, fn func(*unix.SockaddrUnix) error) error {
	const maxPath = 100 // sun_path is 108 bytes, NUL included
	if len(path) <= maxPath {
		return fn(&unix.SockaddrUnix{Name: path})
	}
	dfd, err := unix.Open(filepath.Dir(path), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(dfd)
	short := fmt.Sprintf("/proc/self/fd/%d/%s", dfd, filepath.Base(path))
	if len(short) > maxPath {
		return fmt.Errorf("socket path %s: name too long for a socket address", path)
	}
	return fn(&unix.SockaddrUnix{Name: short})
}
