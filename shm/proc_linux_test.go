package shm

import (
	"bytes"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"
)

// TestPidAlive: a running process is alive; one that has exited is dead
// both before its parent reaps it (a zombie, which kill(pid, 0) still
// finds) and after; and a check allocates next to nothing, since every
// process makes several a second.
func TestPidAlive(t *testing.T) {
	self := uint32(os.Getpid())
	if !pidAlive(self) {
		t.Fatal("this process is not alive")
	}
	if pidAlive(0) || pidAlive(1<<22+1) {
		t.Fatal("pid 0 or one past PID_MAX_LIMIT is alive")
	}
	cmd := exec.Command("true")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := uint32(cmd.Process.Pid)
	stat := "/proc/" + strconv.Itoa(cmd.Process.Pid) + "/stat"
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, err := os.ReadFile(stat)
		if err != nil {
			t.Fatal(err)
		}
		if i := bytes.LastIndexByte(b, ')'); i > 0 && b[i+2] == 'Z' {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("child %d never became a zombie: %s", pid, b)
		}
		time.Sleep(time.Millisecond)
	}
	if pidAlive(pid) {
		t.Errorf("zombie %d is alive", pid)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	if pidAlive(pid) {
		t.Errorf("reaped %d is alive", pid)
	}
	if n := testing.AllocsPerRun(100, func() { pidAlive(self) }); n > 2 {
		t.Errorf("pidAlive allocates %.0f times a call, want at most 2 (the path for the syscall)", n)
	}
}
