package cli

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/moat-shield/moat/internal/ratelimit"
	"github.com/moat-shield/moat/internal/shield"
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
		deny: map[netip.Prefix]denyState{c: {live: true, auto: true, own: true, hits: 100}},
	}
	cur := topSample{at: t0.Add(2 * time.Second), sample: 64,
		hh: map[netip.Prefix]ratelimit.HeavyHitter{
			a: {Source: a, Packets: 3000, Bytes: 192000},
			b: {Source: b, Packets: 1500, Bytes: 1500000, Dropped: 600},
			c: {Source: c, Packets: 640, Bytes: 64000},
		},
		deny: map[netip.Prefix]denyState{c: {live: true, auto: true, own: true, hits: 20100}},
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

// In monitor mode what the rules would drop passes: a heavy hitter's
// samples over a limit, the hits of any live denylist entry and those of
// a monitor mode auto-block count as monitored, not dropped, and the
// verdict says what enforcing would do.
func TestTopReportMonitored(t *testing.T) {
	limited := netip.MustParsePrefix("198.19.1.1/32")
	blocked := netip.MustParsePrefix("198.51.100.7/32")
	auto := netip.MustParsePrefix("2001:db8:f00:1::/64")
	t0 := time.Unix(1000, 0)
	prev := topSample{at: t0, sample: 1, monitor: true,
		hh: map[netip.Prefix]ratelimit.HeavyHitter{
			limited: {Source: limited, Packets: 1000, Monitored: 100},
			blocked: {Source: blocked, Packets: 10},
			auto:    {Source: auto, Packets: 10},
		},
		deny: map[netip.Prefix]denyState{
			blocked: {live: true, own: true, hits: 0},
			auto:    {live: true, auto: true, monitor: true, own: true, hits: 0},
		},
	}
	cur := topSample{at: t0.Add(time.Second), sample: 1, monitor: true,
		hh: map[netip.Prefix]ratelimit.HeavyHitter{
			limited: {Source: limited, Packets: 3000, Monitored: 1900},
			blocked: {Source: blocked, Packets: 10},
			auto:    {Source: auto, Packets: 10},
		},
		deny: map[netip.Prefix]denyState{
			blocked: {live: true, own: true, hits: 500},
			auto:    {live: true, auto: true, monitor: true, own: true, hits: 700},
		},
	}
	row := func(rep TopReport) []string {
		var got []string
		for _, r := range rep.Sources {
			got = append(got, fmt.Sprintf("%s %s %.0f %.0f %.0f", r.Source, r.Verdict, r.PPS, r.DroppedPPS, r.MonitoredPPS))
		}
		return got
	}
	rep := topReport(prev, cur, map[netip.Prefix][]float64{}, "packets", 10)
	want := []string{
		"198.19.1.1/32 would be limited 2000 0 1800",
		"2001:db8:f00:1::/64 would be auto-blocked 700 0 700",
		"198.51.100.7/32 would be blocked 500 0 500",
	}
	if got := row(rep); strings.Join(got, "\n") != strings.Join(want, "\n") || !rep.Monitor {
		t.Errorf("monitor mode, rows:\n%s\nwant:\n%s (monitor %v)", strings.Join(got, "\n"), strings.Join(want, "\n"), rep.Monitor)
	}
	var b strings.Builder
	if err := printTop(&b, rep, "packets"); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "MONITOR MODE") || !strings.Contains(b.String(), "DROPPED PPS  MONITORED PPS  VERDICT") {
		t.Errorf("table in monitor mode:\n%s", b.String())
	}

	// Enforcing, the manual entry's hits are drops again, and a monitor
	// mode auto-block is out of force (readTop reads it as not live).
	prev.monitor, cur.monitor = false, false
	prev.hh[limited] = ratelimit.HeavyHitter{Source: limited, Packets: 1000, Dropped: 100, Monitored: 1900}
	cur.hh[limited] = ratelimit.HeavyHitter{Source: limited, Packets: 3000, Dropped: 1900, Monitored: 1900}
	cur.deny[auto] = denyState{auto: true, monitor: true, own: true, hits: 700}
	want = []string{
		"198.19.1.1/32 limited 2000 1800 0",
		"198.51.100.7/32 blocked 500 500 0",
		"2001:db8:f00:1::/64 pass 0 0 0",
	}
	if got := row(topReport(prev, cur, map[netip.Prefix][]float64{}, "packets", 10)); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("enforcing, rows:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// A prefix entry that covers several sources blocks each, but its hits
// are theirs together: only a source's own entry adds its rate.
func TestTopReportCoveringPrefix(t *testing.T) {
	own := netip.MustParsePrefix("198.51.100.7/32")
	v6 := netip.MustParsePrefix("2001:db8:f00:1::/64")
	covered := []netip.Prefix{netip.MustParsePrefix("198.19.0.1/32"), netip.MustParsePrefix("198.19.0.2/32"), netip.MustParsePrefix("198.19.0.3/32")}
	t0 := time.Unix(1000, 0)
	prev := topSample{at: t0, sample: 1, hh: map[netip.Prefix]ratelimit.HeavyHitter{}, deny: map[netip.Prefix]denyState{}}
	cur := topSample{at: t0.Add(time.Second), sample: 1, hh: map[netip.Prefix]ratelimit.HeavyHitter{}, deny: map[netip.Prefix]denyState{}}
	for _, src := range append([]netip.Prefix{own, v6}, covered...) {
		prev.hh[src] = ratelimit.HeavyHitter{Source: src, Packets: 100}
		cur.hh[src] = ratelimit.HeavyHitter{Source: src, Packets: 100}
	}
	// The /24 counted 30000 packets of its sources in the interval.
	for _, src := range covered {
		prev.deny[src] = denyState{live: true, hits: 1000}
		cur.deny[src] = denyState{live: true, hits: 31000}
	}
	prev.deny[own] = denyState{live: true, own: true, hits: 10}
	cur.deny[own] = denyState{live: true, own: true, hits: 510}
	prev.deny[v6] = denyState{live: true, auto: true, own: true, hits: 0}
	cur.deny[v6] = denyState{live: true, auto: true, own: true, hits: 700}
	var got []string
	for _, r := range topReport(prev, cur, map[netip.Prefix][]float64{}, "packets", 10).Sources {
		got = append(got, fmt.Sprintf("%s %s %.0f %.0f", r.Source, r.Verdict, r.PPS, r.DroppedPPS))
	}
	want := []string{
		"2001:db8:f00:1::/64 auto-blocked 700 700",
		"198.51.100.7/32 blocked 500 500",
		"198.19.0.1/32 blocked 0 0",
		"198.19.0.2/32 blocked 0 0",
		"198.19.0.3/32 blocked 0 0",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("rows:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// A heavy hitter evicted and sampled again starts from zero: any counter
// lower than before means that, not a delta near 2^64.
func TestTopReportRestarted(t *testing.T) {
	a := netip.MustParsePrefix("198.19.1.1/32")
	t0 := time.Unix(1000, 0)
	for _, c := range []struct {
		name      string
		prev, cur ratelimit.HeavyHitter
	}{
		{"packets", ratelimit.HeavyHitter{Packets: 5000, Bytes: 100, Dropped: 10}, ratelimit.HeavyHitter{Packets: 200, Bytes: 12800, Dropped: 20}},
		{"bytes", ratelimit.HeavyHitter{Packets: 100, Bytes: 500000, Dropped: 10}, ratelimit.HeavyHitter{Packets: 200, Bytes: 12800, Dropped: 20}},
		{"dropped", ratelimit.HeavyHitter{Packets: 100, Bytes: 100, Dropped: 5000}, ratelimit.HeavyHitter{Packets: 200, Bytes: 12800, Dropped: 20}},
		{"monitored", ratelimit.HeavyHitter{Packets: 100, Bytes: 100, Dropped: 10, Monitored: 5000}, ratelimit.HeavyHitter{Packets: 200, Bytes: 12800, Dropped: 20}},
	} {
		prev := topSample{at: t0, hh: map[netip.Prefix]ratelimit.HeavyHitter{a: c.prev}}
		cur := topSample{at: t0.Add(time.Second), hh: map[netip.Prefix]ratelimit.HeavyHitter{a: c.cur}}
		r := topReport(prev, cur, map[netip.Prefix][]float64{}, "packets", 10).Sources[0]
		if r.PPS != 200 || r.Mbps != 0.1024 || r.DroppedPPS != 20 {
			t.Errorf("%s lower: %.0f pps, %.4f Mbit/s, %.0f dropped; want the new counts: 200, 0.1024, 20", c.name, r.PPS, r.Mbps, r.DroppedPPS)
		}
	}
}

// A re-attach recreates an interface's counters at zero: the watch rate is
// what they counted since, not a wrapped difference.
func TestWatchRatesReset(t *testing.T) {
	count := func(p, b uint64) shield.Count { return shield.Count{Packets: p, Bytes: b} }
	prev := shield.Counters{Passed: count(1_000_000, 64_000_000), Dropped: count(500, 32_000), Answered: count(80, 5920)}
	cur := shield.Counters{Passed: count(2000, 128_000), Dropped: count(1500, 96_000), Answered: count(20, 1480)}
	got := *watchRates(prev, cur, 2)
	want := Rates{PassedPPS: 1000, DroppedPPS: 500, PassedMbps: 0.512, DroppedMbps: 0.256, AnsweredPPS: 10, AnsweredMbps: 0.00592}
	if got != want {
		t.Errorf("rates %+v, want %+v", got, want)
	}
}

// denyOf tells a source's own entry from a shorter prefix that covers it.
func TestDenyOfOwnEntry(t *testing.T) {
	var st unix.Statfs_t
	if err := unix.Statfs("/sys/fs/bpf", &st); err != nil || st.Type != unix.BPF_FS_MAGIC {
		t.Skip("no bpffs at /sys/fs/bpf")
	}
	var rnd [6]byte
	rand.Read(rnd[:])
	base := "fxm-top-" + hex.EncodeToString(rnd[:])
	s, err := shield.Open(filepath.Join("/sys/fs/bpf", base))
	if err != nil {
		t.Skipf("open state: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Remove(); err != nil {
			t.Errorf("remove state: %v", err)
		}
		s.Close()
		locks, _ := filepath.Glob("/run/moat-*" + base + "*.lock")
		for _, l := range locks {
			os.Remove(l)
		}
	})
	var entries []shield.Entry
	for _, p := range []string{"198.51.100.0/24", "203.0.113.9/32", "2001:db8:f00::/48", "2001:db8:a::/64"} {
		entries = append(entries, shield.Entry{Prefix: netip.MustParsePrefix(p)})
	}
	if err := s.Add(shield.DenyList, entries, shield.Strict); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		src   string
		found bool
		own   bool
	}{
		{"198.51.100.7/32", true, false},
		{"203.0.113.9/32", true, true},
		{"2001:db8:f00:1::/64", true, false},
		{"2001:db8:a::/64", true, true},
		{"192.0.2.1/32", false, false},
	} {
		d, ok := denyOf(s, netip.MustParsePrefix(c.src), bootNanos())
		if ok != c.found || d.own != c.own || (ok && !d.live) {
			t.Errorf("%s: found %v, %+v; want found %v, own %v", c.src, ok, d, c.found, c.own)
		}
	}
}
