package shm

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// This file holds the Segment type and its life: Create, Attach, the views
// built over a mapped image, and Close. What each role does with a segment
// is in its own file: owner.go (the embedder's words), accelerator.go (the
// accelerator's) and liveness.go (how each judges the others).

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
	exec        counterBlock // execution estimates record, in the accelerator page
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

// create is Create at a checked path. The memfds are made, mapped,
// initialised and sealed before the socket is renamed into place, and all
// of it is undone on any failure.
func create(path string, o Options) (*Segment, error) {
	lay, blk, err := prepareCreate(o)
	if err != nil {
		return nil, err
	}
	gen, err := nextGeneration(path, o.Generation)
	if err != nil {
		return nil, err
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
	b := newBroker(o, blk, z)
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
	if err := b.makeMemfds(o.Geometry.Lanes); err != nil {
		return nil, err
	}
	if vm, err = reserveVM(z.vm, lay.stagingData); err != nil {
		return nil, err
	}
	if err := mapImage(vm, lay, z, b, o.Geometry); err != nil {
		return nil, err
	}
	s := initOwner(path, vm, lay, gen, o)
	if err := b.sealMemfds(); err != nil {
		return nil, err
	}
	if ln, tmp, err = listenSegmentSocket(filepath.Dir(path), filepath.Base(path), o.Mode); err != nil {
		return nil, err
	}
	if err := s.publish(b, ln, tmp); err != nil {
		return nil, err
	}
	ok = true
	return s, nil
}

// prepareCreate checks what Create is asked for, makes the directory, and
// returns the layout and the staging memfd's page size. It makes the
// process non-dumpable (setUndumpable) before any memory is made.
func prepareCreate(o Options) (layout, int, error) {
	if len(o.ModelID) > ModelIDBytes {
		return layout{}, 0, fmt.Errorf("model id longer than %d bytes", ModelIDBytes)
	}
	lay, err := computeLayout(o.Geometry)
	if err != nil {
		return layout{}, 0, err
	}
	if o.Mode.Perm()&0o002 != 0 {
		return layout{}, 0, fmt.Errorf("%w: mode %v is writable by every user, and attach refuses such a segment", ErrUnsafeFile, o.Mode.Perm())
	}
	if err := ensureDir(o.Dir, o.Mode); err != nil {
		return layout{}, 0, err
	}
	// Huge pages when the directory is a hugetlbfs mount, as when the
	// segment was a file there: the staging buffers, the one large region
	// a device reads, get them.
	blk, err := fsBlock(o.Dir)
	if err != nil {
		return layout{}, 0, fmt.Errorf("statfs: %w", err)
	}
	if err := setUndumpable(); err != nil {
		return layout{}, 0, err
	}
	return lay, blk, nil
}

// nextGeneration is the generation a new segment at path gets: want, or
// one past the generation already there when want is 0. A generation not
// newer than the one at the path is refused (ErrGeneration).
func nextGeneration(path string, want uint64) (uint64, error) {
	prev := existingGeneration(path)
	gen := want
	switch {
	case gen == 0:
		gen = prev + 1
	case gen <= prev:
		return 0, fmt.Errorf("%w: generation %d is not newer than %d already at the path", ErrGeneration, gen, prev)
	}
	return gen, nil
}

// newBroker makes the owner's broker, holding no memfd yet.
func newBroker(o Options, blk int, z sizes) *broker {
	b := &broker{reserve: o.Reserve, block: blk, z: z, accel: map[*brokerConn]bool{}, conns: map[*brokerConn]bool{},
		claims: map[peerKey][]laneClaim{}, key: o.AcceleratorKey, maxLanes: o.MaxLanesPerPeer}
	for i := range b.fds {
		b.fds[i] = -1
	}
	return b
}

// makeMemfds makes the shared memfds and one per lane, at the sizes of
// b.z. On failure the caller closes the ones made.
func (b *broker) makeMemfds(lanes int) error {
	names := [numShared]string{"recmesh-header", "recmesh-bell", "recmesh-core", "recmesh-staging"}
	for i := range b.fds {
		block := PageSize
		if i == fdStaging {
			block = b.block
		}
		var err error
		if b.fds[i], err = newMemfd(names[i], b.z.shared[i], block, b.reserve); err != nil {
			return err
		}
	}
	for i := 0; i < lanes; i++ {
		fd, err := newMemfd(fmt.Sprintf("recmesh-lane-%d", i), b.z.lane, PageSize, b.reserve)
		if err != nil {
			return err
		}
		b.lanes = append(b.lanes, fd)
	}
	b.dirty = make([]bool, lanes)
	return nil
}

// mapImage maps every memfd of b, read-write, at its place in the
// reserved image.
func mapImage(vm *vmRange, lay layout, z sizes, b *broker, g Geometry) error {
	for _, p := range lay.sharedPieces(z) {
		if err := vm.mapFixed(p.off, p.n, b.fds[p.kind], p.fdOff, true); err != nil {
			return err
		}
	}
	for i, fd := range b.lanes {
		for _, p := range lay.lanePieces(i, g) {
			if err := vm.mapFixed(p.off, p.n, fd, p.fdOff, true); err != nil {
				return err
			}
		}
	}
	return nil
}

// initOwner writes the header of the mapped image and builds the owner's
// Segment over it, beating and ready.
func initOwner(path string, vm *vmRange, lay layout, gen uint64, o Options) *Segment {
	mem := vm.bytes(lay.total)
	writeSegmentHeader(mem, o, lay, gen, lay.total)
	s := newSegment(path, mem, o.Geometry, lay, gen, o.ModelID, DefaultStaleAfter)
	s.vm = vm
	s.owner = true
	put32(mem, hdrOwnerPid, s.pid)
	put64(mem, hdrOwnerPidNS, s.pidNS)
	s.Beat()
	atomic.StoreUint32(s.state, uint32(StateReady))
	return s
}

// sealMemfds seals every memfd. It comes once the owner's writable mapping
// of the header exists: the header's seal keeps it the only one.
func (b *broker) sealMemfds() error {
	for i, fd := range b.fds {
		seals := baseSeals
		if i == fdHeader {
			seals |= unix.F_SEAL_FUTURE_WRITE
		}
		if err := seal(fd, seals); err != nil {
			return err
		}
	}
	for _, fd := range b.lanes {
		if err := seal(fd, baseSeals); err != nil {
			return err
		}
	}
	return nil
}

// publish hands the complete segment to b and renames the socket bound at
// tmp over s.path, where attachers find it; a segment of this process
// already there is told to drain first.
func (s *Segment) publish(b *broker, ln *wireConn, tmp string) error {
	var st unix.Stat_t
	if err := unix.Stat(tmp, &st); err != nil {
		return err
	}
	s.dev, s.ino = uint64(st.Dev), st.Ino
	b.s, b.ln = s, ln
	s.br = b
	markDraining(s.path)
	if err := os.Rename(tmp, s.path); err != nil {
		return err
	}
	b.start()
	return nil
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
		batchTail:   word64(mem, lay.batchRing+ringTail),
		embedder:    newSplitDoorbell(mem, lay.bell+bellWord, hdrEmbedderBell+bellWaiters),
		batchBell:   newDoorbell(mem, acc+hdrBatchBell),
		stagingBell: newDoorbell(mem, acc+hdrStagingBell),
	}
	s.useAccelPage()
	s.exec = newCounterBlock(mem, acc+hdrExecTable, &execCounterRecord)
	s.lanes = make([]laneCtl, g.Lanes)
	for i := range s.lanes {
		s.lanes[i] = s.newLaneCtl(i)
	}
	s.staging = s.newStagings()
	return s
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
