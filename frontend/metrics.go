package frontend

import (
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"

	"github.com/recmesh/recmesh/frontend/h2unary"
)

// numCodes is the number of gRPC status codes (OK .. Unauthenticated).
const numCodes = int(codes.Unauthenticated) + 1

// metrics are the recmesh_frontend_* series. They count ModelInfer calls
// only: health, metadata and reflection calls are not inference traffic.
type metrics struct {
	// byCode holds requests_total's child for every code, resolved once so
	// the hot path does no label lookup (which would hash and allocate).
	byCode   [numCodes]prometheus.Counter
	examples prometheus.Counter
	duration prometheus.Histogram
	inflight prometheus.Gauge
	misses   prometheus.Counter
	// steering is 1 for the steering mode in use (ebpf or kernel-hash).
	steering *prometheus.GaugeVec
	// conns counts the gRPC connections open now.
	conns prometheus.Gauge
	// refused holds refused_total's child for each reason the transport
	// counts, resolved once: refuse does no label lookup.
	refused map[string]prometheus.Counter
	target  time.Duration
}

// refusalReasons are the reasons recmesh_frontend_refused_total counts,
// by transport: what each limit refuses (h2unary.Reason*, and
// reasonConnections), where the transport lets the frontend see it.
// grpc-go keeps to itself its refusals of header lists (RST_STREAM), of
// streams past MaxStreams, of ping floods, of idle connections and of
// unfinished header blocks (which it has no timer for), so the grpc
// transport counts only the limits package frontend enforces around it.
var refusalReasons = map[string][]string{
	TransportGRPC: {reasonConnections, h2unary.ReasonHandshakeTimeout, h2unary.ReasonBodyBytesConn, h2unary.ReasonBodyBytesTotal, h2unary.ReasonBodyTimeout},
	TransportLean: {reasonConnections, h2unary.ReasonHandshakeTimeout, h2unary.ReasonBodyBytesConn, h2unary.ReasonBodyBytesTotal, h2unary.ReasonBodyTimeout,
		h2unary.ReasonHeaderList, h2unary.ReasonHeaderTimeout, h2unary.ReasonIdleTimeout, h2unary.ReasonStreams, h2unary.ReasonPings},
}

// refuse counts one refusal of a limit.
func (m *metrics) refuse(reason string) {
	if c, ok := m.refused[reason]; ok {
		c.Inc()
	}
}

func newMetrics(reg prometheus.Registerer, target time.Duration) (*metrics, error) {
	requests := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "recmesh",
		Subsystem: "frontend",
		Name:      "requests_total",
		Help:      "ModelInfer calls answered, by gRPC status code.",
		// code is codes.Code.String() ("OK", "InvalidArgument", …), the
		// label values of the usual grpc-go server metrics.
	}, []string{"code"})
	m := &metrics{
		examples: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "recmesh",
			Subsystem: "frontend",
			Name:      "examples_total",
			Help:      "Examples scored in ModelInfer calls answered OK.",
		}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "recmesh",
			Subsystem: "frontend",
			Name:      "request_duration_seconds",
			Help:      "Time from a ModelInfer call reaching the handler to its answer, whatever the code.",
			// 50 µs .. ~13 s: a cache-hot small batch to a deadline-bound one.
			Buckets: prometheus.ExponentialBuckets(50e-6, 2, 19),
		}),
		inflight: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "recmesh",
			Subsystem: "frontend",
			Name:      "inflight_requests",
			Help:      "ModelInfer calls being handled now.",
		}),
		misses: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "recmesh",
			Subsystem: "frontend",
			Name:      "budget_misses_total",
			Help:      "ModelInfer calls answered OK but slower than the latency target (--latency-target).",
		}),
		steering: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "recmesh",
			Subsystem: "frontend",
			Name:      "steering_mode",
			Help:      "1 for how new connections reach this frontend: ebpf (the steering program picks the least loaded ready frontend) or kernel-hash (the kernel's hash; the frontend listens only once ready).",
		}, []string{"mode"}),
		conns: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "recmesh",
			Subsystem: "frontend",
			Name:      "connections",
			Help:      "gRPC connections open now (at most --max-connections).",
		}),
		target: target,
	}
	// Every code is exported from the start, at zero, so that rate() and
	// alerts see a series before the first failure.
	for c := range m.byCode {
		m.byCode[c] = requests.WithLabelValues(codes.Code(c).String())
	}
	for _, c := range []prometheus.Collector{requests, m.examples, m.duration, m.inflight, m.misses, m.steering, m.conns} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("frontend: register metrics: %w", err)
		}
	}
	return m, nil
}

// done records one answered ModelInfer call of n examples.
func (m *metrics) done(start time.Time, n int, code codes.Code) {
	took := time.Since(start)
	m.duration.Observe(took.Seconds())
	if code == codes.OK && took > m.target {
		m.misses.Inc()
	}
	if int(code) >= numCodes {
		code = codes.Unknown
	}
	m.byCode[code].Inc()
	if code == codes.OK {
		m.examples.Add(float64(n))
	}
}

// registerLimits adds the series of the limits on what clients hold:
// refused_total for transport's reasons, and buffered_request_bytes,
// which reads buffered.
func (m *metrics) registerLimits(reg prometheus.Registerer, transport string, buffered func() float64) error {
	refused := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "recmesh",
		Subsystem: "frontend",
		Name:      "refused_total",
		Help: "Connections, streams and calls a limit refused or ended, by transport and reason: connections (past --max-connections), handshake_timeout, " +
			"body_bytes_conn and body_bytes_total (buffered request bytes), body_timeout (a request body not complete in time); lean also counts header_list, " +
			"header_timeout, idle_timeout, streams (past --max-streams) and pings (a ping flood).",
	}, []string{"transport", "reason"})
	// Exported from the start, at zero, as requests_total's codes.
	m.refused = map[string]prometheus.Counter{}
	for _, reason := range refusalReasons[transport] {
		m.refused[reason] = refused.WithLabelValues(transport, reason)
	}
	bufferedBytes := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "recmesh",
		Subsystem: "frontend",
		Name:      "buffered_request_bytes",
		Help: "Request bytes held now by calls whose body is not complete or whose handler runs (lean: their declared sizes); " +
			"grpc: an upper bound on what unfinished bodies hold, from the bytes their connections read.",
	}, buffered)
	for _, c := range []prometheus.Collector{refused, bufferedBytes} {
		if err := reg.Register(c); err != nil {
			return fmt.Errorf("frontend: register metrics: %w", err)
		}
	}
	return nil
}
