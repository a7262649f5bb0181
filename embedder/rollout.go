package embedder

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/recmesh/recmesh/model"
	"github.com/recmesh/recmesh/proto/updates"
)

// ErrBusy answers a rollout requested while another is in progress: each
// one holds a second copy of the tables until it finishes, so two at once
// could double memory again.
var ErrBusy = errors.New("busy: another model load is in progress; retry when it finishes")

// Rollouts admits model loads from the control plane: one at a time, only
// bundles under the model root, only when the machine has the memory for
// a second copy of the tables, and the result recorded in the root so a
// restarted process comes back on it.
type Rollouts struct {
	e    *Embedder
	root model.Root
	// prepare has the accelerator compile the bundle at dir before the
	// switch.
	prepare func(ctx context.Context, dir, modelID string) error
	// available reports the bytes a new table copy may take; nil means
	// MemAvailable (and the cgroup's limit).
	available func() (int64, error)
	// updates, when set, replays the row updates onto a new model's
	// tables before they serve.
	updates UpdatesHandoff
	busy    atomic.Bool

	// mu orders writes of the serving record: a rollout's and the row
	// updates' (RecordApplied); serving is the record as last written or
	// to be written.
	mu      sync.Mutex
	serving model.Serving
}

// NewRollouts returns the admission of rollouts for e; prepare may be nil.
func NewRollouts(e *Embedder, root model.Root, prepare func(ctx context.Context, dir, modelID string) error) *Rollouts {
	r := &Rollouts{e: e, root: root, prepare: prepare, available: availableMemory}
	cfg := e.Store().Config
	bundle := e.opts.Bundle
	if abs, err := filepath.Abs(bundle); err == nil {
		if real, err := filepath.EvalSymlinks(abs); err == nil {
			bundle = real
		}
	}
	// Until a rollout, a record of this bundle is the row updates' alone
	// (model.Serving.UpdatesOnly): it must not pin the bundle.
	r.serving = model.Serving{Bundle: bundle, ModelID: cfg.ID(), Since: time.Now().UTC(), UpdatesBase: cfg.UpdatesSeq, UpdatesApplied: cfg.UpdatesSeq, UpdatesOnly: true}
	if s, ok, err := root.Serving(); err == nil && ok && s.Bundle == e.opts.Bundle {
		r.serving = s
	}
	return r
}

// Serving is the serving record: what a restart comes back on, and how
// far the row updates had reached.
func (r *Rollouts) Serving() model.Serving {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.serving
}

// RecordApplied records that the serving tables hold the row updates up
// to sequence applied, so a restarted embedder replays at least that far
// before it serves. It writes the record only when the sequence moved.
func (r *Rollouts) RecordApplied(applied uint64) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if applied <= r.serving.UpdatesApplied {
		return nil
	}
	s := r.serving
	s.UpdatesApplied = applied
	if err := r.root.SetServing(s); err != nil {
		return err
	}
	r.serving = s
	return nil
}

// Load rolls out the bundle name (relative to the root, or an absolute
// path inside it). Every refusal leaves the serving model untouched and
// says why.
func (r *Rollouts) Load(ctx context.Context, name string) (Generation, error) {
	if !r.busy.CompareAndSwap(false, true) {
		return Generation{}, ErrBusy
	}
	defer r.busy.Store(false)
	dir, err := r.root.Resolve(name)
	if err != nil {
		return Generation{}, fmt.Errorf("embedder: rollout refused: %w", err)
	}
	cfg, err := model.ReadConfig(dir)
	if err != nil {
		return Generation{}, fmt.Errorf("embedder: rollout refused: %w", err)
	}
	if err := r.checkMemory(cfg.TableBytes()); err != nil {
		return Generation{}, fmt.Errorf("embedder: rollout of %s refused: %w", name, err)
	}
	var prepare func(ctx context.Context, modelID string) error
	if r.prepare != nil {
		prepare = func(ctx context.Context, modelID string) error { return r.prepare(ctx, dir, modelID) }
	}
	// The serving record changes with the switch, holding how far the
	// new tables' row updates reached, so that the applied sequences the
	// consumer records from then on are the new model's.
	var recordErr error
	record := func(modelID string, applied uint64) {
		r.mu.Lock()
		defer r.mu.Unlock()
		s := model.Serving{Bundle: dir, ModelID: modelID, Since: time.Now().UTC(), UpdatesBase: cfg.UpdatesSeq, UpdatesApplied: applied}
		r.serving = s
		if err := r.root.SetServing(s); err != nil {
			// The mesh serves the new model; only a restart would lose it.
			recordErr = fmt.Errorf("embedder: %s serves, but a restart would not keep it: %w", modelID, err)
		}
	}
	var switchVia func(ctx context.Context, store *Store, switchTo func() error) error
	if r.updates != nil {
		switchVia = func(ctx context.Context, store *Store, switchTo func() error) error {
			var u Updater // the consumer's goroutine has its own
			_, err := r.updates.Handoff(ctx, store.Config.ID(), cfg.UpdatesSeq,
				func(m updates.Message) error { return store.Apply(&u, m) },
				func(applied uint64) error {
					if err := switchTo(); err != nil {
						return err
					}
					record(store.Config.ID(), applied)
					return nil
				})
			if err != nil {
				return fmt.Errorf("embedder: rollout of %s: row updates: %w", name, err)
			}
			return nil
		}
	}
	g, err := r.e.Load(ctx, dir, prepare, switchVia)
	if err != nil {
		return g, err
	}
	if switchVia == nil {
		record(g.ModelID, cfg.UpdatesSeq)
	}
	return g, recordErr
}

// UpdatesHandoff moves the row updates to a rolled-out model's tables:
// rowupdate.Consumer.Handoff. It replays the stream onto the new tables
// after base, calls switchTo once they hold everything, and follows the
// new model from the sequence it passes to switchTo.
type UpdatesHandoff interface {
	Handoff(ctx context.Context, modelID string, base uint64, apply func(updates.Message) error, switchTo func(applied uint64) error) (uint64, error)
}

// SetUpdates makes rollouts hand the row updates over to each new model's
// tables before they serve. Call it before the first Load.
func (r *Rollouts) SetUpdates(h UpdatesHandoff) { r.updates = h }

// memoryHeadroom is kept free beyond the new tables: the bundle's page
// cache while it is copied, the new generation's segment, and the rest of
// the machine.
const memoryHeadroom = 256 << 20

func (r *Rollouts) checkMemory(need int64) error {
	if r.available == nil {
		return nil
	}
	avail, err := r.available()
	if err != nil {
		return fmt.Errorf("cannot tell the free memory: %w", err)
	}
	if need+memoryHeadroom > avail {
		return fmt.Errorf("not enough memory for a second copy of the tables: need %d MiB (+%d MiB headroom), %d MiB available",
			need>>20, memoryHeadroom>>20, avail>>20)
	}
	return nil
}

// availableMemory is the kernel's MemAvailable, lowered to what the
// process's cgroup v2 limit still allows.
func availableMemory() (int64, error) {
	avail, err := memAvailable("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	if left, ok := cgroupLeft("/sys/fs/cgroup"); ok && left < avail {
		avail = left
	}
	return avail, nil
}

func memAvailable(path string) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		rest, ok := strings.CutPrefix(s.Text(), "MemAvailable:")
		if !ok {
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%s: MemAvailable: %w", path, err)
		}
		return kb << 10, nil
	}
	return 0, fmt.Errorf("%s: no MemAvailable line", path)
}

// cgroupLeft is memory.max - memory.current of the cgroup v2 mounted at
// dir (the process's own, in a container); ok is false without a limit.
func cgroupLeft(dir string) (int64, bool) {
	read := func(name string) (int64, bool) {
		b, err := os.ReadFile(dir + "/" + name)
		if err != nil {
			return 0, false
		}
		v, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		return v, err == nil
	}
	limit, ok := read("memory.max") // "max" fails to parse: no limit
	if !ok {
		return 0, false
	}
	cur, ok := read("memory.current")
	if !ok {
		return 0, false
	}
	return limit - cur, true
}
