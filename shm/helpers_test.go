package shm

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// deadPid is above the kernel's PID_MAX_LIMIT, so no process has it.
const deadPid = 1<<22 + 1

// testGeometry is small enough that a segment costs little and large enough
// to exercise every region.
func testGeometry() Geometry {
	return Geometry{
		Lanes:           4,
		RingCapacity:    64,
		SlotsPerLane:    32,
		ArenaBytes:      256 << 10,
		StagingCount:    2,
		StagingBytes:    64 << 10,
		MaxBatchEntries: 64,
		MaxExamples:     64,
		ExampleBytes:    64,
	}
}

// testDir is where test segments live: /dev/shm when usable (the real
// thing), else a temporary directory.
func testDir(t testing.TB) string {
	if err := unix.Access(DefaultDir, unix.W_OK); err == nil {
		return DefaultDir
	}
	return t.TempDir()
}

var segSeq atomic.Uint64 // unique names within one test process

func testName(t testing.TB) string {
	n := strings.NewReplacer("/", "_", " ", "_").Replace(t.Name())
	return fmt.Sprintf("recmesh-test-%d-%s-%d", os.Getpid(), n, segSeq.Add(1))
}

// newTestSegment creates a segment owned by this process, beats its owner
// heartbeat, and removes it when the test ends.
func newTestSegment(t testing.TB, g Geometry) *Segment {
	t.Helper()
	s := newQuietSegment(t, g)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.Heartbeat(ctx, 0, nil)
	}()
	// Registered after newQuietSegment's cleanup, so it runs first: the
	// heartbeat stops before the segment is unmapped.
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return s
}

// newQuietSegment is newTestSegment without the heartbeat goroutine, for
// tests that set the heartbeat themselves.
func newQuietSegment(t testing.TB, g Geometry) *Segment {
	t.Helper()
	s, err := Create(Options{Name: testName(t), Dir: testDir(t), ModelID: "test-model", Geometry: g})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if s.mem != nil {
			s.Close()
		}
		s.Remove()
	})
	return s
}

// attachTest attaches to s's file and closes the mapping when the test ends.
func attachTest(t testing.TB, s *Segment) *Segment {
	t.Helper()
	a, err := Attach(s.Path(), AttachOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if a.mem != nil {
			a.Close()
		}
	})
	return a
}

// waitFor polls cond until it holds or timeout passes. Tests synchronise
// with it, never with bare sleeps.
func waitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(time.Millisecond)
	}
}

// memSegment builds an owner segment over anonymous memory: the fuzz tests
// and the reference-model tests need many images and no files.
func memSegment(t testing.TB, g Geometry) *Segment {
	t.Helper()
	lay, err := computeLayout(g)
	if err != nil {
		t.Fatal(err)
	}
	size := roundUp(lay.total, PageSize)
	mem, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_ANON)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(mem) })
	return initMem(mem, g, lay)
}

// initMem writes a fresh ready header into mem and returns the owner's view.
func initMem(mem []byte, g Geometry, lay layout) *Segment {
	clear(mem)
	writeSegmentHeader(mem, Options{ModelID: "test-model", Geometry: g}, lay, 1, len(mem))
	s := newSegment("mem", mem, g, lay, 1, "test-model", DefaultStaleAfter)
	s.owner = true
	put32(mem, hdrOwnerPid, s.pid)
	put64(mem, hdrOwnerPidNS, s.pidNS)
	s.Beat()
	atomic.StoreUint32(s.state, uint32(StateReady))
	return s
}

// roundTrip pushes one request through lane l and the serving side of seg:
// the embedder reads it, the accelerator writes scores and completes it.
func roundTrip(t testing.TB, l *Lane, rr *RequestReader, cw *CompletionWriter, id uint64) {
	t.Helper()
	slot, payload, err := l.Claim(2, 16)
	if err != nil {
		t.Fatal(err)
	}
	for i := range payload {
		payload[i] = byte(id) + byte(i)
	}
	if err := l.Commit(slot, RequestMeta{ID: id}); err != nil {
		t.Fatal(err)
	}
	req, ok, err := rr.Next()
	if err != nil || !ok {
		t.Fatalf("Next = %v, %v", ok, err)
	}
	if req.RequestID != id || req.Slot != slot || req.Examples != 2 || len(req.Payload) != 16 || req.Payload[3] != byte(id)+3 {
		t.Fatalf("request %+v does not match what was committed", req)
	}
	scores, err := cw.Scores(req.Slot, req.Epoch)
	if err != nil {
		t.Fatal(err)
	}
	put32(scores, 0, uint32(id))
	if err := cw.Complete(Completion{Slot: req.Slot, Epoch: req.Epoch, Examples: req.Examples}); err != nil {
		t.Fatal(err)
	}
	c, ok, err := l.Poll()
	if err != nil || !ok || c.Slot != slot || c.Status != StatusOK {
		t.Fatalf("Poll = %+v, %v, %v", c, ok, err)
	}
	got, err := l.Scores(slot)
	if err != nil || get32(got, 0) != uint32(id) {
		t.Fatalf("Scores = %v, %v", got, err)
	}
	if freed, err := l.Free(slot); err != nil || !freed {
		t.Fatalf("Free of a completed slot = %v, %v", freed, err)
	}
}
