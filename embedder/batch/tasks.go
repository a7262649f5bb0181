package batch

import (
	"sync/atomic"
	"time"

	"github.com/recmesh/recmesh/shm"
)

// Task is one request a batch carries, as TF Serving's Batch<Task> holds
// its tasks: where its answer goes (lane, slot and epoch), its examples
// and their rows in the staging buffer, its deadline and trace context,
// and its outcome.
//
// The embedder decides a request's outcome here, in Fail, and nowhere
// else: every check it makes (the payload's decoding, the caller's cancel
// flag, the deadline, admission control, the lookups, the checks at seal)
// reports a failure through it. The first failure found stands, and a
// failed request carries no rows, only its status. The accelerator adds
// to it no more than a failure to run the batch or to deliver the scores,
// and the frontend reads it back; both only carry the outcome.
type Task struct {
	Lane, Slot int
	Epoch      uint32
	// Examples is how many examples the request asked for; FirstRow is
	// the first of its rows in the staging buffer, given by Batcher.Add.
	Examples, FirstRow int
	// Deadline is the caller's, unix ns (0: none); ReadAt is when the
	// embedder read the request from its lane.
	Deadline int64
	ReadAt   time.Time
	Trace    shm.TraceContext
	status   shm.Status
}

// Fail decides that the task failed with st, unless an earlier check
// failed it already: the first failure found stands. StatusOK changes
// nothing.
func (t *Task) Fail(st shm.Status) {
	if t.status == shm.StatusOK {
		t.status = st
	}
}

// OK reports whether nothing has failed the task so far.
func (t *Task) OK() bool { return t.status == shm.StatusOK }

// Status is the task's outcome so far.
func (t *Task) Status() shm.Status { return t.status }

// Rows is how many examples are looked up and run for the task: none once
// it has failed, when only its status needs delivering.
func (t *Task) Rows() int {
	if !t.OK() {
		return 0
	}
	return t.Examples
}

// Expired reports whether the task's deadline has passed at now.
func (t *Task) Expired(now time.Time) bool {
	return t.Deadline != 0 && now.UnixNano() > t.Deadline
}

// Entry is the task as the accelerator reads it from the batch's entries
// table.
func (t *Task) Entry() shm.BatchEntry {
	return shm.BatchEntry{Lane: t.Lane, Slot: t.Slot, Epoch: t.Epoch, FirstRow: t.FirstRow, Rows: t.Rows(), Status: t.status}
}

// Canceler reports whether the caller of the request in a lane's slot has
// given up on it (the frontend's cancel flag).
type Canceler interface {
	Canceled(lane, slot int) bool
}

// Tasks is the requests of one batch. The embedder keeps one per staging
// buffer, made once, so filling a batch allocates nothing. One goroutine
// adds and settles the tasks; the lookup workers report failures through
// LookupFailed meanwhile.
type Tasks struct {
	tasks []Task
	// lookup is what the lookups of each task found. The workers looking
	// up a request's chunks write it concurrently, so it is a word apart,
	// which Settle reads once they are done.
	lookup []atomic.Uint32
}

// NewTasks returns an empty Tasks for up to max requests (the Batcher's
// MaxEntries).
func NewTasks(max int) *Tasks {
	return &Tasks{tasks: make([]Task, 0, max), lookup: make([]atomic.Uint32, max)}
}

// Add appends t and returns its index.
func (ts *Tasks) Add(t Task) int {
	k := len(ts.tasks)
	ts.tasks = append(ts.tasks, t)
	ts.lookup[k].Store(uint32(shm.StatusOK))
	return k
}

// Len is how many tasks the batch holds.
func (ts *Tasks) Len() int { return len(ts.tasks) }

// At returns task k.
func (ts *Tasks) At(k int) *Task { return &ts.tasks[k] }

// Reset empties the batch for reuse.
func (ts *Tasks) Reset() { ts.tasks = ts.tasks[:0] }

// LookupFailed records that looking up some of task k's examples failed
// with st. It is safe to call from several goroutines at once.
func (ts *Tasks) LookupFailed(k int, st shm.Status) { ts.lookup[k].Store(uint32(st)) }

// Settle decides task k's outcome as its batch is sealed at now, once its
// lookups are done: a failed lookup fails it; otherwise a request whose
// deadline passed, or whose caller gave up, while it was batched is
// dropped before it runs. It reports whether a lookup failed the task.
func (ts *Tasks) Settle(k int, now time.Time, c Canceler) (lookupFailed bool) {
	t := &ts.tasks[k]
	if !t.OK() {
		return false
	}
	if st := shm.Status(ts.lookup[k].Load()); st != shm.StatusOK {
		t.Fail(st)
		return true
	}
	if t.Expired(now) {
		t.Fail(shm.StatusExpired)
	} else if c.Canceled(t.Lane, t.Slot) {
		t.Fail(shm.StatusCanceled)
	}
	return false
}
