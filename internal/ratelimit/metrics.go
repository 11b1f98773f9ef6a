package ratelimit

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Collector exports the limits' counters, the heaviest sources and the
// attack shape as Prometheus metrics, read from the maps at each scrape.
// A daemon registers it beside its other collectors.
type Collector struct {
	m    Maps
	topN int

	packets, bytes, blocks, tracked *prometheus.Desc
	hhPackets, hhBytes, hhDropped   *prometheus.Desc
	shape                           *prometheus.Desc
}

// NewCollector exports m with the topN heaviest sources (their labels are
// addresses, so keep topN small).
func NewCollector(m Maps, topN int) *Collector {
	lim := []string{"kind", "scope"}
	return &Collector{
		m: m, topN: topN,
		packets:   prometheus.NewDesc("moat_ratelimit_packets_total", "Packets a limit or budget passed or dropped.", append(lim, "verdict"), nil),
		bytes:     prometheus.NewDesc("moat_ratelimit_bytes_total", "Bytes a limit or budget passed or dropped.", append(lim, "verdict"), nil),
		blocks:    prometheus.NewDesc("moat_ratelimit_autoblocks_total", "Denylist entries a source limit wrote.", lim, nil),
		tracked:   prometheus.NewDesc("moat_ratelimit_buckets_created_total", "Per-source buckets a source limit created.", lim, nil),
		hhPackets: prometheus.NewDesc("moat_heavy_hitter_packets", "Estimated packets of a heavy source since it was first sampled.", []string{"source"}, nil),
		hhBytes:   prometheus.NewDesc("moat_heavy_hitter_bytes", "Estimated bytes of a heavy source since it was first sampled.", []string{"source"}, nil),
		hhDropped: prometheus.NewDesc("moat_heavy_hitter_dropped_packets", "Estimated packets of a heavy source that a limit or budget dropped.", []string{"source"}, nil),
		shape:     prometheus.NewDesc("moat_attack_shape_packets_total", "Packets that reached the limits, by shape.", []string{"dimension", "bucket"}, nil),
	}
}

func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.packets, c.bytes, c.blocks, c.tracked, c.hhPackets, c.hhBytes, c.hhDropped, c.shape} {
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
	if ls, err := c.m.Limits(); err == nil {
		for _, l := range ls {
			k, s := l.Kind.String(), l.Scope.String()
			counter(c.packets, l.Stats.Passed, k, s, "passed")
			counter(c.packets, l.Stats.Dropped, k, s, "dropped")
			counter(c.bytes, l.Stats.PassedBytes, k, s, "passed")
			counter(c.bytes, l.Stats.DroppedBytes, k, s, "dropped")
			if l.Kind == Source {
				counter(c.blocks, l.Stats.Blocks, k, s)
				counter(c.tracked, l.Stats.Tracked, k, s)
			}
		}
	} else {
		ch <- prometheus.NewInvalidMetric(c.packets, err)
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
		}
	} else {
		ch <- prometheus.NewInvalidMetric(c.hhPackets, err)
	}
	if sh, err := c.m.Shape(c.topN); err == nil {
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
