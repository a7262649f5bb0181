package server

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/recmesh/recmesh/model"
	"github.com/recmesh/recmesh/shm"
)

// The tests run the real serving loop against a real segment in a
// temporary directory, playing the embedder (the segment's owner, which
// reads requests and publishes batches) and a frontend (a claimed lane).
// The compiled program is replaced by fakeProgram, whose score of a row is
// the row's first dense feature: the tests can tell which rows reached
// which request.

// testMaxExamples is the segment's MaxExamples and the fake's largest bucket.
const testMaxExamples = 8

// fakeProgram stands in for the compiled program.
type fakeProgram struct {
	cfg     model.Config
	buckets []int
	runs    atomic.Int64 // Run calls
	lastN   atomic.Int64 // examples of the last Run
	fail    atomic.Bool  // Run fails
	closed  atomic.Bool
	runTime time.Duration // each Run takes at least this long
}

func newFakeProgram() *fakeProgram {
	return &fakeProgram{cfg: model.DLRMv2(model.DevVocabCap), buckets: []int{1, 2, 4, testMaxExamples}}
}

func (p *fakeProgram) Buckets() []int       { return p.buckets }
func (p *fakeProgram) MaxBucket() int       { return p.buckets[len(p.buckets)-1] }
func (p *fakeProgram) Config() model.Config { return p.cfg }
func (p *fakeProgram) Close()               { p.closed.Store(true) }

func (p *fakeProgram) BucketFor(n int) (bucket, index int, err error) {
	for i, b := range p.buckets {
		if n >= 1 && b >= n {
			return b, i, nil
		}
	}
	return 0, 0, fmt.Errorf("fake: batch of %d outside 1..%d", n, p.MaxBucket())
}

// fakeInputs is an input region: the staging buffer itself, or a private
// copy of its rows.
type fakeInputs struct {
	lay model.StagingLayout
	mem []byte
}

func (p *fakeProgram) NewInputs(mem []byte, rows int) (inputs, error) {
	lay := p.cfg.Staging(rows)
	if len(mem) < lay.Size {
		return nil, fmt.Errorf("fake: %d-byte region, need %d", len(mem), lay.Size)
	}
	return &fakeInputs{lay: lay, mem: mem}, nil
}

func (p *fakeProgram) NewHostInputs(rows int) (inputs, error) {
	lay := p.cfg.Staging(rows)
	return &fakeInputs{lay: lay, mem: make([]byte, lay.Size)}, nil
}

func (in *fakeInputs) CopyRows(src []byte, n int) error {
	if n < 0 || n > in.lay.Rows || len(src) < in.lay.Size {
		return fmt.Errorf("fake: copy %d rows from %d bytes", n, len(src))
	}
	copy(in.mem, src[:in.lay.Size])
	return nil
}

func (in *fakeInputs) Close() {}

func (p *fakeProgram) Run(in inputs, n int, scores []float32) error {
	p.runs.Add(1)
	p.lastN.Store(int64(n))
	time.Sleep(p.runTime)
	if p.fail.Load() {
		return errors.New("fake: device error")
	}
	if _, _, err := p.BucketFor(n); err != nil {
		return err
	}
	fi := in.(*fakeInputs)
	for i := range n {
		scores[i] = math.Float32frombits(binary.NativeEndian.Uint32(fi.mem[fi.lay.DenseOffset+4*i*p.cfg.NumDense:]))
	}
	return nil
}

// generation is one embedder generation as the test plays it.
type generation struct {
	t     *testing.T
	cfg   model.Config
	seg   *shm.Segment // owner
	lane  *shm.Lane    // the frontend's
	rr    *shm.RequestReader
	bw    *shm.BatchWriter
	close func() // stops the heartbeat and closes the segment (once)
}

func testGeometry(cfg model.Config) shm.Geometry {
	g := shm.Geometry{
		Lanes: 2, RingCapacity: 8, SlotsPerLane: 8, StagingCount: 2,
		StagingBytes: cfg.Staging(testMaxExamples).Size, MaxBatchEntries: 8,
		MaxExamples: testMaxExamples, ExampleBytes: cfg.Request(1).Size,
	}
	g.ArenaBytes = 4 * g.MinArenaBytes()
	return g
}

// newGeneration creates (or replaces) the segment dir/name, beats its
// owner heartbeat and claims a lane in it.
func newGeneration(t *testing.T, dir, name string, cfg model.Config) *generation {
	t.Helper()
	seg, err := shm.Create(shm.Options{Name: name, Dir: dir, ModelID: cfg.ID(), Geometry: testGeometry(cfg)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	beat := make(chan struct{})
	go func() { defer close(beat); _ = seg.Heartbeat(ctx, 0, nil) }()
	var once sync.Once
	g := &generation{t: t, cfg: cfg, seg: seg, bw: seg.BatchWriter()}
	g.close = func() {
		once.Do(func() {
			cancel()
			<-beat
			seg.Close()
		})
	}
	t.Cleanup(g.close)
	if g.lane, err = seg.ClaimLane(os.Getpid()); err != nil {
		t.Fatal(err)
	}
	if g.rr, err = seg.RequestReader(g.lane.Index()); err != nil {
		t.Fatal(err)
	}
	return g
}

// submit commits a request of n examples as the frontend and reads it as
// the embedder.
func (g *generation) submit(n int) shm.Request {
	g.t.Helper()
	slot, _, err := g.lane.Claim(n, g.cfg.Request(n).Size)
	if err != nil {
		g.t.Fatal(err)
	}
	if err := g.lane.Commit(slot, shm.RequestMeta{ID: uint64(slot) + 1}); err != nil {
		g.t.Fatal(err)
	}
	req, ok, err := g.rr.Next()
	if !ok || err != nil || req.Slot != slot {
		g.t.Fatalf("embedder read %+v, %v, %v; want slot %d", req, ok, err, slot)
	}
	return req
}

// rowScore is the score the fake gives batch row r: the first dense
// feature the embedder wrote for it.
func rowScore(seq, r int) float32 { return float32(1000*seq+r) + 0.25 }

// publish writes one batch with the given entries, filling the dense rows
// [0, examples), and returns its seq.
func (g *generation) publish(examples int, entries ...shm.BatchEntry) uint64 {
	g.t.Helper()
	st, ok := g.bw.TryAcquire()
	if !ok {
		g.t.Fatal("no free staging buffer")
	}
	seq := int(g.seg.PublishedSeq()) + 1
	lay := g.cfg.Staging(testMaxExamples)
	data := st.Data()
	for r := range min(examples, testMaxExamples) {
		binary.NativeEndian.PutUint32(data[lay.DenseOffset+4*r*g.cfg.NumDense:], math.Float32bits(rowScore(seq, r)))
	}
	for i, e := range entries {
		if err := st.SetEntry(i, e); err != nil {
			g.t.Fatal(err)
		}
	}
	got, err := g.bw.Publish(st, shm.BatchDesc{Examples: examples, Entries: len(entries)})
	if err != nil || int(got) != seq {
		g.t.Fatalf("Publish = %d, %v; want seq %d", got, err, seq)
	}
	return got
}

// entry is the batch entry carrying req at rows [first, first+rows).
func entry(req shm.Request, first, rows int, st shm.Status) shm.BatchEntry {
	return shm.BatchEntry{Lane: req.Lane, Slot: req.Slot, Epoch: req.Epoch, FirstRow: first, Rows: rows, Status: st}
}

// completions waits for n completions on the frontend's lane.
func (g *generation) completions(n int) map[int]shm.Completion {
	g.t.Helper()
	out := map[int]shm.Completion{}
	waitFor(g.t, fmt.Sprintf("%d completions", n), func() bool {
		for {
			c, ok, err := g.lane.Poll()
			if err != nil {
				g.t.Fatalf("Poll: %v", err)
			}
			if !ok {
				return len(out) >= n
			}
			if _, dup := out[c.Slot]; dup {
				g.t.Fatalf("slot %d completed twice", c.Slot)
			}
			out[c.Slot] = c.Completion
		}
	})
	if len(out) != n {
		g.t.Fatalf("%d completions, want %d: %+v", len(out), n, out)
	}
	return out
}

// scores reads a completed slot's scores as the frontend does.
func (g *generation) scores(slot int) []float32 {
	g.t.Helper()
	raw, err := g.lane.Scores(slot)
	if err != nil {
		g.t.Fatal(err)
	}
	out := make([]float32, len(raw)/4)
	for i := range out {
		out[i] = math.Float32frombits(binary.NativeEndian.Uint32(raw[4*i:]))
	}
	return out
}

// free gives completed slots back, so the lane's room is reused.
func (g *generation) free(cs map[int]shm.Completion) {
	g.t.Helper()
	for slot := range cs {
		if _, err := g.lane.Free(slot); err != nil {
			g.t.Fatal(err)
		}
	}
}

// waitFor polls cond until it holds; generous for a loaded machine and
// the race detector.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// serving is a Server running over dir/name.
type serving struct {
	srv    *Server
	prog   *fakeProgram
	cancel context.CancelFunc
	done   chan error
}

func startServer(t *testing.T, dir, name string, opts Options) *serving {
	t.Helper()
	return startServerWith(t, dir, name, opts, newFakeProgram())
}

// startServerWith is startServer serving prog.
func startServerWith(t *testing.T, dir, name string, opts Options, prog *fakeProgram) *serving {
	t.Helper()
	opts.ShmDir, opts.Segment = dir, name
	srv := newServer(opts, prog)
	ctx, cancel := context.WithCancel(context.Background())
	s := &serving{srv: srv, prog: prog, cancel: cancel, done: make(chan error, 1)}
	go func() { s.done <- srv.Run(ctx) }()
	t.Cleanup(func() { s.stop(t) })
	return s
}

// stop cancels Run and waits for it (idempotent).
func (s *serving) stop(t *testing.T) {
	t.Helper()
	s.cancel()
	if s.done == nil {
		return
	}
	select {
	case err := <-s.done:
		if err != nil {
			t.Errorf("Run = %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
	s.done = nil
}

// attached waits until the server serves g.
func (s *serving) attached(t *testing.T, g *generation) {
	t.Helper()
	waitFor(t, fmt.Sprintf("the server to attach generation %d", g.seg.Generation()), func() bool {
		return s.srv.Generation() == g.seg.Generation() && g.seg.AcceleratorAlive(0) == nil
	})
	// Calibration runs before the accelerator shows as attached (attach
	// publishes its figures first), so the tests can count the runs they
	// cause from here.
}

func newRig(t *testing.T, opts Options) (*generation, *serving) {
	t.Helper()
	dir, name := t.TempDir(), "recmesh-server-test"
	g := newGeneration(t, dir, name, model.DLRMv2(model.DevVocabCap))
	s := startServer(t, dir, name, opts)
	s.attached(t, g)
	return g, s
}

// TestCalibratedBeforeAttach: by the time the segment shows an accelerator
// (when the frontends start taking calls), every bucket's execution time
// is already published, so no call waits for calibration and the
// embedder's first batch is planned with real figures.
func TestCalibratedBeforeAttach(t *testing.T) {
	dir, name := t.TempDir(), "recmesh-server-test"
	g := newGeneration(t, dir, name, model.DLRMv2(model.DevVocabCap))
	prog := newFakeProgram()
	prog.runTime = 2 * time.Millisecond
	startServerWith(t, dir, name, Options{}, prog)
	waitFor(t, "an accelerator in the segment", func() bool { return g.seg.AcceleratorAlive(0) == nil })
	for _, b := range prog.Buckets() {
		if d := g.seg.ExecTime(b); d < prog.runTime {
			t.Errorf("bucket %d: execution time %v published at attach, want at least %v", b, d, prog.runTime)
		}
	}
}

// TestReleaseAfterCalibration: Options.Release runs once calibration has
// run the buckets, once per program, and before the accelerator shows as
// attached, so the heap is handed back before the first call.
func TestReleaseAfterCalibration(t *testing.T) {
	dir, name := t.TempDir(), "recmesh-server-test"
	g := newGeneration(t, dir, name, model.DLRMv2(model.DevVocabCap))
	prog := newFakeProgram()
	var releases, runsAtRelease atomic.Int64
	opts := Options{Release: func() {
		releases.Add(1)
		runsAtRelease.Store(prog.runs.Load())
	}}
	s := startServerWith(t, dir, name, opts, prog)
	s.attached(t, g)
	if n := releases.Load(); n != 1 {
		t.Fatalf("Release ran %d times by attach, want once", n)
	}
	if got, want := runsAtRelease.Load(), int64(len(prog.Buckets())); got < want {
		t.Errorf("Release ran after %d program runs, want it after calibration's (at least %d)", got, want)
	}
	// Another generation of the same program is not calibrated again.
	g.close()
	g2 := newGeneration(t, dir, name, model.DLRMv2(model.DevVocabCap))
	s.attached(t, g2)
	if n := releases.Load(); n != 1 {
		t.Errorf("Release ran %d times after a second generation of the same program, want once", n)
	}
}

// TestServeBatch: every request of a batch is completed with its own rows'
// scores, from the staging buffer in place or from a private copy, and the
// buffer goes back to the embedder.
func TestServeBatch(t *testing.T) {
	for _, zeroCopy := range []bool{false, true} {
		t.Run(fmt.Sprintf("zero-copy=%v", zeroCopy), func(t *testing.T) {
			g, s := newRig(t, Options{CopyStaging: !zeroCopy})
			for round := range 3 { // more batches than staging buffers
				a, b, c := g.submit(1), g.submit(2), g.submit(3)
				seq := g.publish(6, entry(a, 0, 1, shm.StatusOK), entry(b, 1, 2, shm.StatusOK), entry(c, 3, 3, shm.StatusOK))
				cs := g.completions(3)
				for _, tc := range []struct {
					req   shm.Request
					first int
				}{{a, 0}, {b, 1}, {c, 3}} {
					got := cs[tc.req.Slot]
					if got.Status != shm.StatusOK || got.Examples != tc.req.Examples || got.Epoch != tc.req.Epoch {
						t.Fatalf("round %d slot %d: completion %+v", round, tc.req.Slot, got)
					}
					sc := g.scores(tc.req.Slot)
					for i, v := range sc {
						if want := rowScore(int(seq), tc.first+i); v != want {
							t.Fatalf("round %d slot %d score %d = %v, want %v (row %d)", round, tc.req.Slot, i, v, want, tc.first+i)
						}
					}
				}
				waitFor(t, "the batch to be done", func() bool { return g.seg.CompletedSeq() == seq })
				if s.prog.lastN.Load() != 6 {
					t.Fatalf("the program ran %d examples, want 6", s.prog.lastN.Load())
				}
				g.free(cs)
			}
			if g.seg.ExecutedSeq() != 3 {
				t.Fatalf("executed seq %d, want 3", g.seg.ExecutedSeq())
			}
		})
	}
}

// TestServeDroppedEntries: an entry the embedder dropped (nonzero Status)
// is completed with that status and no scores, and its rows are not run; a
// batch of dropped entries only is not executed at all. A failed run
// completes the batch's live requests with StatusInternal.
func TestServeDroppedEntries(t *testing.T) {
	g, s := newRig(t, Options{})
	live, canceled, expired, invalid := g.submit(2), g.submit(1), g.submit(3), g.submit(1)
	runs := s.prog.runs.Load()
	g.publish(2, entry(canceled, 0, 0, shm.StatusCanceled), entry(live, 0, 2, shm.StatusOK),
		entry(expired, 2, 0, shm.StatusExpired), entry(invalid, 2, 0, shm.StatusInvalid))
	cs := g.completions(4)
	for _, tc := range []struct {
		req  shm.Request
		want shm.Status
	}{{live, shm.StatusOK}, {canceled, shm.StatusCanceled}, {expired, shm.StatusExpired}, {invalid, shm.StatusInvalid}} {
		req, want := tc.req, tc.want
		c := cs[req.Slot]
		if c.Status != want {
			t.Errorf("slot %d: status %v, want %v", req.Slot, c.Status, want)
		}
		if want != shm.StatusOK && c.Examples != 0 {
			t.Errorf("dropped slot %d completed with %d examples", req.Slot, c.Examples)
		}
	}
	if got := s.prog.runs.Load() - runs; got != 1 || s.prog.lastN.Load() != 2 {
		t.Fatalf("%d runs, last of %d examples; want 1 run of the 2 live rows", got, s.prog.lastN.Load())
	}
	g.free(cs)

	a, b := g.submit(1), g.submit(2)
	g.publish(0, entry(a, 0, 0, shm.StatusOverloaded), entry(b, 0, 0, shm.StatusCanceled))
	cs = g.completions(2)
	if cs[a.Slot].Status != shm.StatusOverloaded || cs[b.Slot].Status != shm.StatusCanceled {
		t.Fatalf("an all-dropped batch completed %+v", cs)
	}
	if got := s.prog.runs.Load() - runs; got != 1 {
		t.Fatalf("a batch without live rows was executed (%d runs)", got)
	}
	g.free(cs)

	s.prog.fail.Store(true)
	a, b = g.submit(2), g.submit(1)
	g.publish(2, entry(a, 0, 2, shm.StatusOK), entry(b, 2, 0, shm.StatusExpired))
	cs = g.completions(2)
	if cs[a.Slot].Status != shm.StatusInternal || cs[a.Slot].Examples != 0 || cs[b.Slot].Status != shm.StatusExpired {
		t.Fatalf("after a failed run: %+v", cs)
	}
}

// TestServeCorruptEntries: entries whose lane, slot or rows fail
// validation are skipped (no completion is invented for them, nothing
// crashes), the batch's valid entries are served, and the generation goes
// on: the next batch is served by the same attachment.
func TestServeCorruptEntries(t *testing.T) {
	g, s := newRig(t, Options{})
	gen := s.srv.Generation()
	good, victim := g.submit(2), g.submit(1)
	bad := []shm.BatchEntry{
		{Lane: 7, Slot: victim.Slot, Epoch: victim.Epoch, Rows: 1},                            // lane out of range
		{Lane: victim.Lane, Slot: 99, Epoch: victim.Epoch, Rows: 1},                           // slot out of range
		{Lane: victim.Lane, Slot: victim.Slot, Epoch: victim.Epoch, FirstRow: 2, Rows: 5},     // rows beyond the batch
		{Lane: victim.Lane, Slot: victim.Slot, Epoch: victim.Epoch + 1, FirstRow: 2, Rows: 1}, // another epoch
	}
	seq := g.publish(3, append(bad, entry(good, 0, 2, shm.StatusOK))...)
	cs := g.completions(1)
	if c := cs[good.Slot]; c.Status != shm.StatusOK || c.Examples != 2 {
		t.Fatalf("the valid entry: %+v (all: %+v)", c, cs)
	}
	if sc := g.scores(good.Slot); sc[0] != rowScore(int(seq), 0) || sc[1] != rowScore(int(seq), 1) {
		t.Fatalf("the valid entry's scores %v", sc)
	}
	// Completions of one batch are published together: anything invented
	// for the bad entries would be visible now.
	if c, ok, err := g.lane.Poll(); ok || err != nil {
		t.Fatalf("a completion for a corrupt entry: %+v, %v", c, err)
	}
	waitFor(t, "the batch to be done", func() bool { return g.seg.CompletedSeq() == seq })
	g.free(cs)

	// The victim's request is still the frontend's to finish; a valid
	// batch answers it on the same generation.
	g.publish(1, entry(victim, 0, 1, shm.StatusOK))
	if c := g.completions(1)[victim.Slot]; c.Status != shm.StatusOK {
		t.Fatalf("after the corrupt batch: %+v", c)
	}
	g.free(map[int]shm.Completion{victim.Slot: {}})

	// A batch claiming more rows than a staging buffer holds is not run;
	// its live requests fail, its dropped ones keep their status.
	runs := s.prog.runs.Load()
	big, dropped := g.submit(1), g.submit(1)
	g.publish(testMaxExamples+1, entry(big, 0, 1, shm.StatusOK), entry(dropped, 0, 0, shm.StatusCanceled))
	cs = g.completions(2)
	if cs[big.Slot].Status != shm.StatusInternal || cs[dropped.Slot].Status != shm.StatusCanceled {
		t.Fatalf("a batch larger than a staging buffer: %+v", cs)
	}
	if s.prog.runs.Load() != runs {
		t.Fatal("a batch larger than a staging buffer was executed")
	}
	if s.srv.Generation() != gen || g.seg.AcceleratorAlive(0) != nil || !s.srv.Live() {
		t.Fatalf("the corrupt batch ended the generation (attached %d, was %d): %v", s.srv.Generation(), gen, g.seg.AcceleratorAlive(0))
	}
}

// TestGenerations: a new generation at the path is attached beside the
// replaced one, which is served until its embedder closes it; the server
// then detaches from it and keeps the new one.
func TestGenerations(t *testing.T) {
	dir, name := t.TempDir(), "recmesh-server-test"
	cfg := model.DLRMv2(model.DevVocabCap)
	old := newGeneration(t, dir, name, cfg)
	s := startServer(t, dir, name, Options{})
	s.attached(t, old)
	// A second view of the old generation outlives its owner's mapping,
	// to watch the accelerator leave it.
	watch, err := shm.Attach(old.seg.Path(), shm.AttachOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { watch.Close() })

	// Committed before the replacement: a draining segment takes no new
	// requests, but those in flight must complete.
	r := old.submit(1)
	next := newGeneration(t, dir, name, cfg)
	if next.seg.Generation() <= old.seg.Generation() || old.seg.State() != shm.StateDraining {
		t.Fatalf("generation %d replacing %d (state %v)", next.seg.Generation(), old.seg.Generation(), old.seg.State())
	}
	s.attached(t, next)

	// The replaced generation still has its accelerator.
	old.publish(1, entry(r, 0, 1, shm.StatusOK))
	if c := old.completions(1)[r.Slot]; c.Status != shm.StatusOK {
		t.Fatalf("draining generation: %+v", c)
	}
	r = next.submit(2)
	next.publish(2, entry(r, 0, 2, shm.StatusOK))
	if c := next.completions(1)[r.Slot]; c.Status != shm.StatusOK {
		t.Fatalf("new generation: %+v", c)
	}

	old.close()
	waitFor(t, "the accelerator to detach from the closed generation", func() bool {
		return errors.Is(watch.AcceleratorAlive(0), shm.ErrAcceleratorDead)
	})
	if s.srv.Generation() != next.seg.Generation() || next.seg.AcceleratorAlive(0) != nil {
		t.Fatalf("closing the old generation disturbed the new one: attached %d, %v", s.srv.Generation(), next.seg.AcceleratorAlive(0))
	}
}

// TestRunDetachesOnCancel: when Run's context ends it detaches from the
// segment at once (frontends fail in-flight work rather than wait for the
// heartbeat to go stale) and reports no generation; a later server can
// attach the same generation again.
func TestRunDetachesOnCancel(t *testing.T) {
	g, s := newRig(t, Options{})
	s.stop(t)
	if err := g.seg.AcceleratorAlive(0); !errors.Is(err, shm.ErrAcceleratorDead) {
		t.Fatalf("after Run returned: AcceleratorAlive = %v, want detached", err)
	}
	if s.srv.Generation() != 0 {
		t.Fatalf("detached server reports generation %d", s.srv.Generation())
	}
	if err := g.lane.Beat(); err != nil {
		t.Fatalf("the frontend's lane was disturbed: %v", err)
	}

	s2 := startServer(t, filepath.Dir(g.seg.Path()), filepath.Base(g.seg.Path()), Options{})
	s2.attached(t, g)
	r := g.submit(1)
	g.publish(1, entry(r, 0, 1, shm.StatusOK))
	if c := g.completions(1)[r.Slot]; c.Status != shm.StatusOK {
		t.Fatalf("served by the second server: %+v", c)
	}
}

// TestModelIDFollowsRollout: the model the server reports is the one new
// generations are served with, which a rollout's first generation changes.
func TestModelIDFollowsRollout(t *testing.T) {
	dir, name := t.TempDir(), "recmesh-server-test"
	cfg := model.DLRMv2(model.DevVocabCap)
	first := newGeneration(t, dir, name, cfg)
	s := startServer(t, dir, name, Options{})
	s.attached(t, first)
	if got := s.srv.ModelID(); got != cfg.ID() {
		t.Fatalf("ModelID = %q, want %q", got, cfg.ID())
	}
	next := newFakeProgram()
	next.cfg.Seed = 9
	s.srv.prepare(next)
	if got := s.srv.ModelID(); got != cfg.ID() {
		t.Fatalf("ModelID = %q once a rollout is prepared, want still %q", got, cfg.ID())
	}
	rolled := newGeneration(t, dir, name, next.cfg)
	s.attached(t, rolled)
	if got := s.srv.ModelID(); got != next.cfg.ID() {
		t.Fatalf("ModelID = %q after the rollout, want %q", got, next.cfg.ID())
	}
}
