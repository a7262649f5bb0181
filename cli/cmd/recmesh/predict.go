package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/recmesh/recmesh/model"
	"github.com/recmesh/recmesh/proto/inference"
	"github.com/recmesh/recmesh/proto/oip"
)

func init() {
	register(&command{
		name:    "predict",
		summary: "send a random (or given) example to a frontend and print the scores",
		run:     runPredict,
	})
}

func runPredict(ctx context.Context, e *env, args []string) error {
	fs := flag.NewFlagSet("predict", flag.ContinueOnError)
	addr := fs.String("addr", "127.0.0.1:8001", "frontend `host:port`")
	modelName := fs.String("model-name", "dlrm", "model name")
	bundle := fs.String("bundle", "", "bundle `dir` whose config.json gives the vocabulary sizes for random ids (default: ask the server's ModelConfig)")
	batch := fs.Int("batch", 1, "examples per request (random inputs)")
	seed := fs.Uint64("seed", uint64(time.Now().UnixNano()), "random input seed")
	dense := fs.String("dense", "", "13 comma-separated dense features of one example (instead of random)")
	sparse := fs.String("sparse", "", "214 comma-separated ids of one example (instead of random)")
	timeout := fs.Duration("timeout", 5*time.Second, "call deadline")
	if err := parseFlags(fs, args, e); err != nil {
		return err
	}
	conn, err := grpc.NewClient(*addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("predict: %w", err)
	}
	defer conn.Close()
	client := inference.NewGRPCInferenceServiceClient(conn)
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	var cfg model.Config
	if *bundle != "" {
		if cfg, err = readConfig(*bundle); err != nil {
			return usagef("--bundle %s: %v", *bundle, err)
		}
	} else if cfg, err = serverConfig(ctx, client, *modelName); err != nil {
		return fmt.Errorf("predict: %w (or give --bundle)", err)
	}
	n := *batch
	var d []float32
	var s []int32
	if *dense != "" || *sparse != "" {
		if d, err = parseFloats(*dense, cfg.NumDense); err != nil {
			return usagef("--dense: %v", err)
		}
		ids, err := parseInts(*sparse, cfg.SparseWidth())
		if err != nil {
			return usagef("--sparse: %v", err)
		}
		s, n = ids, 1
	} else {
		if n < 1 || n > 4096 {
			return usagef("--batch %d: want 1..4096", n)
		}
		d, s = model.RandomInputs(cfg, *seed, n)
	}
	start := time.Now()
	req, err := oip.BuildRequest(*modelName, cfg, d, s, n, oip.TypeINT32)
	if err != nil {
		return fmt.Errorf("predict: %w", err)
	}
	resp, err := client.ModelInfer(ctx, req)
	if err != nil {
		return fmt.Errorf("predict: %w", err)
	}
	scores, err := oip.Scores(resp, n)
	if err != nil {
		return fmt.Errorf("predict: %w", err)
	}
	for i, v := range scores {
		fmt.Fprintf(e.stdout, "score[%d] = %.6f\n", i, v)
	}
	fmt.Fprintf(e.stderr, "predict: %d example(s) from %s in %.2f ms\n", n, *addr, float64(time.Since(start).Microseconds())/1000)
	return nil
}

// serverConfig asks the server's ModelConfig for what random requests
// need: the vocabulary sizes, the bags' sizes and the dense width, which
// recmesh reports as parameters. The dense network is not needed.
func serverConfig(ctx context.Context, client inference.GRPCInferenceServiceClient, name string) (model.Config, error) {
	resp, err := client.ModelConfig(ctx, &inference.ModelConfigRequest{Name: name})
	if err != nil {
		return model.Config{}, fmt.Errorf("ModelConfig: %w", err)
	}
	p := resp.GetConfig().GetParameters()
	ints := func(key string) ([]int, error) {
		v, ok := p[key]
		if !ok {
			return nil, fmt.Errorf("ModelConfig has no %q parameter (not a recmesh server?)", key)
		}
		var out []int
		for _, f := range strings.Split(v.GetStringValue(), ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n <= 0 {
				return nil, fmt.Errorf("ModelConfig parameter %s: %q is not a positive integer", key, f)
			}
			out = append(out, n)
		}
		return out, nil
	}
	vocab, err := ints("vocab_sizes")
	if err != nil {
		return model.Config{}, err
	}
	hot, err := ints("multi_hot_sizes")
	if err != nil {
		return model.Config{}, err
	}
	if len(vocab) != len(hot) {
		return model.Config{}, fmt.Errorf("ModelConfig: %d vocabulary sizes but %d bag sizes", len(vocab), len(hot))
	}
	cfg := model.DLRMv2(model.DevVocabCap)
	cfg.VocabSizes, cfg.Hotness = vocab, hot
	for _, in := range resp.GetConfig().GetInput() {
		if in.GetName() == "dense" && len(in.GetDims()) == 1 {
			cfg.NumDense = int(in.GetDims()[0])
		}
	}
	return cfg, nil
}

func readConfig(dir string) (model.Config, error) {
	var cfg model.Config
	raw, err := os.ReadFile(filepath.Join(dir, model.ConfigFile))
	if err != nil {
		return cfg, err
	}
	if err := json.Unmarshal(raw, &cfg); err != nil {
		return cfg, err
	}
	return cfg, cfg.Validate()
}

func parseFloats(s string, want int) ([]float32, error) {
	parts := strings.Split(s, ",")
	if len(parts) != want {
		return nil, fmt.Errorf("%d values, want %d", len(parts), want)
	}
	out := make([]float32, want)
	for i, p := range parts {
		v, err := strconv.ParseFloat(strings.TrimSpace(p), 32)
		if err != nil {
			return nil, fmt.Errorf("value %d: %v", i, err)
		}
		out[i] = float32(v)
	}
	return out, nil
}

func parseInts(s string, want int) ([]int32, error) {
	parts := strings.Split(s, ",")
	if len(parts) != want {
		return nil, fmt.Errorf("%d values, want %d", len(parts), want)
	}
	out := make([]int32, want)
	for i, p := range parts {
		v, err := strconv.ParseInt(strings.TrimSpace(p), 10, 32)
		if err != nil {
			return nil, fmt.Errorf("value %d: %v", i, err)
		}
		out[i] = int32(v)
	}
	return out, nil
}
