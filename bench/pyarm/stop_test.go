package pyarm

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/recmesh/recmesh/model"
	"github.com/recmesh/recmesh/proto/oip"
)

// TestStopWithACallWaitingOnTheOwner stops py-mp while a frontend's call
// waits on a device owner that does not answer (stopped with SIGSTOP): the
// frontend ends the call and exits by itself within the supervisor's
// deadline, so nothing has to be killed and the stop is clean.
func TestStopWithACallWaitingOnTheOwner(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Python arm")
	}
	p := paths(t)
	dir, b, _ := fixture(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	s, stopped := startStoppedByTest(ctx, t, Options{Paths: p, Mode: "py-mp", Bundle: dir, Processes: 1, Workers: 4, WarmMax: 4, Log: testLog{t}})
	owner, submit := deviceOwner(t, s.PID())
	frontends := slices.DeleteFunc(childPIDs(t, s.PID()), func(pid int) bool { return pid == owner })
	if len(frontends) != 1 {
		t.Fatalf("frontends %v, want one", frontends)
	}
	// A second reader of the owner's submission pipe, only to see the call
	// arrive (FIONREAD); it never reads.
	pipe, err := os.OpenFile(fmt.Sprintf("/proc/%d/fd/%d", owner, submit), os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer pipe.Close()
	if err := syscall.Kill(owner, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer syscall.Kill(owner, syscall.SIGCONT)

	pool := dial(t, s.Addr, 1)
	dense, sparse := model.RandomInputs(b.Config, 7, 1)
	req, err := oip.BuildRequest(oip.DefaultModelName, b.Config, dense, sparse, 1, oip.TypeINT32)
	if err != nil {
		t.Fatal(err)
	}
	called := make(chan error, 1)
	go func() {
		cctx, ccancel := context.WithTimeout(ctx, time.Minute)
		defer ccancel()
		_, err := pool.Client(0).ModelInfer(cctx, req)
		called <- err
	}()
	// The frontend has handed the call to the owner once its record waits
	// in the pipe.
	waitUntil(ctx, t, "the call reaching the device owner", called, func() bool {
		n, err := unix.IoctlGetInt(int(pipe.Fd()), unix.TIOCINQ) // FIONREAD
		if err != nil {
			t.Fatal(err)
		}
		return n > 0
	})

	stopErr := make(chan error, 1)
	go func() { stopErr <- s.Stop(20 * time.Second) }()
	// The frontend must end by itself while its call still waits; the
	// owner may go after it (it leaves once every frontend has gone).
	waitUntil(ctx, t, "the frontend ending before the arm", stopErr, func() bool { return !alive(frontends[0]) })
	if err := syscall.Kill(owner, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	*stopped = true
	if err := <-stopErr; err != nil {
		t.Errorf("stop: %v", err)
	}
	// The frontend's stop cancelled it: UNAVAILABLE, as for any call a
	// stopping server ends.
	if err := <-called; status.Code(err) != codes.Unavailable {
		t.Errorf("the waiting call ended with %v, want UNAVAILABLE", err)
	}
	if left := groupPIDs(t, s.PID()); len(left) > 0 {
		t.Errorf("processes %v outlived the stop", left)
	}
	checkNoShm(t, s.PID())
}

// deviceOwner finds py-mp's device owner among the children of pid and the
// descriptor it reads submissions from (its --link spec's "submit").
func deviceOwner(t *testing.T, pid int) (owner, submit int) {
	t.Helper()
	for _, child := range childPIDs(t, pid) {
		raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", child))
		if err != nil {
			continue
		}
		args := strings.Split(strings.TrimRight(string(raw), "\x00"), "\x00")
		role := slices.Index(args, "--role")
		link := slices.Index(args, "--link")
		if role < 0 || role+1 >= len(args) || args[role+1] != "owner" || link < 0 || link+1 >= len(args) {
			continue
		}
		var spec struct {
			Submit *int `json:"submit"`
		}
		if err := json.Unmarshal([]byte(args[link+1]), &spec); err != nil || spec.Submit == nil {
			t.Fatalf("device owner %d: --link %q names no submit descriptor (%v)", child, args[link+1], err)
		}
		return child, *spec.Submit
	}
	t.Fatalf("no device owner among the children of %d", pid)
	return 0, 0
}

// alive reports whether process pid exists and has not exited (a zombie
// its parent has not reaped counts as ended).
func alive(pid int) bool {
	st, err := readProcStat(pid)
	return err == nil && st.state != "Z"
}

// waitUntil checks cond every 10 ms until it holds, failing the test as
// what says when ended delivers first or ctx ends.
func waitUntil(ctx context.Context, t *testing.T, what string, ended <-chan error, cond func() bool) {
	t.Helper()
	for !cond() {
		select {
		case err := <-ended:
			t.Fatalf("%s: ended first (%v)", what, err)
		case <-ctx.Done():
			t.Fatalf("%s: %v", what, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}
