package daemon

import (
	"io"
	"log/slog"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/moat-shield/moat/internal/feed"
	"github.com/moat-shield/moat/internal/metrics"
)

// TestScrapeDoesNotWaitForAChange: a scrape of the daemon's metrics
// answers while a change holds the daemon's lock (a reload of a long
// list, a heal that loads the programs again, a feed's apply: seconds).
// The feeds' collector took the lock, so every scrape, with feeds or
// none, waited for the change to end, and one longer than Prometheus's
// scrape timeout left a gap in every series.
func TestScrapeDoesNotWaitForAChange(t *testing.T) {
	d := &Daemon{log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	h := metrics.Handler(metrics.Config{Root: filepath.Join(t.TempDir(), "none"), Logger: d.log,
		Extra: []prometheus.Collector{feed.NewCollector(d.FeedStatus)}})
	d.mu.Lock() // a reload under way
	defer d.mu.Unlock()
	done := make(chan int, 1)
	go func() {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest("GET", "/metrics", nil))
		done <- w.Code
	}()
	select {
	case code := <-done:
		if code != 200 {
			t.Errorf("scrape: status %d", code)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("a scrape waited for the change that held the daemon's lock")
	}
}
