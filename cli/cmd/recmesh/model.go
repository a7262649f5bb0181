package main

import (
	"context"
	"flag"
	"fmt"
	"path/filepath"
	"time"

	"github.com/recmesh/recmesh/proto/control"
)

func init() {
	register(&command{
		name:    "model",
		summary: "model rollout: recmesh model load DIR switches the mesh to the bundle in DIR with no failed request",
		run:     runModel,
	})
}

func runModel(ctx context.Context, e *env, args []string) error {
	if len(args) == 0 || args[0] != "load" {
		return usagef("usage: recmesh model load [--nats-url URL] [--timeout D] DIR")
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
