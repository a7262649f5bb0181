package e2e

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/recmesh/recmesh/shm"
	"github.com/recmesh/recmesh/shm/shmtest"
)

// hostileEnv makes the test binary a hostile frontend instead of running
// tests: "<segment path>,<seconds>,<seed>,<pause file>"; while the pause
// file exists it tries nothing that could end a generation (the test
// measures hang detection then, which a new generation would reset). make
// chaos starts it, kills it and starts it again, as a compromised frontend
// would behave.
const hostileEnv = "RECMESH_CHAOS_HOSTILE"

func TestMain(m *testing.M) {
	if spec := os.Getenv(hostileEnv); spec != "" {
		// Same user, no privilege: the test runs as root, whose
		// CAP_SYS_PTRACE would open any process's /proc/<pid>/fd.
		shmtest.DropCapabilities()
		os.Exit(runHostile(spec))
	}
	if spec := os.Getenv(natsProcessEnv); spec != "" {
		os.Exit(runNATSProcess(spec))
	}
	os.Exit(m.Run())
}

// runHostile holds a lane of whatever generation is at the path and, until
// its time is up, does one hostile thing after another: random words into
// its lane's control block (ring counters, entries, slot headers) and
// arena (payloads), garbage requests committed, a slot left half-written,
// and attempts to reach beyond its lane, which must all be refused: the
// header made writable, any memfd resized, the embedder's /proc/<pid>/fd
// and /proc/<pid>/mem opened, the socket at the path opened as a file. It
// prints "actions N" as it goes, so a kill loses at most a few from the
// count, and "breach <what>" for an attempt that was not refused.
func runHostile(spec string) int {
	parts := strings.Split(spec, ",")
	if len(parts) != 4 {
		fmt.Fprintln(os.Stderr, "hostile: want path,seconds,seed,pause-file")
		return 2
	}
	pauseFile = parts[3]
	path := parts[0]
	secs, _ := strconv.Atoi(parts[1])
	seed, _ := strconv.ParseUint(parts[2], 10, 64)
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	end := time.Now().Add(time.Duration(secs) * time.Second)
	actions := 0
	report := func() { fmt.Printf("actions %d\n", actions) }
	defer report()
	for time.Now().Before(end) {
		seg, err := shm.Attach(path, shm.AttachOptions{})
		if err != nil {
			time.Sleep(20 * time.Millisecond)
			continue
		}
		lane, err := seg.ClaimLane(os.Getpid())
		if err != nil {
			seg.Close()
			time.Sleep(20 * time.Millisecond)
			continue
		}
		// One generation until it is lost (we or the embedder end it).
		_ = shm.GuardFaults(func() error {
			for k := 0; k < 200 && time.Now().Before(end); k++ {
				hostileAction(rng, path, seg, lane)
				actions++
				if actions%20 == 0 {
					report()
				}
				time.Sleep(time.Duration(rng.IntN(5)) * time.Millisecond)
			}
			return nil
		})
		_ = shm.GuardFaults(func() error { _ = lane.Release(); return seg.Close() })
	}
	return 0
}

func hostileAction(rng *rand.Rand, path string, seg *shm.Segment, lane *shm.Lane) {
	scribble := func(b []byte, words int) {
		for i := 0; i < words && len(b) >= 8; i++ {
			off := rng.IntN(len(b)-7) &^ 7
			binary.LittleEndian.PutUint64(b[off:], rng.Uint64())
		}
	}
	switch p := rng.IntN(100); {
	case p < 35: // the lane's own control words
		scribble(lane.ControlBlock(), 1+rng.IntN(4))
	case p < 55: // its payloads
		scribble(lane.Arena(), 1+rng.IntN(16))
	case p < 85: // a request of garbage, committed
		n := 1 + rng.IntN(16)
		slot, payload, err := lane.Claim(n, n*seg.Geometry().ExampleBytes)
		if err != nil {
			return
		}
		for i := range payload {
			payload[i] = byte(rng.Uint32())
		}
		_ = lane.Commit(slot, shm.RequestMeta{ID: rng.Uint64(), Deadline: time.Now().Add(time.Second).UnixNano()})
	case p < 93: // a slot claimed, half-written, held
		n := 1 + rng.IntN(16)
		if _, payload, err := lane.Claim(n, n*seg.Geometry().ExampleBytes); err == nil {
			copy(payload[:len(payload)/2], make([]byte, len(payload)/2))
			time.Sleep(time.Duration(50+rng.IntN(200)) * time.Millisecond)
		}
	case time.Since(lastFileAction) < fileActionEvery || paused():
		scribble(lane.ControlBlock(), 1)
	default: // reach beyond the lane: every way must be refused
		lastFileAction = time.Now()
		tried, breaches := escapeAttempts(path)
		for _, b := range breaches {
			fmt.Printf("breach %s\n", b)
		}
		fmt.Printf("refused %d\n", tried-len(breaches))
	}
}

// escapeAttempts tries every way out of the lane a same-user process has
// and returns how many it tried and those that were not refused.
func escapeAttempts(path string) (int, []string) {
	var breaches []string
	tried := 0
	refused := func(what string, err error) {
		tried++
		if err == nil {
			breaches = append(breaches, what)
		}
	}
	// The memfds this process holds: none may be resized.
	fds, _ := os.ReadDir("/proc/self/fd")
	for _, e := range fds {
		target, err := os.Readlink("/proc/self/fd/" + e.Name())
		if err != nil || !strings.HasPrefix(target, "/memfd:recmesh") {
			continue
		}
		fd, _ := strconv.Atoi(e.Name())
		var st unix.Stat_t
		if unix.Fstat(fd, &st) != nil {
			continue
		}
		refused("ftruncate "+target, unix.Ftruncate(fd, st.Size/2))
		refused("extend "+target, unix.Ftruncate(fd, st.Size+4096))
		refused("fallocate past the end of "+target, unix.Fallocate(fd, 0, st.Size, 4096))
		if strings.Contains(target, "header") {
			m, err := unix.Mmap(fd, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
			if err == nil {
				unix.Munmap(m)
			}
			refused("map the header writable", err)
		}
	}
	// The header mapping made writable.
	if maps, err := os.ReadFile("/proc/self/maps"); err == nil {
		for _, line := range strings.Split(string(maps), "\n") {
			if !strings.Contains(line, "/memfd:recmesh-header") {
				continue
			}
			var lo, hi uintptr
			if _, err := fmt.Sscanf(line, "%x-%x", &lo, &hi); err == nil {
				refused("mprotect the header writable", mprotect(lo, hi-lo))
			}
		}
	}
	// The embedder's descriptors and memory, through /proc. (Without
	// capabilities, a uid-0 process may still list the fd directory,
	// which a non-dumpable process hands to root; opening an entry needs
	// ptrace access either way.)
	for _, pid := range pidsOf("bin/embedder") {
		dir := "/proc/" + pid + "/fd"
		if names, err := os.ReadDir(dir); err == nil {
			for _, n := range names {
				f, err := os.Open(dir + "/" + n.Name())
				if err == nil {
					f.Close()
				}
				refused("open "+dir+"/"+n.Name(), err)
			}
		} else {
			refused("list "+dir, err)
		}
		f, err := os.OpenFile("/proc/"+pid+"/mem", os.O_RDWR, 0)
		if err == nil {
			f.Close()
		}
		refused("open /proc/"+pid+"/mem", err)
	}
	// The socket at the path, as a file.
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err == nil {
		f.Close()
	}
	refused("open the segment path as a file", err)
	return tried, breaches
}

// pidsOf lists the processes whose command line contains name.
func pidsOf(name string) []string {
	var out []string
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		if b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline"); err == nil && strings.Contains(string(b), name) {
			out = append(out, e.Name())
		}
	}
	return out
}

func mprotect(addr, n uintptr) error {
	_, _, e := unix.Syscall(unix.SYS_MPROTECT, addr, n, unix.PROT_READ|unix.PROT_WRITE)
	if e != 0 {
		return e
	}
	return nil
}

// The escape attempts come at most this often: each walks /proc.
const fileActionEvery = time.Second

var (
	lastFileAction time.Time
	pauseFile      string
)

func paused() bool {
	_, err := os.Stat(pauseFile)
	return err == nil
}
