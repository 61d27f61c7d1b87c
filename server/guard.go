package server

import "github.com/prometheus/client_golang/prometheus"

// guardMetrics count what the router refuses or runs without to protect
// itself: degraded components, capped prompts (counted by the picker's
// by-load reasons), shed decisions, refused records and header values.
type guardMetrics struct {
	r          *Server
	idleClosed prometheus.Counter
}

func newGuardMetrics(r *Server) guardMetrics {
	return guardMetrics{r: r, idleClosed: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvroute_extproc_streams_idle_closed_total",
		Help: "ext_proc streams closed because Envoy sent nothing within the stream idle timeout."})}
}

var descDegraded = prometheus.NewDesc("kvroute_degraded",
	"1 while the router routes without a component (nats: no KV events, load reports or replica sync; etcd: worker discovery frozen at the last known fleet); readiness is not affected.",
	[]string{"component"}, nil)

func (g guardMetrics) Describe(ch chan<- *prometheus.Desc) {
	ch <- descDegraded
	g.idleClosed.Describe(ch)
}

func (g guardMetrics) Collect(ch chan<- prometheus.Metric) {
	for _, d := range g.r.dependenciesInUse() {
		v := 0.0
		if g.r.isDown(d) {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(descDegraded, prometheus.GaugeValue, v, d)
	}
	g.idleClosed.Collect(ch)
}

// StreamIdle implements extproc.Metrics.
func (m *Metrics) StreamIdle() { m.guard.idleClosed.Inc() }
