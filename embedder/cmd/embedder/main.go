// Command embedder runs the mesh's embedding service: it loads the tables
// of --bundle into huge pages, creates the shared-memory segment frontends
// and the accelerator attach to, and serves lookups until SIGTERM.
//
// Every flag has an environment twin (RECMESH_<FLAG>, see -h).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/recmesh/recmesh/embedder"
	"github.com/recmesh/recmesh/embedder/batch"
	"github.com/recmesh/recmesh/shm"
	"github.com/recmesh/recmesh/telemetry"
	"github.com/recmesh/recmesh/telemetry/flagenv"
)

// version is set at link time (-ldflags -X main.version=...).
var version = "dev"

func main() {
	if err := run(os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "embedder:", err)
		os.Exit(2)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("embedder", flag.ContinueOnError)
	var (
		bundle      = fs.String("bundle", "data/dlrm-cap1000", "model bundle directory")
		shmDir      = fs.String("shm-dir", shm.DefaultDir, "directory of the shared-memory segment (/dev/shm or a hugetlbfs mount)")
		segment     = fs.String("segment", embedder.DefaultSegment, "segment file name")
		lanes       = fs.Int("lanes", embedder.DefaultLanes, "frontend lanes (frontends that can attach at once)")
		mode        = fs.String("batch-mode", "full", "batching: none (one lookup and model call per request), model (merge model calls), full (merge lookups and model calls)")
		maxBatch    = fs.Int("max-batch", batch.DefaultMaxBatch, "most examples per batch")
		window      = fs.Duration("batch-window", batch.DefaultWindow, "how long a full-mode batch waits for more requests")
		workers     = fs.Int("workers", 0, "lookup goroutines (0: the usable cores)")
		staging     = fs.Int("staging", embedder.DefaultStaging, "staging buffers: batches in flight to the accelerator")
		metricsAddr = fs.String("metrics-addr", ":9102", "address of /metrics and /healthz (empty: off)")
		natsURL     = fs.String("nats-url", "", "NATS server for the control plane (env NATS_URL; empty: no control plane)")
	)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: embedder [flags]")
		flagenv.Usage(fs)
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := flagenv.Apply(fs, os.Getenv); err != nil {
		return err
	}
	if *natsURL == "" {
		*natsURL = os.Getenv("NATS_URL")
	}
	m, err := batch.ParseMode(*mode)
	if err != nil {
		return fmt.Errorf("--batch-mode: %w", err)
	}
	if *maxBatch < 1 || *maxBatch > 1<<16 {
		return fmt.Errorf("--max-batch %d: want 1..65536", *maxBatch)
	}
	if *lanes < 1 || *lanes > 1024 {
		return fmt.Errorf("--lanes %d: want 1..1024", *lanes)
	}
	if *window < 0 || *window > time.Second {
		return fmt.Errorf("--batch-window %v: want 0..1s", *window)
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	tel, err := telemetry.New(ctx, "recmesh-embedder", telemetry.Options{Version: version})
	if err != nil {
		return err
	}
	defer tel.Shutdown(context.Background())

	e, err := embedder.New(embedder.Options{
		Bundle: *bundle, ShmDir: *shmDir, Segment: *segment, Lanes: *lanes,
		Mode: m, MaxBatch: *maxBatch, Window: *window, Workers: *workers, Staging: *staging,
		Log: tel.Log, Registry: tel.Registry,
	})
	if err != nil {
		return err
	}
	ready := func() bool { return e.Current().Generation != 0 }
	if _, err := tel.ServeHTTP(ctx, *metricsAddr, ready); err != nil {
		e.Close()
		return err
	}
	_ = natsURL // the control plane attaches here (announce, status, rollout)
	if err := e.Run(ctx); err != nil {
		return err
	}
	tel.Log.Info("stopped")
	return nil
}
