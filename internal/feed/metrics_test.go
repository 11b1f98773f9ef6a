package feed_test

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/moat-shield/moat/internal/feed"
)

// The collector reports each feed as its status says, a failing feed
// down and a feed never confirmed at 0.
func TestFeedMetrics(t *testing.T) {
	at := time.Unix(1700000000, 0)
	c := feed.NewCollector(func() []feed.Status {
		return []feed.Status{
			{URL: "https://a.example/deny.txt", List: "deny", Deny: 12, LastSuccess: at, LastChange: at, Failures: 1},
			{URL: "https://b.example/allow.txt", List: "allow", Allow: 3, Failures: 4, Error: "server answered 503"},
		}
	})
	want := `
# HELP moat_feed_entries Entries of the feed's current copy, by list.
# TYPE moat_feed_entries gauge
moat_feed_entries{list="allow",url="https://a.example/deny.txt"} 0
moat_feed_entries{list="allow",url="https://b.example/allow.txt"} 3
moat_feed_entries{list="deny",url="https://a.example/deny.txt"} 12
moat_feed_entries{list="deny",url="https://b.example/allow.txt"} 0
# HELP moat_feed_failures_total Fetches of the feed that failed, and copies the maps refused.
# TYPE moat_feed_failures_total counter
moat_feed_failures_total{url="https://a.example/deny.txt"} 1
moat_feed_failures_total{url="https://b.example/allow.txt"} 4
# HELP moat_feed_up 1 if the feed's last fetch or apply worked, 0 if it failed (the last good copy stays applied).
# TYPE moat_feed_up gauge
moat_feed_up{url="https://a.example/deny.txt"} 1
moat_feed_up{url="https://b.example/allow.txt"} 0
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(want), "moat_feed_entries", "moat_feed_failures_total", "moat_feed_up"); err != nil {
		t.Fatal(err)
	}
	if n := testutil.CollectAndCount(c, "moat_feed_last_success_timestamp_seconds"); n != 2 {
		t.Fatalf("%d last-success series", n)
	}
}
