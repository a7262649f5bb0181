// Package batch decides how the embedder groups requests into batches: how
// many examples a batch may hold and when an open batch is sealed and handed
// to the accelerator. It is pure policy: no goroutines, no shared memory, a
// clock passed in, so tests drive it by hand.
package batch

import (
	"fmt"
	"strings"
	"time"
)

// Mode is a batching mode, as serving engineers know them.
type Mode int

const (
	// None runs one lookup and one model call per request.
	None Mode = iota
	// Model looks requests up one by one and merges model calls: a batch is
	// sealed as soon as the device is idle (a zero-wait merger), so under
	// load requests pile up while the device is busy and run together.
	Model
	// Full merges lookups and model calls: a batch stays open for the batch
	// window (or until full), then all of it is looked up and run at once.
	Full
)

// ParseMode reads "none", "model" or "full".
func ParseMode(s string) (Mode, error) {
	switch strings.ToLower(s) {
	case "none":
		return None, nil
	case "model":
		return Model, nil
	case "full":
		return Full, nil
	}
	return 0, fmt.Errorf("batch: mode %q: want none, model or full", s)
}

func (m Mode) String() string {
	switch m {
	case None:
		return "none"
	case Model:
		return "model"
	case Full:
		return "full"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// Defaults.
const (
	DefaultMaxBatch = 4096
	DefaultWindow   = time.Millisecond
)

// Options configure a Batcher. Zero fields take the defaults.
type Options struct {
	// Mode is the batching mode. Default None.
	Mode Mode
	// MaxBatch is the most examples a batch may hold. Default 4096. A
	// larger MaxBatch amortises per-call costs but makes the worst batch
	// slower.
	MaxBatch int
	// MaxEntries is the most requests a batch may hold (the size of a
	// staging buffer's entries table). Default MaxBatch.
	MaxEntries int
	// Window is how long a Full batch waits for more requests after its
	// first one. Default 1 ms. The worst added queueing delay of a request
	// in Full mode is Window plus the time the batch ahead takes to run.
	Window time.Duration
}

func (o Options) withDefaults() Options {
	if o.MaxBatch <= 0 {
		o.MaxBatch = DefaultMaxBatch
	}
	if o.MaxEntries <= 0 {
		o.MaxEntries = o.MaxBatch
	}
	if o.Window <= 0 {
		o.Window = DefaultWindow
	}
	return o
}

// Batcher tracks the one open batch. It is not safe for concurrent use:
// the embedder's dispatcher goroutine owns it.
type Batcher struct {
	opts    Options
	rows    int
	entries int
	first   time.Time
}

// New returns a Batcher with an empty open batch.
func New(opts Options) *Batcher { return &Batcher{opts: opts.withDefaults()} }

// Options returns the options with defaults filled in.
func (b *Batcher) Options() Options { return b.opts }

// Fits reports whether a request of n examples can join the open batch.
// A request that does not fit means: seal the open batch, then add it to
// the next one. n is at most MaxBatch (frontends refuse larger requests).
func (b *Batcher) Fits(n int) bool {
	if b.entries == 0 {
		return true
	}
	if b.opts.Mode == None {
		return false
	}
	return b.rows+n <= b.opts.MaxBatch && b.entries < b.opts.MaxEntries
}

// Add puts a request of n examples (0 for a request that failed before
// lookup and only needs its error delivered) into the open batch and
// returns its first row. The caller checks Fits first.
func (b *Batcher) Add(n int, now time.Time) (firstRow int) {
	if b.entries == 0 {
		b.first = now
	}
	firstRow = b.rows
	b.rows += n
	b.entries++
	return firstRow
}

// Rows and Entries describe the open batch.
func (b *Batcher) Rows() int    { return b.rows }
func (b *Batcher) Entries() int { return b.entries }

// ShouldSeal reports whether the open batch should go to the accelerator
// now, given whether the device is idle.
func (b *Batcher) ShouldSeal(now time.Time, deviceIdle bool) bool {
	if b.entries == 0 {
		return false
	}
	if b.rows >= b.opts.MaxBatch || b.entries >= b.opts.MaxEntries {
		return true
	}
	switch b.opts.Mode {
	case None:
		return true
	case Model:
		return deviceIdle
	default:
		return !now.Before(b.first.Add(b.opts.Window))
	}
}

// Deadline is when the open batch must be sealed even if nothing else
// arrives (Full mode's window); ok is false when no timer is needed.
func (b *Batcher) Deadline() (t time.Time, ok bool) {
	if b.entries == 0 || b.opts.Mode != Full {
		return time.Time{}, false
	}
	return b.first.Add(b.opts.Window), true
}

// Reset starts a new, empty batch (after the open one was sealed).
func (b *Batcher) Reset() {
	b.rows, b.entries = 0, 0
	b.first = time.Time{}
}
