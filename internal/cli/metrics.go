package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/moat-shield/moat/internal/metrics"
)

func init() {
	extraCommands = append(extraCommands, newMetricsCmd)
}

// newMetricsCmd serves the Prometheus metrics without the daemon, for
// testing and for hosts that run moat from the CLI alone. It reads the
// pins without the state lock, so it runs beside a daemon or CLI writers.
func newMetricsCmd(g *globals) *cobra.Command {
	var (
		listen string
		top    int
		once   bool
	)
	cmd := &cobra.Command{
		Use:   "metrics [--listen ADDR] [--top N] [--once]",
		Short: "Serve Prometheus metrics of the pinned state on /metrics",
		Long: "Serves moat's counters in the Prometheus text format at http://ADDR/metrics, read from the pinned " +
			"maps at every scrape. The default address is loopback only: the metrics name who is blocked and what " +
			"is let through. --once prints one scrape to stdout and exits. Program run time is only counted while " +
			"the sysctl kernel.bpf_stats_enabled is 1.",
		Args: args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if os.Geteuid() != 0 {
				return errors.New("moat needs root (CAP_BPF) to read its maps")
			}
			if top == 0 {
				top = -1 // the flag's 0 means none; the package's 0 means its default
			}
			logger := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), nil))
			h := metrics.Handler(metrics.Config{Root: g.root, TopEntries: top, Logger: logger})
			if once {
				rec := httptest.NewRecorder()
				req := httptest.NewRequest(http.MethodGet, "/metrics", nil)
				req.Header.Set("Accept", "text/plain")
				h.ServeHTTP(rec, req)
				if rec.Code != http.StatusOK {
					return fmt.Errorf("scrape: HTTP %d: %s", rec.Code, rec.Body.String())
				}
				_, err := cmd.OutOrStdout().Write(rec.Body.Bytes())
				return err
			}
			return serveMetrics(cmd.Context(), listen, h, logger)
		},
	}
	cmd.Flags().StringVar(&listen, "listen", metrics.DefaultListen, "address to serve on")
	cmd.Flags().IntVar(&top, "top", metrics.DefaultTopEntries, "allow/deny entries with the most hits, and heavy-hitter sources, to export one series each (0: none)")
	cmd.Flags().BoolVar(&once, "once", false, "print one scrape and exit")
	return cmd
}

func serveMetrics(ctx context.Context, listen string, h http.Handler, logger *slog.Logger) error {
	if ctx == nil {
		ctx = context.Background()
	}
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return usagef("listen on %s: %v", listen, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", h)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	logger.Info("serving metrics", "url", "http://"+ln.Addr().String()+"/metrics")
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shut, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return srv.Shutdown(shut)
}
