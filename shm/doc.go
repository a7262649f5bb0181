// Package shm owns recmesh's shared-memory transport: the segment that one
// embedder generation creates (sealed memfds, handed out over a unix
// socket by the owner's broker), the lanes frontends are assigned in it, the
// single-producer single-consumer rings and slot tables inside each lane, the
// staging buffers and batch ring between the embedder and the accelerator,
// the futex doorbells that wake sleeping consumers, and the liveness rules
// (heartbeats, pid checks, lane reclaim) that keep a dead process from
// hanging the others. How many CPUs a process may use, which decides
// whether its waiters spin, is counted by package shm/sched.
//
// The package knows nothing about models: payloads and staging buffers are
// bytes whose meaning the embedder and accelerator agree on. Its only
// knowledge of request sizes is the pair of geometry values MaxExamples and
// ExampleBytes, which size the lane arenas.
//
// # Roles
//
// Every ring has exactly one producer and one consumer, each a fixed role:
//
//	ring               producer      consumer      doorbell rung by producer
//	lane requests      frontend      embedder      segment embedder bell
//	lane completions   accelerator   frontend      lane bell
//	batches            embedder      accelerator   segment batch bell
//	staging release    accelerator   embedder      segment staging bell
//
// The handle types follow the roles: a frontend uses [Lane]; the embedder
// (the segment owner) uses [RequestReader], [BatchWriter] and
// [Segment.ReclaimLanes]; the accelerator uses [BatchReader] and
// [CompletionWriter]. The ring sides are single-threaded by design, so the
// reader and writer handles are not safe for concurrent use: their owner
// serialises calls. [Lane] is the one exception, shared by a frontend's
// callers and its completion reader; its documentation states the
// contract.
//
// The accelerator is the only writer of completions. When the embedder
// drops a request (cancelled, expired, invalid), it still carries it in a
// batch entry, with Rows 0 and a nonzero Status, and the accelerator
// completes it with that status; so the completion ring stays
// single-producer and every committed request gets exactly one completion.
//
// # Liveness
//
// The owner, the accelerator and every lane beat a heartbeat
// (CLOCK_MONOTONIC ns) and record their pid and pid namespace. A peer in the
// same pid namespace is dead as soon as its pid has exited (or is a zombie)
// and, if alive, after DefaultHungAfter without a beat; a peer in another
// namespace is judged by its heartbeat (DefaultStaleAfter), but while the
// kernel holds its broker connection open (the owner's, as each attacher
// sees its own; the accelerator's, which the owner publishes) the process
// exists, and it is judged hung only after DefaultHungAfter: a node too
// busy starting pods to run it for a few beats must not end a generation. A frontend
// waiting for a completion re-checks every DefaultLivenessTick, so in-flight
// work fails within 100 ms of the embedder or accelerator dying. A clean
// Close marks the segment closed (owner) or the accelerator detached, which
// waiters see at once.
//
// A lane whose frontend died or released it with work in flight is
// reclaimed by the embedder (Segment.ReclaimLanes): marked draining, its
// queued requests dropped, then freed, with a new epoch, once no batch in
// flight can still write into its arena. Ring counters are never reset;
// reclaim empties a ring by moving its head to its tail, so cached counters
// in other processes stay valid. Epochs in every entry keep work of a
// previous owner from reaching the next one.
//
// A new generation is a new segment renamed over the same path (Create);
// the old one is marked draining and stays mapped by the processes that
// hold it until they finish their in-flight work and close it.
//
// # Trust
//
// The segment is built so that a frontend can corrupt at most its own
// lane. The owner creates it from several memfds and serves them over the
// unix socket at the segment path (broker.go); each process gets the
// memory its role may touch and no more (memfd.go has the table):
//
//   - A frontend gets the header read-only, the bell page (the embedder
//     doorbell's futex word) and, per ClaimLane, one lane memfd chosen by
//     the broker. It never receives the batch ring, the staging buffers,
//     the accelerator's words or another lane. Every process maps the
//     segment as one contiguous image (reserved PROT_NONE, pieces mapped
//     MAP_FIXED), so offsets mean the same everywhere and a region a
//     process was not given faults: GuardFaults turns that into
//     ErrSegmentLost, and mprotect can only turn it into private memory.
//   - Every memfd is sealed against shrinking and growing: no process can
//     truncate the segment under another's mapping. The header is also
//     sealed against new writable mappings once the owner has mapped it,
//     which closes the last route to it (reopening the descriptor
//     read-write through /proc/self/fd). The accelerator's words live in
//     their own page, which the owner copies into the header at every
//     beat for the frontends to read.
//   - A lane that changes hands gets a fresh memfd, mapped by the
//     accelerator (which acknowledges) and then by the owner, before the
//     next frontend receives it: a fenced frontend that lives on keeps a
//     mapping nobody else reads.
//   - Create and Attach make the process non-dumpable, so processes of the
//     same user cannot take its descriptors or memory through /proc or
//     ptrace (setUndumpable).
//
// Within its lane a frontend can still write any word, any time. Each
// value read from shared memory is therefore validated before it is used
// as an index, offset or length; a corrupt or hostile value makes the
// reader return an error wrapping [ErrCorrupt] (or a more specific
// sentinel) and never makes it panic or read outside the mapping. No Go
// pointer is ever stored in shared memory: it holds only integers and
// bytes. A ring whose counters cannot be trusted gets the lane evicted
// (Segment.EvictLane): its in-flight calls fail (ErrLaneLost), and the
// frontend attaches anew; the frontend's own reader gives up a completion
// ring that keeps yielding corrupt entries the same way. The bell page is
// the one shared page a frontend writes: bumping or clearing its futex
// word costs the embedder spurious or late wake-ups (latency, bounded by
// its wait timeout), never data, because the waiter count ringers trust is
// in the header.
//
// The path is checked before connecting (no symbolic link, a socket of
// the trusted user, not writable by others) and the broker after
// (SO_PEERCRED of that user; memfds sealed): ErrUnsafeFile otherwise. The
// trusted user is the attacher's own, or the embedder's for a frontend of
// another user (AttachOptions.OwnerUID). The broker records
// the pid the kernel reports for each peer, grants the accelerator's
// memfds only to a peer of its own uid while no live accelerator holds the
// segment, and takes a drain request only from its own process.
//
// Heartbeats stand for the work loops (Pulse), so a stuck process is
// declared hung, not just a dead one. GuardFaults stays as the last line:
// every goroutine that touches a mapping runs under it.
//
// What the same user can still do outside shared memory (signal the
// embedder, replace the socket at the path, ask for the accelerator role
// while none is attached) the kernel and the broker refuse to frontends
// running as another user, in a group a 0660 socket admits, that name the
// embedder's uid (OwnerUID); see docs/security.md.
//
// # Platform
//
// The package is Linux-only: segments are memfds (huge pages when the
// segment directory is a hugetlbfs mount), doorbells shared futexes,
// liveness reads /proc.
//
// The memory layout is documented in one place, layout.go, with the
// records it places in records.go and counters.go (the counters record:
// each lane's served and missed calls, the accelerator's execution
// estimates, one described block of atomic words in each place).
package shm
