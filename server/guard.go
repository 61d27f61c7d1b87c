package server

import "github.com/prometheus/client_golang/prometheus"

// guardMetrics count what the router refuses or runs without to protect
// itself: degraded components, capped prompts (counted by the picker's
// by-load reasons), shed decisions, refused records and header values.
type guardMetrics struct {
	r *Server
}

var descDegraded = prometheus.NewDesc("kvroute_degraded",
	"1 while the router routes without a component (component=nats: no KV events, load reports or replica sync); readiness is not affected.",
	[]string{"component"}, nil)

func (g guardMetrics) Describe(ch chan<- *prometheus.Desc) { ch <- descDegraded }

func (g guardMetrics) Collect(ch chan<- prometheus.Metric) {
	nats := 0.0
	if g.r.nc != nil && !g.r.nc.IsConnected() {
		nats = 1
	}
	ch <- prometheus.MustNewConstMetric(descDegraded, prometheus.GaugeValue, nats, "nats")
}
