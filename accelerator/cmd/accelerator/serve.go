package main

import (
	"context"
	"flag"
	"os"

	"github.com/recmesh/recmesh/accelerator/device"
	"github.com/recmesh/recmesh/accelerator/executor"
	"github.com/recmesh/recmesh/accelerator/server"
	"github.com/recmesh/recmesh/model"
	"github.com/recmesh/recmesh/shm"
	"github.com/recmesh/recmesh/telemetry"
	"github.com/recmesh/recmesh/telemetry/flagenv"
)

// version is set at link time (-ldflags -X main.version=...).
var version = "dev"

func runServe(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	var c commonFlags
	c.register(fs)
	shmDir := fs.String("shm-dir", shm.DefaultDir, "directory of the embedder's shared-memory segment")
	segment := fs.String("segment", server.DefaultSegment, "segment file name")
	metricsAddr := fs.String("metrics-addr", ":9103", "address of /metrics and /healthz (empty: off)")
	fs.Usage = func() { flagenv.Usage(fs) }
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := flagenv.Apply(fs, os.Getenv); err != nil {
		return err
	}
	if err := c.validate(); err != nil {
		return err
	}
	tel, err := telemetry.New(ctx, "recmesh-accelerator", telemetry.Options{Version: version})
	if err != nil {
		return err
	}
	defer tel.Shutdown(context.Background())

	bundle, err := model.Open(c.bundle)
	if err != nil {
		return err
	}
	defer bundle.Close()
	rt, err := device.Open(c.plugin, tel.Log)
	if err != nil {
		return err
	}
	defer rt.Close()
	ex, err := executor.New(ctx, rt, bundle, executor.Options{MaxBatch: c.maxBatch, Log: tel.Log})
	if err != nil {
		return err
	}
	defer ex.Close()
	srv, err := server.New(server.Options{ShmDir: *shmDir, Segment: *segment, Executor: ex, Log: tel.Log, Registry: tel.Registry})
	if err != nil {
		return err
	}
	if _, err := tel.ServeHTTP(ctx, *metricsAddr, func() bool { return srv.Generation() != 0 }); err != nil {
		return err
	}
	return srv.Run(ctx)
}
