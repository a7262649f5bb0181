package sched

import (
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestUseBatchScheduling runs in a child process, so this test binary's
// threads keep their policy; the child moves itself, starts more threads,
// and checks every one of them.
func TestUseBatchScheduling(t *testing.T) {
	if os.Getenv("SHM_SCHED_CHILD") == "1" {
		if err := UseBatchScheduling(); err != nil {
			t.Fatal(err)
		}
		// New threads: locked goroutines force the runtime to start them.
		release := make(chan struct{})
		started := make(chan struct{})
		for range 4 {
			go func() {
				runtime.LockOSThread()
				started <- struct{}{}
				<-release
			}()
		}
		for range 4 {
			<-started
		}
		defer close(release)
		tids, err := os.ReadDir("/proc/self/task")
		if err != nil {
			t.Fatal(err)
		}
		if len(tids) < 5 {
			t.Fatalf("only %d threads", len(tids))
		}
		for _, e := range tids {
			tid, _ := strconv.Atoi(e.Name())
			attr, err := unix.SchedGetAttr(tid, 0)
			if err != nil {
				t.Fatal(err)
			}
			if attr.Policy != unix.SCHED_BATCH {
				t.Errorf("thread %d: policy %d, want SCHED_BATCH (%d)", tid, attr.Policy, unix.SCHED_BATCH)
			}
		}
		return
	}
	before, err := unix.SchedGetAttr(0, 0)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestUseBatchScheduling$", "-test.v")
	cmd.Env = append(os.Environ(), "SHM_SCHED_CHILD=1")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS") {
		t.Fatalf("child: %v\n%s", err, out)
	}
	// This process was left alone.
	attr, err := unix.SchedGetAttr(0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if attr.Policy != before.Policy {
		t.Fatalf("the test process's policy changed from %d to %d", before.Policy, attr.Policy)
	}
}
