package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	pb "github.com/recmesh/recmesh/proto/inference"
	"github.com/recmesh/recmesh/proto/oip"
)

// TestE2ESLOSheds runs the mesh in slo mode with a 1 ms latency target,
// which no batch of the dense network meets on a CPU, under 8 concurrent
// clients: requests with work queued ahead of them must be shed before
// lookup with RESOURCE_EXHAUSTED (and counted as shed), while every request
// that is answered carries correct scores, and nothing fails any other way.
func TestE2ESLOSheds(t *testing.T) {
	w := loadWorkload(t)
	c := newCluster(t, "slo")
	c.latencyTarget = "1ms"
	c.startMesh(1)

	const clients, perClient = 8, 12
	var (
		mu           sync.Mutex
		ok, shed     int
		worst        float64
		unexpected   []string
		wg           sync.WaitGroup
		deadlineSlop = 60 * time.Second
	)
	for cl := 0; cl < clients; cl++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := grpc.NewClient(c.addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				mu.Lock()
				unexpected = append(unexpected, err.Error())
				mu.Unlock()
				return
			}
			defer conn.Close()
			client := pb.NewGRPCInferenceServiceClient(conn)
			for i := range perClient {
				k := (i + cl) % len(w.reqs)
				ctx, cancel := context.WithTimeout(context.Background(), deadlineSlop)
				resp, err := client.ModelInfer(ctx, w.reqs[k])
				cancel()
				mu.Lock()
				switch {
				case err == nil:
					got, serr := oip.Scores(resp, w.n[k])
					if serr != nil {
						unexpected = append(unexpected, serr.Error())
					} else {
						ok++
						worst = max(worst, maxAbsDiff(got, w.want[k]))
					}
				case status.Code(err) == codes.ResourceExhausted:
					shed++
				default:
					unexpected = append(unexpected, fmt.Sprintf("request %d: %v", k, err))
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if len(unexpected) > 0 {
		t.Fatalf("%d calls failed other than by shedding, first: %s", len(unexpected), unexpected[0])
	}
	t.Logf("slo 1 ms: %d answered (max|Δ| %.3g), %d shed", ok, worst, shed)
	if worst > 1e-4 {
		t.Fatalf("answered scores off by %g", worst)
	}
	if ok == 0 {
		t.Fatal("nothing was answered: a request with nothing ahead of it must be served")
	}
	if shed == 0 {
		t.Fatal("nothing was shed although no batch can meet a 1 ms target")
	}
	// The embedder counted what it shed: some, and no more than the
	// clients saw refused (a full lane also answers RESOURCE_EXHAUSTED).
	resp, err := http.Get("http://" + c.metrics["embedder"] + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	const series = `recmesh_embedder_requests_total{status="shed"} `
	i := strings.Index(string(body), series)
	if i < 0 {
		t.Fatalf("embedder metrics lack %s", series)
	}
	var counted int
	if _, err := fmt.Sscan(string(body[i+len(series):]), &counted); err != nil {
		t.Fatal(err)
	}
	if counted < 1 || counted > shed {
		t.Errorf("embedder counted %d shed, clients saw %d refused", counted, shed)
	}
}
