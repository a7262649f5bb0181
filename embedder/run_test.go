package embedder

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/recmesh/recmesh/embedder/batch"
	"github.com/recmesh/recmesh/model"
	"github.com/recmesh/recmesh/shm"
)

// TestRunClosesGenerationsOnEveryExit: whatever ends Run, its context or
// a generation that cannot be started, every generation it leaves (the
// current one and a predecessor still draining after a rollout) ends
// drained and closed, no segment file is left at the path, the stores are
// closed, and a later Load is refused at once.
func TestRunClosesGenerationsOnEveryExit(t *testing.T) {
	bundle := t.TempDir()
	if err := model.Export(context.Background(), bundle, model.DLRMv2(model.DevVocabCap), 5, nil); err != nil {
		t.Fatal(err)
	}
	for _, exit := range []struct {
		name    string
		end     func(t *testing.T, x exitRig) // ends Run
		wantErr bool
	}{
		{name: "cancel", end: func(t *testing.T, x exitRig) { x.cancel() }},
		{
			// Generation 2 fails (its accelerator goes) and its successor
			// cannot be created (a file stands where its directory was; a
			// directory merely gone would be made again): a fatal error,
			// with generation 1 still draining.
			name: "fatal",
			end: func(t *testing.T, x exitRig) {
				if err := os.RemoveAll(x.dir); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(x.dir, nil, 0o600); err != nil {
					t.Fatal(err)
				}
				x.gen2.DetachAccelerator()
			},
			wantErr: true,
		},
		{
			// Generation 2 fails and Run is cancelled while it waits to
			// start the next one (or just after it did).
			name: "cancel-after-failure",
			end: func(t *testing.T, x exitRig) {
				x.gen2.DetachAccelerator()
				waitUntil(t, "generation 2 to close", func() bool { return state(t, x.gen2) == shm.StateClosed })
				x.cancel()
			},
		},
	} {
		t.Run(exit.name, func(t *testing.T) {
			dir, err := os.MkdirTemp(shm.DefaultDir, "recmesh-run-test-")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { os.RemoveAll(dir) })
			e, err := New(Options{Bundle: bundle, ShmDir: dir, Segment: "seg", Lanes: 2, Mode: batch.None, MaxBatch: 64, Workers: 1})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			runErr := make(chan error, 1)
			go func() { runErr <- e.Run(ctx) }()
			path := filepath.Join(dir, "seg")

			waitUntil(t, "generation 1", func() bool { return e.Current().Generation == 1 })
			gen1 := attachSegment(t, path)
			// A lane held in generation 1 keeps it draining after the
			// rollout, until Run ends.
			if _, err := gen1.ClaimLane(os.Getpid()); err != nil {
				t.Fatal(err)
			}
			store1 := e.Store()
			if _, err := e.Load(ctx, bundle, nil, nil); err != nil {
				t.Fatal(err)
			}
			if g := e.Current().Generation; g != 2 {
				t.Fatalf("after the rollout generation %d serves, want 2", g)
			}
			gen2 := attachSegment(t, path)
			// This test is generation 2's accelerator, so that its
			// leaving ends the generation as an accelerator's death does
			// (the segment's memory cannot be cut short to fail it).
			if err := gen2.SetAccelerator(os.Getpid()); err != nil {
				t.Fatal(err)
			}
			store2 := e.Store()
			if st := gen1.State(); st != shm.StateDraining {
				t.Fatalf("generation 1 is %v after the rollout, want draining", st)
			}

			exit.end(t, exitRig{cancel: cancel, dir: dir, gen2: gen2})
			select {
			case err := <-runErr:
				if exit.wantErr && err == nil {
					t.Fatal("Run returned nil after a fatal error")
				}
				if !exit.wantErr && err != nil {
					t.Fatalf("Run: %v", err)
				}
				if exit.wantErr && !errors.Is(err, syscall.ENOTDIR) {
					t.Fatalf("Run's error does not wrap its cause: %v", err)
				}
				t.Logf("Run: %v", err)
			case <-time.After(30 * time.Second):
				t.Fatal("Run did not return")
			}

			for i, seg := range []*shm.Segment{gen1, gen2} {
				if st := state(t, seg); st != shm.StateClosed {
					t.Errorf("generation %d is %v after Run returned, want closed", i+1, st)
				}
			}
			if _, err := os.Stat(path); !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, syscall.ENOTDIR) {
				t.Errorf("a segment file is left at %s: %v", path, err)
			}
			for i, s := range []*Store{store1, store2} {
				if s.region.Bytes() != nil {
					t.Errorf("store %d is still mapped after Run returned", i+1)
				}
			}
			if lanes := e.Lanes(); lanes != nil {
				t.Errorf("Lanes after Run returned: %v", lanes)
			}
			if _, err := e.Load(context.Background(), bundle, nil, nil); !errors.Is(err, errStopped) {
				t.Errorf("Load after Run returned: %v", err)
			}
		})
	}
}

// exitRig is what a way of ending Run works with: generation 2's
// segment, as this test maps it (as its accelerator).
type exitRig struct {
	cancel context.CancelFunc
	dir    string
	gen2   *shm.Segment
}

// state reads a segment's state word; a fault must fail the test, not
// kill it.
func state(t *testing.T, seg *shm.Segment) shm.State {
	t.Helper()
	var st shm.State
	if err := shm.GuardFaults(func() error { st = seg.State(); return nil }); err != nil {
		t.Fatalf("read the state of generation %d: %v", seg.Generation(), err)
	}
	return st
}

func attachSegment(t *testing.T, path string) *shm.Segment {
	t.Helper()
	seg, err := shm.Attach(path, shm.AttachOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { seg.Close() })
	return seg
}

// waitUntil waits, up to a bound far beyond any healthy run, for cond.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}
