package shm

import (
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// startPeer starts a child process running sh -c script, killed at the
// end of the test.
func startPeer(t *testing.T, script string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("sh", "-c", script)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return cmd
}

// waitActivity waits until the kernel reports pid doing want.
func waitActivity(t *testing.T, pid uint32, want procActivity) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for activity(pid) != want {
		if time.Now().After(deadline) {
			t.Fatalf("pid %d: activity %d, want %d", pid, activity(pid), want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestPeerAliveJudgesByActivity: a live peer in this pid namespace whose
// beats are late is judged by what the kernel says it does. One whose
// threads all sleep, or that is stopped, is hung after DefaultHungAfter;
// one that runs (an overloaded host starves it) only after
// DefaultStarvedAfter; one that exited is dead at once.
func TestPeerAliveJudgesByActivity(t *testing.T) {
	s := newQuietSegment(t, testGeometry())
	ns := s.pidNS
	late := func(d time.Duration) uint64 { return uint64(monoNow() - int64(d)) }

	sleeper := startPeer(t, "exec sleep 600")
	sp := uint32(sleeper.Process.Pid)
	waitActivity(t, sp, procIdle)
	if err := s.peerAlive(sp, ns, late(DefaultHungAfter/2), 0, linkNone); err != nil {
		t.Fatalf("a sleeping peer within DefaultHungAfter: %v", err)
	}
	if err := s.peerAlive(sp, ns, late(2*DefaultHungAfter), 0, linkNone); err == nil {
		t.Fatal("a sleeping peer 2 s behind on beats is alive, want hung")
	}

	busy := startPeer(t, "while :; do :; done")
	bp := uint32(busy.Process.Pid)
	waitActivity(t, bp, procBusy)
	if err := s.peerAlive(bp, ns, late(2*DefaultHungAfter), 0, linkNone); err != nil {
		t.Fatalf("a running peer 2 s behind on beats: %v, want alive (starved, not hung)", err)
	}
	if err := s.peerAlive(bp, ns, late(DefaultStarvedAfter+time.Second), 0, linkNone); err == nil {
		t.Fatal("a running peer past DefaultStarvedAfter is alive, want dead")
	}
	if err := busy.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	waitActivity(t, bp, procStopped)
	if err := s.peerAlive(bp, ns, late(2*DefaultHungAfter), 0, linkNone); err == nil {
		t.Fatal("a stopped peer 2 s behind on beats is alive, want dead")
	}
	_ = busy.Process.Signal(syscall.SIGCONT)

	_ = sleeper.Process.Kill()
	_ = sleeper.Wait()
	if err := s.peerAlive(sp, ns, late(0), 0, linkNone); err == nil {
		t.Fatal("an exited peer with a fresh beat is alive, want dead")
	}
	// In another pid namespace the heartbeat alone decides.
	if err := s.peerAlive(bp, ns+1, late(2*DefaultStaleAfter), 0, linkNone); err == nil {
		t.Fatal("a foreign-namespace peer past staleAfter is alive, want dead")
	}
}

// TestForeignPeerVouchedByItsConnection: a peer in another pid namespace
// whose beats are late stays alive while the kernel holds its broker
// connection open (a starved host, not a dead peer), up to
// DefaultHungAfter; once the process is killed its connection closes and
// the heartbeat alone judges it again. Both links are checked against a
// real process: the accelerator's, which the owner publishes, and the
// attacher's own to the owner.
func TestForeignPeerVouchedByItsConnection(t *testing.T) {
	late := func(d time.Duration) uint64 { return uint64(monoNow() - int64(d)) }

	s := newTestSegment(t, testGeometry())
	accel := startChild(t, "accelerator", pathEnv+"="+s.Path())
	accel.expect(t, "ready", 20*time.Second)
	fe := attachTest(t, s)
	foreign := fe.pidNS + 1
	pid := uint32(accel.pid())
	waitFor(t, 5*time.Second, "the accelerator's link published", func() bool { return fe.linkOpen(linkAccel) })
	if err := fe.peerAlive(pid, foreign, late(2*DefaultStaleAfter), 0, linkAccel); err != nil {
		t.Fatalf("a connected foreign accelerator 2 beats late: %v, want alive", err)
	}
	if err := fe.peerAlive(pid, foreign, late(2*DefaultHungAfter), 0, linkAccel); err == nil {
		t.Fatal("a connected foreign accelerator past DefaultHungAfter is alive, want hung")
	}
	if err := fe.peerAlive(pid, foreign, late(2*DefaultStaleAfter), 0, linkNone); err == nil {
		t.Fatal("a foreign lane past staleAfter is alive, want dead")
	}
	accel.kill()
	waitFor(t, 5*time.Second, "the killed accelerator's link closed", func() bool { return !fe.linkOpen(linkAccel) })
	if err := fe.peerAlive(pid, foreign, late(2*DefaultStaleAfter), 0, linkAccel); err == nil {
		t.Fatal("a killed foreign accelerator past staleAfter is alive, want dead")
	}

	name := testName(t)
	owner := startChild(t, "owner", pathEnv+"="+name)
	path := owner.expect(t, "ready", 20*time.Second)
	t.Cleanup(func() { os.Remove(path) })
	a, err := Attach(path, AttachOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	opid := uint32(owner.pid())
	if err := a.peerAlive(opid, foreign, late(2*DefaultStaleAfter), 0, linkOwner); err != nil {
		t.Fatalf("a connected foreign owner 2 beats late: %v, want alive", err)
	}
	owner.kill()
	waitFor(t, 5*time.Second, "the killed owner's connection hung up", func() bool { return !a.linkOpen(linkOwner) })
	if err := a.peerAlive(opid, foreign, late(2*DefaultStaleAfter), 0, linkOwner); err == nil {
		t.Fatal("a killed foreign owner past staleAfter is alive, want dead")
	}
}
