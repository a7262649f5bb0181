package shm

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

// peerID is who a broker peer is, as far as the kernel vouches for it.
type peerID struct {
	// pid is the peer's pid as its own pid namespace numbers it (what its
	// lane records), and pidNS that namespace's inode.
	pid   uint32
	pidNS uint64
	// visible says the peer lives in this process's pid namespace or one
	// below it, so the kernel confirmed pid and pidNS. An invisible peer
	// (a sibling namespace) is taken at its word, but it can never pass
	// for a process of this namespace.
	visible bool
	// key identifies the process for per-process limits: its pid as this
	// namespace sees it, or, when invisible, the pid and namespace it
	// names.
	key peerKey
}

type peerKey struct {
	pid   uint32
	pidNS uint64
}

// verifyPeer checks the pid and pid namespace a hello names against the
// socket's SO_PEERCRED and /proc, so that no peer can pass for another
// process: the pid the kernel gives is in this namespace, and
// /proc/<pid>/status's NSpid line says what the peer's own namespace calls
// it. ours is this process's pid namespace.
func verifyPeer(cred unix.Ucred, pid uint32, pidNS, ours uint64) (peerID, error) {
	if pid == 0 || pid > 1<<22 {
		return peerID{}, fmt.Errorf("hello names pid %d", pid)
	}
	if cred.Pid <= 0 {
		// The peer's namespace is not below ours: the kernel cannot map
		// its pid here. It may not claim ours.
		if pidNS == 0 || pidNS == ours {
			return peerID{}, fmt.Errorf("hello names pid %d in this pid namespace, but the peer is not in it", pid)
		}
		return peerID{pid: pid, pidNS: pidNS, key: peerKey{pid, pidNS}}, nil
	}
	nspids, err := readNSpid(cred.Pid)
	if err != nil {
		return peerID{}, fmt.Errorf("read the peer's pids: %w", err)
	}
	own := nspids[len(nspids)-1]
	if own != pid {
		return peerID{}, fmt.Errorf("hello names pid %d, the kernel says the peer is pid %d in its namespace (pid %d in this one)", pid, own, cred.Pid)
	}
	id := peerID{pid: pid, visible: true, key: peerKey{pid: uint32(cred.Pid), pidNS: ours}}
	if len(nspids) == 1 {
		if pidNS != 0 && pidNS != ours {
			return peerID{}, fmt.Errorf("hello names pid namespace %d, the peer is in this one (%d)", pidNS, ours)
		}
		id.pidNS = ours
		return id, nil
	}
	// A namespace below ours.
	if pidNS == 0 || pidNS == ours {
		return peerID{}, fmt.Errorf("hello names this pid namespace, the peer is in one below it")
	}
	if ns, err := nsInode(cred.Pid); err == nil && ns != pidNS {
		return peerID{}, fmt.Errorf("hello names pid namespace %d, the peer is in %d", pidNS, ns)
	}
	// Unreadable (the peer is undumpable and we may not trace it): NSpid
	// already proved it is not in ours, so its own word cannot hurt.
	id.pidNS = pidNS
	return id, nil
}

// readNSpid returns the pids of process pid (a pid of this namespace), from
// this namespace's number down to its own namespace's. A kernel without the
// NSpid line (before 4.1) has no nested view: the pid is its own.
func readNSpid(pid int32) ([]uint32, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(int(pid)) + "/status")
	if err != nil {
		return nil, err
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		rest, ok := bytes.CutPrefix(sc.Bytes(), []byte("NSpid:"))
		if !ok {
			continue
		}
		var pids []uint32
		for _, f := range bytes.Fields(rest) {
			v, err := strconv.ParseUint(string(f), 10, 32)
			if err != nil {
				return nil, fmt.Errorf("NSpid %q: %w", rest, err)
			}
			pids = append(pids, uint32(v))
		}
		if len(pids) == 0 || pids[0] != uint32(pid) {
			return nil, fmt.Errorf("NSpid %q does not start with pid %d", rest, pid)
		}
		return pids, nil
	}
	return []uint32{uint32(pid)}, nil
}

// nsInode is the inode of process pid's pid namespace.
func nsInode(pid int32) (uint64, error) {
	fi, err := os.Stat("/proc/" + strconv.Itoa(int(pid)) + "/ns/pid")
	if err != nil {
		return 0, err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, fmt.Errorf("no inode for /proc/%d/ns/pid", pid)
	}
	return st.Ino, nil
}
