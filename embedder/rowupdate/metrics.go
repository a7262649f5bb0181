package rowupdate

import "github.com/prometheus/client_golang/prometheus"

// metrics follow recmesh_embedder_update_<thing>_<unit>.
type metrics struct {
	rows, messages          prometheus.Counter
	refused                 *prometheus.CounterVec
	applied                 prometheus.Gauge
	lagMessages, lagSeconds prometheus.Gauge
	apply                   prometheus.Histogram
	visible                 prometheus.Histogram
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
		// The gauge above keeps only the last message's age; an operator
		// holding updates to a visibility target (p99) needs them all.
		// Buckets 1.5x apart, 1 ms to 11 s, so a quantile read from them
		// is within a third of the truth.
		visible: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "recmesh_embedder_update_visible_seconds",
			Help:    "Time from a row-update message's storing in the stream to its rows' visibility to lookups (applied, or refused), per message.",
			Buckets: prometheus.ExponentialBuckets(1e-3, 1.5, 24),
		}),
	}
	for _, r := range []string{"encoding", "value", "model"} {
		m.refused.WithLabelValues(r)
	}
	if reg != nil {
		reg.MustRegister(m.rows, m.messages, m.refused, m.applied, m.lagMessages, m.lagSeconds, m.apply, m.visible)
	}
	return m
}
