package main

import (
	"context"
	"flag"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/recmesh/recmesh/model"
	"github.com/recmesh/recmesh/telemetry/flagenv"
)

// clearEnv unsets every environment twin for the test.
func clearEnv(t *testing.T) {
	newFlagSet(&config{}).VisitAll(func(f *flag.Flag) {
		env := flagenv.Name(f.Name)
		t.Setenv(env, "")
		os.Unsetenv(env)
	})
	t.Setenv("NATS_URL", "")
}

func TestFlagsAndEnvTwins(t *testing.T) {
	clearEnv(t)
	c, err := parseFlags(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.listen != ":8001" || c.metricsAddr != "127.0.0.1:9110-9125" || c.modelName != "dlrm" || c.maxBatch != 4096 ||
		c.bundle != "data/dlrm-cap1000" || c.backend != "shm" || c.drainTimeout != 30*time.Second {
		t.Errorf("defaults: %+v", c)
	}

	t.Setenv("RECMESH_PORT", "9000")
	t.Setenv("RECMESH_MODEL_NAME", "ranker")
	t.Setenv("RECMESH_DRAIN_DELAY", "2s")
	c, err = parseFlags([]string{"--model-name=explicit"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.listen != ":9000" || c.modelName != "explicit" || c.drainDelay != 2*time.Second {
		t.Errorf("env twins: listen %q model %q drain delay %v", c.listen, c.modelName, c.drainDelay)
	}
	c, err = parseFlags([]string{"--listen=127.0.0.1:7000"}, io.Discard)
	if err != nil || c.listen != "127.0.0.1:7000" {
		t.Errorf("--listen: %q, %v", c.listen, err)
	}
	t.Setenv("RECMESH_MAX_CONNECTIONS", "100")
	t.Setenv("RECMESH_BODY_TIMEOUT", "3s")
	t.Setenv("RECMESH_IDLE_TIMEOUT", "2m")
	t.Setenv("RECMESH_MAX_BUFFERED_BYTES", "134217728")
	if c, err = parseFlags([]string{"--header-timeout=4s", "--max-conn-buffered-bytes=50000000"}, io.Discard); err != nil ||
		c.maxConnections != 100 || c.bodyTimeout != 3*time.Second || c.idleTimeout != 2*time.Minute || c.headerTimeout != 4*time.Second ||
		c.maxBufferedBytes != 128<<20 || c.maxConnBufferedBytes != 50_000_000 || c.handshakeTimeout != 10*time.Second {
		t.Errorf("limit flags and twins: %+v, %v", c, err)
	}
	t.Setenv("RECMESH_STEERING", "kernel-hash")
	t.Setenv("RECMESH_STEERING_DIR", "/sys/fs/bpf/elsewhere")
	if c, err = parseFlags(nil, io.Discard); err != nil || c.steering != "kernel-hash" || c.steeringDir != "/sys/fs/bpf/elsewhere" {
		t.Errorf("steering twins: %q %q, %v", c.steering, c.steeringDir, err)
	}
}

// TestOneConfigurationScheme: every flag's twin is RECMESH_<FLAG>, as for
// every other recmesh binary; RECMESH_MAX_BATCH (which compose sets for
// the whole mesh) reaches --max-batch, and NATS_URL still names the
// control plane when RECMESH_NATS_URL does not.
func TestOneConfigurationScheme(t *testing.T) {
	clearEnv(t)
	t.Setenv("RECMESH_MAX_BATCH", "512")
	t.Setenv("NATS_URL", "nats://from-nats-url:4222")
	c, err := parseFlags(nil, io.Discard)
	if err != nil || c.maxBatch != 512 || c.natsURL != "nats://from-nats-url:4222" {
		t.Fatalf("max batch %d, nats %q, %v", c.maxBatch, c.natsURL, err)
	}
	t.Setenv("RECMESH_NATS_URL", "nats://from-recmesh:4222")
	if c, err = parseFlags(nil, io.Discard); err != nil || c.natsURL != "nats://from-recmesh:4222" {
		t.Fatalf("RECMESH_NATS_URL: %q, %v", c.natsURL, err)
	}
	var usage strings.Builder
	fs := newFlagSet(&config{})
	fs.SetOutput(&usage)
	fs.Usage()
	fs.VisitAll(func(f *flag.Flag) {
		if f.Name == flagenv.PrintConfigFlag {
			return // not configurable by environment
		}
		if !strings.Contains(usage.String(), "environment: "+flagenv.Name(f.Name)) {
			t.Errorf("-h does not name --%s's twin %s", f.Name, flagenv.Name(f.Name))
		}
	})
}

func TestConfigErrorsNameTheFlag(t *testing.T) {
	clearEnv(t)
	dir := t.TempDir()
	if err := model.Export(context.Background(), dir, model.DLRMv2(model.DevVocabCap), 1, nil); err != nil {
		t.Fatal(err)
	}
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	for _, tc := range []struct {
		name string
		env  map[string]string
		args []string
		want string // the error's prefix
	}{
		{"bad env twin", map[string]string{"RECMESH_MAX_BATCH": "many"}, nil,
			`invalid value "many" for RECMESH_MAX_BATCH (flag -max-batch)`},
		{"bad port", nil, []string{"--port=70000"}, "--port: 70000 is not a port number"},
		{"stray argument", nil, []string{"serve"}, `unexpected argument "serve"`},
		{"negative reference delay", nil, []string{"--reference-delay=-1s"}, "--reference-delay: -1s is negative"},
		{"negative segment owner", nil, []string{"--segment-owner-uid=-1"}, "--segment-owner-uid: -1 is not a uid"},
		{"no bundle", nil, []string{"--bundle=" + dir + "/missing"}, "--bundle=" + dir + "/missing: open"},
		{"unknown backend", nil, []string{"--bundle=" + dir, "--backend=gpu"}, `--backend: unknown backend "gpu"`},
		{"max batch", nil, []string{"--bundle=" + dir, "--max-batch=100000"}, "--max-batch: 100000 is not in 1..65536"},
		{"drain timeout", nil, []string{"--bundle=" + dir, "--drain-timeout=-1s"}, "--drain-timeout: -1s is negative"},
		{"stream workers", nil, []string{"--bundle=" + dir, "--stream-workers=-2"}, "--stream-workers: -2 is not in 1..65536"},
		{"listen busy", nil, []string{"--bundle=" + dir, "--listen=" + busy.Addr().String(), "--metrics-addr=off"},
			"--listen (or --port): bind " + busy.Addr().String()},
		{"steering", nil, []string{"--bundle=" + dir, "--steering=magic"}, `--steering: "magic": want`},
		{"metrics busy", nil, []string{"--bundle=" + dir, "--listen=127.0.0.1:0", "--metrics-addr=" + busy.Addr().String()},
			"--metrics-addr: listen tcp " + busy.Addr().String()},
		{"body timeout", nil, []string{"--bundle=" + dir, "--body-timeout=-1s"}, "--body-timeout: -1s is negative"},
		{"max connections", map[string]string{"RECMESH_MAX_CONNECTIONS": "-1"}, []string{"--bundle=" + dir}, "--max-connections: -1 is negative"},
		{"connection bytes", nil, []string{"--bundle=" + dir, "--max-conn-buffered-bytes=1000"}, "--max-conn-buffered-bytes: 1000 bytes would refuse the largest request"},
		{"total bytes", nil, []string{"--bundle=" + dir, "--max-buffered-bytes=20000000"}, "--max-buffered-bytes: 20000000 bytes is less than MaxConnBufferedBytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			err := run(ctx, tc.args, io.Discard)
			if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
				t.Errorf("got %v\nwant an error starting %q", err, tc.want)
			}
		})
	}
}
