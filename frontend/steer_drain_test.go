//go:build linux

package frontend

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/recmesh/recmesh/proto/inference"
)

// startSteered starts a frontend in eBPF steering mode on addr (port 0
// for a new port) with its maps under pinRoot, or skips where eBPF
// steering cannot run (RECMESH_REQUIRE_EBPF=1, as CI sets it, fails
// instead).
func startSteered(t *testing.T, tr, addr, pinRoot string) *testServer {
	t.Helper()
	probe, err := New(Options{Transport: tr, Listen: addr, Model: testConfig(), Backend: newFakeBackend(), MaxBatch: testMaxBatch,
		Logger: discardLogger(), Version: "test", Steering: SteeringEBPF, SteeringDir: pinRoot})
	if err == nil {
		err = probe.Listen()
		probe.steer.close()
	}
	if err != nil {
		if os.Getenv("RECMESH_REQUIRE_EBPF") != "" || !strings.Contains(err.Error(), "eBPF steering") {
			t.Fatalf("eBPF steering required here: %v", err)
		}
		t.Skipf("no eBPF steering here: %v", err)
	}
	ts := startServerOn(t, tr, newFakeBackend(), func(o *Options) {
		o.Listen, o.Steering, o.SteeringDir = addr, SteeringEBPF, pinRoot
	})
	waitFor(t, 10*time.Second, "the frontend to join the steering group", func() bool {
		return ts.srv.steer.member.Load() != nil
	})
	return ts
}

// TestSteeredDrainLosesNoConnection: while clients keep dialling new
// connections, one call each, frontends that join the port's group and
// then drain fail no call. A connection steered to a frontend just before
// it turned unready, and still queued or just accepted when the drain
// begins, is either served or moved to a live frontend, never reset
// (grpc-go closes, unserved, any connection it accepts once GracefulStop
// has begun).
func TestSteeredDrainLosesNoConnection(t *testing.T) {
	forEachTransport(t, testSteeredDrainLosesNoConnection)
}

func testSteeredDrainLosesNoConnection(t *testing.T, tr string) {
	pinRoot := filepath.Join("/sys/fs/bpf", fmt.Sprintf("recmesh-test-%d-%s", os.Getpid(), strings.ReplaceAll(t.Name(), "/", "-")))
	t.Cleanup(func() { _ = os.RemoveAll(pinRoot) })
	stable := startSteered(t, tr, "127.0.0.1:0", pinRoot)
	addr := stable.srv.Addr().String()
	if !stable.srv.steer.group.Migrates() {
		t.Skip("kernel older than 5.14: queued connections cannot migrate")
	}

	dense, sparse := inputs(1)
	req := rawRequest(dense, sparse, 1, false)
	stop := make(chan struct{})
	var (
		mu     sync.Mutex
		calls  int
		failed = map[codes.Code]int{}
		first  error
	)
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
				if err != nil {
					t.Error(err)
					return
				}
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				_, err = inference.NewGRPCInferenceServiceClient(conn).ModelInfer(ctx, req)
				cancel()
				conn.Close()
				mu.Lock()
				calls++
				if err != nil {
					failed[status.Code(err)]++
					if first == nil {
						first = err
					}
				}
				mu.Unlock()
			}
		})
	}

	const cycles = 12
	for range cycles {
		ts := startSteered(t, tr, addr, pinRoot)
		// Drain it once the group has sent it calls.
		waitFor(t, 10*time.Second, "calls on the new frontend", func() bool {
			return ts.srv.opts.Backend.(*fakeBackend).submits.Load() > 0
		})
		ts.stop()
		if err := ts.wait(t, 30*time.Second); err != nil {
			t.Fatalf("Run = %v", err)
		}
	}
	close(stop)
	wg.Wait()
	t.Logf("%d calls over new connections, %d frontends drained", calls, cycles)
	if len(failed) != 0 {
		t.Errorf("calls failed while frontends drained: %v; first: %v", failed, first)
	}
	if c, err := net.DialTimeout("tcp", addr, time.Second); err != nil {
		t.Errorf("the frontend that stayed refuses connections: %v", err)
	} else {
		c.Close()
	}
}
