package daemon

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/moat-shield/moat/internal/config"
	"github.com/moat-shield/moat/internal/metrics"
)

// listenMetrics opens the metrics listener, or none if metrics are off.
// The daemon opens it before it applies anything, so that an address it
// cannot take refuses the start while nothing has changed.
func listenMetrics(cfg *config.Config) (net.Listener, error) {
	if !cfg.Metrics.On() {
		return nil, nil
	}
	ln, err := net.Listen("tcp", cfg.Metrics.Address)
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	return ln, nil
}

// serveMetrics serves the Prometheus exposition on ln. The collector
// reads the pinned maps without the state lock, so a scrape never waits
// for a change.
func (d *Daemon) serveMetrics(ln net.Listener, cfg *config.Config) *http.Server {
	mux := http.NewServeMux()
	mux.Handle("/metrics", metrics.Handler(metrics.Config{Root: d.root, TopEntries: cfg.Metrics.TopEntries, Logger: d.log}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln)
	d.log.Info("serving metrics", "address", "http://"+ln.Addr().String()+"/metrics")
	return srv
}

// notify tells systemd about the daemon's state (sd_notify): a datagram to
// the unix socket named by $NOTIFY_SOCKET, where a leading @ names an
// abstract socket. Without the variable, nobody listens: nothing to do.
func notify(msg string) {
	path := os.Getenv("NOTIFY_SOCKET")
	if path == "" {
		return
	}
	if strings.HasPrefix(path, "@") {
		path = "\x00" + path[1:]
	}
	c, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		return
	}
	defer c.Close()
	c.Write([]byte(msg))
}
