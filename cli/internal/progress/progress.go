// Package progress draws a one-line progress bar for long recmesh
// commands. It is meant for terminals only: callers decide (with
// golang.org/x/term) whether to draw one at all.
package progress

import (
	"fmt"
	"io"
	"strings"
	"time"
)

// Drawing constants.
const (
	// barWidth is the number of cells between the brackets.
	barWidth = 30
	// redrawEvery limits redraws, so a fast producer does not flood the
	// terminal.
	redrawEvery = 100 * time.Millisecond
)

// Bar is a byte-count progress bar redrawn in place with a carriage
// return. It is not safe for concurrent use.
type Bar struct {
	w     io.Writer
	label string
	now   func() time.Time
	start time.Time
	drawn time.Time // last redraw; zero before the first
	done  bool      // Finish has run
}

// New returns a bar labelled label that draws on w.
func New(w io.Writer, label string) *Bar {
	return newBar(w, label, time.Now)
}

func newBar(w io.Writer, label string, now func() time.Time) *Bar {
	return &Bar{w: w, label: label, now: now, start: now()}
}

// Update records that done of total bytes are finished and redraws the bar
// if it has not been redrawn for a while or the work is complete.
func (b *Bar) Update(done, total int64) {
	t := b.now()
	if done < total && !b.drawn.IsZero() && t.Sub(b.drawn) < redrawEvery {
		return
	}
	b.drawn = t
	frac := 1.0
	if total > 0 {
		frac = min(max(float64(done)/float64(total), 0), 1)
	}
	cells := int(frac * barWidth)
	// \x1b[K clears what a longer previous draw left on the line.
	fmt.Fprintf(b.w, "\r%s [%s%s] %3.0f%% %s/%s %.1fs\x1b[K",
		b.label, strings.Repeat("#", cells), strings.Repeat(" ", barWidth-cells),
		100*frac, Bytes(done), Bytes(total), t.Sub(b.start).Seconds())
}

// Finish ends the bar's line. It is safe to call more than once.
func (b *Bar) Finish() {
	if b.done || b.drawn.IsZero() {
		return
	}
	b.done = true
	fmt.Fprintln(b.w)
}

// Bytes formats n with a decimal unit: 512 B, 75.3 MB, 3.2 GB.
func Bytes(n int64) string {
	const unit = 1000
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	f, i := float64(n), 0
	for f >= unit && i < 4 {
		f /= unit
		i++
	}
	return fmt.Sprintf("%.1f %cB", f, " kMGT"[i])
}
