package cli

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/moat-shield/moat/internal/ratelimit"
)

// topReport turns two reads into rates and verdicts: sampled counts for
// sources that reach the limits, denylist hits for blocked ones.
func TestTopReport(t *testing.T) {
	a := netip.MustParsePrefix("198.19.1.1/32")
	b := netip.MustParsePrefix("198.19.2.2/32")
	c := netip.MustParsePrefix("2001:db8:f00:1::/64")
	t0 := time.Unix(1000, 0)
	prev := topSample{at: t0, sample: 64,
		hh: map[netip.Prefix]ratelimit.HeavyHitter{
			a: {Source: a, Packets: 1000, Bytes: 64000},
			b: {Source: b, Packets: 500, Bytes: 500000, Dropped: 0},
			c: {Source: c, Packets: 640, Bytes: 64000},
		},
		deny: map[netip.Prefix]denyState{c: {live: true, auto: true, hits: 100}},
	}
	cur := topSample{at: t0.Add(2 * time.Second), sample: 64,
		hh: map[netip.Prefix]ratelimit.HeavyHitter{
			a: {Source: a, Packets: 3000, Bytes: 192000},
			b: {Source: b, Packets: 1500, Bytes: 1500000, Dropped: 600},
			c: {Source: c, Packets: 640, Bytes: 64000},
		},
		deny: map[netip.Prefix]denyState{c: {live: true, auto: true, hits: 20100}},
	}
	hist := map[netip.Prefix][]float64{}
	rep := topReport(prev, cur, hist, "packets", 10)
	var got []string
	for _, r := range rep.Sources {
		got = append(got, fmt.Sprintf("%s %s %.0f %.0f", r.Source, r.Verdict, r.PPS, r.DroppedPPS))
	}
	want := []string{
		"2001:db8:f00:1::/64 auto-blocked 10000 10000",
		"198.19.1.1/32 pass 1000 0",
		"198.19.2.2/32 limited 500 300",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("rows:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if rep.Sources[2].Mbps != 4 {
		t.Errorf("198.19.2.2: %.2f Mbit/s, want 4", rep.Sources[2].Mbps)
	}
	rep = topReport(prev, cur, hist, "bytes", 1)
	if len(rep.Sources) != 1 || rep.Sources[0].Source != b || len(rep.Sources[0].History) != 2 {
		t.Errorf("by bytes, top 1: %+v", rep.Sources)
	}
	if s := sparkline([]float64{0, 5, 10}); s != "▁▄█" {
		t.Errorf("sparkline %q", s)
	}
}
