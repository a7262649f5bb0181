package main

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/recmesh/recmesh/model"
	"github.com/recmesh/recmesh/proto/control"
	"github.com/recmesh/recmesh/proto/updates"
)

func init() {
	registerUpdate(&updateCommand{
		name:    "dense",
		summary: "put new dense weights for the serving model into the object store; the accelerator swaps them in between two batches",
		run:     runUpdateDense,
	})
}

// denseWaitPoll is how long each status round of --wait collects answers:
// the resolution of swap_ms.
const denseWaitPoll = 50 * time.Millisecond

func runUpdateDense(ctx context.Context, e *env, args []string) error {
	fs := flag.NewFlagSet("update dense", flag.ContinueOnError)
	natsURL := fs.String("nats-url", "", "NATS server (env NATS_URL); the identity comes from NATS_NKEY, NATS_CREDS or NATS_USER/NATS_PASSWORD: the trainer's or the operator's")
	bundleDir := fs.String("bundle", model.DefaultDevBundle, "the serving model's bundle `dir`: its id names the object, its network gives the shapes the weights must have")
	from := fs.String("from", "", "`path` of the weights to push: a bundle directory (its dense parameters) or a dense-weights safetensors file (default: --bundle's own)")
	scale := fs.Float64("scale", 1, "multiply every dense weight by `F` (tests and demos: the scores change)")
	modelID := fs.String("model", "", "model `id` the object is named for, the accelerator's serving model (default: --bundle's)")
	wait := fs.Bool("wait", false, "wait until the accelerator serves the new weights (or says why not)")
	timeout := fs.Duration("timeout", 2*time.Minute, "give up after this long, pushing and --wait together")
	if err := parseFlags(fs, args, e); err != nil {
		return err
	}
	if *natsURL == "" {
		*natsURL = e.getenv("NATS_URL")
	}
	if *natsURL == "" {
		return usagef("%v", control.ErrNoURL)
	}
	if *bundleDir == "" {
		return usagef("--bundle is empty: give the serving model's bundle directory")
	}
	if *timeout <= 0 {
		return usagef("--timeout %v: want a positive duration", *timeout)
	}
	if math.IsNaN(*scale) || math.IsInf(*scale, 0) || *scale == 0 {
		return usagef("--scale %v: want a finite, non-zero factor", *scale)
	}
	cfg, err := model.ReadConfig(*bundleDir)
	if err != nil {
		return err
	}
	id := cmp.Or(*modelID, cfg.ID())
	data, err := denseWeightsFile(cfg, cmp.Or(*from, *bundleDir), float32(*scale))
	if err != nil {
		return fmt.Errorf("update dense: %w (nothing pushed)", err)
	}

	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	nc, err := control.Dial(*natsURL, "recmesh-update-dense")
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("update dense: %w", err)
	}
	obs, err := denseBucket(ctx, js)
	if err != nil {
		return fmt.Errorf("update dense: %w", err)
	}
	info, err := obs.PutBytes(ctx, id, data)
	if err != nil {
		return fmt.Errorf("update dense: put %s/%s: %w", updates.DenseBucket, id, err)
	}
	put := time.Now()
	line := fmt.Sprintf("dense pushed model=%s bytes=%d revision=%s", id, len(data), info.NUID)
	if !*wait {
		fmt.Fprintln(e.stdout, line)
		return nil
	}
	if err := waitDenseSwap(ctx, nc, info.NUID); err != nil {
		fmt.Fprintln(e.stdout, line+" swapped=no")
		return fmt.Errorf("update dense: %w", err)
	}
	fmt.Fprintf(e.stdout, "%s swapped=yes swap_ms=%d\n", line, time.Since(put).Milliseconds())
	return nil
}

// denseWeightsFile returns the dense-weights file to push for the model
// cfg: from is a bundle directory or a dense-weights file, its values
// multiplied by scale. It is checked as the accelerator will check it.
func denseWeightsFile(cfg model.Config, from string, scale float32) ([]byte, error) {
	fi, err := os.Stat(from)
	if err != nil {
		return nil, err
	}
	var params map[string][]float32
	if fi.IsDir() {
		b, err := model.Open(from)
		if err != nil {
			return nil, err
		}
		defer b.Close()
		// Through the file format, so that a bundle of another network is
		// refused as the accelerator would refuse it, naming the tensor.
		var buf bytes.Buffer
		if _, err := model.WriteDenseWeights(&buf, b.Config, model.DenseWeightsOf(b)); err != nil {
			return nil, err
		}
		if params, err = model.ReadDenseWeights(cfg, buf.Bytes()); err != nil {
			return nil, fmt.Errorf("bundle %s does not fit model %s: %w", from, cfg.ID(), err)
		}
	} else {
		raw, err := os.ReadFile(from)
		if err != nil {
			return nil, err
		}
		if params, err = model.ReadDenseWeights(cfg, raw); err != nil {
			return nil, fmt.Errorf("%s does not fit model %s: %w", from, cfg.ID(), err)
		}
	}
	if scale != 1 {
		scaled := make(map[string][]float32, len(params))
		for name, v := range params {
			s := make([]float32, len(v))
			for i, x := range v {
				s[i] = x * scale
			}
			scaled[name] = s
		}
		params = scaled
	}
	var out bytes.Buffer
	if _, err := model.WriteDenseWeights(&out, cfg, params); err != nil {
		return nil, err
	}
	// The scaled values must still be weights of the model's precision.
	if _, err := model.ReadDenseWeights(cfg, out.Bytes()); err != nil {
		return nil, err
	}
	return out.Bytes(), nil
}

// denseBucket opens the dense-weights bucket, creating it the first time
// (the accelerator only reads it).
func denseBucket(ctx context.Context, js jetstream.JetStream) (jetstream.ObjectStore, error) {
	obs, err := js.ObjectStore(ctx, updates.DenseBucket)
	if !errors.Is(err, jetstream.ErrBucketNotFound) {
		return obs, err
	}
	obs, err = js.CreateObjectStore(ctx, jetstream.ObjectStoreConfig{
		Bucket:      updates.DenseBucket,
		Description: "recmesh dense weights, one object per model id",
		Storage:     jetstream.FileStorage,
	})
	if errors.Is(err, jetstream.ErrBucketExists) { // created meanwhile
		return js.ObjectStore(ctx, updates.DenseBucket)
	}
	if err != nil {
		return nil, fmt.Errorf("create bucket %s: %w", updates.DenseBucket, err)
	}
	return obs, nil
}

// waitDenseSwap polls the accelerators' status until one serves revision
// rev, or refused it, or ctx ends.
func waitDenseSwap(ctx context.Context, nc *nats.Conn, rev string) error {
	for {
		sts, err := control.Gather(ctx, nc, denseWaitPoll)
		for _, st := range sts {
			if st.Service != control.ServiceAccelerator || st.Dense == nil {
				continue
			}
			if strings.HasSuffix(st.Dense.Source, "@"+rev) {
				return nil
			}
			if strings.Contains(st.Dense.Error, "@"+rev+" ") {
				return fmt.Errorf("the accelerator refused the new weights; the previous ones keep serving: %s", st.Dense.Error)
			}
		}
		if err != nil {
			return fmt.Errorf("no accelerator reported serving revision %s before the timeout (is one serving this model on this NATS?): %w", rev, err)
		}
	}
}
