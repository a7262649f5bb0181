package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/recmesh/recmesh/model"
	"github.com/recmesh/recmesh/proto/control"
	pb "github.com/recmesh/recmesh/proto/inference"
	"github.com/recmesh/recmesh/proto/oip"
)

func startNATS(t *testing.T) string {
	t.Helper()
	ns, err := natsserver.NewServer(&natsserver.Options{Host: "127.0.0.1", Port: natsserver.RANDOM_PORT, NoSigs: true, NoLog: true})
	if err != nil {
		t.Fatal(err)
	}
	ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("embedded NATS did not start")
	}
	t.Cleanup(ns.Shutdown)
	return ns.ClientURL()
}

// TestE2ERollout switches the mesh to another model under steady load:
// every call must succeed, with the old model's scores before the switch
// and the new model's after it. A rollout of a broken bundle must fail and
// leave the old model serving.
func TestE2ERollout(t *testing.T) {
	w := loadWorkload(t)
	c := newCluster(t, "model")
	c.natsURL = startNATS(t)
	c.startMesh(2)

	// The new model: same shapes, other weights (seed 12), under the
	// model root rollouts may load from.
	newDir := filepath.Join(c.modelRoot, "seed12")
	if err := model.Export(context.Background(), newDir, model.DLRMv2(model.DevVocabCap), 12, nil); err != nil {
		t.Fatal(err)
	}
	nb, err := model.Open(newDir)
	if err != nil {
		t.Fatal(err)
	}
	ref, err := model.NewReference(nb)
	if err != nil {
		t.Fatal(err)
	}
	// Requests of one and sixteen examples, with both models' answers.
	var idx []int
	var wantNew [][]float32
	for i := range w.reqs {
		if w.n[i] > 16 {
			continue
		}
		got, err := ref.Predict(w.dense[i], w.sparse[i], w.n[i])
		if err != nil {
			t.Fatal(err)
		}
		idx = append(idx, i)
		wantNew = append(wantNew, got)
	}
	nb.Close()

	nc, err := control.Connect(c.natsURL, "rollout-test", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	// A broken rollout first: the old model must keep serving.
	if err := os.Mkdir(filepath.Join(c.modelRoot, "empty"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := control.Call(ctx, nc, control.SubjectModelLoad, control.LoadRequest{Bundle: "empty"}); err == nil {
		t.Fatal("rollout of an empty directory succeeded")
	} else if !strings.Contains(err.Error(), "config.json") {
		t.Errorf("rollout error %q does not say what is wrong with the bundle", err)
	}

	var (
		stop                = make(chan struct{})
		wg                  sync.WaitGroup
		mu                  sync.Mutex
		failures            = map[string]int{}
		oldOK, newOK, wrong atomic.Int64
		switched            atomic.Bool
		oldAfter            atomic.Int64
	)
	for cl := 0; cl < 4; cl++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := grpc.NewClient(c.addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Error(err)
				return
			}
			defer conn.Close()
			client := pb.NewGRPCInferenceServiceClient(conn)
			for k := cl; ; k++ {
				select {
				case <-stop:
					return
				default:
				}
				j := k % len(idx)
				i := idx[j]
				cctx, ccancel := context.WithTimeout(context.Background(), 30*time.Second)
				resp, err := client.ModelInfer(cctx, w.reqs[i])
				ccancel()
				if err != nil {
					mu.Lock()
					failures[status.Code(err).String()+": "+status.Convert(err).Message()]++
					mu.Unlock()
					continue
				}
				got, err := oip.Scores(resp, w.n[i])
				switch {
				case err != nil:
					wrong.Add(1)
				case maxAbsDiff(got, w.want[i]) <= 1e-4:
					oldOK.Add(1)
					if switched.Load() {
						oldAfter.Add(1)
					}
				case maxAbsDiff(got, wantNew[j]) <= 1e-4:
					newOK.Add(1)
				default:
					wrong.Add(1)
				}
			}
		}()
	}
	waitFor(t, time.Minute, "traffic on the old model", func() bool { return oldOK.Load() >= 20 })
	rep, err := control.Call(ctx, nc, control.SubjectModelLoad, control.LoadRequest{Bundle: newDir})
	if err != nil {
		close(stop)
		wg.Wait()
		t.Fatalf("rollout: %v", err)
	}
	switched.Store(true)
	t.Logf("rolled out generation %d (%s)", rep.Generation, rep.ModelID)
	before := newOK.Load()
	waitFor(t, time.Minute, "traffic on the new model", func() bool { return newOK.Load() >= before+20 })
	close(stop)
	wg.Wait()

	t.Logf("old-model answers %d (%d after the switch returned), new-model answers %d, wrong %d, failures %v",
		oldOK.Load(), oldAfter.Load(), newOK.Load(), wrong.Load(), failures)
	if len(failures) > 0 {
		t.Errorf("calls failed across the model switch: %v", failures)
	}
	if wrong.Load() > 0 {
		t.Errorf("%d answers matched neither model", wrong.Load())
	}
	if !strings.Contains(rep.ModelID, "seed12") {
		t.Errorf("rolled-out model id %q is not the new bundle's", rep.ModelID)
	}
}
