package embedder

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/recmesh/recmesh/embedder/batch"
	"github.com/recmesh/recmesh/model"
)

// TestRolloutAdmission checks every refusal a rollout can meet before it
// touches the serving model: a name outside the root, a broken bundle, too
// little memory, and a second load while one is in progress.
func TestRolloutAdmission(t *testing.T) {
	rootDir := t.TempDir()
	bundle := filepath.Join(rootDir, "v1")
	if err := model.Export(context.Background(), bundle, model.DLRMv2(model.DevVocabCap), 5, nil); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(rootDir, "broken"), 0o755); err != nil {
		t.Fatal(err)
	}
	e, err := New(Options{Bundle: bundle, Segment: fmt.Sprintf("recmesh-rollout-test-%d", os.Getpid()), Lanes: 1,
		Mode: batch.None, MaxBatch: 16, Workers: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	root, err := model.OpenRoot(rootDir)
	if err != nil {
		t.Fatal(err)
	}
	entered := make(chan struct{})
	release := make(chan struct{})
	r := NewRollouts(e, root, func(ctx context.Context, dir, modelID string) error {
		close(entered)
		<-release
		return errors.New("accelerator says no")
	})
	r.available = func() (int64, error) { return 1 << 40, nil }
	ctx := context.Background()

	if _, err := r.Load(ctx, "../"+filepath.Base(os.TempDir())); !errors.Is(err, model.ErrOutsideRoot) {
		t.Errorf("load outside the root: %v", err)
	}
	if _, err := r.Load(ctx, "broken"); err == nil || !strings.Contains(err.Error(), model.ConfigFile) {
		t.Errorf("load of a bundle without %s: %v", model.ConfigFile, err)
	}
	r.available = func() (int64, error) { return 64 << 20, nil }
	if _, err := r.Load(ctx, "v1"); err == nil || !strings.Contains(err.Error(), "not enough memory") {
		t.Errorf("load with 64 MiB free: %v", err)
	}
	r.available = func() (int64, error) { return 1 << 40, nil }

	first := make(chan error, 1)
	go func() { _, err := r.Load(ctx, "v1"); first <- err }()
	<-entered
	if _, err := r.Load(ctx, "v1"); !errors.Is(err, ErrBusy) {
		t.Errorf("second load during the first: %v; want ErrBusy", err)
	}
	close(release)
	if err := <-first; err == nil || !strings.Contains(err.Error(), "accelerator says no") {
		t.Errorf("first load: %v; want the accelerator's refusal", err)
	}
	if _, ok, _ := root.Serving(); ok {
		t.Error("a failed rollout was recorded as serving")
	}
	if got := e.Store().Config.ID(); got == "" {
		t.Error("the serving store is gone after refused rollouts")
	}
}

func TestMemAvailable(t *testing.T) {
	p := filepath.Join(t.TempDir(), "meminfo")
	if err := os.WriteFile(p, []byte("MemTotal:       24000000 kB\nMemFree:  100 kB\nMemAvailable:   2048 kB\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := memAvailable(p); err != nil || got != 2048<<10 {
		t.Errorf("memAvailable = %d, %v; want %d", got, err, 2048<<10)
	}
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "memory.max"), []byte("max\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "memory.current"), []byte("100\n"), 0o644)
	if _, ok := cgroupLeft(dir); ok {
		t.Error("cgroupLeft reported a limit for memory.max = max")
	}
	os.WriteFile(filepath.Join(dir, "memory.max"), []byte("1000\n"), 0o644)
	if left, ok := cgroupLeft(dir); !ok || left != 900 {
		t.Errorf("cgroupLeft = %d, %v; want 900", left, ok)
	}
}

// TestSegmentReservationError: a shared-memory directory too small for the
// segment fails the start with an error naming the knobs, not a SIGBUS.
func TestSegmentReservationError(t *testing.T) {
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=8m"); err != nil {
		t.Skipf("cannot mount a small tmpfs here (needs root): %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, 0) })
	bundle := t.TempDir()
	if err := model.Export(context.Background(), bundle, model.DLRMv2(model.DevVocabCap), 5, nil); err != nil {
		t.Fatal(err)
	}
	e, err := New(Options{Bundle: bundle, ShmDir: dir, Segment: "tiny", Lanes: 2, Mode: batch.None, MaxBatch: 64, Workers: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	_, err = e.create(e.Store())
	if err == nil {
		t.Fatal("a segment was created in an 8 MiB directory")
	}
	for _, want := range []string{dir, "RECMESH_SHM_SIZE", "--lanes", "sizeLimit"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("the failed reservation left %d files behind", len(entries))
	}
}

// TestSegmentCannotBeTruncated: the segment path is the owner's socket and
// its memory sealed memfds, so the truncation that used to SIGBUS the
// embedder (and cost every lane its generation) is refused outright, and
// the generation keeps serving.
func TestSegmentCannotBeTruncated(t *testing.T) {
	bundle := t.TempDir()
	if err := model.Export(context.Background(), bundle, model.DLRMv2(model.DevVocabCap), 5, nil); err != nil {
		t.Fatal(err)
	}
	name := fmt.Sprintf("recmesh-truncate-test-%d", os.Getpid())
	e, err := New(Options{Bundle: bundle, Segment: name, Lanes: 2, Mode: batch.None, MaxBatch: 64, Workers: 2})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	runErr := make(chan error, 1)
	go func() { runErr <- e.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-runErr; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	path := filepath.Join("/dev/shm", name)
	deadline := time.Now().Add(20 * time.Second)
	for e.Current().Generation == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no generation")
		}
		time.Sleep(5 * time.Millisecond)
	}
	gen := e.Current().Generation
	for _, size := range []int64{16 << 10, 0, 5000} {
		if err := os.Truncate(path, size); err == nil {
			t.Fatalf("truncating the segment path to %d bytes succeeded", size)
		}
	}
	if g := e.Current().Generation; g != gen || !e.Live() {
		t.Fatalf("generation %d (was %d), live %v after the truncation attempts", g, gen, e.Live())
	}
}
