package shm

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/recmesh/recmesh/shm/shmtest"
)

// Multi-process tests re-execute the test binary as a helper process: the
// helper's name and arguments travel in the environment, and TestMain runs
// the helper instead of the tests. Helpers report progress as lines on
// stdout, which the parent waits for with deadlines.

const (
	helperEnv = "RECMESH_SHM_HELPER"
	pathEnv   = "RECMESH_SHM_PATH"
	countEnv  = "RECMESH_SHM_COUNT"
)

func TestMain(m *testing.M) {
	if name := os.Getenv(helperEnv); name != "" {
		os.Exit(runHelper(name))
	}
	os.Exit(m.Run())
}

func runHelper(name string) int {
	var err error
	switch name {
	case "frontend-seq":
		err = helperFrontendSeq()
	case "frontend-torn":
		err = helperFrontendTorn()
	case "owner":
		err = helperOwner()
	case "owner-shared":
		err = helperSharedOwner()
	case "stranger":
		err = helperStranger()
	case "dial":
		err = helperDial()
	case "accelerator":
		err = helperAccelerator()
	case "ringer":
		err = helperRinger()
	case "hostile":
		err = helperHostile()
	default:
		err = fmt.Errorf("unknown helper %q", name)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "helper %s: %v\n", name, err)
		return 1
	}
	return 0
}

// child is a helper process started by a test.
type child struct {
	cmd    *exec.Cmd
	lines  chan string
	exited chan struct{}
	err    error // Wait's result, set before exited closes
}

func startChild(t *testing.T, helper string, env ...string) *child {
	t.Helper()
	return startChildAs(t, nil, os.Args[0], helper, env...)
}

// startChildAs starts the helper from the test binary at bin, as the user
// cred names (nil: this process's).
func startChildAs(t *testing.T, cred *syscall.Credential, bin, helper string, env ...string) *child {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-test.run=^$")
	cmd.Env = append(append(os.Environ(), helperEnv+"="+helper), env...)
	if cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	}
	cmd.Stdout = w
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	c := &child{cmd: cmd, lines: make(chan string, 64), exited: make(chan struct{})}
	go func() {
		defer close(c.lines)
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
		r.Close()
	}()
	// Reaping at once keeps a killed child from lingering as a zombie; the
	// liveness checks would see through one anyway.
	go func() {
		c.err = cmd.Wait()
		close(c.exited)
	}()
	t.Cleanup(func() {
		c.kill()
		<-c.exited
	})
	return c
}

func (c *child) pid() int { return c.cmd.Process.Pid }

// refusals reads a helper's escape report: each "breach <what>" line (an
// attempt that was not refused) fails the test, and the "refused <n>"
// line that ends the report gives the count it returns.
func (c *child) refusals(t *testing.T, who string, timeout time.Duration) int {
	t.Helper()
	rest := c.await(t, "refused", timeout, func(line string) {
		if strings.HasPrefix(line, "breach") {
			t.Errorf("%s: %s", who, line)
		}
	})
	n, err := strconv.Atoi(rest)
	if err != nil {
		t.Fatalf("%s: bad report %q", who, rest)
	}
	return n
}

func (c *child) kill() { syscall.Kill(c.pid(), syscall.SIGKILL) }

// expect waits for the child's next line starting with prefix and returns
// the rest of it.
func (c *child) expect(t *testing.T, prefix string, timeout time.Duration) string {
	t.Helper()
	return c.await(t, prefix, timeout, nil)
}

// await is expect, showing every line read before it to seen (when not
// nil).
func (c *child) await(t *testing.T, prefix string, timeout time.Duration, seen func(string)) string {
	t.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case line, ok := <-c.lines:
			if !ok {
				<-c.exited
				t.Fatalf("child exited (%v) before printing %q", c.err, prefix)
			}
			if rest, found := strings.CutPrefix(line, prefix); found {
				return strings.TrimSpace(rest)
			}
			if seen != nil {
				seen(line)
			}
		case <-deadline:
			t.Fatalf("child did not print %q within %v", prefix, timeout)
		}
	}
}

func (c *child) wait(t *testing.T, timeout time.Duration) {
	t.Helper()
	select {
	case <-c.exited:
		if c.err != nil {
			t.Fatalf("child failed: %v", c.err)
		}
	case <-time.After(timeout):
		t.Fatalf("child still running after %v", timeout)
	}
}

// serveLane is the embedder and accelerator of one lane in the parent: it
// reads each request, checks it with check, writes one score per example
// (the request id) and completes it.
type serveLane struct {
	s     *Segment
	rr    *RequestReader
	cw    *CompletionWriter
	check func(Request) error
}

// step serves every request waiting now and reports how many it served.
func (sv *serveLane) step() (int, error) {
	n := 0
	for {
		req, ok, err := sv.rr.Next()
		if err != nil {
			return n, err
		}
		if !ok {
			return n, nil
		}
		if err := sv.check(req); err != nil {
			return n, err
		}
		scores, err := sv.cw.Scores(req.Slot, req.Epoch)
		if err != nil {
			return n, err
		}
		for i := 0; i < req.Examples; i++ {
			put32(scores, 4*i, uint32(req.RequestID))
		}
		if err := sv.cw.Add(Completion{Slot: req.Slot, Epoch: req.Epoch, Examples: req.Examples}); err != nil {
			return n, err
		}
		n++
		if n%16 == 0 {
			sv.cw.Flush()
		}
	}
}

func (sv *serveLane) flush() { sv.cw.Flush() }

// helperAttachLane attaches to the segment named in the environment and
// claims a lane with a running heartbeat.
func helperAttachLane() (*Segment, *Lane, error) {
	s, err := Attach(os.Getenv(pathEnv), AttachOptions{})
	if err != nil {
		return nil, nil, err
	}
	l, err := s.ClaimLane(os.Getpid())
	if err != nil {
		return nil, nil, err
	}
	go l.Heartbeat(context.Background(), 0)
	return s, l, nil
}

// reapCompletions frees every completed slot, checking the scores.
func reapCompletions(l *Lane, block bool) error {
	for {
		var c Completed
		var ok bool
		var err error
		if block {
			c, err = l.WaitCompletion(context.Background())
			ok = err == nil
			block = false
		} else {
			c, ok, err = l.Poll()
		}
		if err != nil {
			return err
		}
		if !ok {
			return nil
		}
		if c.Status != StatusOK {
			return fmt.Errorf("slot %d completed with status %d", c.Slot, c.Status)
		}
		if _, err := l.Free(c.Slot); err != nil {
			return err
		}
	}
}

// helperFrontendSeq commits requests 1..count in order, reusing slots as
// completions return, and prints "done" when every one has completed.
func helperFrontendSeq() error {
	count, _ := strconv.Atoi(os.Getenv(countEnv))
	_, l, err := helperAttachLane()
	if err != nil {
		return err
	}
	fmt.Println("claimed", l.Index())
	for id := 1; id <= count; {
		slot, payload, err := l.Claim(1, 8)
		if errors.Is(err, ErrFull) {
			if err := reapCompletions(l, true); err != nil {
				return err
			}
			continue
		}
		if err != nil {
			return err
		}
		put64(payload, 0, uint64(id))
		if err := l.Commit(slot, RequestMeta{ID: uint64(id)}); err != nil {
			return err
		}
		id++
	}
	for l.InFlight() > 0 {
		if err := reapCompletions(l, true); err != nil {
			return err
		}
	}
	fmt.Println("done")
	return nil
}

// The parent and a frontend process exchange 2M requests through one lane;
// the embedder side sees every id exactly once and in order, and every
// completion comes back.
func TestOrderedDeliveryAcrossProcesses(t *testing.T) {
	count := 2_000_000
	if testing.Short() {
		count = 200_000
	}
	g := testGeometry()
	g.Lanes, g.SlotsPerLane, g.RingCapacity = 1, 256, 256
	s := newTestSegment(t, g)
	c := startChild(t, "frontend-seq", pathEnv+"="+s.Path(), countEnv+"="+strconv.Itoa(count))
	c.expect(t, "claimed", 10*time.Second)

	next := uint64(1)
	sv := &serveLane{s: s, check: func(req Request) error {
		if req.RequestID != next || get64(req.Payload, 0) != next {
			return fmt.Errorf("got request %d (payload %d), want %d", req.RequestID, get64(req.Payload, 0), next)
		}
		next++
		return nil
	}}
	sv.rr, _ = s.RequestReader(0)
	sv.cw, _ = s.CompletionWriter(0)
	start := time.Now()
	deadline := start.Add(2 * time.Minute)
	for next <= uint64(count) {
		n, err := sv.step()
		if err != nil {
			t.Fatal(err)
		}
		sv.flush()
		if n == 0 {
			if time.Now().After(deadline) {
				t.Fatalf("stalled at request %d", next)
			}
			s.EmbedderBell().Wait(context.Background(), sv.rr.Pending, DefaultLivenessTick)
		}
	}
	c.expect(t, "done", 30*time.Second)
	c.wait(t, 10*time.Second)
	t.Logf("%d requests in order in %v", count, time.Since(start))
}

// helperFrontendTorn commits requests of random size forever; each payload
// carries its id, length and a CRC of its body, so a reader can tell a
// torn one. Writing the payload dominates its time, so a SIGKILL usually
// lands mid-write.
func helperFrontendTorn() error {
	_, l, err := helperAttachLane()
	if err != nil {
		return err
	}
	rng := rand.New(rand.NewPCG(uint64(os.Getpid()), 1))
	fmt.Println("running")
	for id := uint64(1); ; id++ {
		n := 16 + rng.IntN(48<<10)
		var slot int
		var payload []byte
		for {
			slot, payload, err = l.Claim(1+int(id%8), n)
			if !errors.Is(err, ErrFull) {
				break
			}
			if err := reapCompletions(l, true); err != nil {
				return err
			}
		}
		if err != nil {
			return err
		}
		body := payload[16:]
		for i := range body {
			body[i] = byte(id*131 + uint64(i)*7)
		}
		put64(payload, 0, id)
		put32(payload, 8, uint32(n))
		put32(payload, 12, crc32.ChecksumIEEE(body))
		if err := l.Commit(slot, RequestMeta{ID: id}); err != nil {
			return err
		}
		if err := reapCompletions(l, false); err != nil {
			return err
		}
	}
}

func checkTornPayload(req Request, want uint64) error {
	p := req.Payload
	if len(p) < 16 {
		return fmt.Errorf("request %d: payload of %d bytes", req.RequestID, len(p))
	}
	id, n, sum := get64(p, 0), int(get32(p, 8)), get32(p, 12)
	switch {
	case req.RequestID != want || id != want:
		return fmt.Errorf("request %d (payload says %d), want %d", req.RequestID, id, want)
	case n != len(p):
		return fmt.Errorf("request %d: payload says %d bytes, header %d", id, n, len(p))
	case crc32.ChecksumIEEE(p[16:]) != sum:
		return fmt.Errorf("request %d: torn payload (CRC mismatch)", id)
	case req.Examples != 1+int(id%8):
		return fmt.Errorf("request %d: %d examples", id, req.Examples)
	}
	return nil
}

// A frontend killed with SIGKILL at random points while writing leaves no
// torn request visible, and its lane is reclaimed and reused by the next
// frontend (the segment has a single lane, so reuse is forced).
func TestKilledProducerLeavesNoTornMessage(t *testing.T) {
	g := testGeometry()
	g.Lanes, g.ArenaBytes = 1, 1<<20
	s := newTestSegment(t, g)
	rr, _ := s.RequestReader(0)
	cw, _ := s.CompletionWriter(0)
	rng := rand.New(rand.NewPCG(3, 4))
	total, rounds := 0, 8
	for round := 0; round < rounds; round++ {
		c := startChild(t, "frontend-torn", pathEnv+"="+s.Path())
		c.expect(t, "running", 20*time.Second)
		var next uint64 = 1
		sv := &serveLane{s: s, rr: rr, cw: cw, check: func(req Request) error {
			if err := checkTornPayload(req, next); err != nil {
				return err
			}
			next++
			return nil
		}}
		killAt := time.Now().Add(time.Duration(5+rng.IntN(40)) * time.Millisecond)
		for time.Now().Before(killAt) || next < 100 {
			if _, err := sv.step(); err != nil {
				t.Fatalf("round %d: %v", round, err)
			}
			sv.flush()
		}
		c.kill()
		<-c.exited
		// Everything the dead producer published is whole.
		for {
			n, err := sv.step()
			if err != nil {
				t.Fatalf("round %d after the kill: %v", round, err)
			}
			if n == 0 {
				break
			}
		}
		sv.flush()
		total += int(next - 1)
		waitFor(t, 5*time.Second, "lane of the killed frontend reclaimed", func() bool {
			st, err := s.ReclaimLanes(0)
			return err == nil && st.Freed == 1
		})
		if info := s.Lanes()[0]; info.Owner != 0 || info.State != "free" || info.Queued != 0 {
			t.Fatalf("round %d: lane after reclaim %+v", round, info)
		}
	}
	t.Logf("verified %d requests across %d killed producers", total, rounds)
}

// helperOwner creates a segment as its owner (the embedder), serves
// requests with ids below 1000 and leaves the others pending forever.
func helperOwner() error {
	g := testGeometry()
	g.Lanes = 1
	return serveAsOwner(Options{Name: os.Getenv(pathEnv), Dir: testDirFor(), Geometry: g})
}

// serveAsOwner creates a segment and completes every request of lane 0
// whose id is below 1000, until killed.
func serveAsOwner(opts Options) error {
	s, err := Create(opts)
	if err != nil {
		return err
	}
	go s.Heartbeat(context.Background(), 0, nil)
	rr, _ := s.RequestReader(0)
	cw, _ := s.CompletionWriter(0)
	fmt.Println("ready", s.Path())
	for {
		s.EmbedderBell().Wait(context.Background(), rr.Pending, time.Second)
		req, ok, err := rr.Next()
		if err != nil {
			return err
		}
		if ok && req.RequestID < 1000 {
			if err := cw.Complete(Completion{Slot: req.Slot, Epoch: req.Epoch, Examples: req.Examples}); err != nil {
				return err
			}
		}
	}
}

func testDirFor() string {
	if st, err := os.Stat(DefaultDir); err == nil && st.IsDir() {
		return DefaultDir
	}
	return os.TempDir()
}

// When the embedder (segment owner, consumer of the request ring) is killed,
// a frontend waiting for a completion learns it within 100 ms.
func TestKilledConsumerNoticedWithin100ms(t *testing.T) {
	name := testName(t)
	c := startChild(t, "owner", pathEnv+"="+name)
	path := c.expect(t, "ready", 20*time.Second)
	t.Cleanup(func() { os.Remove(path) })
	s, err := Attach(path, AttachOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	l, err := s.ClaimLane(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	slot, _, _ := l.Claim(1, 8)
	if err := l.Commit(slot, RequestMeta{ID: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := l.WaitCompletion(context.Background()); err != nil {
		t.Fatalf("round trip with the live owner: %v", err)
	}
	if err := l.Commit(slot, RequestMeta{ID: 5000}); err != nil { // never answered
		t.Fatal(err)
	}
	result := make(chan error, 1)
	go func() {
		_, err := l.WaitCompletion(context.Background())
		result <- err
	}()
	// Let the waiter reach its futex sleep, then kill.
	waitFor(t, 5*time.Second, "frontend asleep", func() bool { return l.Bell().Stats().Sleeps > 0 })
	killed := time.Now()
	c.kill()
	select {
	case err := <-result:
		took := time.Since(killed)
		if !errors.Is(err, ErrOwnerDead) {
			t.Fatalf("WaitCompletion = %v, want ErrOwnerDead", err)
		}
		if took > 100*time.Millisecond {
			t.Fatalf("noticed the dead consumer after %v, budget 100ms", took)
		}
		t.Logf("dead consumer noticed after %v", took)
	case <-time.After(5 * time.Second):
		t.Fatal("in-flight request hangs after the consumer died")
	}
}

// helperAccelerator attaches as the accelerator and beats until killed.
func helperAccelerator() error {
	s, err := Attach(os.Getenv(pathEnv), AttachOptions{})
	if err != nil {
		return err
	}
	if err := s.SetAccelerator(os.Getpid()); err != nil {
		return err
	}
	fmt.Println("ready")
	return s.AcceleratorHeartbeat(context.Background(), 0, nil)
}

// When the accelerator (producer of completions) is killed, a frontend
// waiting for a completion learns it within 100 ms.
func TestKilledAcceleratorNoticedWithin100ms(t *testing.T) {
	s := newTestSegment(t, testGeometry())
	c := startChild(t, "accelerator", pathEnv+"="+s.Path())
	c.expect(t, "ready", 20*time.Second)
	fe := attachTest(t, s)
	l, err := fe.ClaimLane(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	slot, _, _ := l.Claim(1, 8)
	if err := l.Commit(slot, RequestMeta{ID: 1}); err != nil {
		t.Fatal(err)
	}
	result := make(chan error, 1)
	go func() {
		_, err := l.WaitCompletion(context.Background())
		result <- err
	}()
	waitFor(t, 5*time.Second, "frontend asleep", func() bool { return l.Bell().Stats().Sleeps > 0 })
	killed := time.Now()
	c.kill()
	select {
	case err := <-result:
		took := time.Since(killed)
		if !errors.Is(err, ErrAcceleratorDead) {
			t.Fatalf("WaitCompletion = %v, want ErrAcceleratorDead", err)
		}
		if took > 100*time.Millisecond {
			t.Fatalf("noticed the dead accelerator after %v, budget 100ms", took)
		}
		t.Logf("dead accelerator noticed after %v", took)
	case <-time.After(5 * time.Second):
		t.Fatal("in-flight request hangs after the accelerator died")
	}
}

// helperRinger attaches as a frontend, claims a lane, and once the owner
// is asleep on the embedder doorbell commits a request, which rings it.
func helperRinger() error {
	s, l, err := helperAttachLane()
	if err != nil {
		return err
	}
	slot, _, err := l.Claim(1, 8)
	if err != nil {
		return err
	}
	d := s.EmbedderBell()
	fmt.Println("claimed")
	for atomic.LoadUint32(d.waiters) == 0 {
		time.Sleep(time.Millisecond)
	}
	if err := l.Commit(slot, RequestMeta{ID: 1}); err != nil {
		return err
	}
	fmt.Println("rang", d.Stats().Wakes)
	return nil
}

// The doorbell is a shared futex: a producer in one process wakes a
// consumer asleep in another, with exactly one wake syscall, and only
// because a waiter was registered. The frontend rings through the bell
// page (the only shared page it may write) while the count it trusts is
// in the header, which only the embedder writes.
func TestDoorbellAcrossProcesses(t *testing.T) {
	s := newTestSegment(t, testGeometry())
	c := startChild(t, "ringer", pathEnv+"="+s.Path())
	c.expect(t, "claimed", 20*time.Second)
	d := s.EmbedderBell()
	d.SetSpin(0)
	ok, err := d.Wait(context.Background(), s.RequestsPending, 30*time.Second)
	if !ok || err != nil || d.Stats().Sleeps == 0 {
		t.Fatalf("owner woke with %v %v after %d sleeps", ok, err, d.Stats().Sleeps)
	}
	if got := c.expect(t, "rang", 10*time.Second); got != "1" {
		t.Fatalf("%s wake syscalls, want 1", got)
	}
	c.wait(t, 10*time.Second)
}

// The torn-message check must be able to fail: a flipped byte or a short
// write is caught.
func TestTornPayloadCheckDetectsTearing(t *testing.T) {
	p := make([]byte, 100)
	for i := range p[16:] {
		p[16+i] = byte(5*131 + uint64(i)*7)
	}
	put64(p, 0, 5)
	put32(p, 8, 100)
	put32(p, 12, crc32.ChecksumIEEE(p[16:]))
	req := Request{SlotHeader: SlotHeader{RequestID: 5, Examples: 1 + 5%8}, Payload: p}
	if err := checkTornPayload(req, 5); err != nil {
		t.Fatal(err)
	}
	p[60] ^= 1
	if err := checkTornPayload(req, 5); err == nil {
		t.Fatal("flipped byte not detected")
	}
	p[60] ^= 1
	req.Payload = p[:99]
	if err := checkTornPayload(req, 5); err == nil {
		t.Fatal("short payload not detected")
	}
}

// helperHostile is a frontend of the same user gone bad: it claims a lane,
// tries every way out of it (printing "refused <n>" and one "breach <what>"
// per attempt that was not refused), then scribbles over its own lane and
// commits garbage until killed.
func helperHostile() error {
	shmtest.DropCapabilities()
	s, l, err := helperAttachLane()
	if err != nil {
		return err
	}
	refused := 0
	breach := func(what string) { fmt.Println("breach", what) }
	for _, r := range frontendRefusals(s) {
		if r.err == nil || !errors.Is(r.err, r.want) {
			breach(fmt.Sprintf("%s: %v", r.what, r.err))
		} else {
			refused++
		}
	}
	owner, _ := strconv.Atoi(os.Getenv(ownerEnv))
	if err := openProcFDs(owner); errors.Is(err, os.ErrPermission) {
		refused++
	} else {
		breach(fmt.Sprintf("open the owner's descriptors: %v", err))
	}
	mem := fmt.Sprintf("/proc/%d/mem", owner)
	if f, err := os.OpenFile(mem, os.O_RDWR, 0); errors.Is(err, os.ErrPermission) {
		refused++
	} else {
		if f != nil {
			f.Close()
		}
		breach(fmt.Sprintf("open %s: %v", mem, err))
	}
	if err := unix.PtraceAttach(owner); errors.Is(err, unix.EPERM) {
		refused++
	} else {
		if err == nil {
			// Let it go at once: a stopped owner would hang the test
			// instead of failing it.
			var ws unix.WaitStatus
			_, _ = unix.Wait4(owner, &ws, unix.WALL, nil)
			_ = unix.PtraceDetach(owner)
		}
		breach(fmt.Sprintf("ptrace the owner: %v", err))
	}
	local := []unix.Iovec{{Base: &make([]byte, 8)[0], Len: 8}}
	remote := []unix.RemoteIovec{{Base: uintptr(unsafe.Pointer(&s.mem[0])), Len: 8}}
	if _, err := unix.ProcessVMWritev(owner, local, remote, 0); errors.Is(err, unix.EPERM) {
		refused++
	} else {
		breach(fmt.Sprintf("process_vm_writev into the owner: %v", err))
	}
	// The broker cannot tell processes of one user apart, but it gives
	// the accelerator's memory to nobody while a live accelerator holds
	// the segment.
	if err := s.SetAccelerator(os.Getpid()); errors.Is(err, ErrAcceleratorPresent) {
		refused++
	} else {
		breach(fmt.Sprintf("become the accelerator: %v", err))
	}
	if _, err := os.OpenFile(os.Getenv(pathEnv), os.O_RDWR, 0); errors.Is(err, unix.ENXIO) {
		refused++
	} else {
		breach(fmt.Sprintf("open the segment socket as a file: %v", err))
	}
	fmt.Println("refused", refused)
	rng := rand.New(rand.NewPCG(uint64(os.Getpid()), 1))
	for {
		_ = GuardFaults(func() error {
			b := l.ControlBlock()
			for i := 0; i < 4; i++ {
				put64(b, rng.IntN(len(b)/8)*8, rng.Uint64())
			}
			a := l.Arena()
			put64(a, rng.IntN(len(a)/8)*8, rng.Uint64())
			slot, p, err := l.Claim(1, 8)
			if err == nil {
				put64(p, 0, rng.Uint64())
				err = l.Commit(slot, RequestMeta{ID: rng.Uint64()})
			}
			if errors.Is(err, ErrLaneLost) {
				// Fenced: ask for another lane, which comes with fresh
				// memory, and go on.
				if nl, cerr := s.ClaimLane(os.Getpid()); cerr == nil {
					l = nl
					fmt.Println("reclaimed")
				}
			}
			return nil
		})
		time.Sleep(100 * time.Microsecond)
	}
}

// ownerEnv passes the owner's pid to a helper.
const ownerEnv = "RECMESH_SHM_OWNER"

// A hostile frontend of the same user, in its own process, can corrupt its
// own lane and nothing else: every way out is refused (the header made or
// mapped writable, any memfd resized, the owner's /proc/<pid>/fd and
// /proc/<pid>/mem, ptrace, process_vm_writev, the accelerator's memory
// while an accelerator is attached, the socket opened as a file), and while it scribbles over its lane another frontend's lane
// keeps serving in the same generation. Its lane is evicted; the owner
// serving loop never fails.
func TestHostileFrontendConfinedToItsLane(t *testing.T) {
	s := newTestSegment(t, testGeometry())
	gen := s.Generation()
	honest := attachTest(t, s)
	hl, err := honest.ClaimLane(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	// A live accelerator holds the segment (the owner does its work
	// below, through the same memory).
	acc := attachTest(t, s)
	if err := acc.SetAccelerator(os.Getpid()); err != nil {
		t.Fatal(err)
	}
	// The owner serves every lane (as embedder and accelerator), evicting
	// lanes whose rings cannot be trusted, until the test ends.
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	evicted := atomic.Int64{}
	go func() { served <- serveAll(ctx, s, &evicted) }()
	var beats sync.WaitGroup
	beats.Add(2)
	go func() { defer beats.Done(); acc.AcceleratorHeartbeat(ctx, 0, nil) }()
	go func() { defer beats.Done(); hl.Heartbeat(ctx, 0) }()
	t.Cleanup(func() {
		cancel()
		beats.Wait()
		if err := <-served; err != nil {
			t.Errorf("owner's serving loop: %v", err)
		}
	})

	c := startChild(t, "hostile", pathEnv+"="+s.Path(), fmt.Sprintf("%s=%d", ownerEnv, os.Getpid()))
	if n := c.refusals(t, "hostile frontend", 20*time.Second); n < 10 {
		t.Errorf("only %d attempts refused", n)
	}
	// The honest lane keeps serving while the hostile one scribbles.
	deadline := time.Now().Add(2 * time.Second)
	for id := uint64(1); time.Now().Before(deadline) || id < 50; id++ {
		slot, p, err := hl.Claim(1, 8)
		if err != nil {
			t.Fatalf("honest claim %d: %v", id, err)
		}
		put64(p, 0, id)
		if err := hl.Commit(slot, RequestMeta{ID: id}); err != nil {
			t.Fatalf("honest commit %d: %v", id, err)
		}
		wctx, wcancel := context.WithTimeout(context.Background(), 5*time.Second)
		cpl, err := hl.WaitCompletion(wctx)
		wcancel()
		if err != nil || cpl.Slot != slot || cpl.Status != StatusOK {
			t.Fatalf("honest call %d: %+v, %v", id, cpl, err)
		}
		if sc, err := hl.Scores(slot); err != nil || get32(sc, 0) != uint32(id) {
			t.Fatalf("honest call %d scores: %v", id, err)
		}
		if _, err := hl.Free(slot); err != nil {
			t.Fatal(err)
		}
	}
	if s.State() != StateReady || honest.Generation() != gen {
		t.Fatalf("segment %v generation %d after the hostile frontend, want ready %d", s.State(), honest.Generation(), gen)
	}
	lanes := 0
	for {
		select {
		case line := <-c.lines:
			if line == "reclaimed" {
				lanes++
			}
			continue
		default:
		}
		break
	}
	t.Logf("honest lane served throughout; hostile lanes evicted %d times, %d lanes claimed anew", evicted.Load(), lanes)
}

// serveAll reads every lane's requests as the embedder, completes each
// (score = request id) as the accelerator, evicts a lane whose counters
// fail validation, and reclaims lanes, until ctx is done. Errors that
// concern one lane are that lane's; any other is returned.
func serveAll(ctx context.Context, s *Segment, evicted *atomic.Int64) error {
	g := s.Geometry()
	rrs := make([]*RequestReader, g.Lanes)
	cws := make([]*CompletionWriter, g.Lanes)
	for i := range rrs {
		rrs[i], _ = s.RequestReader(i)
		cws[i], _ = s.CompletionWriter(i)
	}
	for ctx.Err() == nil {
		if _, err := s.ReclaimLanes(0); err != nil {
			return err
		}
		s.EmbedderBell().Wait(ctx, s.RequestsPending, 5*time.Millisecond)
		for i, rr := range rrs {
			for k := 0; k < 64; k++ {
				req, ok, err := rr.Next()
				if err != nil {
					if req.Slot < 0 {
						evicted.Add(1)
						if err := s.EvictLane(i); err != nil {
							return err
						}
						break
					}
					continue
				}
				if !ok {
					break
				}
				sc, err := cws[i].Scores(req.Slot, req.Epoch)
				if err != nil {
					continue
				}
				for e := 0; e < req.Examples; e++ {
					put32(sc, 4*e, uint32(req.RequestID))
				}
				_ = cws[i].Complete(Completion{Slot: req.Slot, Epoch: req.Epoch, Examples: req.Examples})
			}
		}
	}
	return nil
}

// openProcFDs tries to open the descriptors of process pid through
// /proc/<pid>/fd. It returns the first refusal, or nil if every one
// opened. (A uid-0 process without capabilities may list the directory,
// which a non-dumpable process hands to root; opening an entry needs
// ptrace access either way.)
func openProcFDs(pid int) error {
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	names, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, n := range names {
		f, err := os.Open(dir + "/" + n.Name())
		if err != nil {
			return err
		}
		f.Close()
	}
	return nil
}

// An owner that is stopped (SIGSTOP, a hang) answers no attach: Attach
// gives up within its reply bound instead of hanging the attacher, and
// works again once the owner runs.
func TestAttachToStalledOwnerGivesUp(t *testing.T) {
	name := testName(t)
	c := startChild(t, "owner", pathEnv+"="+name)
	path := c.expect(t, "ready", 20*time.Second)
	t.Cleanup(func() { os.Remove(path) })
	if err := syscall.Kill(c.pid(), syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	// The signal takes effect asynchronously: wait for the stopped state.
	waitFor(t, 10*time.Second, "owner stopped", func() bool {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", c.pid()))
		i := bytes.LastIndexByte(b, ')')
		return err == nil && i >= 0 && i+2 < len(b) && b[i+2] == 'T'
	})
	start := time.Now()
	s, err := Attach(path, AttachOptions{})
	if err == nil {
		s.Close()
		t.Fatal("attached to a stopped owner")
	}
	if took := time.Since(start); took > replyTimeout+2*time.Second {
		t.Fatalf("Attach to a stopped owner took %v (bound %v): %v", took, replyTimeout, err)
	}
	if err := syscall.Kill(c.pid(), syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	// Its heartbeat is stale until its first beat after the stop.
	waitFor(t, 10*time.Second, "attach once the owner runs again", func() bool {
		s, err = Attach(path, AttachOptions{})
		return err == nil
	})
	s.Close()
}
