package ratelimit

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Collector exports the heaviest sources and the attack shape as
// Prometheus metrics, read from the maps at each scrape. The limits' own
// counters are exported by internal/metrics with everything else; its
// collector calls this one.
type Collector struct {
	m              Maps
	topN, topPorts int

	hhPackets, hhBytes, hhDropped, hhMonitored *prometheus.Desc
	shape                                      *prometheus.Desc
}

// NewCollector exports m with the topN heaviest sources (their labels are
// addresses, so keep topN small; 0 or less: none) and the topPorts ports
// of the attack shape with the most packets.
func NewCollector(m Maps, topN, topPorts int) *Collector {
	return &Collector{
		m: m, topN: topN, topPorts: max(topPorts, 0),
		hhPackets:   prometheus.NewDesc("moat_heavy_hitter_packets", "Estimated packets of a heavy source since it was first sampled.", []string{"source"}, nil),
		hhBytes:     prometheus.NewDesc("moat_heavy_hitter_bytes", "Estimated bytes of a heavy source since it was first sampled.", []string{"source"}, nil),
		hhDropped:   prometheus.NewDesc("moat_heavy_hitter_dropped_packets", "Estimated packets of a heavy source that a limit, budget or port rule dropped.", []string{"source"}, nil),
		hhMonitored: prometheus.NewDesc("moat_heavy_hitter_monitored_packets", "Estimated packets of a heavy source that a limit, budget or port rule would have dropped and monitor mode let through.", []string{"source"}, nil),
		shape:       prometheus.NewDesc("moat_attack_shape_packets_total", "Packets that reached the limits, by shape.", []string{"dimension", "bucket"}, nil),
	}
}

func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.hhPackets, c.hhBytes, c.hhDropped, c.hhMonitored, c.shape} {
		ch <- d
	}
}

func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	gauge := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, float64(v), labels...)
	}
	if hh, err := c.m.HeavyHitters(); err == nil {
		for i, h := range hh {
			if i >= c.topN {
				break
			}
			src := h.Source.String()
			gauge(c.hhPackets, h.Packets, src)
			gauge(c.hhBytes, h.Bytes, src)
			gauge(c.hhDropped, h.Dropped, src)
			gauge(c.hhMonitored, h.Monitored, src)
		}
	} else {
		ch <- prometheus.NewInvalidMetric(c.hhPackets, err)
	}
	if sh, err := c.m.Shape(c.topPorts); err == nil {
		for _, x := range []struct {
			dim string
			cs  []Count
		}{{"size", sh.Sizes}, {"protocol", sh.Protocols}, {"tcp_flags", sh.TCPFlags}, {"syn_options", sh.SYNOptions}, {"port", sh.Ports}} {
			for _, b := range x.cs {
				counter(c.shape, b.Packets, x.dim, b.Name)
			}
		}
	} else {
		ch <- prometheus.NewInvalidMetric(c.shape, err)
	}
}
