package feed

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

var (
	entriesDesc = prometheus.NewDesc("moat_feed_entries",
		"Entries of the feed's current copy, by list.", []string{"url", "list"}, nil)
	successDesc = prometheus.NewDesc("moat_feed_last_success_timestamp_seconds",
		"When the server last confirmed or sent the feed's current copy (0: never since the daemon started). "+
			"Worth an alert when older than a few refresh periods.", []string{"url"}, nil)
	changeDesc = prometheus.NewDesc("moat_feed_last_change_timestamp_seconds",
		"When a new copy of the feed was last applied (0: never).", []string{"url"}, nil)
	failuresDesc = prometheus.NewDesc("moat_feed_failures_total",
		"Fetches of the feed that failed, and copies the maps refused.", []string{"url"}, nil)
	okDesc = prometheus.NewDesc("moat_feed_up",
		"1 if the feed's last fetch or apply worked, 0 if it failed (the last good copy stays applied).", []string{"url"}, nil)
)

// Collector exports the feeds' status as status reports it at scrape time.
type Collector struct{ status func() []Status }

// NewCollector returns a collector of the feeds status lists.
func NewCollector(status func() []Status) *Collector { return &Collector{status} }

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{entriesDesc, successDesc, changeDesc, failuresDesc, okDesc} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	for _, s := range c.status() {
		ch <- prometheus.MustNewConstMetric(entriesDesc, prometheus.GaugeValue, float64(s.Allow), s.URL, "allow")
		ch <- prometheus.MustNewConstMetric(entriesDesc, prometheus.GaugeValue, float64(s.Deny), s.URL, "deny")
		ch <- prometheus.MustNewConstMetric(successDesc, prometheus.GaugeValue, unix(s.LastSuccess), s.URL)
		ch <- prometheus.MustNewConstMetric(changeDesc, prometheus.GaugeValue, unix(s.LastChange), s.URL)
		ch <- prometheus.MustNewConstMetric(failuresDesc, prometheus.CounterValue, float64(s.Failures), s.URL)
		up := 1.0
		if s.Error != "" {
			up = 0
		}
		ch <- prometheus.MustNewConstMetric(okDesc, prometheus.GaugeValue, up, s.URL)
	}
}

// unix is t in seconds since the epoch, 0 for the zero time.
func unix(t time.Time) float64 {
	if t.IsZero() {
		return 0
	}
	return float64(t.UnixNano()) / 1e9
}
