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

// serveMetrics serves the Prometheus exposition on the configured address,
// or nothing if metrics are off. The collector reads the pinned maps
// without the state lock, so a scrape never waits for a change.
func (d *Daemon) serveMetrics(cfg *config.Config) (*http.Server, error) {
	if !cfg.Metrics.On() {
		return nil, nil
	}
	ln, err := net.Listen("tcp", cfg.Metrics.Address)
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", metrics.Handler(metrics.Config{Root: d.root, TopEntries: cfg.Metrics.TopEntries, Logger: d.log}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln)
	d.log.Info("serving metrics", "address", "http://"+ln.Addr().String()+"/metrics")
	return srv, nil
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
