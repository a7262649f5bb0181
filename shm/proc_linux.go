package shm

import (
	"bytes"
	"errors"
	"os"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

// monoNow returns CLOCK_MONOTONIC in nanoseconds. Heartbeats use it rather
// than time.Now because Go's monotonic reading is relative to each process's
// start, while CLOCK_MONOTONIC is one clock for every process on the machine
// (within one time namespace), and it never jumps with wall-clock changes.
func monoNow() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		// CLOCK_MONOTONIC cannot fail on Linux; a zero heartbeat reads as
		// stale, which is the safe direction.
		return 0
	}
	return ts.Nano()
}

// pidNamespace identifies this process's pid namespace (the inode of
// /proc/self/ns/pid), or 0 when /proc does not tell. Pids are only compared
// between processes whose namespaces match: frontends in other containers
// share the segment (same IPC namespace) but not the pid numbering, and there
// liveness falls back to heartbeats alone.
func pidNamespace() uint64 {
	fi, err := os.Stat("/proc/self/ns/pid")
	if err != nil {
		return 0
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Ino
	}
	return 0
}

// pidAlive reports whether pid is a live (not zombie) process. Only call it
// for pids from this process's pid namespace. Every process checks its
// peers with it several times a second, so it reads into a buffer on the
// stack rather than through os.ReadFile (a File, a Stat and a growing
// buffer per call: most of an idle embedder's garbage).
func pidAlive(pid uint32) bool {
	if pid == 0 || pid > 1<<22 { // 1<<22 is the kernel's PID_MAX_LIMIT
		return false
	}
	if err := unix.Kill(int(pid), 0); errors.Is(err, unix.ESRCH) {
		return false
	}
	// kill(pid, 0) succeeds on a zombie: a dead process whose parent has not
	// reaped it yet still holds its pid. Its state letter says it is dead.
	var buf [statPrefix]byte
	b, err := readStatPrefix(pid, &buf)
	if err != nil {
		return !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.ESRCH)
	}
	// The fields after the state are numbers, so a prefix holding comm
	// finds the same state as the whole line.
	switch state, _ := statState(b); state {
	case 'Z', 'X', 'x':
		return false
	}
	return true
}

// statState is the state letter of a /proc/<pid>/stat line, "pid (comm)
// S ...": comm may hold spaces and parentheses, so the state is the first
// field after the last ')'. ok is false when b has none.
func statState(b []byte) (state byte, ok bool) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return 0, false
	}
	return b[i+2], true
}

// statPrefix is how much of /proc/<pid>/stat pidAlive reads: the pid (7
// digits at most), comm (64 bytes at most) in parentheses and the state.
const statPrefix = 128

// readStatPrefix reads the start of /proc/<pid>/stat into buf.
func readStatPrefix(pid uint32, buf *[statPrefix]byte) ([]byte, error) {
	var path [32]byte
	p := append(path[:0], "/proc/"...)
	p = strconv.AppendUint(p, uint64(pid), 10)
	p = append(p, "/stat"...)
	fd, err := unix.Open(string(p), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	n, err := unix.Read(fd, buf[:])
	if err != nil {
		return nil, err
	}
	return buf[:n], nil
}

// procActivity is what the kernel says a live process is doing, for a peer
// whose beats are late.
type procActivity int

const (
	procIdle    procActivity = iota // every thread sleeps: it waits on something that does not come
	procBusy                        // a thread runs, waits for a CPU or for the disk: it progresses, slowly
	procStopped                     // stopped by a signal or a tracer: it will not progress by itself
	procUnknown                     // /proc did not say
)

// activity reads the state letter of each of pid's threads. A process whose
// beats stopped while a thread is runnable is starved (an overloaded host,
// a throttled container), not hung; one whose threads all sleep is waiting
// for something that will not come. Only call it for pids from this
// process's pid namespace.
func activity(pid uint32) procActivity {
	dir := "/proc/" + strconv.FormatUint(uint64(pid), 10) + "/task"
	tasks, err := os.ReadDir(dir)
	if err != nil {
		return procUnknown
	}
	// The thread asking runs, of course: when a process judges itself (a
	// test does), that says nothing.
	self := ""
	if int(pid) == os.Getpid() {
		self = strconv.Itoa(unix.Gettid())
	}
	stopped := false
	for _, t := range tasks {
		if t.Name() == self {
			continue
		}
		b, err := os.ReadFile(dir + "/" + t.Name() + "/stat")
		if err != nil {
			continue // the thread exited meanwhile
		}
		state, ok := statState(b)
		if !ok {
			continue
		}
		switch state {
		case 'R', 'D':
			return procBusy
		case 'T', 't':
			stopped = true
		}
	}
	if stopped {
		return procStopped
	}
	return procIdle
}

// fsBlock is the size the segment file must be a multiple of: the huge page
// size on hugetlbfs, where ftruncate and mmap work in whole huge pages, and
// PageSize elsewhere.
func fsBlock(dir string) (int, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0, err
	}
	if st.Type == unix.HUGETLBFS_MAGIC && st.Bsize > PageSize {
		return int(st.Bsize), nil
	}
	return PageSize, nil
}
