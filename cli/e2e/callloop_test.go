package e2e

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"

	pb "github.com/recmesh/recmesh/proto/inference"
)

// windows marks the stretches of a test when failures are expected (a
// restart, a hang, an outage): a call that overlaps one is told so.
type windows struct {
	opened atomic.Int64 // windows opened so far; odd while one is open
}

// set opens (true) or closes (false) a window; setting the current state
// again does nothing.
func (w *windows) set(open bool) {
	if open != (w.opened.Load()%2 == 1) {
		w.opened.Add(1)
	}
}

// callInfo describes one finished call of callLoop.
type callInfo struct {
	began    time.Time
	took     time.Duration
	inWindow bool // a window was open when it began, or opened or closed during it
}

// callLoop runs clients goroutines that call ModelInfer with the small
// requests (up to 16 examples) of w, one after another, until done closes,
// and hands every outcome to record. After a failure a client waits 10 ms
// and dials afresh: a dead frontend's connection is gone, and gRPC's
// reconnect back-off would outlast a restart. wg counts the goroutines.
func callLoop(t *testing.T, c *cluster, w *workload, clients int, bound time.Duration, win *windows,
	done <-chan struct{}, wg *sync.WaitGroup, record func(i int, resp *pb.ModelInferResponse, err error, ci callInfo)) {
	for cl := 0; cl < clients; cl++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var conn *grpc.ClientConn
			defer func() {
				if conn != nil {
					conn.Close()
				}
			}()
			for k := cl; ; k++ {
				select {
				case <-done:
					return
				default:
				}
				i := k % len(w.reqs)
				if w.n[i] > 16 {
					continue
				}
				if conn == nil {
					var err error
					if conn, err = grpc.NewClient(c.addr(), c.dialOption()); err != nil {
						t.Error(err)
						return
					}
				}
				before := win.opened.Load()
				ctx, cancel := context.WithTimeout(context.Background(), bound)
				began := time.Now()
				resp, err := pb.NewGRPCInferenceServiceClient(conn).ModelInfer(ctx, w.reqs[i])
				took := time.Since(began)
				cancel()
				record(i, resp, err, callInfo{began: began, took: took, inWindow: before%2 == 1 || win.opened.Load() != before})
				if err != nil {
					conn.Close()
					conn = nil
					time.Sleep(10 * time.Millisecond)
				}
			}
		}()
	}
}
