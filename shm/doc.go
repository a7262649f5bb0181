// Package shm owns recmesh's shared-memory transport: the segment file that
// one embedder generation creates, the lanes that frontends claim in it, the
// single-producer single-consumer rings and slot tables inside each lane, the
// staging buffers and batch ring between the embedder and the accelerator,
// the futex doorbells that wake sleeping consumers, and the liveness rules
// (heartbeats, pid checks, lane reclaim) that keep a dead process from
// hanging the others. It also owns how a mesh process counts the CPUs it
// may use (UsableCPUs: affinity mask and cgroup quota), since how its
// waiters wait follows from it; the accelerator sizes XLA's threads by
// the same count.
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
// [CompletionWriter]. A handle is not safe for concurrent use: its owner
// serialises calls, because a ring side is single-threaded by design.
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
// namespace is judged by its heartbeat alone (DefaultStaleAfter). A frontend
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
// Every process that maps a segment can write any byte of it. Each value
// read from shared memory is therefore validated before it is used as an
// index, offset or length; a corrupt or hostile value makes the reader
// return an error wrapping [ErrCorrupt] (or a more specific sentinel) and
// never makes it panic or read outside the mapping. No Go pointer is ever
// stored in shared memory: it holds only integers and bytes.
//
// What a misbehaving frontend can do, and what contains it:
//
//   - Corrupt its own lane's words: the embedder's reader rejects the
//     entry, and a ring whose counters cannot be trusted gets the lane
//     evicted (Segment.EvictLane); the frontend's own reader gives up a
//     completion ring that keeps yielding corrupt entries and attaches
//     anew. Other lanes are untouched.
//   - Truncate or shrink the file: every goroutine that touches a mapping
//     runs under GuardFaults, so the resulting SIGBUS is an ErrSegmentLost
//     error for that goroutine, never a crash; the owner also checks the
//     file's size (CheckFile) and replaces the generation, and everyone
//     attaches to the next one. In-flight calls of that generation fail
//     UNAVAILABLE.
//   - Plant a file or a symbolic link at the path: the segment is created
//     O_EXCL|O_NOFOLLOW and opened O_NOFOLLOW, and a file of another owner,
//     writable by others or not regular is refused (ErrUnsafeFile).
//   - Stop beating or hang: heartbeats stand for the work loops (Pulse),
//     so a stuck process is declared hung, not just a dead one.
//
// Processes of the same user can still write any word of the header, the
// batch ring or the staging buffers, which the embedder and the
// accelerator alone should: such corruption is detected (validation,
// ErrState) and ends the generation, which is replaced, but it is not
// confined to the offender's lane. A hard boundary there needs the
// frontends to run as another user with those regions mapped read-only,
// which this layout (one file) does not yet allow; see docs/security.md.
//
// # Platform
//
// The package is Linux-only: doorbells are shared futexes, liveness reads
// /proc, and segments live in /dev/shm or a hugetlbfs mount.
//
// The memory layout is documented in one place, layout.go.
package shm
