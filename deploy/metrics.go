package deploy

import "strings"

// Kind is a Prometheus metric type.
type Kind int

const (
	Counter Kind = iota
	Gauge
	Histogram
	Summary
)

// Metric is one metric family a recmesh process exports.
type Metric struct {
	Name string
	Kind Kind
	// Labels are the labels the process sets. Prometheus adds job and
	// instance to every series; histograms add le to _bucket and summaries
	// quantile.
	Labels []string
	// Processes are the kinds of process that export it: frontend,
	// embedder, accelerator.
	Processes []string
}

// The recmesh processes.
const (
	Frontend    = "frontend"
	Embedder    = "embedder"
	Accelerator = "accelerator"
)

// Processes lists every kind of recmesh process that serves /metrics.
var Processes = []string{Frontend, Embedder, Accelerator}

var all = []string{Frontend, Embedder, Accelerator}

// Metrics is the expected set: the metric families the processes register,
// which the Grafana dashboard and any alert may use. The end-to-end test
// (cli/e2e TestE2EMetrics) scrapes a running mesh and fails when a process
// does not export one of them.
var Metrics = []Metric{
	// Frontend.
	{"recmesh_frontend_requests_total", Counter, []string{"code"}, []string{Frontend}},
	{"recmesh_frontend_request_duration_seconds", Histogram, nil, []string{Frontend}},
	{"recmesh_frontend_examples_total", Counter, nil, []string{Frontend}},
	{"recmesh_frontend_inflight_requests", Gauge, nil, []string{Frontend}},
	{"recmesh_frontend_budget_misses_total", Counter, nil, []string{Frontend}},
	{"recmesh_frontend_steering_mode", Gauge, []string{"mode"}, []string{Frontend}},
	{"recmesh_frontend_connections", Gauge, nil, []string{Frontend}},
	// Triton's names for the same counts, for Triton's dashboards.
	{"nv_inference_request_success", Counter, []string{"model", "version"}, []string{Frontend}},
	{"nv_inference_request_failure", Counter, []string{"model", "version"}, []string{Frontend}},
	{"nv_inference_count", Counter, []string{"model", "version"}, []string{Frontend}},
	{"nv_inference_exec_count", Counter, []string{"model", "version"}, []string{Frontend}},
	{"nv_inference_request_duration_us", Counter, []string{"model", "version"}, []string{Frontend}},
	{"nv_inference_queue_duration_us", Counter, []string{"model", "version"}, []string{Frontend}},
	{"nv_inference_compute_infer_duration_us", Counter, []string{"model", "version"}, []string{Frontend}},

	// Embedder.
	{"recmesh_embedder_requests_total", Counter, []string{"status"}, []string{Embedder}},
	{"recmesh_embedder_queue_wait_seconds", Histogram, nil, []string{Embedder}},
	{"recmesh_embedder_lookup_seconds", Histogram, nil, []string{Embedder}},
	{"recmesh_embedder_batch_examples", Histogram, nil, []string{Embedder}},
	{"recmesh_embedder_queue_depth", Gauge, nil, []string{Embedder}},
	{"recmesh_embedder_ring_occupancy_ratio", Gauge, []string{"lane"}, []string{Embedder}},
	{"recmesh_embedder_lanes_in_use", Gauge, nil, []string{Embedder}},
	{"recmesh_embedder_huge_page_fraction", Gauge, nil, []string{Embedder}},
	{"recmesh_embedder_generation", Gauge, nil, []string{Embedder}},
	{"recmesh_embedder_table_bytes", Gauge, nil, []string{Embedder}},
	{"recmesh_embedder_predicted_execute_seconds", Histogram, nil, []string{Embedder}},
	{"recmesh_embedder_slo_margin_seconds", Gauge, nil, []string{Embedder}},
	{"recmesh_embedder_arrival_wait_seconds", Histogram, nil, []string{Embedder}},
	{"recmesh_embedder_generation_failures_total", Counter, nil, []string{Embedder}},

	// Accelerator.
	{"recmesh_accelerator_requests_total", Counter, []string{"status"}, []string{Accelerator}},
	{"recmesh_accelerator_execute_seconds", Histogram, []string{"bucket"}, []string{Accelerator}},
	{"recmesh_accelerator_batch_examples", Histogram, nil, []string{Accelerator}},
	{"recmesh_accelerator_padding_ratio", Histogram, nil, []string{Accelerator}},
	{"recmesh_accelerator_runs_total", Counter, []string{"bucket"}, []string{Accelerator}},
	{"recmesh_accelerator_predicted_execute_seconds", Gauge, []string{"bucket"}, []string{Accelerator}},

	// The build each process runs (telemetry.Version), on every process.
	{"recmesh_build_info", Gauge, []string{"service", "version", "revision"}, all},

	// The standard process and Go runtime collectors, on every process.
	{"process_resident_memory_bytes", Gauge, nil, all},
	{"process_virtual_memory_bytes", Gauge, nil, all},
	{"process_cpu_seconds_total", Counter, nil, all},
	{"process_open_fds", Gauge, nil, all},
	{"process_start_time_seconds", Gauge, nil, all},
	{"go_goroutines", Gauge, nil, all},
	{"go_threads", Gauge, nil, all},
	{"go_gc_duration_seconds", Summary, nil, all},
	{"go_memstats_heap_alloc_bytes", Gauge, nil, all},
	{"go_memstats_heap_inuse_bytes", Gauge, nil, all},
	{"go_memstats_alloc_bytes_total", Counter, nil, all},
}

// ScrapeMetrics are the series Prometheus itself writes for every target.
var ScrapeMetrics = []Metric{
	{"up", Gauge, nil, nil},
	{"scrape_duration_seconds", Gauge, nil, nil},
	{"scrape_samples_scraped", Gauge, nil, nil},
}

// TargetLabels are the labels Prometheus attaches to every scraped series.
var TargetLabels = []string{"job", "instance"}

// LookupSeries finds the metric family a series name belongs to: the name
// itself (not for a classic histogram, which has no series of its bare
// name), or a histogram's _bucket, _sum or _count, or a summary's _sum or
// _count. It returns the family and the labels a selector on that series
// may use (the family's labels, the target labels, and le or quantile
// where the series has them).
func LookupSeries(series string) (Metric, []string, bool) {
	for _, set := range [][]Metric{Metrics, ScrapeMetrics} {
		for _, m := range set {
			labels := append(append([]string{}, m.Labels...), TargetLabels...)
			if series == m.Name && m.Kind != Histogram {
				if m.Kind == Summary {
					labels = append(labels, "quantile")
				}
				return m, labels, true
			}
			if m.Kind != Histogram && m.Kind != Summary {
				continue
			}
			suffix, ok := strings.CutPrefix(series, m.Name)
			if !ok {
				continue
			}
			switch {
			case suffix == "_bucket" && m.Kind == Histogram:
				return m, append(labels, "le"), true
			case suffix == "_sum" || suffix == "_count":
				return m, labels, true
			}
		}
	}
	return Metric{}, nil, false
}
