package shm

import (
	"context"
	"errors"
	"fmt"
	"math/bits"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// Segment is one process's mapping of a segment. The creator (Create) is
// the owner: the embedder of that generation. Everyone else attaches
// (Attach) through the owner's broker, and maps only what its role may
// (memfd.go). Methods that only read or beat are safe for concurrent use;
// Close must come after every handle made from the segment is done, because
// it unmaps the memory they point into.
type Segment struct {
	path    string
	mem     []byte
	vm      *vmRange   // the reserved image; nil for test images
	mapMu   sync.Mutex // remapping pieces of vm, and releasing it
	br      *broker    // owner: serves attachers
	cl      *client    // attacher: its connection to the broker
	geo     Geometry
	lay     layout
	gen     uint64
	modelID string
	owner   bool   // this process created the segment
	pid     uint32 // this process
	pidNS   uint64 // this process's pid namespace, 0 if unknown
	stale   time.Duration
	dev     uint64 // identity of the socket, so Remove never unlinks a successor
	ino     uint64
	isAccel atomic.Bool // SetAccelerator succeeded in this process

	state       *uint32
	ownerHB     *uint64
	accelPid    *uint32 // the accelerator page's words (owner, accelerator)
	accelState  *uint32 // or the header's mirror of them (frontends)
	accelPidNS  *uint64
	accelHB     *uint64
	completed   *uint64
	executed    *uint64
	accelIdle   *uint32
	execTable   [ExecTableBuckets]*uint64 // words in the accelerator page
	batchTail   *uint64
	embedder    *Doorbell
	batchBell   *Doorbell
	stagingBell *Doorbell
	lanes       []laneCtl // views of every lane, built once
	staging     []Staging // views of every staging buffer, built once
}

// Create makes a new segment for the calling process, which becomes its
// owner, and publishes it at opts.Dir/opts.Name: a unix socket where the
// owner's broker hands attachers their memfds. The socket is bound under a
// temporary name and renamed into place only when the segment is
// complete, so an attacher never sees a half-initialised one. A segment
// already at the path is replaced: its mappings stay valid for the
// processes that hold them (the old generation drains), and its owner
// marks it draining when it sees its path taken. The socket gets
// opts.Mode, which may not be writable by other users.
func Create(opts Options) (*Segment, error) {
	o := opts.withDefaults()
	if o.Name == "" || strings.ContainsRune(o.Name, '/') || o.Name == "." || o.Name == ".." {
		return nil, fmt.Errorf("shm: create: bad segment name %q", o.Name)
	}
	path := filepath.Join(o.Dir, o.Name)
	s, err := create(path, o)
	if err != nil {
		return nil, fmt.Errorf("shm: create %s: %w", path, err)
	}
	return s, nil
}

func create(path string, o Options) (*Segment, error) {
	if len(o.ModelID) > ModelIDBytes {
		return nil, fmt.Errorf("model id longer than %d bytes", ModelIDBytes)
	}
	lay, err := computeLayout(o.Geometry)
	if err != nil {
		return nil, err
	}
	if o.Mode.Perm()&0o002 != 0 {
		return nil, fmt.Errorf("%w: mode %v is writable by every user, and attach refuses such a segment", ErrUnsafeFile, o.Mode.Perm())
	}
	if err := ensureDir(o.Dir, o.Mode); err != nil {
		return nil, err
	}
	// Huge pages when the directory is a hugetlbfs mount, as when the
	// segment was a file there: the staging buffers, the one large region
	// a device reads, get them.
	blk, err := fsBlock(o.Dir)
	if err != nil {
		return nil, fmt.Errorf("statfs: %w", err)
	}
	if err := setUndumpable(); err != nil {
		return nil, err
	}

	prev := existingGeneration(path)
	gen := o.Generation
	switch {
	case gen == 0:
		gen = prev + 1
	case gen <= prev:
		return nil, fmt.Errorf("%w: generation %d is not newer than %d already at the path", ErrGeneration, gen, prev)
	}

	z := lay.memfdSizes(o.Geometry, blk)
	// On hugetlbfs the huge page pool bounds the staging memfd itself
	// (fallocate fails with ENOSPC), and its free count says nothing of
	// the rest.
	if o.Reserve && blk == PageSize {
		if err := checkRoom(o.Dir, z, o.Geometry.Lanes); err != nil {
			return nil, err
		}
	}
	b := &broker{reserve: o.Reserve, block: blk, z: z, accel: map[*brokerConn]bool{}, conns: map[*brokerConn]bool{},
		claims: map[peerKey][]laneClaim{}, key: o.AcceleratorKey, maxLanes: o.MaxLanesPerPeer}
	for i := range b.fds {
		b.fds[i] = -1
	}
	var vm *vmRange
	var ln *wireConn
	var tmp string
	ok := false
	defer func() {
		if ok {
			return
		}
		if ln != nil {
			ln.close()
			os.Remove(tmp)
		}
		vm.release()
		closeAll(b.fds[:])
		closeAll(b.lanes)
	}()
	names := [numShared]string{"recmesh-header", "recmesh-bell", "recmesh-core", "recmesh-staging"}
	for i := range b.fds {
		block := PageSize
		if i == fdStaging {
			block = blk
		}
		if b.fds[i], err = newMemfd(names[i], z.shared[i], block, o.Reserve); err != nil {
			return nil, err
		}
	}
	for i := 0; i < o.Geometry.Lanes; i++ {
		fd, err := newMemfd(fmt.Sprintf("recmesh-lane-%d", i), z.lane, PageSize, o.Reserve)
		if err != nil {
			return nil, err
		}
		b.lanes = append(b.lanes, fd)
	}
	b.dirty = make([]bool, o.Geometry.Lanes)
	if vm, err = reserveVM(z.vm, lay.stagingData); err != nil {
		return nil, err
	}
	for _, p := range lay.sharedPieces(z) {
		if err := vm.mapFixed(p.off, p.n, b.fds[p.kind], p.fdOff, true); err != nil {
			return nil, err
		}
	}
	for i, fd := range b.lanes {
		for _, p := range lay.lanePieces(i, o.Geometry) {
			if err := vm.mapFixed(p.off, p.n, fd, p.fdOff, true); err != nil {
				return nil, err
			}
		}
	}
	mem := vm.bytes(lay.total)
	writeSegmentHeader(mem, o, lay, gen, lay.total)
	s := newSegment(path, mem, o.Geometry, lay, gen, o.ModelID, DefaultStaleAfter)
	s.vm = vm
	s.owner = true
	put32(mem, hdrOwnerPid, s.pid)
	put64(mem, hdrOwnerPidNS, s.pidNS)
	s.Beat()
	atomic.StoreUint32(s.state, uint32(StateReady))

	// Sealed now that the owner's writable mapping of the header exists:
	// it stays the only one.
	for i, fd := range b.fds {
		seals := baseSeals
		if i == fdHeader {
			seals |= unix.F_SEAL_FUTURE_WRITE
		}
		if err := seal(fd, seals); err != nil {
			return nil, err
		}
	}
	for _, fd := range b.lanes {
		if err := seal(fd, baseSeals); err != nil {
			return nil, err
		}
	}

	if ln, tmp, err = listenSegmentSocket(filepath.Dir(path), filepath.Base(path), o.Mode); err != nil {
		return nil, err
	}
	var st unix.Stat_t
	if err := unix.Stat(tmp, &st); err != nil {
		return nil, err
	}
	s.dev, s.ino = uint64(st.Dev), st.Ino
	b.s, b.ln = s, ln
	s.br = b
	markDraining(path)
	if err := os.Rename(tmp, path); err != nil {
		return nil, err
	}
	b.start()
	ok = true
	return s, nil
}

// existingGeneration asks the broker at path for its generation: 0 when
// there is none, or nobody answers (its owner is gone, and with it the
// memory: the path's generations then start over).
func existingGeneration(path string) uint64 { return probe(path, false) }

// markDraining tells the segment about to be replaced at path, when its
// owner is this very process (a rollout), to drain at once; the broker
// refuses anyone else, and an owner in another process notices by itself
// that its path was taken (broker.watch). Failure is harmless: frontends
// also notice the new socket and re-attach.
func markDraining(path string) { probe(path, true) }

// Attach maps the segment at path for a frontend or the accelerator,
// through the owner's broker: it gets the header, read-only, and the bell
// page; ClaimLane adds one lane, SetAccelerator everything else. It checks
// the magic, the layout version, the geometry against the memfds, the
// generation and model id asked for, the state word, and that the owner is
// alive; any failure is a clear error wrapping one of the sentinels. The
// path must be safe to trust (ErrUnsafeFile otherwise): not a symbolic
// link, a socket of this process's effective uid (any owner when that is
// root), not writable by other users, with a broker of that uid behind it.
// Attach makes the process non-dumpable (see setUndumpable).
func Attach(path string, want AttachOptions) (*Segment, error) {
	s, err := attach(path, want)
	if err != nil {
		return nil, fmt.Errorf("shm: attach %s: %w", path, err)
	}
	return s, nil
}

// attachMem validates a mapped segment image and builds an attacher's
// Segment over it. It reads nothing beyond the header until the header has
// proven that the layout fits inside mem. The fuzz tests call it on
// hostile images.
func attachMem(path string, mem []byte, want AttachOptions) (*Segment, error) {
	g, lay, err := parseHeader(mem)
	if err != nil {
		return nil, err
	}
	gen := get64(mem, hdrGeneration)
	if want.Generation != 0 && gen != want.Generation {
		return nil, fmt.Errorf("%w: segment has generation %d, want %d", ErrGeneration, gen, want.Generation)
	}
	id := readModelID(mem)
	if want.ModelID != "" && id != want.ModelID {
		return nil, fmt.Errorf("%w: segment serves %q, want %q", ErrModel, id, want.ModelID)
	}
	stale := want.StaleAfter
	if stale <= 0 {
		stale = DefaultStaleAfter
	}
	s := newSegment(path, mem, g, lay, gen, id, stale)
	s.useAccelMirror()
	switch st := s.State(); st {
	case StateReady:
	case StateDraining:
		return nil, ErrDraining
	case StateClosed:
		return nil, ErrClosed
	case StateCreating:
		return nil, ErrNotReady
	default:
		return nil, fmt.Errorf("%w: state word %v", ErrCorrupt, st)
	}
	return s, nil
}

// parseHeader checks the header of mem and returns the geometry and layout
// it describes, which must fit in mem.
func parseHeader(mem []byte) (Geometry, layout, error) {
	if len(mem) < HeaderBytes {
		return Geometry{}, layout{}, fmt.Errorf("%w: %d bytes, smaller than the header", ErrGeometry, len(mem))
	}
	if !aligned(mem, PageSize) {
		return Geometry{}, layout{}, fmt.Errorf("%w: mapping not page aligned", ErrGeometry)
	}
	g, lay, err := readSegmentHeader(mem[:HeaderBytes])
	if err != nil {
		return Geometry{}, layout{}, err
	}
	if size := get64(mem, hdrFileSize); size != uint64(len(mem)) {
		return Geometry{}, layout{}, fmt.Errorf("%w: image size is %d, the mapping %d", ErrGeometry, size, len(mem))
	}
	if lay.total > len(mem) {
		return Geometry{}, layout{}, fmt.Errorf("%w: layout needs %d bytes, the mapping has %d", ErrGeometry, lay.total, len(mem))
	}
	return g, lay, nil
}

// newSegment builds the views of a segment image as the owner and the
// accelerator see it: the accelerator's words in the accelerator page.
// Frontends switch to the header's mirror of them (useAccelMirror).
func newSegment(path string, mem []byte, g Geometry, lay layout, gen uint64, modelID string, stale time.Duration) *Segment {
	acc := lay.accel
	s := &Segment{
		path:        path,
		mem:         mem,
		geo:         g,
		lay:         lay,
		gen:         gen,
		modelID:     modelID,
		pid:         uint32(os.Getpid()),
		pidNS:       pidNamespace(),
		stale:       stale,
		state:       word32(mem, hdrState),
		ownerHB:     word64(mem, hdrOwnerHeartbeat),
		completed:   word64(mem, acc+hdrCompletedSeq),
		executed:    word64(mem, acc+hdrExecutedSeq),
		accelIdle:   word32(mem, acc+hdrAccelIdle),
		batchTail:   word64(mem, lay.batchRing+ringTail),
		embedder:    newSplitDoorbell(mem, lay.bell+bellWord, hdrEmbedderBell+bellWaiters),
		batchBell:   newDoorbell(mem, acc+hdrBatchBell),
		stagingBell: newDoorbell(mem, acc+hdrStagingBell),
	}
	s.useAccelPage()
	for i := range s.execTable {
		s.execTable[i] = word64(mem, acc+hdrExecTable+8*i)
	}
	s.lanes = make([]laneCtl, g.Lanes)
	for i := range s.lanes {
		s.lanes[i] = s.newLaneCtl(i)
	}
	s.staging = s.newStagings()
	return s
}

// useAccelPage points the accelerator's words at the accelerator page,
// where the accelerator writes them: the owner's and the accelerator's
// view.
func (s *Segment) useAccelPage() { s.pointAccel(s.lay.accel) }

// useAccelMirror points them at the header's copy, the only one a
// frontend maps.
func (s *Segment) useAccelMirror() { s.pointAccel(0) }

func (s *Segment) pointAccel(base int) {
	s.accelPid = word32(s.mem, base+hdrAccelPid)
	s.accelState = word32(s.mem, base+hdrAccelState)
	s.accelPidNS = word64(s.mem, base+hdrAccelPidNS)
	s.accelHB = word64(s.mem, base+hdrAccelHeartbeat)
}

// mirrorAccel copies the accelerator's liveness words into the header,
// where frontends read them. Owner only; every beat. The state goes last,
// so a frontend that sees "running" sees the pid it belongs to.
func (s *Segment) mirrorAccel() {
	m := s.mem
	atomic.StoreUint32(word32(m, hdrAccelPid), atomic.LoadUint32(s.accelPid))
	atomic.StoreUint64(word64(m, hdrAccelPidNS), atomic.LoadUint64(s.accelPidNS))
	atomic.StoreUint64(word64(m, hdrAccelHeartbeat), atomic.LoadUint64(s.accelHB))
	atomic.StoreUint32(word32(m, hdrAccelState), atomic.LoadUint32(s.accelState))
}

// identify records the socket's device and inode for Remove.
func (s *Segment) identify() error {
	var st unix.Stat_t
	if err := unix.Stat(s.path, &st); err != nil {
		return err
	}
	s.dev, s.ino = uint64(st.Dev), st.Ino
	return nil
}

// Path is the segment's path (its broker's socket).
func (s *Segment) Path() string { return s.path }

// Generation is the segment's generation.
func (s *Segment) Generation() uint64 { return s.gen }

// ModelID is the model id the owner wrote.
func (s *Segment) ModelID() string { return s.modelID }

// Geometry is the segment's validated shape.
func (s *Segment) Geometry() Geometry { return s.geo }

// IsOwner reports whether this process created the segment.
func (s *Segment) IsOwner() bool { return s.owner }

// State reads the segment state word.
func (s *Segment) State() State { return State(atomic.LoadUint32(s.state)) }

// Drain marks the segment draining: frontends stop submitting and move to
// the next generation while in-flight work completes. Owner only.
func (s *Segment) Drain() error {
	if !s.owner {
		return fmt.Errorf("shm: drain %s: %w", s.path, ErrNotOwner)
	}
	atomic.CompareAndSwapUint32(s.state, uint32(StateReady), uint32(StateDraining))
	return nil
}

// Beat stamps the owner heartbeat and refreshes the header's copy of the
// accelerator's liveness words. The owner calls it at least every
// DefaultHeartbeatInterval (see Heartbeat).
func (s *Segment) Beat() {
	atomic.StoreUint64(s.ownerHB, uint64(monoNow()))
	if s.owner {
		s.mirrorAccel()
	}
}

// Heartbeat beats as owner every interval (0: DefaultHeartbeatInterval)
// while pulse is Live (nil: always), until ctx is done, and returns ctx's
// error. The caller owns the goroutine that runs it.
func (s *Segment) Heartbeat(ctx context.Context, interval time.Duration, pulse *Pulse) error {
	return beatLoop(ctx, interval, pulse, s.Beat)
}

func beatLoop(ctx context.Context, interval time.Duration, pulse *Pulse, beat func()) error {
	if interval <= 0 {
		interval = DefaultHeartbeatInterval
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if pulse == nil || pulse.Live(0) {
			beat()
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

// OwnerAlive returns nil while the owner is serving: the state word is not
// closed and the owner passes the liveness rule (see peerAlive: pid check
// when the pid namespace is shared, else a heartbeat younger than
// staleAfter, 0 meaning the value given to Attach). Otherwise it returns an
// error wrapping ErrClosed or ErrOwnerDead.
func (s *Segment) OwnerAlive(staleAfter time.Duration) error {
	if s.State() == StateClosed {
		return fmt.Errorf("shm: %s: %w", s.path, ErrClosed)
	}
	pid := get32(s.mem, hdrOwnerPid)
	if s.owner && pid == s.pid {
		return nil // we are the owner and we are running
	}
	if err := s.peerAlive(pid, get64(s.mem, hdrOwnerPidNS), atomic.LoadUint64(s.ownerHB), staleAfter); err != nil {
		return fmt.Errorf("shm: %s: %w: owner pid %d %v", s.path, ErrOwnerDead, pid, err)
	}
	return nil
}

// peerAlive applies the liveness rule to one peer. When the peer shares
// this process's pid namespace, a pid that has exited is dead at once; a
// live pid whose beats stopped for DefaultHungAfter is dead when the kernel
// says it is stopped or that every thread of it sleeps (its work loop waits
// for something that will not come, so its pulse stopped the beats), and
// otherwise (a thread runs or waits for a CPU: an overloaded host starves
// it, it is not hung) only after DefaultStarvedAfter. A peer in another
// namespace is judged by its heartbeat alone, with staleAfter (0: the
// segment's value). The returned error only says why; callers wrap it.
func (s *Segment) peerAlive(pid uint32, pidNS, heartbeat uint64, staleAfter time.Duration) error {
	if staleAfter <= 0 {
		staleAfter = s.stale
	}
	// A heartbeat from the future is as suspect as an old one: it is either
	// corrupt or written under another clock.
	age := time.Duration(monoNow() - int64(heartbeat))
	if pidNS != 0 && pidNS == s.pidNS {
		if !pidAlive(pid) {
			return errors.New("has exited")
		}
		hung := max(staleAfter, DefaultHungAfter)
		if age <= hung && age >= -hung {
			return nil
		}
		switch activity(pid) {
		case procBusy:
			if age <= DefaultStarvedAfter && age >= -DefaultStarvedAfter {
				return nil
			}
			return fmt.Errorf("heartbeat is %v old though it runs (limit %v)", age, DefaultStarvedAfter)
		case procStopped:
			return fmt.Errorf("is stopped, heartbeat %v old (limit %v)", age, hung)
		default:
			return fmt.Errorf("heartbeat is %v old and it sleeps (limit %v)", age, hung)
		}
	}
	if age > staleAfter || age < -staleAfter {
		return fmt.Errorf("heartbeat is %v old (limit %v)", age, staleAfter)
	}
	return nil
}

// ExecEstimate is one bucket's expected execution time (SetExecTime).
type ExecEstimate struct {
	Bucket int
	Time   time.Duration
}

// SetAccelerator records pid as the segment's accelerator. It fails with
// ErrAcceleratorPresent while another live accelerator holds the segment;
// a dead or detached one is replaced. The execution time estimates are
// published before the accelerator shows as running, so the embedder's
// first batch after it is planned with them.
func (s *Segment) SetAccelerator(pid int, exec ...ExecEstimate) error {
	// An attacher first needs the accelerator's memory from the broker,
	// which refuses while a live accelerator holds the segment.
	if s.cl != nil {
		if err := s.becomeAccelerator(pid); err != nil {
			return err
		}
	}
	cur := atomic.LoadUint32(s.accelPid)
	if cur != 0 && cur != uint32(pid) && atomic.LoadUint32(s.accelState) == accelRunning &&
		s.peerAlive(cur, atomic.LoadUint64(s.accelPidNS), atomic.LoadUint64(s.accelHB), 0) == nil {
		return fmt.Errorf("shm: %s: %w: pid %d", s.path, ErrAcceleratorPresent, cur)
	}
	if !atomic.CompareAndSwapUint32(s.accelPid, cur, uint32(pid)) {
		return fmt.Errorf("shm: %s: %w: lost the race to attach", s.path, ErrAcceleratorPresent)
	}
	// The accelerator is the batch doorbell's only waiter; a predecessor
	// killed in its sleep left its registration behind.
	s.batchBell.reset()
	// Namespace and heartbeat before the state, so a frontend that sees
	// "running" judges a fresh heartbeat.
	atomic.StoreUint64(s.accelPidNS, s.pidNS)
	for _, e := range exec {
		s.SetExecTime(e.Bucket, e.Time)
	}
	s.AcceleratorBeat()
	atomic.StoreUint32(s.accelState, accelRunning)
	s.isAccel.Store(true)
	return nil
}

// DetachAccelerator marks the accelerator gone after a clean shutdown, so
// frontends fail in-flight work at once instead of waiting for staleness.
// Close does it for a process that called SetAccelerator.
func (s *Segment) DetachAccelerator() {
	if s.isAccel.CompareAndSwap(true, false) {
		atomic.StoreUint32(s.accelState, accelGone)
	}
}

// AcceleratorBeat stamps the accelerator heartbeat.
func (s *Segment) AcceleratorBeat() { atomic.StoreUint64(s.accelHB, uint64(monoNow())) }

// AcceleratorHeartbeat beats as accelerator every interval while pulse is
// Live (nil: always) until ctx is done, and returns ctx's error.
func (s *Segment) AcceleratorHeartbeat(ctx context.Context, interval time.Duration, pulse *Pulse) error {
	return beatLoop(ctx, interval, pulse, s.AcceleratorBeat)
}

// AcceleratorAlive returns nil while an accelerator is running and alive,
// an error wrapping ErrNoAccelerator before one has attached, and an error
// wrapping ErrAcceleratorDead when it detached, exited or stopped beating.
func (s *Segment) AcceleratorAlive(staleAfter time.Duration) error {
	switch st := atomic.LoadUint32(s.accelState); st {
	case accelNone:
		return fmt.Errorf("shm: %s: %w", s.path, ErrNoAccelerator)
	case accelGone:
		return fmt.Errorf("shm: %s: %w: detached", s.path, ErrAcceleratorDead)
	case accelRunning:
	default:
		return fmt.Errorf("shm: %s: %w: accelerator state %d", s.path, ErrCorrupt, st)
	}
	pid := atomic.LoadUint32(s.accelPid)
	if err := s.peerAlive(pid, atomic.LoadUint64(s.accelPidNS), atomic.LoadUint64(s.accelHB), staleAfter); err != nil {
		return fmt.Errorf("shm: %s: %w: pid %d %v", s.path, ErrAcceleratorDead, pid, err)
	}
	return nil
}

// PeersAlive is the check a frontend runs while it waits: the owner must be
// alive, and so must the accelerator once one has attached.
func (s *Segment) PeersAlive() error {
	if err := s.OwnerAlive(0); err != nil {
		return err
	}
	if err := s.AcceleratorAlive(0); err != nil && !errors.Is(err, ErrNoAccelerator) {
		return err
	}
	return nil
}

// SetAcceleratorIdle publishes whether the accelerator is waiting for work,
// so the embedder can seal a batch early instead of waiting out its window.
func (s *Segment) SetAcceleratorIdle(idle bool) {
	var v uint32
	if idle {
		v = 1
	}
	if atomic.LoadUint32(s.accelIdle) != v {
		atomic.StoreUint32(s.accelIdle, v)
	}
}

// AcceleratorIdle reports the accelerator's idle word.
func (s *Segment) AcceleratorIdle() bool { return atomic.LoadUint32(s.accelIdle) != 0 }

// SetExecTime publishes the accelerator's expected execution time of a
// power-of-two bucket (0: unknown). Buckets beyond the table are ignored.
func (s *Segment) SetExecTime(bucket int, d time.Duration) {
	if i, ok := execIndex(bucket); ok {
		atomic.StoreUint64(s.execTable[i], uint64(max(d, 0)))
	}
}

// ExecTime is the expected execution time of a power-of-two bucket, 0 when
// the accelerator has not published one. The words are read from shared
// memory another process writes, so a value is only ever a prediction:
// callers bound what they do with it.
func (s *Segment) ExecTime(bucket int) time.Duration {
	if i, ok := execIndex(bucket); ok {
		return time.Duration(atomic.LoadUint64(s.execTable[i]))
	}
	return 0
}

func execIndex(bucket int) (int, bool) {
	if bucket < 1 || bucket&(bucket-1) != 0 {
		return 0, false
	}
	i := bits.TrailingZeros(uint(bucket))
	return i, i < ExecTableBuckets
}

// CompletedSeq is the seq of the last batch the accelerator finished.
func (s *Segment) CompletedSeq() uint64 { return atomic.LoadUint64(s.completed) }

// ExecutedSeq is the seq of the last batch the device finished executing
// (BatchReader.Executed); its completions may still be being written. At
// least CompletedSeq.
func (s *Segment) ExecutedSeq() uint64 {
	return max(atomic.LoadUint64(s.executed), atomic.LoadUint64(s.completed))
}

// PublishedSeq is the seq of the last batch the embedder published.
func (s *Segment) PublishedSeq() uint64 { return atomic.LoadUint64(s.batchTail) }

// EmbedderBell is the doorbell frontends ring after publishing a request.
func (s *Segment) EmbedderBell() *Doorbell { return s.embedder }

// BatchBell is the doorbell the embedder rings after publishing a batch.
func (s *Segment) BatchBell() *Doorbell { return s.batchBell }

// StagingBell is the doorbell the accelerator rings when it frees a
// staging buffer.
func (s *Segment) StagingBell() *Doorbell { return s.stagingBell }

// Close unmaps the segment. The owner first marks it closed, so attached
// processes fail at once rather than waiting for the heartbeat to go stale,
// and stops its broker; an accelerator marks itself detached. Close does
// not remove the socket (see Remove). Every handle made from s, and every
// slice it returned, is invalid afterwards: stop Heartbeat loops and the
// goroutines using handles first, because touching unmapped memory is a
// fatal fault, not an error.
func (s *Segment) Close() error {
	if s.mem == nil {
		return fmt.Errorf("shm: close %s: already closed", s.path)
	}
	_ = GuardFaults(func() error {
		if s.owner {
			for {
				st := atomic.LoadUint32(s.state)
				if st == uint32(StateClosed) || atomic.CompareAndSwapUint32(s.state, st, uint32(StateClosed)) {
					break
				}
			}
		}
		s.DetachAccelerator()
		if s.owner {
			s.mirrorAccel()
		}
		return nil
	})
	// No lane is remapped after these: the mapping can go.
	if s.br != nil {
		s.br.stop()
	}
	if s.cl != nil {
		s.cl.close()
	}
	s.mapMu.Lock()
	var err error
	if s.vm != nil {
		err = s.vm.release()
	} else {
		err = unix.Munmap(s.mem)
	}
	s.mem = nil
	s.mapMu.Unlock()
	if err != nil {
		return fmt.Errorf("shm: close %s: %w", s.path, err)
	}
	return nil
}

// Remove unlinks the segment's socket if the path still names it; a
// successor generation renamed over it is left alone. Mappings stay valid
// until each process closes its own.
func (s *Segment) Remove() error {
	var st unix.Stat_t
	if err := unix.Stat(s.path, &st); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return fmt.Errorf("shm: remove %s: %w", s.path, err)
	}
	if uint64(st.Dev) != s.dev || st.Ino != s.ino {
		return nil
	}
	if err := os.Remove(s.path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("shm: remove %s: %w", s.path, err)
	}
	return nil
}

// checkRoom refuses a reserved segment larger than the free space of its
// directory. Memfd pages are charged to the memory cgroup, not to the
// directory's filesystem, but deployments size the segment's directory
// for it (docker --shm-size, the Kubernetes emptyDir's sizeLimit): that
// stays the knob, and a segment that does not fit is an error at start
// naming it, as when the segment was a file there.
func checkRoom(dir string, z sizes, lanes int) error {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return fmt.Errorf("statfs %s: %w", dir, err)
	}
	need := int64(z.lane) * int64(lanes)
	for _, n := range z.shared {
		need += int64(n)
	}
	if st.Bavail == ^uint64(0) {
		return nil // no limit
	}
	if free := int64(st.Bavail) * st.Bsize; free < need {
		return fmt.Errorf("reserve %d bytes: %s has %d bytes free: %w", need, dir, free, unix.ENOSPC)
	}
	return nil
}
