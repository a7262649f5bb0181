// Command ringbench measures the shared-memory lane between two real
// processes: the parent owns the segment and is the echo peer (embedder and
// accelerator roles: it reads each request and completes it), a re-executed
// copy of itself is the frontend, which measures. Both sides spin, as they
// do under load. (The roles are this way round because only the segment's
// owner may wait on the embedder doorbell: its waiter count lives in the
// header, which every other process maps read-only.)
//
// Phase 1 sends one request at a time and records every round trip
// (Commit → peer reads → peer completes → frontend sees the completion).
// Phase 2 streams: the frontend keeps every slot in flight and the peer
// completes in batches; msgs_per_s counts request/response pairs.
//
// The last line of output is, exactly:
//
//	ring: round_trip_p50_us=<x> round_trip_p99_us=<y> msgs_per_s=<z>
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"syscall"
	"time"

	"github.com/recmesh/recmesh/shm"
)

// Defaults for the measurement.
const (
	defaultTrips  = 200_000
	defaultWarmup = 20_000
	defaultStream = 5_000_000
	// peerSpin keeps the peer spinning between requests ("awake"); it
	// sleeps on the doorbell only after this long without work.
	peerSpin = time.Second
)

func main() {
	var (
		trips  = flag.Int("trips", defaultTrips, "measured round trips, one at a time")
		warmup = flag.Int("warmup", defaultWarmup, "unmeasured round trips first")
		stream = flag.Int("stream", defaultStream, "request/response pairs in the streaming phase")
		dir    = flag.String("dir", shm.DefaultDir, "directory for the segment file")
		peer   = flag.String("peer", "", "internal: run as the frontend of the segment at this path")
	)
	flag.Parse()
	var err error
	if *peer != "" {
		err = runFrontend(*peer, *trips, *warmup, *stream)
	} else {
		err = run(*dir, *trips, *warmup, *stream)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "ringbench:", err)
		os.Exit(1)
	}
}

func run(dir string, trips, warmup, stream int) error {
	g := shm.Geometry{
		Lanes:        1,
		RingCapacity: 256,
		SlotsPerLane: 256,
		ArenaBytes:   2 << 20,
		StagingCount: 1,
		StagingBytes: shm.PageSize,
		MaxExamples:  1,
		ExampleBytes: 64,
	}
	seg, err := shm.Create(shm.Options{Name: fmt.Sprintf("ringbench-%d", os.Getpid()), Dir: dir, Geometry: g})
	if err != nil {
		return err
	}
	defer seg.Remove()
	defer seg.Close()
	// Ctrl-C ends the waits below, so the deferred cleanup removes the file.
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	beats := make(chan struct{})
	go func() {
		defer close(beats)
		seg.Heartbeat(ctx, 0, nil)
	}()
	defer func() { cancel(); <-beats }() // stop beating before Close unmaps

	self, err := os.Executable()
	if err != nil {
		return err
	}
	cmd := exec.Command(self, "-peer", seg.Path(), fmt.Sprintf("-trips=%d", trips), fmt.Sprintf("-warmup=%d", warmup), fmt.Sprintf("-stream=%d", stream))
	cmd.Stdout = os.Stdout
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	served := make(chan error, 1)
	sctx, stop := context.WithCancel(ctx)
	go func() { served <- serve(sctx, seg) }()
	var werr error
	select {
	case werr = <-exited:
	case <-ctx.Done():
		cmd.Process.Kill()
		werr = <-exited
	}
	stop()
	if err := <-served; err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	if werr != nil {
		return fmt.Errorf("frontend: %w", werr)
	}
	return nil
}

// runFrontend attaches to the segment at path, claims its only lane and
// measures: one request at a time, then every slot in flight.
func runFrontend(path string, trips, warmup, stream int) error {
	seg, err := shm.Attach(path, shm.AttachOptions{})
	if err != nil {
		return err
	}
	defer seg.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	lane, err := seg.ClaimLane(os.Getpid())
	if err != nil {
		return err
	}
	beats := make(chan struct{})
	go func() {
		defer close(beats)
		lane.Heartbeat(ctx, 0)
	}()
	defer func() { cancel(); <-beats }() // stop beating before Close unmaps
	lane.Bell().SetSpin(peerSpin)
	g := seg.Geometry()
	// Phase 1: one at a time.
	slot, _, err := lane.Claim(1, 64)
	if err != nil {
		return err
	}
	lat := make([]time.Duration, trips)
	for i := -warmup; i < trips; i++ {
		t0 := time.Now()
		if err := lane.Commit(slot, shm.RequestMeta{ID: uint64(i + warmup)}); err != nil {
			return err
		}
		if _, err := lane.WaitCompletion(ctx); err != nil {
			return err
		}
		if i >= 0 {
			lat[i] = time.Since(t0)
		}
	}
	if _, err := lane.Free(slot); err != nil {
		return err
	}
	slices.Sort(lat)
	p := func(q float64) float64 { return float64(lat[int(q*float64(len(lat)-1))]) / 1e3 }
	fmt.Printf("round trips: %d, min %.2f us, p50 %.2f us, p90 %.2f us, p99 %.2f us, p99.9 %.2f us, max %.2f us\n",
		trips, p(0), p(0.5), p(0.9), p(0.99), p(0.999), p(1))

	// Phase 2: every slot in flight.
	slots := make([]int, g.SlotsPerLane)
	for i := range slots {
		if slots[i], _, err = lane.Claim(1, 64); err != nil {
			return err
		}
	}
	start := time.Now()
	sent, done := 0, 0
	for _, s := range slots[:min(len(slots), stream)] {
		if err := lane.Commit(s, shm.RequestMeta{ID: uint64(sent)}); err != nil {
			return err
		}
		sent++
	}
	for done < stream {
		c, err := lane.WaitCompletion(ctx)
		if err != nil {
			return err
		}
		done++
		if sent < stream {
			if err := lane.Commit(c.Slot, shm.RequestMeta{ID: uint64(sent)}); err != nil {
				return err
			}
			sent++
		}
	}
	el := time.Since(start)
	rate := float64(stream) / el.Seconds()
	fmt.Printf("streaming: %d request/response pairs in %v\n", stream, el.Round(time.Millisecond))
	fmt.Printf("ring: round_trip_p50_us=%.2f round_trip_p99_us=%.2f msgs_per_s=%.0f\n", p(0.5), p(0.99), rate)
	return nil
}

// serve is the echo peer: it serves the segment's only lane, as the
// owner, until ctx is done; every request is completed at once,
// completions published in batches.
func serve(ctx context.Context, seg *shm.Segment) error {
	rr, err := seg.RequestReader(0)
	if err != nil {
		return err
	}
	cw, err := seg.CompletionWriter(0)
	if err != nil {
		return err
	}
	bell := seg.EmbedderBell()
	bell.SetSpin(peerSpin)
	for {
		for {
			req, ok, err := rr.Next()
			if err != nil {
				return err
			}
			if !ok {
				break
			}
			if err := cw.Add(shm.Completion{Slot: req.Slot, Epoch: req.Epoch, Examples: req.Examples}); err != nil {
				return err
			}
		}
		cw.Flush()
		if _, err := bell.Wait(ctx, rr.Pending, shm.DefaultLivenessTick); err != nil {
			return err
		}
	}
}
