package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/recmesh/recmesh/shm"
	"github.com/recmesh/recmesh/shm/shmtest"
)

// hostileAbuseEnv makes the test binary, run as TestAbuseHostileHelper,
// the hostile frontend of make e2e-abuse:
// "<segment path>,<a frontend's pid>,<the accelerator's pid>".
const hostileAbuseEnv = "RECMESH_ABUSE_HOSTILE"

// hostileResult is what the hostile frontend got; it prints it as one
// JSON line for the test.
type hostileResult struct {
	AccelPidHeader uint32   `json:"accel_pid_header"` // read from the segment header
	AccelOwn       string   `json:"accel_own"`        // the accelerator role asked for under its own pid
	AccelOwnFDs    []string `json:"accel_own_fds"`    // memfds that request brought
	AccelSpoof     string   `json:"accel_spoof"`      // … under the accelerator's pid, no pid namespace
	AccelSpoofFDs  []string `json:"accel_spoof_fds"`
	PidSpoof       string   `json:"pid_spoof"` // a lane claimed under another frontend's pid
	LanesPkg       int      `json:"lanes_pkg"` // lanes shm.Segment.ClaimLane granted, repeated
	LanesRaw       int      `json:"lanes_raw"` // lanes granted to claims over more broker connections
	Errors         []string `json:"errors,omitempty"`
}

// lanesHeld is every lane the hostile frontend held at once.
func (r hostileResult) lanesHeld() int { return r.LanesPkg + r.LanesRaw }

// hostileFrontend runs the hostile frontend against the mesh's broker
// and judges it: accel_spoof is "refused" when neither accelerator
// request (its own pid, the accelerator's pid without a pid namespace)
// brought a single memfd and the lane claimed under another frontend's
// pid was not recorded as that frontend's; lane_hoard is "capped" when it
// never held more than one lane.
func (a *abuseRun) hostileFrontend(t *testing.T, _ *abuseFrontend) (string, error) {
	emb := a.c.procs["embedder"]
	gens := strings.Count(emb.out.String(), "segment ready")
	spec := fmt.Sprintf("%s,%d,%d", filepath.Join("/dev/shm", a.c.segment), a.pid("frontend-grpc"), a.pid("accelerator"))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestAbuseHostileHelper$", "-test.count=1")
	cmd.Env = append(os.Environ(), hostileAbuseEnv+"="+spec)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.CombinedOutput()
	var res hostileResult
	found := false
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if j, ok := strings.CutPrefix(sc.Text(), "abuse-hostile-result "); ok {
			found = json.Unmarshal([]byte(j), &res) == nil
		}
	}
	if !found {
		return "", fmt.Errorf("the hostile frontend reported nothing (exit: %v):\n%s", err, tail(string(out)))
	}
	for _, e := range res.Errors {
		t.Logf("hostile frontend: %s", e)
	}
	a.mu.Lock()
	a.accelSpoof = "refused"
	if len(res.AccelOwnFDs) > 0 || len(res.AccelSpoofFDs) > 0 || !strings.HasPrefix(res.AccelOwn, "refused") ||
		!strings.HasPrefix(res.AccelSpoof, "refused") || strings.HasPrefix(res.PidSpoof, "recorded as the victim") {
		a.accelSpoof = "granted"
	}
	a.laneHoard = "capped"
	if res.lanesHeld() > 1 {
		a.laneHoard = "hoarded"
	}
	a.mu.Unlock()
	if a.accelSpoof != "refused" {
		t.Errorf("hostile frontend: accelerator role or spoofed pid not refused: own pid: %s %v; accelerator's pid %d: %s %v; a frontend's pid: %s",
			res.AccelOwn, res.AccelOwnFDs, res.AccelPidHeader, res.AccelSpoof, res.AccelSpoofFDs, res.PidSpoof)
	}
	if a.laneHoard != "capped" {
		t.Errorf("hostile frontend: held %d lanes at once (%d through shm.ClaimLane, %d over more broker connections); want at most 1",
			res.lanesHeld(), res.LanesPkg, res.LanesRaw)
	}
	if g := strings.Count(emb.out.String(), "segment ready") - gens; g != 0 {
		t.Logf("hostile frontend: %d new generations while it acted", g)
	}
	return fmt.Sprintf("accel_spoof=%s lane_hoard=%s accel_pid_header=%d accel_own=%q own_fds=%d accel_spoofed=%q spoof_fds=%d pid_spoof=%q lanes_pkg=%d lanes_raw=%d",
		a.accelSpoof, a.laneHoard, res.AccelPidHeader, res.AccelOwn, len(res.AccelOwnFDs), res.AccelSpoof, len(res.AccelSpoofFDs),
		res.PidSpoof, res.LanesPkg, res.LanesRaw), nil
}

// TestAbuseHostileHelper is the hostile frontend's process (see
// hostileAbuseEnv); it does nothing in a normal test run.
func TestAbuseHostileHelper(t *testing.T) {
	spec := os.Getenv(hostileAbuseEnv)
	if spec == "" {
		t.Skip("the hostile frontend of TestE2EAbuse: runs only as that test's child process")
	}
	// Same user, no privilege: the test runs as root, and a compromised
	// frontend has no capabilities. Re-executes this process.
	shmtest.DropCapabilities()
	res := runAbuseHostile(spec)
	b, err := json.Marshal(res)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Println("abuse-hostile-result " + string(b))
}

func runAbuseHostile(spec string) hostileResult {
	var res hostileResult
	fail := func(format string, args ...any) { res.Errors = append(res.Errors, fmt.Sprintf(format, args...)) }
	parts := strings.Split(spec, ",")
	if len(parts) != 3 {
		fail("spec %q: want path,frontend-pid,accelerator-pid", spec)
		return res
	}
	path := parts[0]
	victim, _ := strconv.Atoi(parts[1])
	harnessAccel, _ := strconv.Atoi(parts[2])
	me, myNS := uint32(os.Getpid()), pidNamespaceOf()

	// The accelerator's pid, as any frontend can read it: from the
	// header the hello hands over (offset 384, docs in shm/layout.go).
	if b, err := dialRawBroker(path); err != nil {
		fail("dial the broker: %v", err)
	} else {
		_, fds, err := b.request(brokerMsg{Op: "hello", Pid: me, PidNS: myNS})
		if err == nil && len(fds) > 0 {
			if hdr, err := unix.Mmap(fds[0], 0, shm.HeaderBytes, unix.PROT_READ, unix.MAP_SHARED); err == nil {
				res.AccelPidHeader = binary.LittleEndian.Uint32(hdr[384:])
				unix.Munmap(hdr)
			}
		} else if err != nil {
			fail("hello under its own pid: %v", err)
		}
		closeFDs(fds)
		b.close()
	}
	if res.AccelPidHeader == 0 {
		fail("no accelerator pid in the header; using the harness's %d", harnessAccel)
		res.AccelPidHeader = uint32(harnessAccel)
	}

	// (b) The accelerator role under its own pid, while the real one
	// holds it.
	res.AccelOwn, res.AccelOwnFDs = askAccelerator(path, me, myNS)
	// (a) The same, claiming to be the accelerator, from no pid namespace
	// (so the broker cannot compare the pid with the kernel's).
	res.AccelSpoof, res.AccelSpoofFDs = askAccelerator(path, res.AccelPidHeader, 0)

	// (c) Lane hoarding: ClaimLane again and again through the package,
	// then claims over three more broker connections, all held at once.
	var held []func()
	if seg, err := shm.Attach(path, shm.AttachOptions{}); err != nil {
		fail("shm.Attach: %v", err)
	} else {
		held = append(held, func() { _ = seg.Close() })
		for k := 0; k < 8; k++ {
			lane, err := seg.ClaimLane(os.Getpid())
			if err != nil {
				if k == 0 || res.LanesPkg == 0 {
					fail("ClaimLane %d: %v", k, err)
				}
				continue
			}
			res.LanesPkg++
			held = append(held, func() { _ = shm.GuardFaults(lane.Release) })
		}
	}
	for k := 0; k < 3; k++ {
		b, err := dialRawBroker(path)
		if err != nil {
			fail("dial the broker: %v", err)
			continue
		}
		held = append(held, b.close)
		_, fds, err := b.request(brokerMsg{Op: "hello", Pid: me, PidNS: myNS})
		closeFDs(fds)
		if err != nil {
			fail("hello on connection %d: %v", k, err)
			continue
		}
		for j := 0; j < 3; j++ {
			_, fds, err := b.request(brokerMsg{Op: "claim", Pid: me, PidNS: myNS})
			if err == nil && len(fds) == 1 {
				res.LanesRaw++
			}
			closeFDs(fds)
		}
	}
	for i := len(held) - 1; i >= 0; i-- {
		held[i]()
	}

	// (a) A lane claimed under another frontend's pid: the broker must
	// refuse the hello or record the lane under our own pid (the kernel's
	// word, SO_PEERCRED), never under the victim's.
	res.PidSpoof = spoofFrontendPid(path, uint32(victim), me)
	return res
}

// askAccelerator says hello as pid (of pid namespace ns) and asks for the
// accelerator role; it returns the broker's answer and the memfds that
// came with it, read back by name.
func askAccelerator(path string, pid uint32, ns uint64) (string, []string) {
	b, err := dialRawBroker(path)
	if err != nil {
		return "error: " + err.Error(), nil
	}
	defer b.close()
	_, fds, err := b.request(brokerMsg{Op: "hello", Pid: pid, PidNS: ns})
	closeFDs(fds)
	if err != nil {
		return "refused at hello: " + err.Error(), nil
	}
	_, fds, err = b.request(brokerMsg{Op: "accel", Pid: pid})
	got := fdNames(fds)
	closeFDs(fds)
	if err != nil {
		return "refused: " + err.Error(), got
	}
	// A grant is followed by every lane's memfd: collect them too.
	for {
		_, more, err := b.recv(500 * time.Millisecond)
		if err != nil {
			break
		}
		got = append(got, fdNames(more)...)
		closeFDs(more)
	}
	return "granted", got
}

func spoofFrontendPid(path string, victim, me uint32) string {
	b, err := dialRawBroker(path)
	if err != nil {
		return "error: " + err.Error()
	}
	defer b.close()
	_, fds, err := b.request(brokerMsg{Op: "hello", Pid: victim, PidNS: 0})
	closeFDs(fds)
	if err != nil {
		return "refused at hello: " + err.Error()
	}
	_, fds, err = b.request(brokerMsg{Op: "claim", Pid: victim, PidNS: 0})
	defer closeFDs(fds)
	if err != nil {
		return "refused: " + err.Error()
	}
	if len(fds) != 1 {
		return fmt.Sprintf("error: the claim brought %d descriptors", len(fds))
	}
	// The lane's owner word is its memfd's first (shm/layout.go, laneOwner).
	m, err := unix.Mmap(fds[0], 0, 4096, unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return "error: map the lane: " + err.Error()
	}
	defer unix.Munmap(m)
	switch owner := binary.LittleEndian.Uint32(m); owner {
	case me:
		return "recorded as self"
	case victim:
		return fmt.Sprintf("recorded as the victim's pid %d", victim)
	default:
		return fmt.Sprintf("recorded as pid %d", owner)
	}
}

// brokerMsg mirrors the broker protocol's message (shm/wire.go): one JSON
// object per SOCK_SEQPACKET message, descriptors as SCM_RIGHTS. The
// hostile frontend speaks it by hand, so it can say what the package's
// client never would.
type brokerMsg struct {
	Op    string `json:"op,omitempty"`
	Pid   uint32 `json:"pid,omitempty"`
	PidNS uint64 `json:"pidns,omitempty"`
	Lane  int    `json:"lane"`
	Epoch uint32 `json:"epoch,omitempty"`
	Seq   uint64 `json:"seq,omitempty"`
	Gen   uint64 `json:"gen,omitempty"`
	Block int    `json:"block,omitempty"`
	Code  string `json:"code,omitempty"`
	Err   string `json:"err,omitempty"`
}

type rawBroker struct{ fd int }

func dialRawBroker(path string) (*rawBroker, error) {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("socket: %w", err)
	}
	if err := unix.Connect(fd, &unix.SockaddrUnix{Name: path}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("connect %s: %w", path, err)
	}
	return &rawBroker{fd: fd}, nil
}

func (b *rawBroker) close() { unix.Close(b.fd) }

// request sends m and reads the answer; a refusal is an error. The
// descriptors that came are returned either way, for the caller to count
// and close.
func (b *rawBroker) request(m brokerMsg) (brokerMsg, []int, error) {
	data, err := json.Marshal(m)
	if err != nil {
		return brokerMsg{}, nil, err
	}
	if err := unix.Sendmsg(b.fd, data, nil, nil, unix.MSG_NOSIGNAL); err != nil {
		return brokerMsg{}, nil, fmt.Errorf("send %s: %w", m.Op, err)
	}
	r, fds, err := b.recv(3 * time.Second)
	if err == nil && r.Code != "" {
		err = fmt.Errorf("%s: %s", r.Code, r.Err)
	}
	return r, fds, err
}

func (b *rawBroker) recv(timeout time.Duration) (brokerMsg, []int, error) {
	tv := unix.NsecToTimeval(timeout.Nanoseconds())
	if err := unix.SetsockoptTimeval(b.fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		return brokerMsg{}, nil, err
	}
	buf := make([]byte, 64<<10)
	oob := make([]byte, unix.CmsgSpace(4*16))
	n, oobn, _, _, err := unix.Recvmsg(b.fd, buf, oob, unix.MSG_CMSG_CLOEXEC)
	if err != nil {
		return brokerMsg{}, nil, fmt.Errorf("broker answer: %w", err)
	}
	var fds []int
	if msgs, err := unix.ParseSocketControlMessage(oob[:oobn]); err == nil {
		for i := range msgs {
			if r, err := unix.ParseUnixRights(&msgs[i]); err == nil {
				fds = append(fds, r...)
			}
		}
	}
	if n == 0 {
		return brokerMsg{}, fds, errors.New("broker closed the connection")
	}
	var m brokerMsg
	if err := json.Unmarshal(buf[:n], &m); err != nil {
		return brokerMsg{}, fds, fmt.Errorf("broker answer: %w", err)
	}
	return m, fds, nil
}

// fdNames is what each descriptor is (the memfd's name), to say which
// memory a refused request brought anyway.
func fdNames(fds []int) []string {
	var out []string
	for _, fd := range fds {
		name, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(fd))
		if err != nil {
			name = "fd " + strconv.Itoa(fd)
		}
		out = append(out, strings.TrimSuffix(strings.TrimPrefix(name, "/memfd:"), " (deleted)"))
	}
	return out
}

func closeFDs(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

// pidNamespaceOf is this process's pid namespace, as shm names it (the
// inode of /proc/self/ns/pid).
func pidNamespaceOf() uint64 {
	var st unix.Stat_t
	if err := unix.Stat("/proc/self/ns/pid", &st); err != nil {
		return 0
	}
	return st.Ino
}
