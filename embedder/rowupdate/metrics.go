package rowupdate

import "github.com/prometheus/client_golang/prometheus"

// metrics follow recmesh_embedder_update_<thing>_<unit>.
type metrics struct {
	rows, messages          prometheus.Counter
	refused                 *prometheus.CounterVec
	applied                 prometheus.Gauge
	lagMessages, lagSeconds prometheus.Gauge
	apply                   prometheus.Histogram
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		rows: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "recmesh_embedder_update_rows_total",
			Help: "Embedding rows written into the serving tables by row updates.",
		}),
		messages: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "recmesh_embedder_update_messages_total",
			Help: "Row-update messages applied.",
		}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "recmesh_embedder_updates_refused_total",
			Help: "Row-update messages refused whole, by reason (encoding: does not decode; value: NaN or infinite; model: a table, row or range the model does not have).",
		}, []string{"reason"}),
		applied: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "recmesh_embedder_update_applied_sequence",
			Help: "Stream sequence of the last row update applied (or refused): a trainer waits for its publish's sequence.",
		}),
		lagMessages: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "recmesh_embedder_update_lag_messages",
			Help: "Row-update messages in the stream not yet applied.",
		}),
		lagSeconds: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "recmesh_embedder_update_lag_seconds",
			Help: "Age of the last applied row update when it was applied.",
		}),
		apply: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "recmesh_embedder_update_apply_seconds",
			Help:    "Time to check, quantize and write one row-update message.",
			Buckets: prometheus.ExponentialBuckets(5e-6, 2, 16),
		}),
	}
	for _, r := range []string{"encoding", "value", "model"} {
		m.refused.WithLabelValues(r)
	}
	if reg != nil {
		reg.MustRegister(m.rows, m.messages, m.refused, m.applied, m.lagMessages, m.lagSeconds, m.apply)
	}
	return m
}
