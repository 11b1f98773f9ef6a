package metrics_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/moat-shield/moat/internal/datapath"
	"github.com/moat-shield/moat/internal/metrics"
	"github.com/moat-shield/moat/internal/ratelimit"
	"github.com/moat-shield/moat/internal/rules"
	"github.com/moat-shield/moat/internal/shield"
	"github.com/moat-shield/moat/internal/syncookie"
	"github.com/moat-shield/moat/internal/testpkt"
)

func randHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// freshRoot returns a bpffs root unique to the test; whatever is pinned
// there is removed when the test ends.
func freshRoot(t testing.TB) string {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs("/sys/fs/bpf", &st); err != nil || st.Type != unix.BPF_FS_MAGIC {
		t.Skip("no bpffs at /sys/fs/bpf")
	}
	base := "moat-test-" + randHex(6)
	root := filepath.Join("/sys/fs/bpf", base)
	t.Cleanup(func() {
		if err := os.RemoveAll(root); err != nil {
			t.Errorf("remove %s: %v", root, err)
		}
		locks, _ := filepath.Glob("/run/moat-*" + base + "*.lock")
		for _, l := range locks {
			os.Remove(l)
		}
	})
	return root
}

// openFresh opens the shield on a fresh root; it stays open (and locked)
// until the test ends, as a daemon keeps it.
func openFresh(t *testing.T) *shield.Shield { return openFreshTB(t) }

func openFreshTB(t testing.TB) *shield.Shield {
	t.Helper()
	s, err := shield.Open(freshRoot(t))
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Remove(); err != nil {
			t.Errorf("remove state: %v", err)
		}
		s.Close()
	})
	return s
}

// vethPair creates a veth pair with unique names and leaves it down: no
// frame the kernel sends on its own (IPv6 router solicitations, ...) can
// reach the program and change the counters under the test.
func vethPair(t *testing.T) string {
	t.Helper()
	id := randHex(4)
	name := "mtm" + id + "a"
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: "mtm" + id + "b"}
	if err := netlink.LinkAdd(veth); err != nil {
		t.Fatalf("create veth: %v", err)
	}
	t.Cleanup(func() { netlink.LinkDel(veth) })
	return name
}

var (
	denyHost  = netip.MustParseAddr("198.51.100.7")
	denyNet   = netip.MustParsePrefix("203.0.113.0/24")
	inDenyNet = netip.MustParseAddr("203.0.113.9")
	allowHost = netip.MustParseAddr("192.0.2.50")
	client    = netip.MustParseAddr("192.0.2.99")
	server    = netip.MustParseAddr("192.0.2.1")
)

const (
	synPort = 8080 // SYN-protected in always mode
	// SYN-protected in auto mode with the lowest threshold: the second SYN
	// in a window on one CPU starts a flood.
	autoPort = 8081
	dnsPort  = 53 // port rule udp/53 drop
	sshPort  = 22 // port rule tcp/22 allow
	// A flood budget of 1 packet per second, burst 1: of a quick run of
	// frames, the first passes and the others are dropped.
	budgetPort = 7777
)

// sent is one kind of test frame, how often it is run through the
// program, and what it must add to which counters.
type sent struct {
	name    string
	frame   []byte
	times   int
	verdict string // "pass", "drop"; "" for frames the SYN defence answers
	reason  string
}

func frames() []sent {
	return []sent{
		{"denied host", testpkt.UDPv4(denyHost, server, testpkt.UDP{SrcPort: 1000, DstPort: 9999, Payload: []byte("x")}), 5, "drop", "denylist"},
		{"denied net", testpkt.TCPv4(inDenyNet, server, testpkt.TCP{SrcPort: 1001, DstPort: 443, SYN: true}), 3, "drop", "denylist"},
		{"allowed host to a dropped port", testpkt.UDPv4(allowHost, server, testpkt.UDP{SrcPort: 1002, DstPort: dnsPort, Payload: make([]byte, 300)}), 2, "pass", "allowlist"},
		{"dropped port", testpkt.UDPv4(client, server, testpkt.UDP{SrcPort: 1003, DstPort: dnsPort, Payload: make([]byte, 40)}), 4, "drop", "port_drop"},
		{"allowed port", testpkt.TCPv4(client, server, testpkt.TCP{SrcPort: 1004, DstPort: sshPort, ACK: true, Payload: []byte("ssh")}), 2, "pass", "port_allow"},
		{"no rule", testpkt.UDPv4(client, server, testpkt.UDP{SrcPort: 1005, DstPort: 9999, Payload: make([]byte, 1000)}), 6, "pass", "pass"},
		{"arp", testpkt.Frame{Net: testpkt.ARP{SenderIP: client, TargetIP: server}}.Bytes(), 1, "pass", "non_ip"},
		{"bad tcp data offset", testpkt.TCPv4(client, server, testpkt.TCP{SrcPort: 1006, DstPort: 9999, ACK: true, DataOffset: 15}), 1, "drop", "malformed"},
		// Passed or dropped by the budget: counted apart, from the
		// budget's own counters.
		{"over budget", testpkt.UDPv4(client, server, testpkt.UDP{SrcPort: 1009, DstPort: budgetPort, Payload: make([]byte, 20)}), 4, "", ""},
		// Answered or dropped by the SYN defence, which counts them in its
		// own counters only.
		{"syn", testpkt.TCPv4(client, server, testpkt.TCP{SrcPort: 1007, DstPort: synPort, SYN: true, Seq: 1}), 3, "", ""},
		{"syn to auto port", testpkt.TCPv4(client, server, testpkt.TCP{SrcPort: 1010, DstPort: autoPort, SYN: true, Seq: 3}), 4, "", ""},
		// Dropped, or answered with a RST of 14 + 20 + 20 bytes, within
		// the budget of stray-ACK resets: counted from the port's
		// counters.
		{"ack without cookie", testpkt.TCPv4(client, server, testpkt.TCP{SrcPort: 1008, DstPort: synPort, ACK: true, Seq: 2, Ack: 12345}), 2, "", ""},
	}
}

// setUp installs rules, protects synPort, attaches to a new veth and runs
// the frames through the attached program (BPF_PROG_TEST_RUN on the pinned
// program, so that its per-interface counters are the ones that count).
func setUp(t *testing.T) (s *shield.Shield, iface string, fs []sent, statsOn bool) {
	t.Helper()
	s = openFresh(t)
	iface = vethPair(t)

	if err := s.Add(shield.DenyList, []shield.Entry{
		{Prefix: netip.PrefixFrom(denyHost, 32), Comment: "scanner"},
		{Prefix: denyNet},
	}, shield.Strict); err != nil {
		t.Fatal(err)
	}
	if err := s.Add(shield.AllowList, []shield.Entry{{Prefix: netip.PrefixFrom(allowHost, 32)}}, shield.Strict); err != nil {
		t.Fatal(err)
	}
	if err := s.AddPortRule(rules.PortSpec{Class: rules.UDP, From: dnsPort, To: dnsPort}, rules.Drop); err != nil {
		t.Fatal(err)
	}
	if err := s.AddPortRule(rules.PortSpec{Class: rules.TCP, From: sshPort, To: sshPort}, rules.Allow); err != nil {
		t.Fatal(err)
	}
	if err := syncookie.Protect(s.Map(datapath.MoatMapSynPorts), s.Map(datapath.MoatMapSynCounters), s.Map(datapath.MoatMapSynCensus), synPort, syncookie.ModeAlways, 0); err != nil {
		t.Fatal(err)
	}
	if err := syncookie.Protect(s.Map(datapath.MoatMapSynPorts), s.Map(datapath.MoatMapSynCounters), s.Map(datapath.MoatMapSynCensus), autoPort, syncookie.ModeAuto, 1); err != nil {
		t.Fatal(err)
	}
	if _, err := syncookie.Rotate(s.Map(datapath.MoatMapSynKeys), s.Map(datapath.MoatMapSynRotation)); err != nil {
		t.Fatal(err)
	}
	rl, err := ratelimit.NewMaps(s.Map)
	if err != nil {
		t.Fatal(err)
	}
	budget := ratelimit.Limit{Kind: ratelimit.Budget, Scope: ratelimit.Scope{Class: rules.UDP, From: budgetPort, To: budgetPort}, PPS: 1, BurstPackets: 1}
	if err := rl.Add(budget, false); err != nil {
		t.Fatalf("add budget: %v", err)
	}
	if _, err := s.Attach(iface, shield.ModeNative); err != nil {
		t.Fatalf("attach: %v", err)
	}

	prog, err := ebpf.LoadPinnedProgram(filepath.Join(s.Root(), "ifaces", iface, "prog"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer prog.Close()
	// Run time is only counted while statistics are on; the descriptor
	// turns them off again when closed.
	if stats, err := ebpf.EnableStats(unix.BPF_STATS_RUN_TIME); err == nil {
		defer stats.Close()
		statsOn = true
	} else {
		t.Logf("BPF statistics not available: %v", err)
	}
	fs = frames()
	// On one CPU, as flood detection counts SYNs per CPU; in a network
	// namespace of our own, where the SYN defence finds our listeners on
	// the protected ports (it answers only for local listeners) and no
	// socket of the host can change a verdict.
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread() // left locked: the thread exits with the goroutine
		var cpu0 unix.CPUSet
		cpu0.Set(0)
		if err := unix.SchedSetaffinity(0, &cpu0); err != nil {
			t.Errorf("pin to CPU 0: %v", err)
			return
		}
		ns, err := netns.New()
		if err != nil {
			t.Errorf("new netns: %v", err)
			return
		}
		defer ns.Close()
		for _, port := range []int{synPort, autoPort} {
			var lc net.ListenConfig
			lc.SetMultipathTCP(false) // moat leaves an MPTCP listener's SYNs to the kernel
			ln, err := lc.Listen(context.Background(), "tcp", fmt.Sprintf("[::]:%d", port))
			if err != nil {
				t.Errorf("listen on %d: %v", port, err)
				return
			}
			defer ln.Close()
		}
		for _, f := range fs {
			// One run per frame, not Repeat: the SYN defence rewrites a SYN
			// into its SYN-ACK in place, and a repeat would see the SYN-ACK.
			for i := 0; i < f.times; i++ {
				if _, err := prog.Run(&ebpf.RunOptions{Data: bytes.Clone(f.frame), DataOut: make([]byte, len(f.frame)+256)}); err != nil {
					t.Errorf("%s: test run: %v", f.name, err)
					return
				}
			}
		}
	}()
	<-done
	if t.Failed() {
		t.FailNow()
	}
	return s, iface, fs, statsOn
}

// scrape fetches the metrics over HTTP and parses them with the
// Prometheus text parser.
func scrape(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	req.Header.Set("Accept", "text/plain; version=0.0.4")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("scrape: %v", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("scrape: %s\n%s", resp.Status, body)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
		t.Fatalf("scrape: content type %q", ct)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("parse exposition: %v\n%s", err, body)
	}
	return fams
}

// series is a parsed exposition, looked up by name and labels.
type series map[string]*dto.MetricFamily

func labelsOf(m *dto.Metric) map[string]string {
	out := map[string]string{}
	for _, l := range m.GetLabel() {
		out[l.GetName()] = l.GetValue()
	}
	return out
}

func value(m *dto.Metric) float64 {
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Untyped != nil:
		return m.Untyped.GetValue()
	}
	return 0
}

// all returns the series of a family whose labels include want.
func (s series) all(name string, want map[string]string) []*dto.Metric {
	var out []*dto.Metric
	for _, m := range s[name].GetMetric() {
		got := labelsOf(m)
		ok := true
		for k, v := range want {
			if got[k] != v {
				ok = false
			}
		}
		if ok {
			out = append(out, m)
		}
	}
	return out
}

// get returns the value of exactly one series, failing otherwise.
func (s series) get(t *testing.T, name string, typ dto.MetricType, labels ...string) float64 {
	t.Helper()
	fam := s[name]
	if fam == nil {
		t.Fatalf("no metric %s", name)
	}
	if fam.GetType() != typ {
		t.Errorf("%s is a %s, want %s", name, fam.GetType(), typ)
	}
	want := map[string]string{}
	for i := 0; i+1 < len(labels); i += 2 {
		want[labels[i]] = labels[i+1]
	}
	ms := s.all(name, want)
	if len(ms) != 1 {
		t.Fatalf("%s%v: %d series, want 1", name, want, len(ms))
	}
	return value(ms[0])
}

func (s series) eq(t *testing.T, name string, typ dto.MetricType, want float64, labels ...string) {
	t.Helper()
	if got := s.get(t, name, typ, labels...); got != want {
		t.Errorf("%s%v = %v, want %v", name, labels, got, want)
	}
}

var (
	counterT = dto.MetricType_COUNTER
	gaugeT   = dto.MetricType_GAUGE
)

// TestScrape loads rules, attaches, runs known frames once (attaching is
// the slow part) and checks the scrape against them in subtests.
func TestScrape(t *testing.T) {
	s, iface, fs, statsOn := setUp(t)
	t.Run("values", func(t *testing.T) { testValues(t, s, iface, fs, statsOn) })
	t.Run("top entries", func(t *testing.T) { testTopEntries(t, s) })
	t.Run("top sources", func(t *testing.T) { testTopSources(t, s) })
	t.Run("lint", func(t *testing.T) { testLint(t, s) })
	t.Run("monitor mode", func(t *testing.T) { testMonitorMode(t, s, iface, fs) })
}

// testMonitorMode: moat_monitor_mode follows the policy, and the frames
// over the budget that monitor mode passes count as verdict monitored of
// the budget, not as its drops.
func testMonitorMode(t *testing.T, s *shield.Shield, iface string, fs []sent) {
	srv := httptest.NewServer(metrics.Handler(metrics.Config{Root: s.Root()}))
	defer srv.Close()
	set, err := s.Settings()
	if err != nil {
		t.Fatal(err)
	}
	var over sent
	for _, f := range fs {
		if f.name == "over budget" {
			over = f
		}
	}
	prog, err := ebpf.LoadPinnedProgram(filepath.Join(s.Root(), "ifaces", iface, "prog"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer prog.Close()
	budget := func(got series, verdict string) (pkts, nbytes float64) {
		labels := []string{"kind", "budget", "scope", fmt.Sprintf("udp/%d", budgetPort), "verdict", verdict}
		return got.get(t, "moat_ratelimit_packets_total", counterT, labels...), got.get(t, "moat_ratelimit_bytes_total", counterT, labels...)
	}
	for _, on := range []bool{true, false} {
		set.Monitor = on
		if err := s.SetSettings(set); err != nil {
			t.Fatal(err)
		}
		want := 0.0
		if on {
			want = 1
		}
		before := series(scrape(t, srv.URL))
		before.eq(t, "moat_monitor_mode", gaugeT, want)
		if !on {
			continue
		}
		// 1 packet per second, burst 1: one of these may find a token.
		const n = 4
		for range n {
			ret, err := prog.Run(&ebpf.RunOptions{Data: over.frame})
			if err != nil {
				t.Fatal(err)
			}
			if ret != 2 {
				t.Errorf("over budget in monitor mode: verdict %d, want XDP_PASS", ret)
			}
		}
		after := series(scrape(t, srv.URL))
		var delta [3][2]float64
		for i, v := range []string{"pass", "drop", "monitored"} {
			p0, b0 := budget(before, v)
			p1, b1 := budget(after, v)
			delta[i] = [2]float64{p1 - p0, b1 - b0}
		}
		pass, drop, mon := delta[0], delta[1], delta[2]
		if drop != [2]float64{} {
			t.Errorf("budget drops grew by %v packets, %v bytes in monitor mode", drop[0], drop[1])
		}
		if pass[0]+mon[0] != n || mon[0] < n-1 || mon[1] != mon[0]*float64(len(over.frame)) {
			t.Errorf("budget passed %v and monitored %v packets (%v bytes) of %d frames of %d bytes", pass[0], mon[0], mon[1], n, len(over.frame))
		}
	}
}

// testValues checks every metric against what the test sent and what the
// data path counted.
func testValues(t *testing.T, s *shield.Shield, iface string, fs []sent, statsOn bool) {
	// The shield stays open, holding the state's lock, as a daemon does:
	// the scrape must not need it.
	srv := httptest.NewServer(metrics.Handler(metrics.Config{Root: s.Root()}))
	defer srv.Close()
	got := series(scrape(t, srv.URL+"/metrics"))

	// What the frames must have added, worked out from the table.
	type key struct{ verdict, reason string }
	want := map[key]shield.Count{}
	for _, f := range fs {
		if f.verdict != "" {
			c := want[key{f.verdict, f.reason}]
			c.Packets += uint64(f.times)
			c.Bytes += uint64(f.times * len(f.frame))
			want[key{f.verdict, f.reason}] = c
		}
	}
	// The budget's frames: those it passed went on to "no rule".
	rl, err := ratelimit.NewMaps(s.Map)
	if err != nil {
		t.Fatal(err)
	}
	limits, err := rl.Limits()
	if err != nil {
		t.Fatal(err)
	}
	if len(limits) != 1 {
		t.Fatalf("%d limits, want the budget", len(limits))
	}
	bs := limits[0].Stats
	var budgetFrame sent
	for _, f := range fs {
		if f.name == "over budget" {
			budgetFrame = f
		}
	}
	if bs.Passed+bs.Dropped != uint64(budgetFrame.times) || bs.Passed == 0 || bs.Dropped == 0 {
		t.Fatalf("budget passed %d and dropped %d of %d frames", bs.Passed, bs.Dropped, budgetFrame.times)
	}
	frameLen := uint64(len(budgetFrame.frame))
	if bs.PassedBytes != bs.Passed*frameLen || bs.DroppedBytes != bs.Dropped*frameLen {
		t.Errorf("budget bytes %+v for %d-byte frames", bs, frameLen)
	}
	want[key{"pass", "pass"}] = shield.Count{Packets: want[key{"pass", "pass"}].Packets + bs.Passed, Bytes: want[key{"pass", "pass"}].Bytes + bs.PassedBytes}
	want[key{"drop", "budget"}] = shield.Count{Packets: bs.Dropped, Bytes: bs.DroppedBytes}
	// SYNs to the auto port before the flood went on to the kernel: no rule.
	if auto, err := syncookie.Status(s.Map(datapath.MoatMapSynPorts), s.Map(datapath.MoatMapSynCounters)); err == nil && len(auto) == 2 {
		left := auto[1].SYNs - auto[1].CookiesIssued
		var synLen uint64
		for _, f := range fs {
			if f.name == "syn to auto port" {
				synLen = uint64(len(f.frame))
			}
		}
		c := want[key{"pass", "pass"}]
		want[key{"pass", "pass"}] = shield.Count{Packets: c.Packets + left, Bytes: c.Bytes + left*synLen}
		// Every cookie answered an option-less IPv4 SYN: a SYN-ACK of 14
		// + 20 + 24 bytes (the MSS option alone).
		issued := auto[0].CookiesIssued + auto[1].CookiesIssued
		want[key{"tx", "syn_cookie"}] = shield.Count{Packets: issued, Bytes: issued * 58}
		var ackLen uint64
		for _, f := range fs {
			if f.name == "ack without cookie" {
				ackLen = uint64(len(f.frame))
			}
		}
		resets := auto[0].ResetsSent
		if resets == 0 || auto[0].ACKsDropped != 2 {
			t.Errorf("syn status %+v: want 2 stray ACKs, answered with RSTs within the default budget", auto[0])
		}
		want[key{"tx", "syn_defence"}] = shield.Count{Packets: resets, Bytes: resets * 54}
		want[key{"drop", "syn_defence"}] = shield.Count{Packets: auto[0].ACKsDropped - resets, Bytes: (auto[0].ACKsDropped - resets) * ackLen}
	}
	for _, v := range []struct {
		verdict      string
		pkts, nbytes uint64
	}{{"pass", bs.Passed, bs.PassedBytes}, {"drop", bs.Dropped, bs.DroppedBytes}, {"monitored", 0, 0}} {
		got.eq(t, "moat_ratelimit_packets_total", counterT, float64(v.pkts), "kind", "budget", "scope", "udp/7777", "verdict", v.verdict)
		got.eq(t, "moat_ratelimit_bytes_total", counterT, float64(v.nbytes), "kind", "budget", "scope", "udp/7777", "verdict", v.verdict)
	}
	if n := len(got.all("moat_ratelimit_sources_tracked_total", nil)); n != 0 {
		t.Errorf("a budget exported %d per-source series", n)
	}
	got.eq(t, "moat_map_entries", gaugeT, 1, "map", datapath.MoatMapRlRules)

	// The pairs the data path can count (verdict() in bpf/moat.bpf.c).
	possible := map[key]bool{}
	for _, k := range []key{
		{"pass", "pass"}, {"pass", "non_ip"}, {"pass", "allowlist"}, {"pass", "port_allow"},
		{"drop", "denylist"}, {"drop", "port_drop"}, {"drop", "ratelimit"}, {"drop", "budget"}, {"drop", "syn_defence"},
		{"pass", "fragment"}, {"drop", "fragment"}, {"pass", "malformed"}, {"drop", "malformed"},
		{"tx", "syn_cookie"}, {"tx", "syn_defence"},
		{"monitored", "denylist"}, {"monitored", "port_drop"}, {"monitored", "ratelimit"}, {"monitored", "budget"},
		{"monitored", "fragment"}, {"monitored", "malformed"},
	} {
		possible[k] = true
	}

	// And what the data path says it counted.
	counters, err := s.Counters(iface)
	if err != nil {
		t.Fatal(err)
	}
	for _, reason := range shield.ReasonNames {
		rc := counters.ByReason[reason]
		for _, v := range []struct {
			verdict string
			count   shield.Count
		}{{"pass", rc.Passed}, {"drop", rc.Dropped}, {"tx", rc.Answered}, {"monitored", rc.Monitored}} {
			if v.count != want[key{v.verdict, reason}] {
				t.Errorf("data path counted %s/%s %+v, the test sent %+v", v.verdict, reason, v.count, want[key{v.verdict, reason}])
			}
			labels := []string{"interface", iface, "verdict", v.verdict, "reason", reason}
			if !possible[key{v.verdict, reason}] {
				// Never counted: not exported.
				for _, name := range []string{"moat_packets_total", "moat_bytes_total"} {
					if n := len(got.all(name, map[string]string{"interface": iface, "verdict": v.verdict, "reason": reason})); n != 0 {
						t.Errorf("%s%v exported, a pair the data path never counts", name, labels)
					}
				}
				continue
			}
			got.eq(t, "moat_packets_total", counterT, float64(v.count.Packets), labels...)
			got.eq(t, "moat_bytes_total", counterT, float64(v.count.Bytes), labels...)
		}
	}
	// HELP names every reason and verdict the series hold.
	for _, name := range []string{"moat_packets_total", "moat_bytes_total"} {
		if n := len(got.all(name, map[string]string{"interface": iface})); n != len(possible) {
			t.Errorf("%s: %d series, want %d", name, n, len(possible))
		}
	}
	help := got["moat_packets_total"].GetHelp()
	for k := range possible {
		if !strings.Contains(help, k.verdict+":") || !strings.Contains(help, k.reason) {
			t.Errorf("moat_packets_total HELP does not say verdict %s or reason %s: %q", k.verdict, k.reason, help)
		}
	}
	if !strings.Contains(got["moat_bytes_total"].GetHelp(), "verdict tx") {
		t.Errorf("moat_bytes_total HELP does not say what tx bytes are: %q", got["moat_bytes_total"].GetHelp())
	}
	got.eq(t, "moat_interface_attached", gaugeT, 1, "interface", iface, "mode", "native")
	got.eq(t, "moat_state_present", gaugeT, 1)
	got.eq(t, "moat_monitor_mode", gaugeT, 0)

	// Rule hits: per port rule, and the heaviest list entries.
	got.eq(t, "moat_port_rule_hits_total", counterT, 4, "rule", "udp/53", "action", "drop")
	got.eq(t, "moat_port_rule_hits_total", counterT, 2, "rule", "tcp/22", "action", "allow")
	got.eq(t, "moat_list_entry_hits_total", counterT, 5, "list", "denylist", "prefix", "198.51.100.7/32")
	got.eq(t, "moat_list_entry_hits_total", counterT, 3, "list", "denylist", "prefix", "203.0.113.0/24")
	got.eq(t, "moat_list_entry_hits_total", counterT, 2, "list", "allowlist", "prefix", "192.0.2.50/32")

	// SYN cookies: three SYNs answered, two ACKs without a cookie dropped
	// on the always port; a flood detected on the auto port.
	st, err := syncookie.Status(s.Map(datapath.MoatMapSynPorts), s.Map(datapath.MoatMapSynCounters))
	if err != nil {
		t.Fatal(err)
	}
	if len(st) != 2 || st[0].Port != synPort || st[0].SYNs != 3 || st[0].CookiesIssued != 3 || st[0].ACKsDropped != 2 {
		t.Fatalf("data path SYN counters %+v, want 3 SYNs, 3 cookies, 2 ACKs dropped on %d", st, synPort)
	}
	if auto := st[1]; auto.Port != autoPort || auto.SYNs != 4 || !auto.Flooding || auto.CookiesIssued == 0 || auto.LastChange.IsZero() {
		t.Fatalf("data path SYN state %+v, want a flood after 4 SYNs on %d", auto, autoPort)
	}
	for _, p := range st {
		port := fmt.Sprint(p.Port)
		got.eq(t, "moat_syncookie_syns_total", counterT, float64(p.SYNs), "port", port)
		got.eq(t, "moat_syncookie_cookies_issued_total", counterT, float64(p.CookiesIssued), "port", port)
		got.eq(t, "moat_syncookie_cookies_accepted_total", counterT, float64(p.CookiesAccepted), "port", port)
		got.eq(t, "moat_syncookie_cookies_rejected_total", counterT, float64(p.CookiesRejected), "port", port)
		got.eq(t, "moat_syncookie_acks_dropped_total", counterT, float64(p.ACKsDropped), "port", port)
		got.eq(t, "moat_syncookie_accept_errors_total", counterT, float64(p.AcceptErrors), "port", port)
		got.eq(t, "moat_syncookie_accept_queue_full_total", counterT, float64(p.AcceptQueueFull), "port", port)
		got.eq(t, "moat_syncookie_mptcp_syns_total", counterT, float64(p.MPTCPSYNs), "port", port)
		got.eq(t, "moat_syncookie_nat_syns_total", counterT, float64(p.NATSYNs), "port", port)
		got.eq(t, "moat_syncookie_resets_sent_total", counterT, float64(p.ResetsSent), "port", port)
		got.eq(t, "moat_syncookie_syns_dropped_total", counterT, float64(p.SYNsDropped), "port", port)
		got.eq(t, "moat_syncookie_syns_passed_total", counterT, float64(p.SYNsPassed), "port", port)
		got.eq(t, "moat_syncookie_stale_key_syns_total", counterT, float64(p.StaleKeySYNs), "port", port)
		got.eq(t, "moat_syncookie_flood_threshold_syns_per_second", gaugeT, float64(p.ThresholdPerSec), "port", port)
		got.eq(t, "moat_syncookie_port_info", gaugeT, 1, "port", port, "mode", p.Mode)
	}
	got.eq(t, "moat_syncookie_flooding", gaugeT, 0, "port", fmt.Sprint(synPort))
	got.eq(t, "moat_syncookie_flooding_last_change_timestamp_seconds", gaugeT, 0, "port", fmt.Sprint(synPort))
	got.eq(t, "moat_syncookie_flooding", gaugeT, 1, "port", fmt.Sprint(autoPort))
	changed := got.get(t, "moat_syncookie_flooding_last_change_timestamp_seconds", gaugeT, "port", fmt.Sprint(autoPort))
	if d := changed - float64(st[1].LastChange.UnixNano())/1e9; d < -0.01 || d > 0.01 {
		t.Errorf("flood started at %v, the data path says %v", changed, st[1].LastChange)
	}
	if age := time.Since(time.Unix(0, int64(changed*1e9))); age < 0 || age > time.Minute {
		t.Errorf("flood started %v ago, want within the test", age)
	}
	got.eq(t, "moat_syncookie_key_rotations_total", counterT, 1)
	got.eq(t, "moat_syncookie_keys_stale", gaugeT, 0)
	// No daemon here, so no census passes.
	got.eq(t, "moat_syncookie_census_passes_total", counterT, 0)
	got.eq(t, "moat_syncookie_census_current", gaugeT, 0)
	rotated := got.get(t, "moat_syncookie_key_last_rotation_timestamp_seconds", gaugeT)
	if age := time.Since(time.Unix(0, int64(rotated*1e9))); age < 0 || age > time.Minute {
		t.Errorf("last key rotation %v ago, want within the test", age)
	}

	// Fill levels.
	for _, m := range []struct {
		name       string
		entries    float64
		maxEntries float64
	}{
		{datapath.MoatMapDenyV4Hosts, 1, float64(s.Map(datapath.MoatMapDenyV4Hosts).MaxEntries())},
		{datapath.MoatMapDenyV4Nets, 1, float64(s.Map(datapath.MoatMapDenyV4Nets).MaxEntries())},
		{datapath.MoatMapDenyV6Hosts, 0, float64(s.Map(datapath.MoatMapDenyV6Hosts).MaxEntries())},
		{datapath.MoatMapAllowV4Hosts, 1, float64(s.Map(datapath.MoatMapAllowV4Hosts).MaxEntries())},
		{datapath.MoatMapAllowV6Nets, 0, float64(s.Map(datapath.MoatMapAllowV6Nets).MaxEntries())},
		{datapath.MoatMapComments, 1, float64(s.Map(datapath.MoatMapComments).MaxEntries())},
		{datapath.MoatMapAutoReasons, 0, float64(s.Map(datapath.MoatMapAutoReasons).MaxEntries())},
		{datapath.MoatMapPortRuleDefs, 2, float64(s.Map(datapath.MoatMapPortRuleDefs).MaxEntries() - 1)},
		{datapath.MoatMapSynCounters, 2, float64(syncookie.MaxProtectedPorts)},
	} {
		got.eq(t, "moat_map_entries", gaugeT, m.entries, "map", m.name)
		got.eq(t, "moat_map_max_entries", gaugeT, m.maxEntries, "map", m.name)
	}
	if mem := got.get(t, "moat_map_memory_bytes", gaugeT, "map", datapath.MoatMapPortRules); mem < 4*65536*4 {
		t.Errorf("port_rules memory %v bytes, less than its 262,144 4-byte slots", mem)
	}

	// Program run time, when the kernel let us turn statistics on.
	if runs := got.get(t, "moat_program_runs_total", counterT, "interface", iface, "program", "xdp_filter"); statsOn {
		var n int
		for _, f := range fs {
			n += f.times
		}
		if runs != float64(n) {
			t.Errorf("xdp_filter runs %v, want %d", runs, n)
		}
		if rt := got.get(t, "moat_program_run_time_seconds_total", counterT, "interface", iface, "program", "xdp_filter"); rt <= 0 || rt > 1 {
			t.Errorf("xdp_filter run time %v s for %d runs", rt, n)
		}
	}
	got.eq(t, "moat_program_runs_total", counterT, 0, "interface", iface, "program", "tc_syn_accept")

	for _, part := range []string{"interfaces", "port_rules", "lists", "syncookie", "ratelimit", "maps"} {
		got.eq(t, "moat_scrape_collector_success", gaugeT, 1, "collector", part)
	}
	// The Go and process collectors share the registry.
	for _, name := range []string{"go_goroutines", "process_resident_memory_bytes", "promhttp_metric_handler_requests_total"} {
		if got[name] == nil {
			t.Errorf("no %s", name)
		}
	}
}

// testTopEntries: only the N entries with most hits get a series.
func testTopEntries(t *testing.T, s *shield.Shield) {
	srv := httptest.NewServer(metrics.Handler(metrics.Config{Root: s.Root(), TopEntries: 2}))
	defer srv.Close()
	got := series(scrape(t, srv.URL))
	var prefixes []string
	for _, m := range got.all("moat_list_entry_hits_total", nil) {
		prefixes = append(prefixes, labelsOf(m)["prefix"])
	}
	sort.Strings(prefixes)
	if want := []string{"198.51.100.7/32", "203.0.113.0/24"}; fmt.Sprint(prefixes) != fmt.Sprint(want) {
		t.Errorf("top 2 entries %v, want %v (the two with most hits)", prefixes, want)
	}

	srv2 := httptest.NewServer(metrics.Handler(metrics.Config{Root: s.Root(), TopEntries: -1}))
	defer srv2.Close()
	if n := len(series(scrape(t, srv2.URL)).all("moat_list_entry_hits_total", nil)); n != 0 {
		t.Errorf("TopEntries -1 exported %d entries", n)
	}
}

// testTopSources: heavy hitters, whose labels are addresses too, follow
// TopEntries; none at all when it is negative.
func testTopSources(t *testing.T, s *shield.Shield) {
	rl, err := ratelimit.NewMaps(s.Map)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := rl.Config()
	if err != nil {
		t.Fatal(err)
	}
	var keys []datapath.MoatRlSrcKey
	for i := range 12 {
		k := datapath.MoatRlSrcKey{Family: 4, Prefixlen: 32}
		copy(k.Addr[:], []byte{198, 51, 100, byte(i + 1)})
		if err := rl.HHSources.Put(k, datapath.MoatHhCounts{Packets: uint64(100 + i), Bytes: 6400, Dropped: 3, Monitored: 2}); err != nil {
			t.Fatal(err)
		}
		keys = append(keys, k)
	}
	t.Cleanup(func() {
		for _, k := range keys {
			rl.HHSources.Delete(k)
		}
	})
	for _, c := range []struct{ top, want int }{{0, metrics.DefaultTopEntries}, {3, 3}, {-1, 0}} {
		srv := httptest.NewServer(metrics.Handler(metrics.Config{Root: s.Root(), TopEntries: c.top}))
		got := series(scrape(t, srv.URL))
		srv.Close()
		for _, name := range []string{"moat_heavy_hitter_packets", "moat_heavy_hitter_bytes", "moat_heavy_hitter_dropped_packets", "moat_heavy_hitter_monitored_packets"} {
			if n := len(got.all(name, nil)); n != c.want {
				t.Errorf("TopEntries %d: %d series of %s, want %d", c.top, n, name, c.want)
			}
		}
		if c.want > 0 {
			// The heaviest, scaled by the sampling interval.
			top := []string{"source", "198.51.100.12/32"}
			got.eq(t, "moat_heavy_hitter_dropped_packets", gaugeT, float64(3*cfg.Sample), top...)
			got.eq(t, "moat_heavy_hitter_monitored_packets", gaugeT, float64(2*cfg.Sample), top...)
		}
		// The attack shape names no address: it stays.
		if n := len(got.all("moat_attack_shape_packets_total", map[string]string{"dimension": "size"})); n == 0 {
			t.Errorf("TopEntries %d: no attack shape", c.top)
		}
	}
}

// testLint runs the Prometheus linter (names, units, _total, HELP) over
// a real collection.
func testLint(t *testing.T, s *shield.Shield) {
	problems, err := testutil.CollectAndLint(metrics.NewCollector(metrics.Config{Root: s.Root()}))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
}

func TestNotSetUp(t *testing.T) {
	root := freshRoot(t) // nothing is pinned there
	srv := httptest.NewServer(metrics.Handler(metrics.Config{Root: root}))
	defer srv.Close()
	got := series(scrape(t, srv.URL))
	got.eq(t, "moat_state_present", gaugeT, 0)
	if got["moat_packets_total"] != nil {
		t.Error("packets exported without any state")
	}
	if _, err := os.Stat(root); err == nil {
		t.Error("the scrape created the state")
	}
}

// TestDetachedInterface: pins left behind by a vanished interface show as
// not attached; the counters stay readable.
func TestDetachedInterface(t *testing.T) {
	s := openFresh(t)
	iface := vethPair(t)
	rl, err := ratelimit.NewMaps(s.Map)
	if err != nil {
		t.Fatal(err)
	}
	budget := ratelimit.Limit{Kind: ratelimit.Budget, Scope: ratelimit.Scope{Class: rules.UDP, From: budgetPort, To: budgetPort}, PPS: 1, BurstPackets: 1}
	if err := rl.Add(budget, false); err != nil {
		t.Fatalf("add budget: %v", err)
	}
	if _, err := s.Attach(iface, shield.ModeNative); err != nil {
		t.Fatal(err)
	}
	link, err := netlink.LinkByName(iface)
	if err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkDel(link); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(metrics.Handler(metrics.Config{Root: s.Root()}))
	defer srv.Close()
	got := series(scrape(t, srv.URL))
	got.eq(t, "moat_interface_attached", gaugeT, 0, "interface", iface, "mode", "")
	got.eq(t, "moat_packets_total", counterT, 0, "interface", iface, "verdict", "pass", "reason", "pass")
	got.eq(t, "moat_scrape_collector_success", gaugeT, 1, "collector", "interfaces")
}
