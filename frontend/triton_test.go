package frontend_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/recmesh/recmesh/frontend"
	"github.com/recmesh/recmesh/frontend/internal/refbackend"
	"github.com/recmesh/recmesh/model"
)

// pythonForClients finds the Python of the project venv that `make deps`
// builds from requirements-dev.txt (tritonclient[grpc], numpy), or
// $RECMESH_PYTHON. Without it the test skips on a developer machine, but in
// CI ($CI set) a missing client is a failure, never a silent skip.
func pythonForClients(t *testing.T) string {
	t.Helper()
	py := os.Getenv("RECMESH_PYTHON")
	if py == "" {
		abs, err := filepath.Abs(filepath.Join("..", ".deps", "venv", "bin", "python"))
		if err != nil {
			t.Fatal(err)
		}
		py = abs
	}
	if _, err := os.Stat(py); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("the Python client venv is missing (%v); `make deps` builds it", err)
		}
		t.Skipf("skipping the tritonclient test: %s not found; run `make deps` (or set RECMESH_PYTHON to a Python with tritonclient[grpc] and numpy)", py)
	}
	return py
}

// TestTritonClient drives the frontend with Triton's own Python client
// (tritonclient[grpc]): health and metadata calls, and inference with raw
// and typed inputs and INT32 and INT64 ids, against an in-process reference
// backend; every score must match the plain-Go reference within 1e-4.
func TestTritonClient(t *testing.T) {
	py := pythonForClients(t)
	bd := exportBundle(t)

	backend := refbackend.New(bd.ref, bd.cfg, refbackend.Options{})
	srv, err := frontend.New(frontend.Options{
		Listen:      "127.0.0.1:0",
		MetricsAddr: frontend.MetricsOff,
		Model:       bd.cfg,
		Backend:     backend,
		Logger:      slog.New(slog.NewTextHandler(io.Discard, nil)),
		Version:     "test",
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Listen(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run = %v", err)
		}
	}()

	const n = 4
	dense, sparse := model.RandomInputs(bd.cfg, 7, n)
	want, err := bd.ref.Predict(dense, sparse, n)
	if err != nil {
		t.Fatal(err)
	}
	in, err := json.Marshal(map[string]any{"n": n, "dense": dense, "sparse": sparse})
	if err != nil {
		t.Fatal(err)
	}
	inputsPath := filepath.Join(t.TempDir(), "inputs.json")
	if err := os.WriteFile(inputsPath, in, 0o644); err != nil {
		t.Fatal(err)
	}

	pctx, pcancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer pcancel()
	cmd := exec.CommandContext(pctx, py, filepath.Join("testdata", "triton_client.py"), "--url", srv.Addr().String(), "--inputs", inputsPath)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("triton_client.py: %v\n%s", err, stderr.String())
	}

	t.Logf("triton_client.py: %s", stdout.String())
	var got struct {
		ServerLive     bool `json:"server_live"`
		ServerReady    bool `json:"server_ready"`
		ModelReady     bool `json:"model_ready"`
		ServerMetadata struct {
			Name    string `json:"name"`
			Version string `json:"version"`
		} `json:"server_metadata"`
		ModelMetadata struct {
			Name     string   `json:"name"`
			Versions []string `json:"versions"`
			Platform string   `json:"platform"`
			Inputs   []tensor `json:"inputs"`
			Outputs  []tensor `json:"outputs"`
		} `json:"model_metadata"`
		RawINT32      inferResult `json:"raw_INT32"`
		RawINT64      inferResult `json:"raw_INT64"`
		RawInTypedOut inferResult `json:"raw_in_typed_out"`
		TypedINT32    inferResult `json:"typed_INT32"`
		TypedINT64    inferResult `json:"typed_INT64"`
		Invalid       *rpcError   `json:"invalid"`
		UnknownModel  *rpcError   `json:"unknown_model"`
		// Triton's extensions, as tritonclient's as_json prints them
		// (protobuf JSON with proto field names, 64-bit integers as strings).
		ModelConfig struct {
			Config struct {
				Name         string `json:"name"`
				Platform     string `json:"platform"`
				Backend      string `json:"backend"`
				MaxBatchSize int    `json:"max_batch_size"`
				Input        []struct {
					Name     string   `json:"name"`
					DataType string   `json:"data_type"`
					Dims     []string `json:"dims"`
				} `json:"input"`
				Output []struct {
					Name     string   `json:"name"`
					DataType string   `json:"data_type"`
					Dims     []string `json:"dims"`
				} `json:"output"`
				DynamicBatching *struct{} `json:"dynamic_batching"`
				Parameters      map[string]struct {
					StringValue string `json:"string_value"`
				} `json:"parameters"`
			} `json:"config"`
		} `json:"model_config"`
		Statistics struct {
			ModelStats []struct {
				Name           string `json:"name"`
				Version        string `json:"version"`
				InferenceCount string `json:"inference_count"`
				InferenceStats struct {
					Success      struct{ Count, Ns string } `json:"success"`
					Fail         struct{ Count, Ns string } `json:"fail"`
					ComputeInfer struct{ Count, Ns string } `json:"compute_infer"`
				} `json:"inference_stats"`
			} `json:"model_stats"`
		} `json:"statistics"`
		RepositoryIndex struct {
			Models []struct {
				Name, Version, State string
			} `json:"models"`
		} `json:"repository_index"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &got); err != nil {
		t.Fatalf("triton_client.py printed %q: %v\n%s", stdout.String(), err, stderr.String())
	}

	if !got.ServerLive || !got.ServerReady || !got.ModelReady {
		t.Errorf("live %v, ready %v, model ready %v; want all true", got.ServerLive, got.ServerReady, got.ModelReady)
	}
	if got.ServerMetadata.Name != "recmesh" || got.ServerMetadata.Version != "test" {
		t.Errorf("server metadata %+v", got.ServerMetadata)
	}
	md := got.ModelMetadata
	wantIn := []tensor{{"dense", "FP32", []any{"-1", "13"}}, {"sparse", "INT32", []any{"-1", "214"}}}
	wantOut := []tensor{{"score", "FP32", []any{"-1", "1"}}}
	if md.Name != "dlrm" || !slices.Equal(md.Versions, []string{"1"}) || md.Platform != "recmesh_dlrm" ||
		fmt.Sprint(md.Inputs) != fmt.Sprint(wantIn) || fmt.Sprint(md.Outputs) != fmt.Sprint(wantOut) {
		t.Errorf("model metadata %+v\nwant inputs %v outputs %v", md, wantIn, wantOut)
	}

	for _, c := range []struct {
		name    string
		r       inferResult
		id      string
		rawOut  bool
		numpyDT string
	}{
		{"raw INT32", got.RawINT32, "raw-INT32", true, "float32"},
		{"raw INT64", got.RawINT64, "raw-INT64", true, "float32"},
		{"raw in, binary_data=false", got.RawInTypedOut, "raw-typed-out", false, "typed"},
		{"typed INT32", got.TypedINT32, "typed-INT32", false, "typed"},
		{"typed INT64", got.TypedINT64, "typed-INT64", false, "typed"},
	} {
		r := c.r
		if r.ID != c.id || r.ModelName != "dlrm" || r.ModelVersion != "1" || r.Name != "score" || r.Datatype != "FP32" {
			t.Errorf("%s: response id %q model %q/%q output %q %q", c.name, r.ID, r.ModelName, r.ModelVersion, r.Name, r.Datatype)
		}
		if fmt.Sprint(r.Shape) != fmt.Sprint([]any{float64(n), float64(1)}) && fmt.Sprint(r.Shape) != fmt.Sprint([]any{fmt.Sprint(n), "1"}) {
			t.Errorf("%s: shape %v, want [%d 1]", c.name, r.Shape, n)
		}
		if (r.RawEntries == 1) != c.rawOut || r.Dtype != c.numpyDT {
			t.Errorf("%s: %d raw output entries, dtype %s; want raw=%v %s", c.name, r.RawEntries, r.Dtype, c.rawOut, c.numpyDT)
		}
		if d := maxAbsDiff(r.Scores, want); d > 1e-4 {
			t.Errorf("%s: scores %v, reference %v (max |Δ| %g)", c.name, r.Scores, want, d)
		}
	}

	wantInvalid := rpcError{"StatusCode.INVALID_ARGUMENT", fmt.Sprintf("input 'sparse': row %d, column 14 (table 5): id 3 is outside the table's vocabulary [0, 3)", n-1)}
	if got.Invalid == nil || *got.Invalid != wantInvalid {
		t.Errorf("invalid request: got %+v, want %+v", got.Invalid, wantInvalid)
	}
	wantUnknown := rpcError{"StatusCode.NOT_FOUND", "unknown model 'nosuchmodel'; this server serves 'dlrm'"}
	if got.UnknownModel == nil || *got.UnknownModel != wantUnknown {
		t.Errorf("unknown model: got %+v, want %+v", got.UnknownModel, wantUnknown)
	}

	mc := got.ModelConfig.Config
	if mc.Name != "dlrm" || mc.Backend != "recmesh" || mc.Platform != "recmesh_dlrm" || mc.MaxBatchSize != frontend.DefaultMaxBatch || mc.DynamicBatching == nil {
		t.Errorf("model config %+v", mc)
	}
	if len(mc.Input) != 2 || mc.Input[0].Name != "dense" || mc.Input[0].DataType != "TYPE_FP32" || fmt.Sprint(mc.Input[0].Dims) != "[13]" ||
		mc.Input[1].Name != "sparse" || mc.Input[1].DataType != "TYPE_INT32" || fmt.Sprint(mc.Input[1].Dims) != "[214]" {
		t.Errorf("model config inputs %+v", mc.Input)
	}
	if len(mc.Output) != 1 || mc.Output[0].Name != "score" || mc.Output[0].DataType != "TYPE_FP32" || fmt.Sprint(mc.Output[0].Dims) != "[1]" {
		t.Errorf("model config output %+v", mc.Output)
	}
	vocab := make([]string, len(bd.cfg.VocabSizes))
	for i, v := range bd.cfg.VocabSizes {
		vocab[i] = fmt.Sprint(v)
	}
	if v := mc.Parameters["vocab_sizes"].StringValue; v != strings.Join(vocab, ",") {
		t.Errorf("model config vocab_sizes %q, want %q", v, strings.Join(vocab, ","))
	}
	// Five calls succeeded with n examples each (raw ×3, typed ×2), one
	// failed validation; the unknown-model call never reached the model.
	if len(got.Statistics.ModelStats) != 1 {
		t.Fatalf("statistics %+v", got.Statistics)
	}
	ms := got.Statistics.ModelStats[0]
	is := ms.InferenceStats
	if ms.Name != "dlrm" || ms.Version != "1" || ms.InferenceCount != fmt.Sprint(5*n) ||
		is.Success.Count != "5" || is.Fail.Count != "1" || is.ComputeInfer.Count != "5" || is.Success.Ns == "" || is.ComputeInfer.Ns == "" {
		t.Errorf("statistics %+v", ms)
	}
	if ri := got.RepositoryIndex.Models; len(ri) != 1 || ri[0].Name != "dlrm" || ri[0].Version != "1" || ri[0].State != "READY" {
		t.Errorf("repository index %+v", got.RepositoryIndex)
	}
}

type tensor struct {
	Name     string `json:"name"`
	Datatype string `json:"datatype"`
	// Shape holds int64s, which protobuf's JSON mapping prints as strings.
	Shape []any `json:"shape"`
}

type inferResult struct {
	ID           string    `json:"id"`
	ModelName    string    `json:"model_name"`
	ModelVersion string    `json:"model_version"`
	Name         string    `json:"name"`
	Datatype     string    `json:"datatype"`
	Shape        []any     `json:"shape"`
	Dtype        string    `json:"dtype"`
	RawEntries   int       `json:"raw_entries"`
	Scores       []float32 `json:"scores"`
}

type rpcError struct {
	Status  string `json:"status"`
	Message string `json:"message"`
}
