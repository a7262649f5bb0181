package batch

import (
	"sync"
	"testing"
	"time"

	"github.com/recmesh/recmesh/shm"
)

// cancelFlags is a Canceler over a set of canceled slots of lane 0.
type cancelFlags map[int]bool

func (c cancelFlags) Canceled(lane, slot int) bool { return lane == 0 && c[slot] }

// TestTaskFirstFailureStands: a task's outcome is its first failure, and a
// failed task carries no rows.
func TestTaskFirstFailureStands(t *testing.T) {
	task := Task{Lane: 1, Slot: 2, Epoch: 3, Examples: 4, FirstRow: 5}
	task.Fail(shm.StatusOK)
	if !task.OK() || task.Rows() != 4 {
		t.Fatalf("StatusOK failed the task: status %v, rows %d", task.Status(), task.Rows())
	}
	task.Fail(shm.StatusCanceled)
	task.Fail(shm.StatusExpired)
	if task.Status() != shm.StatusCanceled || task.Rows() != 0 {
		t.Fatalf("status %v rows %d, want the first failure (canceled) and no rows", task.Status(), task.Rows())
	}
	want := shm.BatchEntry{Lane: 1, Slot: 2, Epoch: 3, FirstRow: 5, Rows: 0, Status: shm.StatusCanceled}
	if e := task.Entry(); e != want {
		t.Fatalf("entry %+v, want %+v", e, want)
	}
}

// TestTasksSettle: at seal a failed lookup decides the outcome first, then
// the deadline, then the caller's cancel flag; a task that failed before
// lookup keeps its outcome.
func TestTasksSettle(t *testing.T) {
	now := t0
	ts := NewTasks(8)
	ok := ts.Add(Task{Slot: 0, Examples: 1})
	badID := ts.Add(Task{Slot: 1, Examples: 1, Deadline: now.Add(-time.Second).UnixNano()})
	expired := ts.Add(Task{Slot: 2, Examples: 1, Deadline: now.Add(-time.Second).UnixNano()})
	canceled := ts.Add(Task{Slot: 3, Examples: 1, Deadline: now.Add(time.Second).UnixNano()})
	shed := ts.Add(Task{Slot: 4, Examples: 1})
	ts.At(shed).Fail(shm.StatusOverloaded)
	ts.LookupFailed(badID, shm.StatusInvalid)
	ts.LookupFailed(shed, shm.StatusInternal) // not looked up: ignored
	flags := cancelFlags{2: true, 3: true}
	want := []struct {
		k            int
		status       shm.Status
		lookupFailed bool
	}{
		{ok, shm.StatusOK, false},
		{badID, shm.StatusInvalid, true},
		{expired, shm.StatusExpired, false},
		{canceled, shm.StatusCanceled, false},
		{shed, shm.StatusOverloaded, false},
	}
	for _, w := range want {
		if got := ts.Settle(w.k, now, flags); got != w.lookupFailed || ts.At(w.k).Status() != w.status {
			t.Errorf("task %d: status %v, lookup failed %v; want %v, %v", w.k, ts.At(w.k).Status(), got, w.status, w.lookupFailed)
		}
	}
	if ts.Len() != len(want) {
		t.Fatalf("Len %d, want %d", ts.Len(), len(want))
	}
	ts.Reset()
	if k := ts.Add(Task{Examples: 2}); k != 0 || ts.Settle(k, now, flags) || !ts.At(k).OK() {
		t.Fatal("a reused slot kept the lookup failure of its last task")
	}
}

// TestTasksLookupFailedConcurrently: the workers of one request report at
// once (run with -race).
func TestTasksLookupFailedConcurrently(t *testing.T) {
	ts := NewTasks(1)
	k := ts.Add(Task{Examples: 64})
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ts.LookupFailed(k, shm.StatusInvalid)
		}()
	}
	wg.Wait()
	if !ts.Settle(k, t0, cancelFlags{}) || ts.At(k).Status() != shm.StatusInvalid {
		t.Fatalf("status %v after the workers failed it", ts.At(k).Status())
	}
}

// TestModeQuestions: what each mode answers the embedder.
func TestModeQuestions(t *testing.T) {
	for _, c := range []struct {
		m                                     Mode
		sealsOnIdle, predicts, sheds, follows bool
	}{
		{None, false, false, false, false},
		{Model, true, false, false, false},
		{Full, false, false, false, false},
		{SLO, true, true, true, true},
	} {
		if c.m.SealsOnIdle() != c.sealsOnIdle || c.m.Predicts() != c.predicts || c.m.Sheds() != c.sheds || c.m.FollowsFeedback() != c.follows {
			t.Errorf("%v: seals on idle %v, predicts %v, sheds %v, follows feedback %v", c.m,
				c.m.SealsOnIdle(), c.m.Predicts(), c.m.Sheds(), c.m.FollowsFeedback())
		}
	}
}
