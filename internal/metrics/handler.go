// Package metrics exports moat's counters and state to Prometheus: a
// collector that reads the pinned BPF maps at scrape time, and an HTTP
// handler that serves it, with the Go runtime and process metrics, in its
// own registry.
package metrics

import (
	"fmt"
	"log/slog"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// DefaultListen is where the metrics are served unless configured
// otherwise: loopback only, since the rule hits and top entries say a lot
// about who attacks the host and what it lets through.
const DefaultListen = "127.0.0.1:9477"

// NewRegistry returns a registry with moat's collector and the Go runtime
// and process collectors. A registry of its own, rather than the global
// one, keeps whatever a library registers globally out of moat's
// exposition.
func NewRegistry(cfg Config) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(
		NewCollector(cfg),
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	reg.MustRegister(cfg.Extra...)
	return reg
}

// Handler serves moat's metrics in the Prometheus exposition formats.
func Handler(cfg Config) http.Handler {
	cfg = cfg.withDefaults()
	reg := NewRegistry(cfg)
	h := promhttp.HandlerFor(reg, promhttp.HandlerOpts{
		ErrorLog: slogPrintln{cfg.Logger},
		// A part that fails is reported by moat_scrape_collector_success;
		// the rest of the scrape is still worth having.
		ErrorHandling: promhttp.ContinueOnError,
		// Each scrape reads every rule once; a pile-up of scrapes must not
		// turn into a pile-up of map walks.
		MaxRequestsInFlight: 2,
		Registry:            reg,
	})
	return promhttp.InstrumentMetricHandler(reg, h)
}

// slogPrintln adapts slog to promhttp's Println logger.
type slogPrintln struct{ l *slog.Logger }

func (s slogPrintln) Println(v ...any) { s.l.Error("metrics: " + fmt.Sprint(v...)) }
