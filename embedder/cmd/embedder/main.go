// Command embedder runs the mesh's embedding service: it loads the tables
// of --bundle into huge pages, creates the shared-memory segment frontends
// and the accelerator attach to, and serves lookups until SIGTERM.
//
// Every flag has an environment twin (RECMESH_<FLAG>, see -h).
package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/recmesh/recmesh/embedder"
	"github.com/recmesh/recmesh/embedder/batch"
	"github.com/recmesh/recmesh/embedder/rowupdate"
	"github.com/recmesh/recmesh/model"
	"github.com/recmesh/recmesh/proto/control"
	"github.com/recmesh/recmesh/proto/updates"
	"github.com/recmesh/recmesh/shm"
	"github.com/recmesh/recmesh/shm/sched"
	"github.com/recmesh/recmesh/telemetry"
	"github.com/recmesh/recmesh/telemetry/flagenv"
)

// announceInterval is how often the current generation is re-announced.
const announceInterval = 2 * time.Second

// rolloutTimeout bounds one model rollout: tables and compilation.
const rolloutTimeout = 10 * time.Minute

// status is the embedder's answer on the control plane; cons is nil with
// row updates off.
func status(e *embedder.Embedder, cons *rowupdate.Consumer) control.Status {
	g := e.Current()
	st := control.Status{State: "starting", Generation: g.Generation, ModelID: g.ModelID}
	if g.Generation != 0 {
		st.State, st.Ready = "ready", true
	}
	if cons != nil {
		u := cons.Status()
		st.Updates = &u
		if !u.CaughtUp && g.Generation == 0 {
			st.State = "replaying updates"
		}
	}
	for _, l := range e.Lanes() {
		st.Lanes = append(st.Lanes, control.LaneStatus{Index: l.Index, Owner: l.Owner, State: l.State, Queued: l.Queued})
		st.QueueDepth += l.Queued
	}
	return st
}

func main() {
	if err := run(os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "embedder:", err)
		os.Exit(2)
	}
}

// optionFlags names the flag behind each embedder.Options field that
// Options validates.
var optionFlags = map[string]string{
	"Bundle": "bundle", "Lanes": "lanes", "LanesPerFrontend": "lanes-per-frontend", "MaxBatch": "max-batch",
	"Window": "batch-window", "LatencyTarget": "latency-target", "SLOBatchBytes": "slo-batch-mib",
}

func run(args []string) error {
	fs := flag.NewFlagSet("embedder", flag.ContinueOnError)
	var (
		bundle      = fs.String("bundle", model.DefaultDevBundle, "model bundle directory (until a rollout records another in the model root)")
		modelRoot   = fs.String("model-root", "", "directory rollouts may load bundles from, and where the serving model is recorded (empty: the directory holding --bundle)")
		shmDir      = fs.String("shm-dir", shm.DefaultDir, "directory of the shared-memory segment (/dev/shm or a hugetlbfs mount); made, writable by this user alone, when it does not exist (its parent must)")
		segment     = fs.String("segment", embedder.DefaultSegment, "segment file name")
		segmentMode = fs.String("segment-mode", "0600", "permission of the segment socket: 0600 (this user's processes only), or 0660 to admit frontends that run as other users in this process's group (give them --segment-owner-uid)")
		lanes       = fs.Int("lanes", embedder.DefaultLanes, "frontend lanes (frontends that can attach at once)")
		lanesPerFE  = fs.Int("lanes-per-frontend", shm.DefaultMaxLanesPerPeer, "most lanes one frontend process may hold, so one cannot lock the others out")
		accelKey    = fs.String("accelerator-key-file", "", "file holding the secret the accelerator must present to attach, created (mode 0600, a random key) when missing; give the same file to the accelerator and to no frontend (empty: no key; then only the user id keeps frontends from the accelerator's place, see docs/security.md)")
		mode        = fs.String("batch-mode", "slo", "batching: slo (merge model calls while the device is busy, as large as the latency target allows; shed what cannot meet it), none (one lookup and model call per request), model (merge model calls whenever the device is busy), full (merge lookups and model calls within --batch-window)")
		target      = fs.Duration("latency-target", batch.DefaultLatencyTarget, "slo mode: the end-to-end p99 budget batches are sized for and requests are admitted against")
		maxBatch    = fs.Int("max-batch", batch.DefaultMaxBatch, "most examples per batch")
		window      = fs.Duration("batch-window", batch.DefaultWindow, "how long a full-mode batch waits for more requests")
		sloBatchMiB = fs.Int("slo-batch-mib", embedder.DefaultSLOBatchBytes>>20, "slo mode: MiB of staged rows one merged batch may hold (1,024 DLRMv2 examples at 16); larger batches fall out of the caches and cost more per example")
		workers     = fs.Int("workers", 0, "lookup goroutines (0: the usable cores)")
		staging     = fs.Int("staging", embedder.DefaultStaging, "staging buffers: batches in flight to the accelerator")
		reserve     = fs.Bool("reserve-segment", true, "reserve each segment's memory when it is created, so a full --shm-dir fails the start with an error instead of a SIGBUS mid-serve")
		metricsAddr = fs.String("metrics-addr", "127.0.0.1:9102", "address of /metrics and /healthz (empty: off; loopback by default, \":9102\" for every interface)")
		natsURL     = fs.String("nats-url", "", "NATS server for the control plane (env NATS_URL; empty: no control plane)")
		schedBatch  = fs.Bool("sched-batch", true, sched.BatchUsage)
		rowUpdates  = fs.Bool("updates", true, "apply row updates from the NATS JetStream stream "+updates.Stream+" while serving (with --nats-url); a restarted embedder replays them before it serves (docs/design.md, Row updates)")
		instance    = fs.String("updates-instance", "", "this embedder's name in its durable consumer of the row updates (embedder-<model id>-<name>): unique among the embedders sharing a NATS server, or they would split the updates between them (default: host name and segment, which the serving pods of a scaled-out mesh already differ in)")
		streamMiB   = fs.Int64("updates-stream-mib", 0, "size limit of the row-update stream when the embedder creates it (0: unlimited); older updates are dropped beyond it, and a bundle older than the oldest kept one needs a snapshot")
	)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: embedder [flags]")
		flagenv.Usage(fs)
	}
	flagenv.DefinePrintConfig(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := flagenv.Apply(fs, os.Getenv); err != nil {
		return err
	}
	if *natsURL == "" {
		*natsURL = os.Getenv("NATS_URL")
	}
	if err := rowupdate.CheckInstance(*instance); err != nil {
		return fmt.Errorf("--updates-instance: %w; name it with letters, digits, '-' and '_'", err)
	}
	m, err := batch.ParseMode(*mode)
	if err != nil {
		return fmt.Errorf("--batch-mode: %w", err)
	}
	var key []byte
	if *accelKey != "" {
		if key, err = shm.AcceleratorKeyFile(*accelKey, true); err != nil {
			return fmt.Errorf("--accelerator-key-file: %w", err)
		}
	}
	var sockMode os.FileMode
	switch *segmentMode {
	case "0600", "600":
		sockMode = 0o600
	case "0660", "660":
		sockMode = 0o660
	default:
		return fmt.Errorf("--segment-mode %q: want 0600, or 0660 to share the segment with this process's group", *segmentMode)
	}
	if *schedBatch {
		if err := sched.UseBatchScheduling(); err != nil {
			return fmt.Errorf("--sched-batch: %w (--sched-batch=false keeps the default policy)", err)
		}
	}

	root, err := model.OpenRoot(cmp.Or(*modelRoot, filepath.Dir(*bundle)))
	if err != nil {
		return fmt.Errorf("--model-root: %w", err)
	}
	startBundle, resumed, err := root.StartBundle(*bundle)
	if err != nil {
		return err
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	tel, err := telemetry.New(ctx, "recmesh-embedder", telemetry.Options{Version: telemetry.Version()})
	if err != nil {
		return err
	}
	defer tel.Shutdown(context.Background())

	var nc *nats.Conn
	if *natsURL != "" {
		if nc, err = control.Connect(*natsURL, control.ServiceEmbedder, tel.Log); err != nil {
			return err
		}
		defer nc.Close()
	}
	announce := func(g embedder.Generation) {
		if nc != nil {
			_ = control.PublishAnnounce(nc, control.Announce{Path: g.Path, Generation: g.Generation, ModelID: g.ModelID})
		}
	}
	if resumed {
		tel.Log.Info("serving the rolled-out model recorded in the model root", "bundle", startBundle, "record", filepath.Join(root.Dir(), model.ServingFile), "flag_bundle", *bundle)
	}
	// Zero would mean "the default" to embedder.Options: say so instead.
	for _, f := range []struct {
		name string
		v    int
	}{{"lanes", *lanes}, {"lanes-per-frontend", *lanesPerFE}, {"max-batch", *maxBatch}, {"slo-batch-mib", *sloBatchMiB}} {
		if f.v < 1 {
			return fmt.Errorf("--%s %d: want at least 1", f.name, f.v)
		}
	}
	if *target == 0 {
		return fmt.Errorf("--latency-target 0: want at least %v", embedder.MinLatencyTarget)
	}
	e, err := embedder.New(embedder.Options{
		Bundle: startBundle, ShmDir: *shmDir, Segment: *segment, SegmentMode: sockMode, Lanes: *lanes, LanesPerFrontend: *lanesPerFE, AcceleratorKey: key,
		Mode: m, MaxBatch: *maxBatch, Window: *window, LatencyTarget: *target, SLOBatchBytes: int64(*sloBatchMiB) << 20, Workers: *workers, Staging: *staging, LazySegment: !*reserve,
		Log: tel.Log, Registry: tel.Registry, OnGeneration: announce, Tracer: tel.Tracer,
	})
	if oe := (*embedder.OptionError)(nil); errors.As(err, &oe) {
		return fmt.Errorf("--%s: %w", optionFlags[oe.Option], oe.Err)
	}
	if err != nil {
		return err
	}
	// replayed is closed once the tables hold every row update the
	// serving record says they held before a restart.
	replayed := make(chan struct{})
	close(replayed)
	if nc != nil {
		// Rollouts: load the new tables beside the old, have the
		// accelerator compile the new program, then switch generations.
		rollouts := embedder.NewRollouts(e, root, func(ctx context.Context, dir, _ string) error {
			_, err := control.Call(ctx, nc, control.SubjectPrepare, control.LoadRequest{Bundle: dir})
			return err
		})
		var cons *rowupdate.Consumer
		if *rowUpdates {
			name := *instance
			if name == "" {
				name = rowupdate.DefaultInstance(*segment)
			}
			if cons, replayed, err = followUpdates(ctx, nc, e, rollouts, name, *streamMiB<<20, tel); err != nil {
				e.Close()
				return err
			}
			// A rollout's tables replay the stream before they serve.
			rollouts.SetUpdates(cons)
		}
		svc, err := control.Register(nc, control.ServiceEmbedder, telemetry.Version(), func() control.Status { return status(e, cons) })
		if err != nil {
			e.Close()
			return err
		}
		defer svc.Stop()
		// The tables' hash, for an operator proving that a replay reached
		// the same tables (recmesh update status --hash).
		hashSub, err := nc.Subscribe(control.SubjectTablesHash, func(m *nats.Msg) {
			var r control.TablesHashReply
			if cons != nil {
				// Applied must name the tables' state exactly: a replay
				// is checked against it.
				cons.Hold(func(applied uint64) { r.Applied, r.Hash = applied, e.Store().TablesHash() })
			} else {
				r.Hash = e.Store().TablesHash()
			}
			b, _ := json.Marshal(r)
			_ = m.Respond(b)
		})
		if err != nil {
			e.Close()
			return fmt.Errorf("subscribe %s: %w", control.SubjectTablesHash, err)
		}
		defer hashSub.Unsubscribe()
		// Snapshots: the serving tables, updates folded in, as a new
		// bundle in the model root, so a later rollout replays less.
		snapSub, err := nc.Subscribe(control.SubjectSnapshot, func(m *nats.Msg) {
			reply := snapshot(root, e, cons, m.Data)
			if reply.Error != "" {
				tel.Log.Error("snapshot failed", "err", reply.Error)
			} else {
				tel.Log.Info("snapshot written", "bundle", reply.Bundle, "updates_seq", reply.UpdatesSeq)
			}
			b, _ := json.Marshal(reply)
			_ = m.Respond(b)
		})
		if err != nil {
			e.Close()
			return fmt.Errorf("subscribe %s: %w", control.SubjectSnapshot, err)
		}
		defer snapSub.Unsubscribe()
		err = control.Serve(svc, "model-load", control.SubjectModelLoad, func(req control.LoadRequest) control.LoadReply {
			lctx, cancel := context.WithTimeout(ctx, rolloutTimeout)
			defer cancel()
			g, err := rollouts.Load(lctx, req.Bundle)
			if err != nil {
				tel.Log.Error("rollout failed; the old model keeps serving", "bundle", req.Bundle, "err", err)
				return control.LoadReply{Error: err.Error()}
			}
			return control.LoadReply{Generation: g.Generation, ModelID: g.ModelID}
		})
		if err != nil {
			e.Close()
			return err
		}
		// Re-announce periodically: a frontend that joins later, or missed
		// a message while NATS restarted, still learns the generation.
		go func() {
			t := time.NewTicker(announceInterval)
			defer t.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
					if g := e.Current(); g.Generation != 0 {
						announce(g)
					}
				}
			}
		}()
	}
	ready := func() bool { return e.Current().Generation != 0 }
	if _, err := tel.ServeHTTP(ctx, *metricsAddr, e.Live, ready); err != nil {
		e.Close()
		return err
	}
	select {
	case <-replayed:
	default:
		// Serving now would answer with older rows than before the
		// restart.
		tel.Log.Info("replaying row updates before serving", "model", e.Store().Config.ID())
		select {
		case <-replayed:
			tel.Log.Info("row updates replayed; serving")
		case <-ctx.Done():
			e.Close()
			return nil
		}
	}
	if err := e.Run(ctx); err != nil {
		return err
	}
	tel.Log.Info("stopped")
	return nil
}

// updatesGCPercent is the embedder's GOGC while it consumes row updates.
const updatesGCPercent = 1000

// followUpdates starts the consumer of the serving model's row updates.
// The channel it returns is closed once the tables hold every update the
// serving record says they held before (at once when there is none to
// replay).
func followUpdates(ctx context.Context, nc *nats.Conn, e *embedder.Embedder, rollouts *embedder.Rollouts, instance string, streamBytes int64, tel *telemetry.Telemetry) (*rowupdate.Consumer, chan struct{}, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, nil, fmt.Errorf("--updates: JetStream: %w", err)
	}
	// The NATS client allocates every message it receives (half a MiB
	// each at full size), while serving allocates nothing and the live
	// heap is a few MiB: at the default GOGC the collector would run tens
	// of times a second under a stream of updates, and each cycle stalls
	// lookups that share the core (make bench-updates measured a third of
	// the throughput lost at 100,000 rows/s, an eighth with GOGC=1000).
	// An operator's GOGC still wins.
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(updatesGCPercent)
	}
	var scratch embedder.Updater
	cons := rowupdate.New(rowupdate.Options{
		JS:          js,
		Apply:       func(m updates.Message) error { return e.Store().Apply(&scratch, m) },
		Record:      rollouts.RecordApplied,
		StreamBytes: streamBytes,
		Instance:    instance,
		Log:         tel.Log,
		Registry:    tel.Registry,
	})
	s := rollouts.Serving()
	caught, err := cons.Follow(e.Store().Config.ID(), s.UpdatesBase, s.UpdatesApplied)
	if err != nil {
		return nil, nil, fmt.Errorf("--updates: %w", err)
	}
	go func() { _ = cons.Run(ctx) }()
	replayed := make(chan struct{})
	go func() {
		defer close(replayed)
		if s.UpdatesApplied <= s.UpdatesBase {
			// No record of updates applied before: replay what the stream
			// holds if it can be reached, or serve the bundle as it is
			// when JetStream is off.
			select {
			case <-cons.Reached():
			case <-ctx.Done():
				return
			}
			if err := cons.ReachErr(); err != nil {
				tel.Log.Warn("row updates: the stream cannot be reached; serving the bundle's rows and retrying", "err", err)
				return
			}
		}
		select {
		case <-caught:
		case <-ctx.Done():
		}
	}()
	return cons, replayed, nil
}

// snapshot answers a SnapshotRequest: the serving tables written as a new
// bundle inside the model root.
func snapshot(root model.Root, e *embedder.Embedder, cons *rowupdate.Consumer, data []byte) control.SnapshotReply {
	var req control.SnapshotRequest
	if err := json.Unmarshal(data, &req); err != nil {
		return control.SnapshotReply{Error: fmt.Sprintf("snapshot request does not decode: %v", err)}
	}
	dir, err := root.NewBundle(req.Out)
	if err != nil {
		return control.SnapshotReply{Error: err.Error()}
	}
	var applied func() uint64
	if cons != nil {
		applied = cons.Applied
	}
	cfg, err := e.Store().WriteSnapshot(dir, applied)
	if err != nil {
		return control.SnapshotReply{Error: err.Error()}
	}
	return control.SnapshotReply{Bundle: dir, ModelID: cfg.ID(), UpdatesSeq: cfg.UpdatesSeq}
}
