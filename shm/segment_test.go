package shm

import (
	"errors"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestCreateAttach(t *testing.T) {
	s := newTestSegment(t, testGeometry())
	if !s.IsOwner() || s.Generation() != 1 || s.State() != StateReady {
		t.Fatalf("new segment: owner=%v gen=%d state=%v", s.IsOwner(), s.Generation(), s.State())
	}
	a, err := Attach(s.Path(), AttachOptions{Generation: 1, ModelID: "test-model"})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if a.IsOwner() || a.Geometry() != s.Geometry() || a.ModelID() != "test-model" {
		t.Fatalf("attached view differs: %+v %q", a.Geometry(), a.ModelID())
	}
	if err := a.OwnerAlive(0); err != nil {
		t.Fatal(err)
	}
	if err := a.AcceleratorAlive(0); !errors.Is(err, ErrNoAccelerator) {
		t.Fatalf("AcceleratorAlive before attach = %v, want ErrNoAccelerator", err)
	}
	// No temporary file is left behind.
	left, _ := filepath.Glob(filepath.Join(filepath.Dir(s.Path()), "."+filepath.Base(s.Path())+".*.tmp"))
	if len(left) != 0 {
		t.Fatalf("temporary files left: %v", left)
	}
}

func TestCreateDefaultsFitLargestRequest(t *testing.T) {
	g := Geometry{}.withDefaults()
	if err := g.validate(); err != nil {
		t.Fatal(err)
	}
	const largest = 4096*(13+214)*4 + 4096*4
	if g.ArenaBytes < largest || g.MinArenaBytes() < largest {
		t.Fatalf("default arena %d / minimum %d below the largest request %d", g.ArenaBytes, g.MinArenaBytes(), largest)
	}
	s := newTestSegment(t, Geometry{})
	a := attachTest(t, s)
	if a.Geometry() != g {
		t.Fatalf("geometry %+v, want defaults %+v", a.Geometry(), g)
	}
}

func TestAttachRejects(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(s *Segment)
		want   AttachOptions
		err    error
	}{
		{"magic", func(s *Segment) { put64(s.mem, hdrMagic, 42) }, AttachOptions{}, ErrBadMagic},
		{"version", func(s *Segment) { put32(s.mem, hdrVersion, LayoutVersion+1) }, AttachOptions{}, ErrVersion},
		{"generation", func(s *Segment) {}, AttachOptions{Generation: 7}, ErrGeneration},
		{"model", func(s *Segment) {}, AttachOptions{ModelID: "other"}, ErrModel},
		{"dead owner pid", func(s *Segment) { put32(s.mem, hdrOwnerPid, deadPid) }, AttachOptions{}, ErrOwnerDead},
		{"stale owner heartbeat", func(s *Segment) {
			// The owner is this test process, which runs: only a beat
			// older than a starved process would miss counts.
			atomic.StoreUint64(s.ownerHB, uint64(monoNow()-int64(DefaultStarvedAfter+time.Second)))
		}, AttachOptions{}, ErrOwnerDead},
		{"stale owner heartbeat, other pid namespace", func(s *Segment) {
			// Its connection vouches it exists, but not past the hung limit.
			put64(s.mem, hdrOwnerPidNS, s.pidNS+1)
			atomic.StoreUint64(s.ownerHB, uint64(monoNow()-int64(DefaultHungAfter+time.Second)))
		}, AttachOptions{}, ErrOwnerDead},
		{"future owner heartbeat", func(s *Segment) {
			atomic.StoreUint64(s.ownerHB, uint64(monoNow()+int64(time.Hour)))
		}, AttachOptions{}, ErrOwnerDead},
		{"closed", func(s *Segment) { atomic.StoreUint32(s.state, uint32(StateClosed)) }, AttachOptions{}, ErrClosed},
		{"draining", func(s *Segment) { s.Drain() }, AttachOptions{}, ErrDraining},
		{"creating", func(s *Segment) { atomic.StoreUint32(s.state, uint32(StateCreating)) }, AttachOptions{}, ErrNotReady},
		{"bad state", func(s *Segment) { atomic.StoreUint32(s.state, 99) }, AttachOptions{}, ErrCorrupt},
		{"lanes", func(s *Segment) { put32(s.mem, hdrLanes, 5) }, AttachOptions{}, ErrGeometry},
		{"zero lanes", func(s *Segment) { put32(s.mem, hdrLanes, 0) }, AttachOptions{}, ErrGeometry},
		{"ring not pow2", func(s *Segment) { put32(s.mem, hdrRingCapacity, 96) }, AttachOptions{}, ErrGeometry},
		{"huge arena", func(s *Segment) { put64(s.mem, hdrArenaBytes, 1<<63+4096) }, AttachOptions{}, ErrGeometry},
		{"offset", func(s *Segment) { put64(s.mem, hdrArenasOff, 4096) }, AttachOptions{}, ErrGeometry},
		{"file size", func(s *Segment) { put64(s.mem, hdrFileSize, 1<<40) }, AttachOptions{}, ErrGeometry},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newQuietSegment(t, testGeometry())
			s.Beat()
			tc.mutate(s)
			a, err := Attach(s.Path(), tc.want)
			if err == nil {
				a.Close()
			}
			if !errors.Is(err, tc.err) {
				t.Fatalf("Attach = %v, want %v", err, tc.err)
			}
		})
	}
}

func TestCreateRejectsBadOptions(t *testing.T) {
	dir := t.TempDir()
	for _, o := range []Options{
		{Name: ""},
		{Name: "a/b"},
		{Name: "x", ModelID: string(make([]byte, ModelIDBytes+1))},
		{Name: "x", Geometry: Geometry{RingCapacity: 100}},
		{Name: "x", Geometry: Geometry{RingCapacity: 16, SlotsPerLane: 32}},
		{Name: "x", Geometry: Geometry{ArenaBytes: 4096}},
		{Name: "x", Geometry: Geometry{StagingBytes: 5000}},
		{Name: "x", Geometry: Geometry{Lanes: maxLanes + 1}},
	} {
		o.Dir = dir
		if s, err := Create(o); err == nil {
			s.Close()
			t.Errorf("Create(%+v) succeeded", o.Geometry)
		}
	}
}

// A new generation replaces the path while the old one drains: old
// attachments keep working, new attachers get the new generation, and the
// old owner's Remove leaves the successor alone.
func TestGenerationRollover(t *testing.T) {
	dir := testDir(t)
	name := testName(t)
	g1, err := Create(Options{Name: name, Dir: dir, Geometry: testGeometry()})
	if err != nil {
		t.Fatal(err)
	}
	defer g1.Close()
	old := attachTest(t, g1)
	lane, err := old.ClaimLane(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	rr, _ := g1.RequestReader(lane.Index())
	cw, _ := g1.CompletionWriter(lane.Index())
	roundTrip(t, lane, rr, cw, 1)

	if _, err := Create(Options{Name: name, Dir: dir, Generation: 1, Geometry: testGeometry()}); !errors.Is(err, ErrGeneration) {
		t.Fatalf("Create with an old generation = %v, want ErrGeneration", err)
	}
	g2, err := Create(Options{Name: name, Dir: dir, Geometry: testGeometry()})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { g2.Close(); g2.Remove() }()
	if g2.Generation() != 2 {
		t.Fatalf("generation %d, want 2", g2.Generation())
	}
	if g1.State() != StateDraining {
		t.Fatalf("old generation state %v, want draining", g1.State())
	}
	// In-flight work of the old generation still completes; new work is refused.
	slot, _, err := lane.Claim(1, 8)
	if err != nil {
		t.Fatal(err)
	}
	if err := lane.Commit(slot, RequestMeta{ID: 2}); !errors.Is(err, ErrDraining) {
		t.Fatalf("Commit on a draining segment = %v, want ErrDraining", err)
	}
	if err := old.OwnerAlive(0); err != nil {
		t.Fatalf("draining owner must stay alive: %v", err)
	}
	if _, err := Attach(g1.Path(), AttachOptions{Generation: 1}); !errors.Is(err, ErrGeneration) {
		t.Fatalf("Attach gen 1 = %v, want ErrGeneration", err)
	}
	a2, err := Attach(g1.Path(), AttachOptions{Generation: 2})
	if err != nil {
		t.Fatal(err)
	}
	a2.Close()
	if err := g1.Remove(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(g2.Path()); err != nil {
		t.Fatalf("old generation's Remove unlinked the new one: %v", err)
	}
	// Clean shutdown of the old owner is seen at once.
	if err := g1.Close(); err != nil {
		t.Fatal(err)
	}
	if err := old.OwnerAlive(0); !errors.Is(err, ErrClosed) {
		t.Fatalf("OwnerAlive after Close = %v, want ErrClosed", err)
	}
}

func TestAcceleratorLiveness(t *testing.T) {
	s := newTestSegment(t, testGeometry())
	fe := attachTest(t, s)
	// A frontend reads the owner's copy of the accelerator's words, which
	// the owner refreshes at every beat: beat before each look.
	see := func() *Segment { s.Beat(); return fe }
	acc := attachTest(t, s)
	if err := acc.SetAccelerator(os.Getpid(), ExecEstimate{16, 3 * time.Millisecond}, ExecEstimate{3, time.Second}); err != nil {
		t.Fatal(err)
	}
	if err := see().AcceleratorAlive(0); err != nil {
		t.Fatal(err)
	}
	// The owner plans with the estimates given at attach; an invalid
	// bucket is ignored as by SetExecTime.
	if got := s.ExecTime(16); got != 3*time.Millisecond || s.ExecTime(3) != 0 {
		t.Fatalf("owner reads ExecTime(16) = %v, ExecTime(3) = %v after attach", got, s.ExecTime(3))
	}
	other := attachTest(t, s)
	if err := other.SetAccelerator(os.Getpid()+1, ExecEstimate{16, time.Second}); !errors.Is(err, ErrAcceleratorPresent) {
		t.Fatalf("second accelerator = %v, want ErrAcceleratorPresent", err)
	}
	if got := s.ExecTime(16); got != 3*time.Millisecond {
		t.Fatalf("a refused accelerator changed ExecTime(16) to %v", got)
	}
	// A live pid past DefaultStarvedAfter without a beat is dead whatever
	// it does (TestPeerAliveJudgesByActivity tells running from hung
	// before that: here the peer is this process, which does both).
	atomic.StoreUint64(acc.accelHB, uint64(monoNow()-int64(DefaultStarvedAfter+time.Second)))
	if err := see().AcceleratorAlive(0); !errors.Is(err, ErrAcceleratorDead) {
		t.Fatalf("stale accelerator = %v, want ErrAcceleratorDead", err)
	}
	if err := see().PeersAlive(); !errors.Is(err, ErrAcceleratorDead) {
		t.Fatalf("PeersAlive = %v, want ErrAcceleratorDead", err)
	}
	// Across pid namespaces the accelerator's open connection vouches it
	// exists, up to the hung limit; without it the short threshold is all
	// there is.
	atomic.StoreUint64(acc.accelHB, uint64(monoNow()-int64(200*time.Millisecond)))
	if err := see().AcceleratorAlive(0); err != nil {
		t.Fatalf("a live pid 200ms behind on beats is not dead yet: %v", err)
	}
	atomic.StoreUint64(acc.accelPidNS, acc.pidNS+1)
	if err := see().AcceleratorAlive(0); err != nil {
		t.Fatalf("a connected accelerator in another pid namespace 200ms behind on beats: %v, want alive", err)
	}
	atomic.StoreUint64(acc.accelHB, uint64(monoNow()-int64(DefaultHungAfter+time.Second)))
	if err := see().AcceleratorAlive(0); !errors.Is(err, ErrAcceleratorDead) {
		t.Fatalf("a connected accelerator in another pid namespace past the hung limit = %v, want ErrAcceleratorDead", err)
	}
	acc.cl.c.close()
	waitFor(t, 5*time.Second, "the broker to see the accelerator's connection close", func() bool { return !fe.linkOpen(linkAccel) })
	atomic.StoreUint64(acc.accelHB, uint64(monoNow()-int64(200*time.Millisecond)))
	if err := see().AcceleratorAlive(0); !errors.Is(err, ErrAcceleratorDead) {
		t.Fatalf("stale accelerator in another pid namespace, connection closed = %v, want ErrAcceleratorDead", err)
	}
	atomic.StoreUint64(acc.accelPidNS, acc.pidNS)
	acc.AcceleratorBeat()
	if err := see().PeersAlive(); err != nil {
		t.Fatal(err)
	}
	acc.Close() // detaches
	if err := see().AcceleratorAlive(0); !errors.Is(err, ErrAcceleratorDead) {
		t.Fatalf("detached accelerator = %v, want ErrAcceleratorDead", err)
	}
	// A dead accelerator can be replaced.
	if err := other.SetAccelerator(os.Getpid()); err != nil {
		t.Fatal(err)
	}
	if err := see().AcceleratorAlive(0); err != nil {
		t.Fatalf("replacement accelerator: %v", err)
	}
}

func TestHeaderLayoutFits(t *testing.T) {
	if hdrUsed > HeaderBytes {
		t.Fatalf("header fields end at %d, beyond %d", hdrUsed, HeaderBytes)
	}
	for name, off := range map[string]int{
		"state": hdrState, "owner heartbeat": hdrOwnerHeartbeat, "accel heartbeat": hdrAccelHeartbeat,
		"completed": hdrCompletedSeq, "executed": hdrExecutedSeq, "lane heartbeat": laneHeartbeat, "drain seq": laneDrainSeq,
		"ring head": ringHead, "slot cancel": slotCancel,
	} {
		if off%8 != 0 && name != "state" {
			t.Errorf("%s at %d is not 8-aligned", name, off)
		}
	}
	if slotTraceFlags >= CacheLine {
		t.Errorf("the slot's request fields spill past the first cache line")
	}
	if laneReqEntries%LinePair != 0 || batchEntriesOff%LinePair != 0 {
		t.Errorf("ring entries do not start on a line pair")
	}
}

func TestCreateReserveAndMode(t *testing.T) {
	s, err := Create(Options{Name: "reserved", Dir: t.TempDir(), Reserve: true, Mode: 0o640, Geometry: testGeometry()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	fi, err := os.Lstat(s.Path())
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o640 || fi.Mode()&os.ModeSocket == 0 {
		t.Fatalf("mode %v, want a 0640 socket", fi.Mode())
	}
	// Every memfd is allocated up front.
	fds := append(append([]int(nil), s.br.fds[:]...), s.br.lanes...)
	for _, fd := range fds {
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			t.Fatal(err)
		}
		if st.Blocks*512 < st.Size || st.Size == 0 {
			t.Fatalf("memfd %d: reserved %d of %d bytes", fd, st.Blocks*512, st.Size)
		}
	}
}

// TestFileIdentityFollowsTheFile: a file renamed over the path (a new
// generation's segment) changes the identity; the same file keeps it.
func TestFileIdentityFollowsTheFile(t *testing.T) {
	dir := t.TempDir()
	path, next := filepath.Join(dir, "seg"), filepath.Join(dir, "seg.next")
	for _, p := range []string{path, next} {
		if err := os.WriteFile(p, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	a, err := FileIdentity(path)
	if err != nil {
		t.Fatal(err)
	}
	if again, _ := FileIdentity(path); again != a {
		t.Fatalf("identity of the same file moved: %d, %d", a, again)
	}
	if err := os.Rename(next, path); err != nil {
		t.Fatal(err)
	}
	if b, err := FileIdentity(path); err != nil || b == a {
		t.Fatalf("identity after a rename over the path: %d (was %d), %v", b, a, err)
	}
	if _, err := FileIdentity(filepath.Join(dir, "missing")); err == nil {
		t.Fatal("a missing file has an identity")
	}
}

func TestExecTable(t *testing.T) {
	seg := newTestSegment(t, testGeometry())
	seg.SetExecTime(16, 3*time.Millisecond)
	seg.SetExecTime(3, time.Second)     // not a power of two: ignored
	seg.SetExecTime(1<<20, time.Second) // beyond the table: ignored
	if got := seg.ExecTime(16); got != 3*time.Millisecond {
		t.Errorf("ExecTime(16) = %v", got)
	}
	if seg.ExecTime(8) != 0 || seg.ExecTime(3) != 0 || seg.ExecTime(1<<20) != 0 || seg.ExecTime(0) != 0 {
		t.Error("an unset or invalid bucket has a time")
	}
}
