// Package loadgen drives an Open Inference Protocol v2 server with DLRM
// requests and measures what it sustains: a closed loop (C clients issuing
// back-to-back) or an open loop (Poisson arrivals at a fixed rate), a
// discarded warm-up followed by a measured window, and per run the achieved
// rates, a latency histogram with its percentiles and the errors by gRPC
// code.
//
// What a run counts, in both modes:
//
//   - Latency and errors cover the requests that start inside the measured
//     window: sent at that time in the closed loop, scheduled at that time
//     in the open loop. Every one of them is awaited (each is bounded by the
//     request timeout), even past the window's end, so a slow tail is never
//     cut off. Latency is recorded for successful requests only; in the open
//     loop it runs from the scheduled time, not from the moment the request
//     went out, so a client that falls behind its schedule cannot hide the
//     server's queueing (coordinated omission).
//   - Throughput (requests_per_s, examples_per_s) is the number of
//     successful requests that complete inside the window, over its length:
//     what the server actually sustained.
package loadgen

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/recmesh/recmesh/proto/inference"
	"github.com/recmesh/recmesh/proto/oip"
)

// Mode is the arrival process.
type Mode string

// The two arrival processes.
const (
	// Closed is C clients each sending its next request as soon as the
	// previous one is answered.
	Closed Mode = "closed"
	// Open is Poisson arrivals at a fixed mean rate, issued on schedule
	// whether or not earlier requests have been answered.
	Open Mode = "open"
)

// Run defaults.
const (
	DefaultTimeout        = 10 * time.Second
	DefaultMaxOutstanding = 4096
)

// BadResponse is the error key of a call that succeeded but whose answer
// did not carry the request's scores.
const BadResponse = "BAD_RESPONSE"

// Dropped is the error key of an open-loop arrival that found
// MaxOutstanding requests already in flight and was not sent.
const Dropped = "DROPPED"

// Config is one run's load.
type Config struct {
	Mode Mode
	// Concurrency is the number of closed-loop clients.
	Concurrency int
	// Rate is the open loop's mean arrival rate in requests per second.
	Rate float64
	// MaxOutstanding bounds the open loop's requests in flight (default
	// DefaultMaxOutstanding); an arrival beyond it is dropped and counted.
	MaxOutstanding int
	// Warmup is sent and discarded before the measured Duration.
	Warmup, Duration time.Duration
	// Timeout bounds each request (default DefaultTimeout).
	Timeout time.Duration
	// Seed drives the open loop's arrival times.
	Seed uint64
}

func (c *Config) check() error {
	switch c.Mode {
	case Closed:
		if c.Concurrency <= 0 {
			return fmt.Errorf("closed loop needs concurrency ≥ 1, got %d", c.Concurrency)
		}
	case Open:
		if !(c.Rate > 0) || math.IsInf(c.Rate, 0) {
			return fmt.Errorf("open loop needs a rate > 0, got %v", c.Rate)
		}
		if c.MaxOutstanding <= 0 {
			c.MaxOutstanding = DefaultMaxOutstanding
		}
	default:
		return fmt.Errorf("mode %q, want %q or %q", c.Mode, Closed, Open)
	}
	if c.Duration <= 0 || c.Warmup < 0 {
		return fmt.Errorf("warm-up %v and duration %v: want warm-up ≥ 0 and duration > 0", c.Warmup, c.Duration)
	}
	if c.Timeout <= 0 {
		c.Timeout = DefaultTimeout
	}
	return nil
}

// Hooks run on the edges of the measured window, so a resource monitor
// samples exactly the traffic that is measured.
type Hooks struct {
	WindowStart func()
	WindowEnd   func()
}

// Result is what one run measured. Durations are in milliseconds.
type Result struct {
	StartedAt time.Time `json:"started_at"`
	// WindowS is the measured window's length in seconds.
	WindowS float64 `json:"window_s"`
	// Sent counts the requests sent in the window; Scheduled (open loop)
	// counts its arrivals, Sent plus Dropped.
	Sent      int64 `json:"sent"`
	Scheduled int64 `json:"scheduled,omitempty"`
	// OK, Errors and Dropped split the window's requests by outcome;
	// Errors includes Dropped, and ErrorsByCode keys every error by its
	// gRPC code name, BadResponse or Dropped.
	OK           int64            `json:"ok"`
	Errors       int64            `json:"errors"`
	Dropped      int64            `json:"dropped"`
	ErrorsByCode map[string]int64 `json:"errors_by_code"`
	// FirstError is the text of the first error, for diagnosis.
	FirstError string `json:"first_error,omitempty"`
	// CompletedInWindow counts successful completions inside the window;
	// the rates below are it over WindowS.
	CompletedInWindow int64   `json:"completed_in_window"`
	RequestsPerS      float64 `json:"requests_per_s"`
	ExamplesPerS      float64 `json:"examples_per_s"`
	// OfferedRPS is the open loop's arrival rate in the window.
	OfferedRPS float64 `json:"offered_rps,omitempty"`
	// MaxSchedulerLagMs is how far the open loop's issuing fell behind its
	// schedule at worst; a large lag means the client, not the server, was
	// the limit (latency still counts from the schedule).
	MaxSchedulerLagMs float64        `json:"max_scheduler_lag_ms,omitempty"`
	Latency           LatencySummary `json:"latency_ms"`
	Histogram         []Bucket       `json:"histogram"`
}

// LatencySummary is a histogram's summary in milliseconds.
type LatencySummary struct {
	Count uint64  `json:"count"`
	Min   float64 `json:"min"`
	Mean  float64 `json:"mean"`
	P50   float64 `json:"p50"`
	P90   float64 `json:"p90"`
	P99   float64 `json:"p99"`
	P999  float64 `json:"p999"`
	Max   float64 `json:"max"`
}

// Summarize returns h's summary.
func Summarize(h *Histogram) LatencySummary {
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	return LatencySummary{
		Count: h.Count(),
		Min:   ms(h.Min()),
		Mean:  ms(h.Mean()),
		P50:   ms(h.Quantile(0.50)),
		P90:   ms(h.Quantile(0.90)),
		P99:   ms(h.Quantile(0.99)),
		P999:  ms(h.Quantile(0.999)),
		Max:   ms(h.Max()),
	}
}

// tally accumulates one run's outcomes from every client goroutine.
type tally struct {
	hist              *Histogram
	sent, ok, dropped atomic.Int64
	scheduled         atomic.Int64
	inWindow          atomic.Int64
	byCode            [17]atomic.Int64 // indexed by codes.Code; beyond 16 counts as Unknown
	bad               atomic.Int64
	firstErr          atomic.Pointer[string]
	maxLag            atomic.Int64
}

// window is the measured interval [start, end) in monotonic time.
type window struct{ start, end time.Time }

func (w window) contains(t time.Time) bool { return !t.Before(w.start) && t.Before(w.end) }

// call sends req on connection i and records it when answered if
// measured (it started, or was scheduled, inside the window); origin is
// where its latency counts from. after, if not nil, runs once it is
// recorded.
func (t *tally) call(c Client, i int, req *oip.PreEncoded, resp *pb.ModelInferResponse,
	timeout time.Duration, w window, origin time.Time, measured bool, after func()) {
	c.Infer(i, req, resp, timeout, func(err error) {
		t.record(err, req, resp, time.Now(), w, origin, measured)
		if after != nil {
			after()
		}
	})
}

// record counts one answered call, done at done.
func (t *tally) record(err error, req *oip.PreEncoded, resp *pb.ModelInferResponse, done time.Time, w window, origin time.Time, measured bool) {
	if err == nil {
		if cerr := oip.CheckScores(resp, req.Examples); cerr != nil {
			err = cerr
		}
	}
	if err == nil && w.contains(done) {
		t.inWindow.Add(1)
	}
	if !measured {
		return
	}
	t.sent.Add(1)
	if err == nil {
		t.ok.Add(1)
		t.hist.Record(done.Sub(origin))
		return
	}
	if s, ok := status.FromError(err); ok {
		c := s.Code()
		if int(c) >= len(t.byCode) {
			c = codes.Unknown
		}
		t.byCode[c].Add(1)
	} else {
		t.bad.Add(1)
	}
	msg := err.Error()
	t.firstErr.CompareAndSwap(nil, &msg)
}

// Run drives client with w's requests under cfg and returns what the measured
// window saw. It returns an error only for a bad configuration or a
// cancelled ctx; failed requests are results.
func Run(ctx context.Context, client Client, w *Workload, cfg Config, hooks Hooks) (*Result, error) {
	if err := cfg.check(); err != nil {
		return nil, fmt.Errorf("loadgen: run: %w", err)
	}
	if client.Len() == 0 || len(w.Requests) == 0 {
		return nil, errors.New("loadgen: run: no connections or no requests")
	}
	t := &tally{hist: NewHistogram()}
	started := time.Now()
	win := window{start: started.Add(cfg.Warmup)}
	win.end = win.start.Add(cfg.Duration)

	// The hooks fire from their own goroutine at the window's edges, so
	// neither loop has to watch the clock for them.
	hooksDone := make(chan struct{})
	go func() {
		defer close(hooksDone)
		if !sleepUntil(ctx, win.start) {
			return
		}
		if hooks.WindowStart != nil {
			hooks.WindowStart()
		}
		if !sleepUntil(ctx, win.end) {
			return
		}
		if hooks.WindowEnd != nil {
			hooks.WindowEnd()
		}
	}()

	switch cfg.Mode {
	case Closed:
		runClosed(ctx, client, w, cfg, t, win)
	case Open:
		runOpen(ctx, client, w, cfg, t, win)
	}
	<-hooksDone
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("loadgen: run: %w", err)
	}
	return t.result(started, cfg, w, win), nil
}

func runClosed(ctx context.Context, client Client, w *Workload, cfg Config, t *tally, win window) {
	var next atomic.Uint64
	var wg sync.WaitGroup
	for i := range cfg.Concurrency {
		wg.Go(func() {
			resp := new(pb.ModelInferResponse)
			answered := make(chan struct{}, 1)
			after := func() { answered <- struct{}{} }
			for ctx.Err() == nil {
				start := time.Now()
				if !start.Before(win.end) {
					return
				}
				req := w.Requests[(next.Add(1)-1)%uint64(len(w.Requests))]
				t.call(client, i, req, resp, cfg.Timeout, win, start, !start.Before(win.start), after)
				<-answered
			}
		})
	}
	wg.Wait()
}

func runOpen(ctx context.Context, client Client, w *Workload, cfg Config, t *tally, win window) {
	rng := rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x6f70656e6c6f6f70)) // "openloop"
	slots := make(chan struct{}, cfg.MaxOutstanding)
	var wg sync.WaitGroup
	defer wg.Wait()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	// Arrival times accumulate in float seconds from the start, not by
	// adding rounded durations, so the mean rate carries no drift.
	start := time.Now()
	at := 0.0
	for k := 0; ; k++ {
		at += rng.ExpFloat64() / cfg.Rate
		scheduled := start.Add(time.Duration(at * float64(time.Second)))
		if !scheduled.Before(win.end) {
			return
		}
		if d := time.Until(scheduled); d > 0 {
			timer.Reset(d)
			select {
			case <-ctx.Done():
				return
			case <-timer.C:
			}
		} else if ctx.Err() != nil {
			return
		}
		measured := !scheduled.Before(win.start)
		if measured {
			t.scheduled.Add(1)
			lag := int64(time.Since(scheduled))
			for {
				m := t.maxLag.Load()
				if lag <= m || t.maxLag.CompareAndSwap(m, lag) {
					break
				}
			}
		}
		select {
		case slots <- struct{}{}:
		default:
			if measured {
				t.dropped.Add(1)
			}
			continue
		}
		// The call is sent from here: an arrival costs no goroutine,
		// and Infer returns once the request is written.
		wg.Add(1)
		t.call(client, k, w.Requests[k%len(w.Requests)], new(pb.ModelInferResponse), cfg.Timeout, win, scheduled, measured,
			func() { <-slots; wg.Done() })
	}
}

// sleepUntil waits until t; false if ctx ended first.
func sleepUntil(ctx context.Context, t time.Time) bool {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err() == nil
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-timer.C:
		return true
	}
}

func (t *tally) result(started time.Time, cfg Config, w *Workload, win window) *Result {
	secs := win.end.Sub(win.start).Seconds()
	r := &Result{
		StartedAt:         started.UTC(),
		WindowS:           secs,
		Sent:              t.sent.Load(),
		OK:                t.ok.Load(),
		Dropped:           t.dropped.Load(),
		ErrorsByCode:      map[string]int64{},
		CompletedInWindow: t.inWindow.Load(),
		Latency:           Summarize(t.hist),
		Histogram:         t.hist.Buckets(),
	}
	for c := range t.byCode {
		if n := t.byCode[c].Load(); n > 0 {
			r.ErrorsByCode[oip.CodeName(codes.Code(c))] = n
		}
	}
	if n := t.bad.Load(); n > 0 {
		r.ErrorsByCode[BadResponse] = n
	}
	if r.Dropped > 0 {
		r.ErrorsByCode[Dropped] = r.Dropped
	}
	for _, n := range r.ErrorsByCode {
		r.Errors += n
	}
	if p := t.firstErr.Load(); p != nil {
		r.FirstError = *p
	} else if r.Dropped > 0 {
		r.FirstError = fmt.Sprintf("open loop: %d arrivals found %d requests in flight and were dropped", r.Dropped, cfg.MaxOutstanding)
	}
	r.RequestsPerS = float64(r.CompletedInWindow) / secs
	r.ExamplesPerS = r.RequestsPerS * float64(w.BatchSize)
	if cfg.Mode == Open {
		r.Scheduled = t.scheduled.Load()
		r.OfferedRPS = float64(r.Scheduled) / secs
		r.MaxSchedulerLagMs = float64(t.maxLag.Load()) / float64(time.Millisecond)
	}
	return r
}
