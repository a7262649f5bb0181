package embedder

import (
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the embedder's Prometheus series; names follow
// recmesh_embedder_<thing>_<unit>.
type metrics struct {
	requests     *prometheus.CounterVec
	queueWait    prometheus.Histogram
	arrivalWait  prometheus.Histogram
	lookup       prometheus.Histogram
	batch        prometheus.Histogram
	queueDepth   prometheus.Gauge
	occupancy    *prometheus.GaugeVec
	lanesInUse   prometheus.Gauge
	hugeFraction prometheus.Gauge
	generation   prometheus.Gauge
	tableBytes   prometheus.Gauge
	// SLO mode: the predicted execution time of each sealed batch (compare
	// recmesh_accelerator_execute_seconds) and the chosen batch size is
	// recmesh_embedder_batch_examples.
	predictedExec prometheus.Histogram
	sloMargin     prometheus.Gauge
	sloOverloaded prometheus.Gauge
	// genFailures counts generations that ended on an error of their own
	// (a corrupt or truncated segment), not the accelerator's death.
	genFailures prometheus.Counter

	// Pre-bound children so the hot path does no label lookups.
	reqOK, reqInvalid, reqExpired, reqCanceled, reqCorrupt, reqShed prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "recmesh_embedder_requests_total",
			Help: "Requests the embedder read from the lanes, by outcome (shed: refused by SLO admission control).",
		}, []string{"status"}),
		queueWait: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "recmesh_embedder_queue_wait_seconds",
			Help:    "Time from reading a request to publishing its batch.",
			Buckets: prometheus.ExponentialBuckets(10e-6, 2, 16),
		}),
		arrivalWait: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "recmesh_embedder_arrival_wait_seconds",
			Help:    "Time from a frontend receiving a request to the embedder reading it (requests whose frontend stamped its arrival).",
			Buckets: prometheus.ExponentialBuckets(10e-6, 2, 16),
		}),
		lookup: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "recmesh_embedder_lookup_seconds",
			Help:    "Gather and sum-pool time of one lookup job.",
			Buckets: prometheus.ExponentialBuckets(5e-6, 2, 16),
		}),
		batch: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "recmesh_embedder_batch_examples",
			Help:    "Examples per published batch.",
			Buckets: prometheus.ExponentialBuckets(1, 2, 13),
		}),
		queueDepth: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "recmesh_embedder_queue_depth",
			Help: "Requests queued in lane rings or held in the open batch.",
		}),
		occupancy: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "recmesh_embedder_ring_occupancy_ratio",
			Help: "Fill of each lane's request ring (0..1).",
		}, []string{"lane"}),
		lanesInUse: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "recmesh_embedder_lanes_in_use",
			Help: "Lanes claimed by frontends.",
		}),
		hugeFraction: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "recmesh_embedder_huge_page_fraction",
			Help: "Fraction of the table region backed by huge pages.",
		}),
		generation: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "recmesh_embedder_generation",
			Help: "Generation of the segment being served.",
		}),
		tableBytes: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "recmesh_embedder_table_bytes",
			Help: "Bytes of embedding tables held (one copy for the whole mesh).",
		}),
		sloMargin: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "recmesh_embedder_slo_margin_seconds",
			Help: "SLO mode: the part of the latency target kept back from batch plans, moved by the share of served calls that missed the target.",
		}),
		sloOverloaded: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "recmesh_embedder_slo_overloaded",
			Help: "SLO mode: 1 while admission control sheds (every request predicted to miss the latency target for a whole overload window), else 0.",
		}),
		genFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "recmesh_embedder_generation_failures_total",
			Help: "Segment generations that failed on their own (a corrupt or truncated segment) and were replaced by a new one.",
		}),
		predictedExec: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "recmesh_embedder_predicted_execute_seconds",
			Help:    "SLO mode: the execution time predicted for each sealed batch.",
			Buckets: prometheus.ExponentialBuckets(50e-6, 2, 16),
		}),
	}
	reg.MustRegister(m.requests, m.queueWait, m.arrivalWait, m.lookup, m.batch, m.queueDepth, m.occupancy,
		m.lanesInUse, m.hugeFraction, m.generation, m.tableBytes, m.predictedExec, m.sloMargin, m.sloOverloaded, m.genFailures)
	m.reqOK = m.requests.WithLabelValues("ok")
	m.reqInvalid = m.requests.WithLabelValues("invalid")
	m.reqExpired = m.requests.WithLabelValues("expired")
	m.reqCanceled = m.requests.WithLabelValues("canceled")
	m.reqCorrupt = m.requests.WithLabelValues("corrupt")
	m.reqShed = m.requests.WithLabelValues("shed")
	return m
}
