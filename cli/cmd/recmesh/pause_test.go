//go:build linux

package main

import (
	"context"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestReapOrphans starts a child that exits at once and checks that
// reapOrphans collects it (its /proc entry, a zombie's until reaped, goes),
// then returns when its context ends.
func TestReapOrphans(t *testing.T) {
	pid, err := syscall.ForkExec("/bin/true", []string{"true"}, &syscall.ProcAttr{})
	if err != nil {
		t.Skipf("cannot start /bin/true: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { reapOrphans(ctx); close(done) }()

	stat := "/proc/" + strconv.Itoa(pid) + "/stat"
	deadline := time.Now().Add(30 * time.Second)
	for {
		b, err := os.ReadFile(stat)
		if os.IsNotExist(err) {
			break // reaped
		}
		if time.Now().After(deadline) {
			t.Fatalf("child %d not reaped after 30 s: %s", pid, strings.TrimSpace(string(b)))
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("reapOrphans did not return after its context ended")
	}
}

func TestPauseRefusesArguments(t *testing.T) {
	code, _, stderr := runT(t, nil, "pause", "extra")
	if code == exitOK || !strings.Contains(stderr, "extra") {
		t.Errorf("pause extra: exit %d, stderr %q; want a usage error naming the argument", code, stderr)
	}
}
