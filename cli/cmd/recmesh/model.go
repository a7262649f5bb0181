package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"path/filepath"
	"time"

	"github.com/recmesh/recmesh/proto/control"
)

func init() {
	register(&command{
		name:    "model",
		summary: "model rollout: recmesh model load DIR switches the mesh to the bundle in DIR with no failed request; recmesh model snapshot --out DIR writes the serving tables, row updates included, as a new bundle",
		run:     runModel,
	})
}

func runModel(ctx context.Context, e *env, args []string) error {
	if len(args) > 0 && args[0] == "snapshot" {
		return runSnapshot(ctx, e, args[1:])
	}
	if len(args) == 0 || args[0] != "load" {
		return usagef("usage: recmesh model load [--nats-url URL] [--timeout D] DIR, or recmesh model snapshot --out DIR")
	}
	fs := flag.NewFlagSet("model load", flag.ContinueOnError)
	natsURL := fs.String("nats-url", "", "NATS server (env NATS_URL)")
	timeout := fs.Duration("timeout", 10*time.Minute, "give up after this long (tables and compilation)")
	if err := parseFlagsArgs(fs, args[1:], e, 1); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return usagef("model load takes one bundle directory")
	}
	if *natsURL == "" {
		*natsURL = e.getenv("NATS_URL")
	}
	if *natsURL == "" {
		return usagef("%v", control.ErrNoURL)
	}
	dir, err := filepath.Abs(fs.Arg(0))
	if err != nil {
		return err
	}
	nc, err := control.Dial(*natsURL, "recmesh-model-load")
	if err != nil {
		return err
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	start := time.Now()
	// A large bundle takes minutes (tables mapped, every bucket compiled):
	// say so every progressEvery, so the wait does not look hung.
	stopProgress := make(chan struct{})
	progressDone := make(chan struct{})
	go func() {
		defer close(progressDone)
		t := time.NewTicker(progressEvery)
		defer t.Stop()
		for {
			select {
			case <-stopProgress:
				return
			case now := <-t.C:
				fmt.Fprintf(e.stderr, "model load: still loading %s after %s (the embedder maps the tables, the accelerator compiles every batch bucket)\n",
					dir, now.Sub(start).Round(time.Second))
			}
		}
	}()
	rep, err := control.Call(ctx, nc, control.SubjectModelLoad, control.LoadRequest{Bundle: dir})
	close(stopProgress)
	<-progressDone
	if err != nil {
		return fmt.Errorf("model load: %w (the previous model keeps serving)", err)
	}
	fmt.Fprintf(e.stdout, "model load: %s serving as generation %d (model %s) after %.1fs\n", dir, rep.Generation, rep.ModelID, time.Since(start).Seconds())
	return nil
}

// runSnapshot has the embedder write its serving tables, row updates
// included, as a new bundle in its model root; rolling that bundle out
// later replays only the updates after it.
func runSnapshot(ctx context.Context, e *env, args []string) error {
	fs := flag.NewFlagSet("model snapshot", flag.ContinueOnError)
	natsURL := fs.String("nats-url", "", "NATS server (env NATS_URL)")
	out := fs.String("out", "", "the new bundle's directory, inside the embedder's model root (relative to it, or absolute); must not exist")
	timeout := fs.Duration("timeout", 30*time.Minute, "give up after this long (the tables are written whole)")
	if err := parseFlags(fs, args, e); err != nil {
		return err
	}
	if *out == "" {
		return usagef("model snapshot needs --out DIR")
	}
	if *natsURL == "" {
		*natsURL = e.getenv("NATS_URL")
	}
	if *natsURL == "" {
		return usagef("%v", control.ErrNoURL)
	}
	nc, err := control.Dial(*natsURL, "recmesh-model-snapshot")
	if err != nil {
		return err
	}
	defer nc.Close()
	req, _ := json.Marshal(control.SnapshotRequest{Out: *out})
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	m, err := nc.RequestWithContext(ctx, control.SubjectSnapshot, req)
	if err != nil {
		return fmt.Errorf("snapshot: no answer from the embedder: %w", err)
	}
	var rep control.SnapshotReply
	if err := json.Unmarshal(m.Data, &rep); err != nil {
		return fmt.Errorf("snapshot: reply does not decode: %w", err)
	}
	if rep.Error != "" {
		return fmt.Errorf("snapshot: %s", rep.Error)
	}
	fmt.Fprintf(e.stdout, "snapshot: bundle=%s model=%s updates_seq=%d\n", rep.Bundle, rep.ModelID, rep.UpdatesSeq)
	return nil
}
