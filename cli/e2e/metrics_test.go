package e2e

import (
	"net/http"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/recmesh/recmesh/deploy"
)

// TestE2EMetrics scrapes /metrics of every process of a mesh that has
// served traffic and finds every metric family the deployment's dashboard
// and alerts rely on (deploy.Metrics), so the dashboard can only chart
// series that exist.
func TestE2EMetrics(t *testing.T) {
	w := loadWorkload(t)
	c := newCluster(t, "full")
	c.startMesh(1)
	calls, _ := drive(t, c.addr(), w, 2)
	tritonQueries(t, c.metrics["frontend-0"], calls)

	for name, addr := range c.metrics {
		kind := name
		if strings.HasPrefix(name, "frontend") {
			kind = deploy.Frontend
		}
		families := scrape(t, addr)
		for _, m := range deploy.Metrics {
			if !contains(m.Processes, kind) {
				continue
			}
			f, ok := families[m.Name]
			if !ok {
				t.Errorf("%s does not export %s", name, m.Name)
				continue
			}
			for _, l := range m.Labels {
				if len(f.Metric) > 0 && !hasLabel(f.Metric[0].Label, l) {
					t.Errorf("%s: %s lacks label %q", name, m.Name, l)
				}
			}
		}
		if _, ok := families["recmesh_"+kind+"_requests_total"]; !ok {
			t.Errorf("%s: no request counter", name)
		}
	}
}

func contains(xs []string, x string) bool {
	for _, v := range xs {
		if v == x {
			return true
		}
	}
	return false
}

func hasLabel[L interface{ GetName() string }](labels []L, name string) bool {
	for _, l := range labels {
		if l.GetName() == name {
			return true
		}
	}
	return false
}

// tritonQueries evaluates, on a scrape of a frontend that answered calls
// calls, what Triton's own Grafana dashboard plots: successful requests
// per model, and the average queue and compute time per request
// (nv_inference_queue_duration_us / nv_inference_request_success).
func tritonQueries(t *testing.T, addr string, calls int) {
	t.Helper()
	families := scrape(t, addr)
	value := func(name string) float64 {
		f, ok := families[name]
		if !ok || len(f.Metric) != 1 {
			t.Fatalf("%s: want one series, have %v", name, f)
		}
		m := f.Metric[0]
		labels := map[string]string{}
		for _, l := range m.Label {
			labels[l.GetName()] = l.GetValue()
		}
		if labels["model"] != "dlrm" || labels["version"] != "1" {
			t.Errorf("%s labels %v, want model=dlrm version=1", name, labels)
		}
		return m.GetCounter().GetValue()
	}
	ok := value("nv_inference_request_success")
	if int(ok) != calls || value("nv_inference_request_failure") != 0 {
		t.Errorf("nv_inference_request_success %v, want the %d calls answered", ok, calls)
	}
	queue := value("nv_inference_queue_duration_us") / ok
	infer := value("nv_inference_compute_infer_duration_us") / ok
	total := value("nv_inference_request_duration_us") / ok
	if !(queue >= 0 && infer > 0 && total >= infer+queue) {
		t.Errorf("per request: queue %.0f µs, compute %.0f µs, total %.0f µs", queue, infer, total)
	}
}

// scrape reads and parses a process's /metrics.
func scrape(t *testing.T, addr string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatalf("scrape %s: %v", addr, err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parse /metrics of %s: %v", addr, err)
	}
	return families
}
