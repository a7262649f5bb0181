package deploy

import (
	"encoding/json"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"sigs.k8s.io/yaml"
)

const dashboardFile = "grafana/dashboards/recmesh.json"

type dsRef struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type panel struct {
	ID         int     `json:"id"`
	Type       string  `json:"type"`
	Title      string  `json:"title"`
	Datasource *dsRef  `json:"datasource"`
	Panels     []panel `json:"panels"`
	GridPos    struct {
		H, W, X, Y int
	} `json:"gridPos"`
	Targets []struct {
		RefID      string `json:"refId"`
		Datasource *dsRef `json:"datasource"`
		Expr       string `json:"expr"`
	} `json:"targets"`
}

type dashboard struct {
	UID    string  `json:"uid"`
	Title  string  `json:"title"`
	Panels []panel `json:"panels"`
}

func loadDashboard(t *testing.T) dashboard {
	t.Helper()
	data, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	if d.UID == "" || d.Title == "" || len(d.Panels) == 0 {
		t.Fatalf("%s: want a uid, a title and panels", dashboardFile)
	}
	return d
}

// allPanels flattens rows.
func allPanels(ps []panel) []panel {
	var out []panel
	for _, p := range ps {
		out = append(out, p)
		out = append(out, allPanels(p.Panels)...)
	}
	return out
}

// provisioned data sources: uid -> type, and their URLs.
type datasources struct {
	APIVersion  int `json:"apiVersion"`
	Datasources []struct {
		Name string `json:"name"`
		UID  string `json:"uid"`
		Type string `json:"type"`
		URL  string `json:"url"`
	} `json:"datasources"`
}

func loadDatasources(t *testing.T) datasources {
	t.Helper()
	data, err := os.ReadFile("grafana/provisioning/datasources/recmesh.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var ds datasources
	if err := yaml.Unmarshal(data, &ds); err != nil {
		t.Fatal(err)
	}
	return ds
}

// TestDashboardQueries: the dashboard JSON parses, every panel queries a
// provisioned data source, and every query selects series of the
// expected metric set (metrics.go) with labels those series have.
func TestDashboardQueries(t *testing.T) {
	d := loadDashboard(t)
	uids := map[string]string{}
	for _, ds := range loadDatasources(t).Datasources {
		uids[ds.UID] = ds.Type
	}
	jobs := prometheusJobs(t)
	ids := map[int]bool{}
	used := map[string]bool{}
	for _, p := range allPanels(d.Panels) {
		if ids[p.ID] {
			t.Errorf("panel id %d used twice", p.ID)
		}
		ids[p.ID] = true
		if p.GridPos.W <= 0 || p.GridPos.X+p.GridPos.W > 24 {
			t.Errorf("panel %q: gridPos %+v is outside the 24-column grid", p.Title, p.GridPos)
		}
		if p.Type == "row" {
			continue
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			ds := tg.Datasource
			if ds == nil {
				ds = p.Datasource
			}
			if ds == nil || uids[ds.UID] == "" || uids[ds.UID] != ds.Type {
				t.Errorf("panel %q query %s: data source %+v is not provisioned (have %v)", p.Title, tg.RefID, ds, uids)
				continue
			}
			if ds.Type != "prometheus" {
				continue
			}
			q, err := parsePromQL(tg.Expr)
			if err != nil {
				t.Errorf("panel %q query %s: %v", p.Title, tg.RefID, err)
				continue
			}
			if len(q.selectors) == 0 {
				t.Errorf("panel %q query %s selects no metric: %s", p.Title, tg.RefID, tg.Expr)
			}
			var allowed []string
			for _, sel := range q.selectors {
				m, labels, ok := LookupSeries(sel.name)
				if !ok {
					t.Errorf("panel %q query %s: %s is not a series of any expected metric (metrics.go)", p.Title, tg.RefID, sel.name)
					continue
				}
				used[m.Name] = true
				for _, l := range sel.labels {
					if !slices.Contains(labels, l) {
						t.Errorf("panel %q query %s: %s has no label %q (it has %v)", p.Title, tg.RefID, sel.name, l, labels)
					}
				}
				allowed = append(allowed, labels...)
			}
			for _, l := range q.grouping {
				if !slices.Contains(allowed, l) {
					t.Errorf("panel %q query %s: groups by %q, which none of its series has", p.Title, tg.RefID, l)
				}
			}
			for _, j := range q.jobs {
				if !slices.Contains(jobs, j) {
					t.Errorf("panel %q query %s: job %q is not a Prometheus job (%v)", p.Title, tg.RefID, j, jobs)
				}
			}
		}
	}
	// What the dashboard must show.
	for _, m := range []string{
		"recmesh_frontend_requests_total",           // request rate, errors by code
		"recmesh_frontend_request_duration_seconds", // p50, p99
		"recmesh_embedder_batch_examples",           // batch size
		"recmesh_accelerator_batch_examples",
		"recmesh_accelerator_padding_ratio",     // padding
		"recmesh_embedder_queue_depth",          // queue depth
		"recmesh_embedder_lookup_seconds",       // lookup time
		"recmesh_accelerator_execute_seconds",   // execute time
		"recmesh_embedder_ring_occupancy_ratio", // ring occupancy
		"process_resident_memory_bytes",         // memory
		"recmesh_embedder_huge_page_fraction",   // huge-page fraction
	} {
		if !used[m] {
			t.Errorf("the dashboard does not chart %s", m)
		}
	}
}

func prometheusJobs(t *testing.T) []string {
	t.Helper()
	data, err := os.ReadFile("prometheus/prometheus.yml")
	if err != nil {
		t.Fatal(err)
	}
	var cfg prometheusConfig
	if err := yaml.Unmarshal(data, &cfg); err != nil {
		t.Fatal(err)
	}
	var jobs []string
	for _, sc := range cfg.ScrapeConfigs {
		jobs = append(jobs, sc.JobName)
	}
	return jobs
}

// TestGrafanaProvisioning: the data sources point at the compose services,
// and Grafana loads the dashboard from where compose mounts it.
func TestGrafanaProvisioning(t *testing.T) {
	p := loadCompose(t, nil, "compose.yaml")
	ds := loadDatasources(t)
	if ds.APIVersion != 1 {
		t.Errorf("datasources apiVersion %d; want 1", ds.APIVersion)
	}
	want := map[string]string{"prometheus": "9090", "jaeger": "16686"}
	for _, d := range ds.Datasources {
		u, err := url.Parse(d.URL)
		if err != nil {
			t.Errorf("data source %s: %v", d.Name, err)
			continue
		}
		port, ok := want[d.Type]
		if !ok {
			t.Errorf("data source %s of unexpected type %s", d.Name, d.Type)
			continue
		}
		delete(want, d.Type)
		if _, ok := p.Services[u.Hostname()]; !ok || u.Port() != port {
			t.Errorf("data source %s: %s is not a compose service on port %s", d.Name, d.URL, port)
		}
	}
	for typ := range want {
		t.Errorf("no %s data source", typ)
	}

	// The dashboard provider reads the directory compose mounts the
	// dashboards into, and the home dashboard is this one.
	var prov struct {
		Providers []struct {
			Options struct {
				Path string `json:"path"`
			} `json:"options"`
		} `json:"providers"`
	}
	data, err := os.ReadFile("grafana/provisioning/dashboards/recmesh.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(data, &prov); err != nil || len(prov.Providers) == 0 {
		t.Fatalf("dashboard provider: %v", err)
	}
	g := p.Services["grafana"]
	dir := hostFile(t, g, prov.Providers[0].Options.Path)
	abs, _ := filepath.Abs(filepath.Dir(dashboardFile))
	if filepath.Clean(dir) != abs {
		t.Errorf("the dashboard provider reads %s, which compose fills from %s; want %s", prov.Providers[0].Options.Path, dir, abs)
	}
	if home := env(g, "GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"); home != "" {
		if _, err := os.Stat(hostFile(t, g, home)); err != nil {
			t.Errorf("home dashboard: %v", err)
		}
	}
	for _, f := range []string{"datasources/recmesh.yaml", "dashboards/recmesh.yaml"} {
		if _, err := os.Stat(hostFile(t, g, "/etc/grafana/provisioning/"+f)); err != nil {
			t.Errorf("grafana provisioning: %v", err)
		}
	}
}
