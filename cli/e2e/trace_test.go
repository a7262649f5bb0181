package e2e

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/recmesh/recmesh/accelerator/device"
	"github.com/recmesh/recmesh/accelerator/executor"
	"github.com/recmesh/recmesh/accelerator/server"
	"github.com/recmesh/recmesh/embedder"
	"github.com/recmesh/recmesh/embedder/batch"
	"github.com/recmesh/recmesh/frontend"
	"github.com/recmesh/recmesh/frontend/shmbackend"
	"github.com/recmesh/recmesh/model"
	pb "github.com/recmesh/recmesh/proto/inference"
)

// TestTraceAcrossHops runs the three components in this process with one
// in-memory span exporter (the shared memory between them is real) and
// checks that every request's trace holds the frontend's server span, the
// embedder's queue-wait span and the accelerator's execute span, and that
// the batch spans link every request they carried.
func TestTraceAcrossHops(t *testing.T) {
	if _, err := device.FindPlugin(""); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI needs the PJRT plugin: %v", err)
		}
		t.Skipf("no PJRT plugin (run make deps): %v", err)
	}
	w := loadWorkload(t)
	dir := exportBundle(t)
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp), sdktrace.WithSampler(sdktrace.AlwaysSample()))
	defer tp.Shutdown(context.Background())

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	segment := fmt.Sprintf("recmesh-trace-%d", os.Getpid())
	defer os.Remove("/dev/shm/" + segment)
	const maxBatch = 256

	emb, err := embedder.New(embedder.Options{Bundle: dir, Segment: segment, Lanes: 2, Mode: batch.Full,
		MaxBatch: maxBatch, Workers: 1, Tracer: tp})
	if err != nil {
		t.Fatal(err)
	}
	wg.Add(1)
	go func() { defer wg.Done(); _ = emb.Run(ctx) }()

	bundle, err := model.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer bundle.Close()
	rt, err := device.Open("", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	ex, err := executor.New(ctx, rt, bundle, executor.Options{MaxBatch: maxBatch})
	if err != nil {
		t.Fatal(err)
	}
	defer ex.Close()
	acc, err := server.New(server.Options{Segment: segment, Executor: ex, Tracer: tp})
	if err != nil {
		t.Fatal(err)
	}
	wg.Add(1)
	go func() { defer wg.Done(); _ = acc.Run(ctx) }()

	be, err := shmbackend.New(shmbackend.Options{Segment: segment, Model: bundle.Config})
	if err != nil {
		t.Fatal(err)
	}
	fe, err := frontend.New(frontend.Options{Listen: "127.0.0.1:0", MetricsAddr: frontend.MetricsOff, Model: bundle.Config,
		Backend: be, MaxBatch: maxBatch, TracerProvider: tp})
	if err != nil {
		t.Fatal(err)
	}
	if err := fe.Listen(); err != nil {
		t.Fatal(err)
	}
	wg.Add(1)
	go func() { defer wg.Done(); _ = fe.Run(ctx) }()
	waitFor(t, 2*time.Minute, "the in-process mesh to be ready", be.Ready)

	conn, err := grpc.NewClient(fe.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := pb.NewGRPCInferenceServiceClient(conn)
	var sent []int
	var cwg sync.WaitGroup
	var mu sync.Mutex
	for i := range w.reqs {
		if w.n[i] > 16 {
			continue
		}
		sent = append(sent, i)
		cwg.Add(1)
		go func() {
			defer cwg.Done()
			cctx, ccancel := context.WithTimeout(ctx, time.Minute)
			defer ccancel()
			if _, err := client.ModelInfer(cctx, w.reqs[i]); err != nil {
				mu.Lock()
				t.Errorf("request %d: %v", i, err)
				mu.Unlock()
			}
		}()
	}
	cwg.Wait()
	if t.Failed() {
		return
	}

	spans := exp.GetSpans()
	byTrace := map[trace.TraceID][]tracetest.SpanStub{}
	var servers []tracetest.SpanStub
	for _, s := range spans {
		byTrace[s.SpanContext.TraceID()] = append(byTrace[s.SpanContext.TraceID()], s)
		if strings.HasSuffix(s.Name, "/ModelInfer") && s.SpanKind == trace.SpanKindServer {
			servers = append(servers, s)
		}
	}
	if len(servers) != len(sent) {
		t.Fatalf("%d ModelInfer server spans for %d requests", len(servers), len(sent))
	}
	linked := map[trace.SpanID]int{}
	for _, s := range spans {
		if s.Name == "embedder.lookup_batch" || s.Name == "accelerator.execute" {
			for _, l := range s.Links {
				linked[l.SpanContext.SpanID()]++
			}
		}
	}
	for _, srv := range servers {
		names := map[string]bool{}
		for _, s := range byTrace[srv.SpanContext.TraceID()] {
			names[s.Name] = true
			if s.Name != srv.Name && s.Parent.SpanID() != srv.SpanContext.SpanID() {
				t.Errorf("span %s in the request's trace is not a child of the server span", s.Name)
			}
		}
		for _, want := range []string{"embedder.queue_wait", "accelerator.execute_request"} {
			if !names[want] {
				t.Errorf("trace %s lacks %s (has %v)", srv.SpanContext.TraceID(), want, names)
			}
		}
		// One link from the embedder's batch span, one from the accelerator's.
		if linked[srv.SpanContext.SpanID()] != 2 {
			t.Errorf("request span %s is linked %d times by batch spans, want 2", srv.SpanContext.SpanID(), linked[srv.SpanContext.SpanID()])
		}
	}
}
