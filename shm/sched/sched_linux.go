package sched

import (
	"errors"
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// BatchUsage is the usage text of the services' --sched-batch flag, which
// calls UseBatchScheduling.
const BatchUsage = "run this process's threads under SCHED_BATCH: the kernel then lets a running thread finish its work before it runs one it just woke, which saves the mesh a context switch per hand-off where its processes share cores; false keeps SCHED_OTHER"

// UseBatchScheduling moves every thread of the process to SCHED_BATCH, the
// policy for throughput work: the kernel then never preempts a running
// thread to run one it has just woken; the wakee runs when the current
// thread blocks or its slice ends. The mesh's processes wake each other
// for every request (frontend to embedder to accelerator and back), so
// where they share cores wake-up preemption turns each hand-off into a
// context switch that interrupts a process in the middle of a batch
// (figures in docs/design.md).
//
// Threads the Go runtime starts later inherit the policy from the thread
// that starts them; the walk is made twice, so a thread started from a
// not-yet-moved one during the first is caught by the second. Only the
// policy changes: the nice value stays, and no privilege is needed.
func UseBatchScheduling() error {
	for range 2 {
		tids, err := os.ReadDir("/proc/self/task")
		if err != nil {
			return fmt.Errorf("sched: list threads: %w", err)
		}
		for _, e := range tids {
			tid, err := strconv.Atoi(e.Name())
			if err != nil {
				continue
			}
			if err := batchThread(tid); err != nil {
				return err
			}
		}
	}
	return nil
}

func batchThread(tid int) error {
	attr, err := unix.SchedGetAttr(tid, 0)
	if errors.Is(err, unix.ESRCH) {
		return nil // the thread exited
	}
	if err != nil {
		return fmt.Errorf("sched: read thread %d's scheduling policy: %w", tid, err)
	}
	if attr.Policy != unix.SCHED_NORMAL {
		// Already batch, or a real-time or idle policy chosen
		// deliberately: keep it.
		return nil
	}
	set := unix.SchedAttr{Size: unix.SizeofSchedAttr, Policy: unix.SCHED_BATCH, Nice: attr.Nice}
	if err := unix.SchedSetAttr(tid, &set, 0); err != nil && !errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("sched: move thread %d to SCHED_BATCH: %w", tid, err)
	}
	return nil
}
