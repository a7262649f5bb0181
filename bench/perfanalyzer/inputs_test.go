package perfanalyzer

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"testing"

	"github.com/recmesh/recmesh/model"
)

var update = flag.Bool("update", false, "rewrite inputs.json")

// inputSeed and inputExamples make inputs.json: perf_analyzer cycles
// through the examples, one per batch element.
const (
	inputSeed     = 2026
	inputExamples = 64
)

// inputFile is perf_analyzer's input-data JSON: one entry per example, each
// input without the batch dimension (the model's max_batch_size > 0).
type inputFile struct {
	Data []struct {
		Dense  []float32 `json:"dense"`
		Sparse []int32   `json:"sparse"`
	} `json:"data"`
}

func render(t *testing.T) []byte {
	cfg := model.DLRMv2(model.DevVocabCap)
	dense, sparse := model.RandomInputs(cfg, inputSeed, inputExamples)
	var f inputFile
	f.Data = make([]struct {
		Dense  []float32 `json:"dense"`
		Sparse []int32   `json:"sparse"`
	}, inputExamples)
	w := cfg.SparseWidth()
	for i := range f.Data {
		f.Data[i].Dense = dense[i*cfg.NumDense : (i+1)*cfg.NumDense]
		f.Data[i].Sparse = sparse[i*w : (i+1)*w]
	}
	b, err := json.Marshal(f)
	if err != nil {
		t.Fatal(err)
	}
	return append(b, '\n')
}

// TestInputsFile: inputs.json is what model.RandomInputs gives for the dev
// bundle, and every id lies within its table's vocabulary.
func TestInputsFile(t *testing.T) {
	want := render(t)
	if *update {
		if err := os.WriteFile("inputs.json", want, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile("inputs.json")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("inputs.json differs from the model's random inputs; regenerate with go test ./bench/perfanalyzer -update")
	}
	var f inputFile
	if err := json.Unmarshal(got, &f); err != nil {
		t.Fatal(err)
	}
	cfg := model.DLRMv2(model.DevVocabCap)
	for i, e := range f.Data {
		if len(e.Dense) != cfg.NumDense || len(e.Sparse) != cfg.SparseWidth() {
			t.Fatalf("example %d: %d dense, %d sparse values", i, len(e.Dense), len(e.Sparse))
		}
		c := 0
		for table, h := range cfg.Hotness {
			for range h {
				if id := e.Sparse[c]; id < 0 || int64(id) >= int64(cfg.VocabSizes[table]) {
					t.Fatalf("example %d column %d: id %d outside table %d's %d rows", i, c, id, table, cfg.VocabSizes[table])
				}
				c++
			}
		}
	}
}
