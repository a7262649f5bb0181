package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/recmesh/recmesh/model"
)

// TestE2ETritonClient drives the real mesh with Triton's own Python client
// (tritonclient[grpc] from PyPI, installed by make deps): liveness, model
// metadata and inference with raw and typed inputs, INT32 and INT64 ids,
// every score compared with the reference.
func TestE2ETritonClient(t *testing.T) {
	py, root := clientPython(t)
	w := loadWorkload(t)
	c := newCluster(t, "full")
	c.startMesh(1)

	got, want := runTritonClient(t, py, root, exportBundle(t), w.cfg, c.addr())
	if !got.ServerLive || !got.ModelReady || got.Model.Name != "dlrm" {
		t.Errorf("live %v, model ready %v, metadata name %q", got.ServerLive, got.ModelReady, got.Model.Name)
	}
	for name, s := range map[string][]float32{"raw INT32": got.RawINT32.Scores, "raw INT64": got.RawINT64.Scores, "typed INT32": got.TypedINT32.Scores} {
		if len(s) != len(want) || maxAbsDiff(s, want) > 1e-4 {
			t.Errorf("%s: scores %v, reference %v", name, s, want)
		}
	}
	if got.Invalid == nil || got.Invalid.Status != "StatusCode.INVALID_ARGUMENT" {
		t.Errorf("an id outside its table came back as %+v, want INVALID_ARGUMENT", got.Invalid)
	}
}

// tritonResult is what frontend/testdata/triton_client.py prints.
type tritonResult struct {
	ServerLive bool `json:"server_live"`
	ModelReady bool `json:"model_ready"`
	Model      struct {
		Name string `json:"name"`
	} `json:"model_metadata"`
	RawINT32   struct{ Scores []float32 } `json:"raw_INT32"`
	RawINT64   struct{ Scores []float32 } `json:"raw_INT64"`
	TypedINT32 struct{ Scores []float32 } `json:"typed_INT32"`
	Invalid    *struct{ Status string }   `json:"invalid"`
}

// runTritonClient runs Triton's own Python client against addr with four
// random examples and returns what it got with the scores the reference of
// the bundle in dir gives for them.
func runTritonClient(t *testing.T, py, root, dir string, cfg model.Config, addr string) (tritonResult, []float32) {
	t.Helper()
	const n = 4
	dense, sparse := model.RandomInputs(cfg, 7, n)
	b, err := model.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ref, err := model.NewReference(b)
	if err != nil {
		t.Fatal(err)
	}
	want, err := ref.Predict(dense, sparse, n)
	if err != nil {
		t.Fatal(err)
	}
	in, _ := json.Marshal(map[string]any{"n": n, "dense": dense, "sparse": sparse})
	inputs := filepath.Join(t.TempDir(), "inputs.json")
	if err := os.WriteFile(inputs, in, 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, py, filepath.Join(root, "frontend", "testdata", "triton_client.py"), "--url", addr, "--inputs", inputs)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("triton_client.py: %v\n%s", err, stderr.String())
	}
	var got tritonResult
	if err := json.Unmarshal(stdout.Bytes(), &got); err != nil {
		t.Fatalf("triton_client.py printed %q: %v", stdout.String(), err)
	}
	return got, want
}

func clientPython(t *testing.T) (py, root string) {
	t.Helper()
	root, err := workspaceRoot()
	if err != nil {
		t.Fatal(err)
	}
	py = os.Getenv("RECMESH_PYTHON")
	if py == "" {
		py = filepath.Join(root, ".deps", "venv", "bin", "python")
	}
	if _, err := os.Stat(py); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("CI needs the client venv (make deps): %v", err)
		}
		t.Skipf("no tritonclient venv at %s (run make deps)", py)
	}
	return py, root
}
