package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/recmesh/recmesh/accelerator/dense"
	"github.com/recmesh/recmesh/accelerator/device"
	"github.com/recmesh/recmesh/accelerator/executor"
	"github.com/recmesh/recmesh/accelerator/server"
	"github.com/recmesh/recmesh/model"
	"github.com/recmesh/recmesh/proto/control"
	"github.com/recmesh/recmesh/proto/updates"
	"github.com/recmesh/recmesh/shm"
	"github.com/recmesh/recmesh/shm/sched"
	"github.com/recmesh/recmesh/telemetry"
)

func runServe(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	var c commonFlags
	c.register(fs)
	shmDir := fs.String("shm-dir", shm.DefaultDir, "directory of the embedder's shared-memory segment")
	segment := fs.String("segment", server.DefaultSegment, "segment file name")
	accelKey := fs.String("accelerator-key-file", "", "file holding the key the embedder's --accelerator-key-file made; presented to attach (empty: none)")
	metricsAddr := fs.String("metrics-addr", "127.0.0.1:9103", "address of /metrics and /healthz (empty: off; loopback by default, \":9103\" for every interface)")
	natsURL := fs.String("nats-url", "", "NATS server for the control plane (env NATS_URL; empty: none)")
	zeroCopy := fs.Bool("zero-copy-staging", true, "let the device read batches in place from the segment's staging buffers (a sealed memfd only the embedder and the accelerator hold); false copies each batch into private memory first, one memcpy per batch")
	modelRoot := fs.String("model-root", "", "directory rollouts may load bundles from, where the serving model is recorded (empty: the directory holding --bundle)")
	schedBatch := fs.Bool("sched-batch", true, sched.BatchUsage+" (XLA's threads, started later, inherit it)")
	if err := c.parse(fs, args); err != nil {
		return err
	}
	if *schedBatch {
		if err := sched.UseBatchScheduling(); err != nil {
			return fmt.Errorf("--sched-batch: %w (--sched-batch=false keeps the default policy)", err)
		}
	}
	if *natsURL == "" {
		*natsURL = os.Getenv("NATS_URL")
	}
	root, err := model.OpenRoot(cmp.Or(*modelRoot, filepath.Dir(c.bundle)))
	if err != nil {
		return fmt.Errorf("--model-root: %w", err)
	}
	startBundle, resumed, err := root.StartBundle(c.bundle)
	if err != nil {
		return err
	}
	tel, err := telemetry.New(ctx, "recmesh-accelerator", telemetry.Options{Version: telemetry.Version()})
	if err != nil {
		return err
	}
	defer tel.Shutdown(context.Background())

	if resumed {
		tel.Log.Info("serving the rolled-out model recorded in the model root", "bundle", startBundle, "record", filepath.Join(root.Dir(), model.ServingFile), "flag_bundle", c.bundle)
	}
	rt, err := c.openDevice(tel.Log)
	if err != nil {
		return err
	}
	defer rt.Close()
	// The bundle is closed once its weights are uploaded: the dense
	// tensors' page cache (61 MiB for MLPerf's network) would otherwise
	// stay in the process's memory for nothing.
	ex, err := compile(ctx, startBundle, rt, c.executorOptions(tel.Log))
	if err != nil {
		return err
	}
	defer ex.Close()
	releaseCompiler(rt, tel.Log)
	srv, err := server.New(server.Options{ShmDir: *shmDir, Segment: *segment, AcceleratorKeyFile: *accelKey, Executor: ex, Log: tel.Log, Registry: tel.Registry, Tracer: tel.Tracer,
		CopyStaging: !*zeroCopy, Release: func() { releaseHeap(tel.Log, "calibrating") }})
	if err != nil {
		return err
	}
	if _, err := tel.ServeHTTP(ctx, *metricsAddr, srv.Live, func() bool { return srv.Generation() != 0 }); err != nil {
		return err
	}
	if *natsURL != "" {
		nc, err := control.Connect(*natsURL, control.ServiceAccelerator, tel.Log)
		if err != nil {
			return err
		}
		defer nc.Close()
		// Dense weights from the object store: the serving model's stored
		// object, if any, before the first batch; then every new one.
		js, err := jetstream.New(nc)
		if err != nil {
			return fmt.Errorf("jetstream: %w", err)
		}
		bundles := &bundleDirs{dirs: map[string]string{ex.Config().ID(): startBundle}}
		weights := dense.New(dense.Options{JS: js, Log: tel.Log, Registry: tel.Registry, Bundle: bundles.get,
			Release: func() { releaseHeap(tel.Log, "dense weights") }})
		if nc.IsConnected() {
			addDense(ctx, weights, ex)
		} else {
			weights.Register(ex)
			tel.Log.Info("NATS not reached yet: serving the bundle's dense weights until the watch finds any stored ones", "bucket", updates.DenseBucket)
		}
		watchCtx, stopWatch := context.WithCancel(ctx)
		watchDone := make(chan struct{})
		go func() {
			defer close(watchDone)
			_ = weights.Run(watchCtx)
		}()
		defer func() { stopWatch(); <-watchDone }() // before ex and nc close
		svc, err := control.Register(nc, control.ServiceAccelerator, telemetry.Version(), func() control.Status {
			id := srv.ModelID()
			st := control.Status{State: "waiting", Generation: srv.Generation(), ModelID: id, Dense: weights.Status(id),
				Detail: fmt.Sprintf("plugin %s (PJRT API %s), %d buckets", rt.PluginFile(), rt.APIVersion(), len(ex.Buckets()))}
			if st.Generation != 0 {
				st.State, st.Ready = "serving", true
			}
			return st
		})
		if err != nil {
			return err
		}
		defer svc.Stop()
		// One compilation at a time: each holds a second program and its
		// weights on the device.
		var busy atomic.Bool
		err = control.Serve(svc, "prepare", control.SubjectPrepare, func(req control.LoadRequest) control.LoadReply {
			if !busy.CompareAndSwap(false, true) {
				return control.LoadReply{Error: "accelerator: busy: another rollout is compiling"}
			}
			defer busy.Store(false)
			dir, err := root.Resolve(req.Bundle)
			if err != nil {
				tel.Log.Error("prepare refused", "bundle", req.Bundle, "err", err)
				return control.LoadReply{Error: "accelerator: " + err.Error()}
			}
			next, err := compile(ctx, dir, rt, c.executorOptions(tel.Log))
			if err != nil {
				tel.Log.Error("prepare failed", "bundle", req.Bundle, "err", err)
				return control.LoadReply{Error: err.Error()}
			}
			bundles.set(next.Config().ID(), dir)
			addDense(ctx, weights, next) // the new model starts on its stored object, if any
			srv.Prepare(next)
			releaseCompiler(rt, tel.Log)
			tel.Log.Info("prepared rollout", "bundle", req.Bundle, "model", next.Config().ID(), "compile_s", next.CompileTime.Seconds())
			return control.LoadReply{ModelID: next.Config().ID()}
		})
		if err != nil {
			return err
		}
	}
	return srv.Run(ctx)
}

// denseLoadTimeout bounds the read of a model's stored dense weights when
// its executor is added: past it (NATS unreachable), the model starts on
// its bundle's weights and the watch swaps the stored ones in later.
const denseLoadTimeout = 30 * time.Second

// addDense registers ex with the dense-weights watcher, which swaps in the
// stored object of its model, if there is one, before returning.
func addDense(ctx context.Context, w *dense.Watcher, ex *executor.Executor) {
	ctx, cancel := context.WithTimeout(ctx, denseLoadTimeout)
	defer cancel()
	w.Add(ctx, ex)
}

// bundleDirs maps each model the process compiled to its bundle, for the
// watcher to bring a bundle's weights back when its object is deleted.
type bundleDirs struct {
	mu   sync.Mutex
	dirs map[string]string
}

func (b *bundleDirs) get(modelID string) (string, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	dir, ok := b.dirs[modelID]
	return dir, ok
}

func (b *bundleDirs) set(modelID, dir string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.dirs[modelID] = dir
}

// releaseCompiler gives back what compiling left in the process's memory:
// the plugin's code pages (device.Runtime.ReleaseCode), most of them XLA's
// compiler, which serving never runs again and which were a third of the
// mesh's memory beyond its tables; and the free pages of the Go and C
// heaps (releaseHeap): the weights' staging copies and the compiler's
// garbage, 120 MiB for MLPerf's network, which neither heap would give
// back while serving.
func releaseCompiler(rt *device.Runtime, log *slog.Logger) {
	n, err := rt.ReleaseCode()
	if err != nil {
		log.Warn("plugin code pages not released", "err", err)
	} else {
		log.Info("plugin code pages released after compiling", "mib", n>>20)
	}
	releaseHeap(log, "compiling")
}

// releaseHeap hands the free pages of the Go and C heaps back to the
// kernel (device.ReleaseHeap) after a rare event that left them, and logs
// what that gave back.
func releaseHeap(log *slog.Logger, after string) {
	before, errBefore := device.Resident()
	trimmed := device.ReleaseHeap()
	resident, errAfter := device.Resident()
	if err := errors.Join(errBefore, errAfter); err != nil {
		log.Warn("heap released; resident memory not read", "after", after, "c_heap_trimmed", trimmed, "err", err)
		return
	}
	log.Info("heap released", "after", after, "c_heap_trimmed", trimmed, "resident_mib_before", before>>20, "resident_mib_after", resident>>20)
}

// compile builds the executor for the bundle at dir; the bundle is only
// needed while the weights upload.
func compile(ctx context.Context, dir string, rt *device.Runtime, opts executor.Options) (*executor.Executor, error) {
	b, err := model.Open(dir)
	if err != nil {
		return nil, err
	}
	defer b.Close()
	return executor.New(ctx, rt, b, opts)
}
