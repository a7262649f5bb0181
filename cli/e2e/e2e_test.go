package e2e

import (
	"context"
	"fmt"
	"math"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/recmesh/recmesh/model"
	pb "github.com/recmesh/recmesh/proto/inference"
	"github.com/recmesh/recmesh/proto/oip"
)

// workload is a fixed set of requests and their reference scores, computed
// once and sent to every mode.
type workload struct {
	cfg  model.Config
	reqs []*pb.ModelInferRequest
	n    []int
	want [][]float32
	// The inputs of each request, to score them with another model.
	dense  [][]float32
	sparse [][]int32
}

var (
	workOnce sync.Once
	work     workload
	workErr  error
)

// requestSizes are the published benchmark's request sizes.
var requestSizes = []int{1, 16, 128}

func loadWorkload(t *testing.T) *workload {
	t.Helper()
	dir := exportBundle(t)
	workOnce.Do(func() {
		var w *workload
		if w, workErr = buildWorkload(dir); workErr == nil {
			work = *w
		}
	})
	if workErr != nil {
		t.Fatal(workErr)
	}
	return &work
}

// buildWorkload makes the requests of every size in requestSizes, twice
// (INT32 and INT64 ids), with their scores from the reference model of the
// bundle in dir.
func buildWorkload(dir string) (*workload, error) {
	b, err := model.Open(dir)
	if err != nil {
		return nil, err
	}
	defer b.Close()
	ref, err := model.NewReference(b)
	if err != nil {
		return nil, err
	}
	w := &workload{cfg: b.Config}
	seed := uint64(1)
	for round := 0; round < 2; round++ {
		for _, n := range requestSizes {
			dense, sparse := model.RandomInputs(b.Config, seed, n)
			seed++
			typ := oip.TypeINT32
			if round == 1 {
				typ = oip.TypeINT64
			}
			req, err := oip.BuildRequest("dlrm", b.Config, dense, sparse, n, typ)
			if err != nil {
				return nil, err
			}
			want, err := ref.Predict(dense, sparse, n)
			if err != nil {
				return nil, err
			}
			w.reqs = append(w.reqs, req)
			w.n = append(w.n, n)
			w.want = append(w.want, want)
			w.dense = append(w.dense, dense)
			w.sparse = append(w.sparse, sparse)
		}
	}
	return w, nil
}

// drive sends every request of w from clients goroutines, each over its
// own connection, and returns the request count and max |Δ|.
func drive(t *testing.T, addr string, w *workload, clients int) (int, float64) {
	t.Helper()
	var mu sync.Mutex
	var worst float64
	count := 0
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	for c := 0; c < clients; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				errs <- err
				return
			}
			defer conn.Close()
			client := pb.NewGRPCInferenceServiceClient(conn)
			for i := range w.reqs {
				k := (i + c) % len(w.reqs)
				ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
				resp, err := client.ModelInfer(ctx, w.reqs[k])
				cancel()
				if err != nil {
					errs <- fmt.Errorf("request %d (B=%d): %w", k, w.n[k], err)
					return
				}
				got, err := oip.Scores(resp, w.n[k])
				if err != nil {
					errs <- err
					return
				}
				d := maxAbsDiff(got, w.want[k])
				mu.Lock()
				worst = math.Max(worst, d)
				count++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	return count, worst
}

func maxAbsDiff(a, b []float32) float64 {
	d := 0.0
	for i := range a {
		x := math.Abs(float64(a[i]) - float64(b[i]))
		if math.IsNaN(x) {
			return math.Inf(1)
		}
		d = math.Max(d, x)
	}
	return d
}

// TestE2EModes runs the mesh in every batching mode, two frontends on one
// port, concurrent clients sending B = 1, 16 and 128, and checks every
// score against the reference. Its summary is the last line of make e2e.
func TestE2EModes(t *testing.T) {
	w := loadWorkload(t)
	modes := []string{"none", "model", "full", "slo"}
	total, worst := 0, 0.0
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			c := newCluster(t, mode)
			// Every score is checked here, so nothing may be shed: a
			// budget no run on a loaded CI machine comes near.
			// TestE2ESLOSheds covers shedding.
			c.latencyTarget = "1m"
			c.startMesh(2)
			n, d := drive(t, c.addr(), w, 4)
			t.Logf("mode %s: %d requests, max|Δ| %.3g", mode, n, d)
			if d > 1e-4 {
				t.Fatalf("mode %s: max|Δ| %g > 1e-4", mode, d)
			}
			total += n
			worst = math.Max(worst, d)
		})
	}
	if t.Failed() {
		return
	}
	line := fmt.Sprintf("e2e ok: requests=%d max_abs_diff=%.3g modes=%s", total, worst, strings.Join(modes, ","))
	t.Log(line)
	if p := os.Getenv("RECMESH_E2E_SUMMARY"); p != "" {
		if err := os.WriteFile(p, []byte(line+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
