package frontend

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestMetrics(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	f := newFakeBackend()
	srv, err := New(Options{Model: testConfig(), Backend: f, MaxBatch: testMaxBatch, Registerer: reg, MetricsAddr: MetricsOff, Logger: discardLogger()})
	if err != nil {
		t.Fatal(err)
	}
	dense, sparse := inputs(3)
	ctx := context.Background()
	for range 2 {
		if _, err := srv.svc.ModelInfer(ctx, rawRequest(dense, sparse, 3, false)); err != nil {
			t.Fatal(err)
		}
	}
	bad := rawRequest(dense, sparse, 3, false)
	bad.ModelName = "nope"
	if _, err := srv.svc.ModelInfer(ctx, bad); err == nil {
		t.Fatal("bad request succeeded")
	}

	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		// Triton's names break Prometheus' conventions (no _total, µs in
		// the name); they are kept as Triton exports them, so Triton's
		// dashboards read them.
		if strings.HasPrefix(p.Metric, "nv_inference_") {
			continue
		}
		t.Errorf("metric %s: %s", p.Metric, p.Text)
	}
	nv := `
# HELP nv_inference_count Examples inferred (Triton's name; a request of batch size B counts B).
# TYPE nv_inference_count counter
nv_inference_count{model="dlrm",version="1"} 6
# HELP nv_inference_request_failure Failed inference requests (Triton's name).
# TYPE nv_inference_request_failure counter
nv_inference_request_failure{model="dlrm",version="1"} 1
# HELP nv_inference_request_success Successful inference requests (Triton's name; recmesh counts this frontend's).
# TYPE nv_inference_request_success counter
nv_inference_request_success{model="dlrm",version="1"} 2
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(nv), "nv_inference_request_success", "nv_inference_request_failure", "nv_inference_count"); err != nil {
		t.Error(err)
	}

	want := `
# HELP recmesh_frontend_examples_total Examples scored in ModelInfer calls answered OK.
# TYPE recmesh_frontend_examples_total counter
recmesh_frontend_examples_total 6
# HELP recmesh_frontend_inflight_requests ModelInfer calls being handled now.
# TYPE recmesh_frontend_inflight_requests gauge
recmesh_frontend_inflight_requests 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "recmesh_frontend_examples_total", "recmesh_frontend_inflight_requests"); err != nil {
		t.Error(err)
	}
	for code, want := range map[string]float64{"OK": 2, "NotFound": 1, "InvalidArgument": 0, "Unauthenticated": 0} {
		got, err := counterValue(reg, "recmesh_frontend_requests_total", "code", code)
		if err != nil {
			t.Error(err)
		} else if got != want {
			t.Errorf("requests_total{code=%q} = %v, want %v", code, got, want)
		}
	}
	if n, err := testutil.GatherAndCount(reg, "recmesh_frontend_requests_total"); err != nil || n != numCodes {
		t.Errorf("requests_total has %d series (err %v), want one per code (%d)", n, err, numCodes)
	}
	if n, err := testutil.GatherAndCount(reg, "recmesh_frontend_request_duration_seconds"); err != nil || n != 1 {
		t.Errorf("request_duration_seconds: %d series (err %v)", n, err)
	}

	// A second server on the same registry is a configuration error, not a
	// panic.
	if _, err := New(Options{Model: testConfig(), Backend: f, Registerer: reg, MetricsAddr: MetricsOff}); err == nil {
		t.Error("New registered the same metrics twice")
	}
}

func counterValue(g prometheus.Gatherer, name, label, value string) (float64, error) {
	mfs, err := g.Gather()
	if err != nil {
		return 0, err
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					return m.GetCounter().GetValue(), nil
				}
			}
		}
	}
	return 0, fmt.Errorf("no series %s{%s=%q}", name, label, value)
}
