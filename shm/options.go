package shm

import (
	"os"
	"time"
)

// Defaults. Each is what a single-node recmesh deployment needs; Options
// fields override them.
const (
	// DefaultDir holds segment files. A hugetlbfs mount works as well: the
	// file is then sized in whole huge pages.
	DefaultDir = "/dev/shm"

	// DefaultSegment is the segment file's name in DefaultDir: the one
	// name the embedder creates and the accelerator and frontends attach
	// to unless told otherwise.
	DefaultSegment = "recmesh"

	// DefaultLanes is the number of frontends one embedder serves at once.
	DefaultLanes = 8
	// DefaultRingCapacity entries per ring: four times the slots, so a
	// frontend never finds its request ring full before it runs out of slots.
	DefaultRingCapacity = 4096
	// DefaultSlotsPerLane bounds the requests one frontend has in flight:
	// a frontend alone on a core answered 18,700 calls/s of B_req 1 with a
	// p99 near 18 ms, and 256 slots (what one frontend had before) ran out
	// in its bursts and refused 89 calls with RESOURCE_EXHAUSTED; 1,024
	// hold 20 ms of 50,000 calls/s. A slot header is 128 bytes.
	DefaultSlotsPerLane = 1024
	// DefaultMaxExamples is the largest request, in examples (the serving
	// max batch).
	DefaultMaxExamples = 4096
	// DefaultExampleBytes is the request payload per example of the
	// DLRM-DCNv2 model recmesh serves: 13 float32 dense features and 214
	// int32 row ids (the 26 multi-hot bags). The package does not interpret
	// payloads; the value only sizes arenas.
	DefaultExampleBytes = (13 + 214) * 4
	// DefaultArenaBytes per lane: room for about eight requests of
	// DefaultMaxExamples (3.6 MiB each with scores) in flight, many more
	// small ones. Tmpfs allocates pages only when touched.
	DefaultArenaBytes = 32 << 20
	// DefaultStagingCount staging buffers: two, so the embedder fills batch
	// k+1 while the accelerator executes batch k.
	DefaultStagingCount = 2
	// DefaultStagingBytes per staging buffer: a 4096-example batch of rows
	// up to 16 KiB each. The embedder sets it from its row width.
	DefaultStagingBytes = 64 << 20
	// DefaultMaxBatchEntries is the most requests one batch carries.
	DefaultMaxBatchEntries = 4096

	// DefaultHeartbeatInterval is how often owner, accelerator and
	// frontends beat. Beats are cheap (one clock read, one store); a short
	// interval lets DefaultStaleAfter tolerate several missed beats.
	DefaultHeartbeatInterval = 20 * time.Millisecond
	// DefaultStaleAfter is the heartbeat age after which the owner or the
	// accelerator counts as dead when its pid cannot be checked (it lives in
	// another pid namespace): four missed beats, and with
	// DefaultLivenessTick still inside the 100 ms detection budget. When the
	// pid can be checked, an exited process is noticed at the next tick
	// and DefaultHungAfter applies to a live one.
	DefaultStaleAfter = 80 * time.Millisecond
	// DefaultHungAfter is the heartbeat age after which a peer whose pid is
	// still alive counts as dead (stopped, deadlocked). It is long because a
	// live process can miss beats for reasons that pass: CFS throttling
	// stalls a container for up to a quota period, and a loaded machine
	// delays any thread; declaring it dead would fail all in-flight work.
	DefaultHungAfter = time.Second
	// DefaultStarvedAfter is the heartbeat age after which a live peer
	// counts as dead even though the kernel says it runs or waits for a
	// CPU: a loop spinning without progress looks busy too. A starved
	// process on an overloaded host beats again long before it.
	DefaultStarvedAfter = 5 * time.Second
	// DefaultMaxLanesPerPeer is how many lanes one process may hold: a
	// frontend needs one, and one that claimed them all would lock out
	// every restarted or newly scaled peer.
	DefaultMaxLanesPerPeer = 1
	// DefaultLaneStaleAfter is the heartbeat age after which the embedder
	// reclaims a lane whose owner pid it cannot check (another pid
	// namespace) or that stopped beating. Longer than DefaultStaleAfter
	// because a wrong reclaim costs the frontend all its in-flight work,
	// while a late one only holds a lane a little longer.
	DefaultLaneStaleAfter = time.Second
	// DefaultLivenessTick bounds a futex sleep, so sleepers re-check peer
	// liveness and context cancellation at least this often.
	DefaultLivenessTick = 10 * time.Millisecond
	// DefaultSpin is how long a waiter spins before it sleeps on the futex:
	// long enough to catch a reply that is already on its way (a round trip
	// is about a microsecond), short enough not to burn a core when idle.
	DefaultSpin = 20 * time.Microsecond
	// DefaultMode is the segment file's permission: processes of the same
	// user only.
	DefaultMode os.FileMode = 0o600
)

// Options configures Create. Zero values take the defaults above.
type Options struct {
	// Name is the segment file's name inside Dir (no slashes).
	Name string
	// Dir is the directory the file lives in; default DefaultDir. Create
	// makes it when it does not exist (its parent must), owned by this
	// process and writable by it alone (dirMode): no other user can then
	// remove or replace the socket in it, which a directory that others
	// may write and that is not sticky (a Kubernetes emptyDir) allows.
	Dir string
	// Generation of the new segment. 0 picks one more than the generation of
	// the segment currently at the path (1 if none). A path's generation
	// never goes backwards: a value not above the current one is refused.
	Generation uint64
	// ModelID names the model the segment serves (at most ModelIDBytes).
	ModelID string
	// Mode is the file permission; default DefaultMode.
	Mode os.FileMode
	// Reserve allocates the whole file up front (fallocate). Without it,
	// tmpfs allocates pages on first touch and a full /dev/shm turns that
	// touch into SIGBUS; with it, Create fails instead, at the cost of
	// committing all the memory at start.
	Reserve bool
	// AcceleratorKey, when set, is a secret the accelerator must present
	// to be given the accelerator's memory (AttachOptions.AcceleratorKey).
	// Give it to the accelerator alone: where frontends run as the same
	// user as the embedder, it is what keeps a compromised frontend from
	// taking the accelerator's place while none is attached.
	AcceleratorKey []byte
	// MaxLanesPerPeer is the most lanes one process may hold at once;
	// default DefaultMaxLanesPerPeer.
	MaxLanesPerPeer int
	// Geometry is the segment's shape; zero fields take the defaults.
	Geometry
}

func (o Options) withDefaults() Options {
	if o.MaxLanesPerPeer <= 0 {
		o.MaxLanesPerPeer = DefaultMaxLanesPerPeer
	}
	if o.Dir == "" {
		o.Dir = DefaultDir
	}
	if o.Mode == 0 {
		o.Mode = DefaultMode
	}
	o.Geometry = o.Geometry.withDefaults()
	return o
}

func (g Geometry) withDefaults() Geometry {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&g.Lanes, DefaultLanes)
	def(&g.RingCapacity, DefaultRingCapacity)
	def(&g.SlotsPerLane, DefaultSlotsPerLane)
	def(&g.ArenaBytes, DefaultArenaBytes)
	def(&g.StagingCount, DefaultStagingCount)
	def(&g.StagingBytes, DefaultStagingBytes)
	def(&g.MaxBatchEntries, DefaultMaxBatchEntries)
	def(&g.MaxExamples, DefaultMaxExamples)
	def(&g.ExampleBytes, DefaultExampleBytes)
	return g
}

// AttachOptions says what an attacher expects of the segment it opens.
type AttachOptions struct {
	// Generation, when not 0, must equal the segment's generation.
	Generation uint64
	// ModelID, when not empty, must equal the segment's model id.
	ModelID string
	// StaleAfter is the heartbeat age after which the owner and the
	// accelerator count as dead; default DefaultStaleAfter.
	StaleAfter time.Duration
	// OwnerUID is the user the segment's socket and broker must belong
	// to, for a frontend that runs as another user than the embedder: it
	// then cannot signal the embedder, replace its socket or be given the
	// accelerator's memory. 0: this process's own user (any user when
	// this process is root). Root cannot be named: an embedder running as
	// root has no business serving frontends of other users.
	OwnerUID int
	// AcceleratorKey is the segment's accelerator key (Options), which
	// SetAccelerator presents; frontends leave it empty.
	AcceleratorKey []byte
}
