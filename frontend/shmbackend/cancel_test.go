package shmbackend

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/recmesh/recmesh/frontend"
	"github.com/recmesh/recmesh/model"
	pb "github.com/recmesh/recmesh/proto/inference"
	"github.com/recmesh/recmesh/proto/oip"
	"github.com/recmesh/recmesh/shm"
)

// cancelPoint is where in a call's life a storm call gives up.
type cancelPoint int

const (
	cancelNever         cancelPoint = iota // runs to its answer
	cancelBeforeAcquire                    // ctx already done at Acquire
	cancelBeforeSubmit                     // done between Acquire and Submit
	cancelNoSubmit                         // released without a Submit
	cancelWhileWaiting                     // cancelled after Submit began, racing the answer
	cancelDeadline                         // a deadline of a few hundred µs
	numCancelPoints
)

// stormCall is one call of the storm: it fills the slot with inputs that
// identify the call (the echo mesh answers each example with its first
// dense value), gives up at point p, and checks any scores it gets.
func stormCall(b *Backend, id int, n int, p cancelPoint) error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	switch p {
	case cancelBeforeAcquire:
		cancel()
	case cancelDeadline:
		ctx, cancel = context.WithTimeout(ctx, time.Duration(50+rand.IntN(500))*time.Microsecond)
		defer cancel()
	}
	slot, err := b.Acquire(ctx, n)
	if err != nil {
		if p == cancelNever {
			return fmt.Errorf("acquire: %w", err)
		}
		return nil
	}
	defer slot.Release()
	dense, sparse := model.RandomInputs(testModel(), uint64(id), n)
	for k := 0; k < n; k++ {
		dense[k*testModel().NumDense] = float32(id*16 + k)
	}
	copy(slot.Dense(), dense)
	copy(slot.Sparse(), sparse)
	switch p {
	case cancelNoSubmit:
		return nil
	case cancelBeforeSubmit:
		cancel()
	case cancelWhileWaiting:
		go func() {
			spin(time.Duration(rand.IntN(300)) * time.Microsecond)
			cancel()
		}()
	}
	scores, err := slot.Submit(ctx, frontend.Call{Arrival: time.Now()})
	if err != nil {
		if p == cancelNever {
			return fmt.Errorf("submit: %w", err)
		}
		if !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("cancelled call failed otherwise: %w", err)
		}
		// A server writes its error answer before it releases the slot:
		// the completion the call gave up on may be read meanwhile.
		spin(time.Duration(rand.IntN(400)) * time.Microsecond)
		return nil
	}
	for k, s := range scores {
		if want := float32(id*16+k) + 0.5; s != want {
			return fmt.Errorf("call %d example %d: score %v, want %v: another call's answer", id, k, s, want)
		}
	}
	return nil
}

// TestCancelAtEveryPoint: callers give up at every point of a call's life
// while the mesh answers with jitter, so cancellations race completions.
// Every call that is answered gets its own scores, the lane's slots and
// references all come back, and the backend serves afterwards: a slot
// freed twice would hand one call's slot to another (wrong scores) or
// drive the reference count below zero (every later call UNAVAILABLE).
func TestCancelAtEveryPoint(t *testing.T) {
	dir := t.TempDir()
	startEchoMesh(t, dir, 0.5, true, 200*time.Microsecond)
	b := newBackend(t, dir)
	a := b.cur.Load()

	const workers, perWorker = 16, 400
	var wg sync.WaitGroup
	var failed atomic.Value
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perWorker {
				id := w*perWorker + i
				p := cancelPoint(rand.IntN(int(numCancelPoints)))
				if err := stormCall(b, id, 1+id%4, p); err != nil {
					failed.CompareAndSwap(nil, fmt.Errorf("point %d: %w", p, err))
					return
				}
			}
		}()
	}
	wg.Wait()
	if err, _ := failed.Load().(error); err != nil {
		t.Fatal(err)
	}
	// Abandoned calls' completions arrive after their callers left.
	waitFor(t, "every slot back in the lane", func() bool {
		return a.refs.Load() == 0 && a.lane.InFlight() == 0 && a.lane.FreePages() == a.seg.Geometry().ArenaBytes/shm.PageSize
	})
	if b.cur.Load() != a {
		t.Fatalf("the storm lost the attachment: generation %d", b.Generation())
	}
	for id := range 64 {
		if err := stormCall(b, 1<<20+id, 1, cancelNever); err != nil {
			t.Fatalf("after the storm: %v", err)
		}
	}
}

// TestCancelAcrossLostGeneration: callers keep giving up while their
// generation is lost under them and replaced; the new one serves every
// later call, and the old one's attachment closes (every reference came
// back).
func TestCancelAcrossLostGeneration(t *testing.T) {
	dir := t.TempDir()
	old := startEchoMesh(t, dir, 0.5, true, 200*time.Microsecond)
	b := newBackend(t, dir)
	a := b.cur.Load()

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var failed atomic.Value
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				p := cancelPoint(1 + rand.IntN(int(numCancelPoints)-1)) // every point that gives up
				if err := stormCall(b, w<<16+i, 1+i%3, p); err != nil {
					failed.CompareAndSwap(nil, err)
					return
				}
			}
		}()
	}
	time.Sleep(100 * time.Millisecond)
	startEchoMesh(t, dir, 0.5, true, 200*time.Microsecond) // the successor
	old.stop()                                             // the generation is lost under the storm
	waitFor(t, "a newer generation", func() bool { return b.Generation() > a.seg.Generation() && b.Ready() })
	time.Sleep(100 * time.Millisecond)
	close(stop)
	wg.Wait()
	if err, _ := failed.Load().(error); err != nil {
		t.Fatal(err)
	}
	waitPhase(t, a, phaseClosed)
	for id := range 32 {
		if err := stormCall(b, 1<<20+id, 2, cancelNever); err != nil {
			t.Fatalf("after the loss: %v", err)
		}
	}
}

// TestDeadlineStormThroughTransports is the outside view of the same: a
// plain grpc-go client with deadlines of 0.2 to 3 ms, on both of the
// frontend's transports, against the shared-memory backend. Afterwards
// the frontend must answer calls with their own scores.
func TestDeadlineStormThroughTransports(t *testing.T) {
	for _, transport := range []string{frontend.TransportGRPC, frontend.TransportLean} {
		t.Run(transport, func(t *testing.T) {
			dir := t.TempDir()
			startEchoMesh(t, dir, 0.5, true, 50*time.Microsecond)
			b := newBackend(t, dir)
			srv, err := frontend.New(frontend.Options{
				Listen: "127.0.0.1:0", MetricsAddr: frontend.MetricsOff, Model: testModel(), Backend: b,
				Transport: transport, Logger: slog.New(slog.DiscardHandler),
			})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			served := make(chan error, 1)
			go func() { served <- srv.Run(ctx) }()
			t.Cleanup(func() { cancel(); <-served })
			waitFor(t, "the frontend listening", func() bool { return srv.Addr() != nil })
			cc, err := grpc.NewClient(srv.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			defer cc.Close()
			client := pb.NewGRPCInferenceServiceClient(cc)

			// 16 callers with short deadlines for 3 s; every call that is
			// answered must carry its own scores.
			end := time.Now().Add(3 * time.Second)
			var wg sync.WaitGroup
			var failed atomic.Value
			var answered atomic.Int64
			for w := range 16 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := 0; time.Now().Before(end); i++ {
						d := time.Duration(200+rand.IntN(2800)) * time.Microsecond
						ok, err := inferOwn(client, w<<16+i, d)
						if err != nil {
							failed.CompareAndSwap(nil, err)
							return
						}
						if ok {
							answered.Add(1)
						}
					}
				}()
			}
			wg.Wait()
			if err, _ := failed.Load().(error); err != nil {
				t.Fatal(err)
			}
			t.Logf("%s: %d calls answered within their deadline", transport, answered.Load())
			// Within seconds the frontend answers every call again.
			for i := range 50 {
				ok, err := inferOwn(client, 1<<30+i, 10*time.Second)
				if err != nil || !ok {
					t.Fatalf("after the storm, call %d: answered=%v err=%v", i, ok, err)
				}
			}
		})
	}
}

// inferOwn sends one call whose examples identify it, with deadline d. ok
// says it was answered; err is set for a wrong answer or a failure other
// than the deadline.
func inferOwn(client pb.GRPCInferenceServiceClient, id int, d time.Duration) (ok bool, err error) {
	const n = 2
	cfg := testModel()
	dense, sparse := model.RandomInputs(cfg, uint64(id), n)
	for k := 0; k < n; k++ {
		dense[k*cfg.NumDense] = float32(id%(1<<20)*16 + k)
	}
	req, err := oip.BuildRequest(frontend.DefaultModelName, cfg, dense, sparse, n, "INT32")
	if err != nil {
		return false, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	resp, err := client.ModelInfer(ctx, req)
	if err != nil {
		switch status.Code(err) {
		case codes.DeadlineExceeded, codes.Canceled, codes.ResourceExhausted:
			return false, nil
		}
		return false, fmt.Errorf("call %d: %w", id, err)
	}
	scores, err := oip.Scores(resp, n)
	if err != nil {
		return false, err
	}
	for k, s := range scores {
		if want := float32(id%(1<<20)*16+k) + 0.5; s != want {
			return false, fmt.Errorf("call %d example %d: score %v, want %v: another call's answer", id, k, s, want)
		}
	}
	return true, nil
}
