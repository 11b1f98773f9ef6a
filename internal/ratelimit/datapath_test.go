package ratelimit_test

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"

	"github.com/moat-shield/moat/internal/datapath"
	"github.com/moat-shield/moat/internal/lab"
	"github.com/moat-shield/moat/internal/ratelimit"
	"github.com/moat-shield/moat/internal/testpkt"
)

var (
	src4  = netip.MustParseAddr("10.1.2.3")
	src4b = netip.MustParseAddr("10.1.2.4")
	dst4  = netip.MustParseAddr("192.0.2.10")
	dst6  = netip.MustParseAddr("2001:db8:ff::10")
)

// filter is the XDP program loaded with fresh, unpinned maps.
type filter struct {
	tb   testing.TB
	coll *ebpf.Collection
	prog *ebpf.Program
	rl   ratelimit.Maps
	ns   *connNetns // where packets run, if not here
	// Or a lab host's namespace, where packets come in on ifindex.
	host    *lab.Host
	ifindex int
}

// xdpMD is the kernel's struct xdp_md, the context of an XDP test run.
type xdpMD struct {
	Data, DataEnd, DataMeta, IngressIfindex, RxQueueIndex, EgressIfindex uint32
}

func newFilter(tb testing.TB) *filter {
	tb.Helper()
	spec, err := datapath.LoadMoat()
	if err != nil {
		tb.Fatal(err)
	}
	coll, err := ebpf.NewCollection(spec)
	if err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			tb.Fatalf("load: %+v", ve)
		}
		tb.Fatalf("load: %v", err)
	}
	tb.Cleanup(func() { coll.Close() })
	f := &filter{tb: tb, coll: coll, prog: coll.Programs["moat_filter"]}
	if f.rl, err = ratelimit.NewMaps(func(n string) *ebpf.Map { return coll.Maps[n] }); err != nil {
		tb.Fatal(err)
	}
	return f
}

// in runs fn where the filter's packets run: on the thread of a
// namespace with connections (inNetns), in a lab host's namespace
// (inLab), or here.
func (f *filter) in(fn func()) {
	switch {
	case f.ns != nil:
		f.ns.Do(fn)
	case f.host != nil:
		if err := f.host.Do(func() error { fn(); return nil }); err != nil {
			f.tb.Fatal(err)
		}
	default:
		fn()
	}
}

// inLab runs the filter's packets from now on in h's namespace, as if
// they came in on ifc (one of h's interfaces): the program's socket
// lookups see h's sockets.
func (f *filter) inLab(h *lab.Host, ifc lab.Iface) {
	f.host, f.ifindex = h, ifc.Index
}

// inNetns runs the filter's packets from now on in a namespace where the
// pairs are established connections (connNetns).
func (f *filter) inNetns(pairs ...[2]netip.AddrPort) {
	f.ns = newConnNetns(f.tb, pairs...)
}

// reset removes every limit and source bucket and sets cfg.
func (f *filter) reset(cfg ratelimit.Config) {
	f.tb.Helper()
	if err := ratelimit.Apply(f.rl, nil); err != nil {
		f.tb.Fatal(err)
	}
	if err := f.rl.Configure(cfg); err != nil {
		f.tb.Fatal(err)
	}
	for _, m := range []*ebpf.Map{f.rl.Sources, f.rl.HHSources, f.coll.Maps[datapath.MoatMapDenyV4Hosts],
		f.coll.Maps[datapath.MoatMapDenyV6Nets], f.coll.Maps[datapath.MoatMapComments], f.coll.Maps[datapath.MoatMapAutoReasons]} {
		clearMap(f.tb, m)
	}
	if err := f.rl.ResetShape(); err != nil {
		f.tb.Fatal(err)
	}
	// A sample left in the heavy-hitter gate would admit its source on
	// its next packet, in the next case.
	clearGate(f.tb, f.coll.Maps[datapath.MoatMapHhGate])
	// The deny summary and the host summary in use and empty, as the
	// control plane leaves them for an empty denylist: auto-blocks must
	// set their own bits.
	for _, m := range []string{datapath.MoatMapDenySummary, datapath.MoatMapDenyHostSummary} {
		if err := datapath.ClearSummaryBlocks(f.coll.Maps[m]); err != nil {
			f.tb.Fatal(err)
		}
	}
	ready := datapath.MoatSummaryState{Ready: uint32(datapath.MoatDenySummaryFamilySUMMARY_V4 | datapath.MoatDenySummaryFamilySUMMARY_V6 |
		datapath.MoatDenySummaryFamilySUMMARY_V4HOSTS | datapath.MoatDenySummaryFamilySUMMARY_V6HOSTS), Built: 1}
	if err := f.coll.Maps[datapath.MoatMapDenySummaryState].Put(uint32(0), &ready); err != nil {
		f.tb.Fatal(err)
	}
	// Sketch cells live for a window (about a second) and rule ids are
	// reused, so counts of the previous case would carry over.
	zeros := make([]uint64, f.rl.Sketch.MaxEntries())
	keys := make([]uint32, len(zeros))
	for i := range keys {
		keys[i] = uint32(i)
	}
	if _, err := f.rl.Sketch.BatchUpdate(keys, zeros, nil); err != nil {
		f.tb.Fatal(err)
	}
	ncpu, _ := ebpf.PossibleCPU()
	cm := f.coll.Maps[datapath.MoatMapCounters]
	for i := uint32(0); i < cm.MaxEntries(); i++ {
		if err := cm.Put(i, make([]datapath.MoatVerdictCounter, ncpu)); err != nil {
			f.tb.Fatal(err)
		}
	}
}

// wantSummaryBit checks that the deny summary bit of a is set.
func wantSummaryBit(t *testing.T, f *filter, a netip.Addr) {
	t.Helper()
	if !summaryBitIn(t, f, datapath.MoatMapDenySummary, a) {
		t.Errorf("summary bit of %v is clear", a)
	}
}

// summaryBitIn is a's bit in the summary map name.
func summaryBitIn(t *testing.T, f *filter, name string, a netip.Addr) bool {
	t.Helper()
	blk, w, mask := datapath.SummaryLocation(a)
	var b datapath.MoatSummaryBlock
	if err := f.coll.Maps[name].Lookup(blk, &b); err != nil {
		t.Fatal(err)
	}
	return b.W[w]&mask != 0
}

func clearGate(tb testing.TB, m *ebpf.Map) {
	tb.Helper()
	keys := make([]uint32, m.MaxEntries())
	for i := range keys {
		keys[i] = uint32(i)
	}
	if _, err := m.BatchUpdate(keys, make([]uint64, len(keys)), nil); err != nil {
		tb.Fatal(err)
	}
}

// gateSlots returns the heavy-hitter gate's slots that hold a sample.
func gateSlots(tb testing.TB, m *ebpf.Map) map[uint32]uint64 {
	tb.Helper()
	out := map[uint32]uint64{}
	var k uint32
	var v uint64
	it := m.Iterate()
	for it.Next(&k, &v) {
		if v != 0 {
			out[k] = v
		}
	}
	if err := it.Err(); err != nil {
		tb.Fatal(err)
	}
	return out
}

func clearMap(tb testing.TB, m *ebpf.Map) {
	tb.Helper()
	var keys [][]byte
	k := make([]byte, m.KeySize())
	it := m.Iterate()
	var v []byte
	for it.Next(&k, &v) {
		keys = append(keys, append([]byte(nil), k...))
	}
	for _, k := range keys {
		m.Delete(k)
	}
}

func (f *filter) add(l ratelimit.Limit) {
	f.tb.Helper()
	if err := f.rl.Add(l, false); err != nil {
		f.tb.Fatalf("add %v: %v", l, err)
	}
}

// send runs pkt n times through the program and returns how many passed,
// read from the verdict counters. One BPF_PROG_TEST_RUN call per packet:
// a call with Repeat that a signal interrupts is run again from the start
// (cilium/ebpf retries on EINTR), so more than n packets would reach the
// rate limiter and the counters; a call of one run never is.
func (f *filter) send(pkt []byte, n int) (passed int) {
	f.tb.Helper()
	before := f.verdicts()
	var err error
	f.in(func() {
		for range n {
			if _, err = f.prog.Run(f.runOptions(pkt)); err != nil {
				return
			}
		}
	})
	if err != nil {
		f.tb.Fatalf("run: %v", err)
	}
	after := f.verdicts()
	if ran := after[0] + after[1] + after[2] - before[0] - before[1] - before[2]; ran != uint64(n) {
		f.tb.Fatalf("%d packets counted for %d runs", ran, n)
	}
	return int(after[0] - before[0])
}

// runOptions runs pkt as if it came in where the filter's packets run.
func (f *filter) runOptions(pkt []byte) *ebpf.RunOptions {
	opts := &ebpf.RunOptions{Data: pkt}
	if f.ifindex != 0 {
		opts.Context = xdpMD{DataEnd: uint32(len(pkt)), IngressIfindex: uint32(f.ifindex)}
	}
	return opts
}

// verdicts returns the packets passed, dropped and monitored (passed in
// monitor mode though a rule would drop them) so far, then the drops per
// reason, then the monitored packets per reason.
func (f *filter) verdicts() [3 + 2*int(datapath.MoatVerdictReasonREASON_MAX)]uint64 {
	f.tb.Helper()
	const reasons = int(datapath.MoatVerdictReasonREASON_MAX)
	var out [3 + 2*reasons]uint64
	m := f.coll.Maps[datapath.MoatMapCounters]
	for r := 0; r < reasons; r++ {
		for slot, idx := range []int{r * 2, r*2 + 1, 2*reasons + r} {
			var per []datapath.MoatVerdictCounter
			if err := m.Lookup(uint32(idx), &per); err != nil {
				f.tb.Fatal(err)
			}
			for _, c := range per {
				out[slot] += c.Packets
				if slot > 0 {
					out[3+(slot-1)*reasons+r] += c.Packets
				}
			}
		}
	}
	return out
}

func (f *filter) dropsFor(reason datapath.MoatVerdictReason) uint64 {
	return f.verdicts()[3+int(reason)]
}

func (f *filter) monitoredFor(reason datapath.MoatVerdictReason) uint64 {
	return f.verdicts()[3+int(datapath.MoatVerdictReasonREASON_MAX)+int(reason)]
}

func udp4(src netip.Addr, dport uint16) []byte {
	return testpkt.UDPv4(src, dst4, testpkt.UDP{SrcPort: 5353, DstPort: dport, Payload: []byte("data")})
}

func syn4(src netip.Addr, dport uint16) []byte {
	return testpkt.TCPv4(src, dst4, testpkt.TCP{SYN: true, SrcPort: 40000, DstPort: dport,
		Options: []testpkt.TCPOption{testpkt.MSS(1460), testpkt.SACKPermitted(), testpkt.WindowScale(7)}})
}

func bootNow(tb testing.TB) uint64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		tb.Fatal(err)
	}
	return uint64(ts.Nano())
}

func scope(tb testing.TB, s string) ratelimit.Scope {
	sc, err := ratelimit.ParseScope(s)
	if err != nil {
		tb.Fatal(err)
	}
	return sc
}

// TestLimits drives the real program with BPF_PROG_TEST_RUN. One load
// serves every case: the verifier takes far longer than a reset.
func TestLimits(t *testing.T) {
	f := newFilter(t)
	defaults := ratelimit.Config{Shape: true, HeavyHitters: true, Sample: 1, Gate: ratelimit.GateSketch}

	// bpf_ktime_get_boot_ns is the real clock: a few hundred runs take
	// well under a millisecond, so a burst is admitted whole and then
	// nothing until time passes.
	for _, gate := range []ratelimit.Gate{ratelimit.GateSketch, ratelimit.GateNone} {
		t.Run("burst then rate, gate "+gate.String(), func(t *testing.T) {
			cfg := defaults
			cfg.Gate = gate
			f.reset(cfg)
			f.add(ratelimit.Limit{Kind: ratelimit.Source, Scope: scope(t, "all"), PPS: 1000, BurstPackets: 50})
			// 400 runs take well under a millisecond, unless the machine
			// preempts it: a token per ms it took may come back meanwhile.
			// And behind the sketch gate, a source's first packets of a
			// sketch window pass uncounted until it has sent track_pkts
			// (32 here) in that window; they are charged to its bucket
			// afterwards, so a burst that a window's turn splits passes up
			// to 31 more.
			burst := func(src netip.Addr) (int, int) {
				start, startWin := time.Now(), bootNow(t)>>30
				got := f.send(udp4(src, 53), 400)
				most := 50 + int(time.Since(start).Milliseconds())
				if gate == ratelimit.GateSketch && bootNow(t)>>30 != startWin {
					most += 31
				}
				return got, most
			}
			// Another source has its own bucket.
			gotOther, most := burst(src4b)
			if gotOther < 50 || gotOther > most {
				t.Fatalf("other source: %d passed, want 50..%d", gotOther, most)
			}
			t0 := time.Now() // no later than the last packet of the burst
			gotBurst, most := burst(src4)
			if gotBurst < 50 || gotBurst > most {
				t.Fatalf("burst: %d passed, want the burst of 50..%d", gotBurst, most)
			}
			win := bootNow(t) >> 30
			time.Sleep(20 * time.Millisecond)
			got := f.send(udp4(src4, 53), 400)
			el := time.Since(t0)
			// 1000 pps: one packet per ms waited, give or take the
			// time between the clock reads and the run; and behind the
			// sketch, up to 31 more if a window turned meanwhile.
			want := int(el.Milliseconds())
			if gate == ratelimit.GateSketch && bootNow(t)>>30 != win {
				want += 31
			}
			if got < 19 || got > want+2 {
				t.Fatalf("after %v: %d passed, want 20..%d at 1000 pps", el, got, want+2)
			}
			if d, want := f.dropsFor(datapath.MoatVerdictReasonREASON_RATELIMIT), uint64(1200-gotOther-gotBurst-got); d != want {
				t.Errorf("rate-limit drops %d, want %d", d, want)
			}
		})
	}

	t.Run("burst then rate, gate sample: right on average", func(t *testing.T) {
		cfg := defaults
		cfg.Gate = ratelimit.GateSample
		f.reset(cfg)
		// track_pkts is 64: a source gets its bucket after 64 packets on
		// average, charged with 63, so it passes 64 packets on average
		// (geometrically distributed, standard deviation about 64).
		f.add(ratelimit.Limit{Kind: ratelimit.Source, Scope: scope(t, "all"), PPS: 10, BurstPackets: 64})
		// 512 sources in turn, 400 packets each, in one run.
		const sources = 512
		vary := varySource(t, f.prog, sources-1)
		before := f.verdicts()[0]
		if _, err := vary.Run(&ebpf.RunOptions{Data: udp4(netip.MustParseAddr("10.0.0.1"), 53), Repeat: sources * 400}); err != nil {
			t.Fatal(err)
		}
		total := f.verdicts()[0] - before
		if tracked, err := f.rl.TrackedSources(); err != nil || len(tracked) < sources*9/10 {
			t.Fatalf("%d sources have a bucket (%v), want nearly all %d", len(tracked), err, sources)
		}
		// The mean of 512 sources has a standard deviation of 2.8: 12
		// is over 4 of them.
		mean := float64(total) / sources
		t.Logf("%.1f packets per source passed on average", mean)
		if mean < 64-12 || mean > 64+12 {
			t.Errorf("%.1f packets per source passed on average, want 64", mean)
		}
	})

	t.Run("IPv6 sources in one /64 share a bucket", func(t *testing.T) {
		f.reset(defaults)
		// 1 pps: no token comes back between the sends on a loaded machine.
		f.add(ratelimit.Limit{Kind: ratelimit.Source, Scope: scope(t, "udp"), PPS: 1, BurstPackets: 10})
		u6 := func(src string) []byte {
			return testpkt.UDPv6(netip.MustParseAddr(src), dst6, testpkt.UDP{SrcPort: 1, DstPort: 53, Payload: []byte("x")})
		}
		if got := f.send(u6("2001:db8:1:2::3"), 100); got != 10 {
			t.Fatalf("first address: %d passed, want 10", got)
		}
		if got := f.send(u6("2001:db8:1:2:ffff::99"), 100); got > 1 {
			t.Fatalf("second address of the /64: %d passed, want its bucket spent", got)
		}
		if got := f.send(u6("2001:db8:1:3::3"), 100); got != 10 {
			t.Fatalf("another /64: %d passed, want its own burst of 10", got)
		}
		// With /128 buckets the addresses are apart.
		f.reset(defaults)
		f.add(ratelimit.Limit{Kind: ratelimit.Source, Scope: scope(t, "udp"), PPS: 1, BurstPackets: 10, IPv6Prefix: 128})
		f.send(u6("2001:db8:1:2::3"), 100)
		if got := f.send(u6("2001:db8:1:2::4"), 100); got != 10 {
			t.Fatalf("/128 buckets: second address %d passed, want 10", got)
		}
	})

	t.Run("scopes apply to their protocol and port only", func(t *testing.T) {
		f.reset(defaults)
		// 1 pps: no token comes back while the cases run, even on a
		// loaded machine.
		f.add(ratelimit.Limit{Kind: ratelimit.Source, Scope: scope(t, "udp/53"), PPS: 1, BurstPackets: 5})
		f.add(ratelimit.Limit{Kind: ratelimit.Budget, Scope: scope(t, "tcp/80+syn"), PPS: 1, BurstPackets: 8})
		for _, c := range []struct {
			name string
			pkt  []byte
			want int
		}{
			{"udp/53 limited", udp4(src4, 53), 5},
			{"udp/54 untouched", udp4(src4, 54), 100},
			{"tcp/53 untouched", syn4(src4, 53), 100},
			{"tcp/80 SYN held to the budget", syn4(src4, 80), 8},
			{"tcp/80 SYN from another source: same budget, spent", syn4(src4b, 80), 0},
			{"tcp/80 ACK not a SYN", testpkt.TCPv4(src4, dst4, testpkt.TCP{ACK: true, SrcPort: 40000, DstPort: 80}), 100},
			{"tcp/81 SYN untouched", syn4(src4, 81), 100},
		} {
			if got := f.send(c.pkt, 100); got != c.want {
				t.Errorf("%s: %d of 100 passed, want %d", c.name, got, c.want)
			}
		}
		if d := f.dropsFor(datapath.MoatVerdictReasonREASON_BUDGET); d != 92+100 {
			t.Errorf("budget drops %d, want 192", d)
		}
		// The most specific scope decides: a whole-UDP limit does not
		// touch udp/53, which has its own.
		f.add(ratelimit.Limit{Kind: ratelimit.Source, Scope: scope(t, "udp"), PPS: 1, BurstPackets: 3})
		if got := f.send(udp4(src4b, 54), 100); got != 3 {
			t.Errorf("udp/54 under the udp limit: %d passed, want 3", got)
		}
		if got := f.send(udp4(src4b, 53), 100); got != 5 {
			t.Errorf("udp/53 under its own limit: %d passed, want 5", got)
		}
	})

	t.Run("allowlisted sources are never limited", func(t *testing.T) {
		f.reset(defaults)
		f.add(ratelimit.Limit{Kind: ratelimit.Source, Scope: scope(t, "all"), PPS: 10, BurstPackets: 1})
		allow := f.coll.Maps[datapath.MoatMapAllowV4Hosts]
		if err := allow.Put(datapath.MoatHostV4{Addr: src4.As4()}, datapath.MoatPrefixRule{Prefixlen: 32}); err != nil {
			t.Fatal(err)
		}
		defer allow.Delete(datapath.MoatHostV4{Addr: src4.As4()})
		// As the control plane does: say that IPv4 has allow entries.
		settings := f.coll.Maps[datapath.MoatMapSettings]
		var set datapath.MoatRuntimeSettings
		if err := settings.Lookup(uint32(0), &set); err != nil {
			t.Fatal(err)
		}
		set.AllowInUse |= uint32(datapath.MoatAllowInUseALLOW_IN_USE_V4)
		if err := settings.Put(uint32(0), set); err != nil {
			t.Fatal(err)
		}
		defer func() {
			set.AllowInUse = 0
			settings.Put(uint32(0), set)
		}()
		if got := f.send(udp4(src4, 53), 100); got != 100 {
			t.Errorf("allowlisted: %d of 100 passed", got)
		}
	})

	t.Run("packets a port rule drops spend no budget and no source's limit", func(t *testing.T) {
		cfg := defaults
		cfg.Gate = ratelimit.GateNone
		f.reset(cfg)
		ports, hits := f.coll.Maps[datapath.MoatMapPortRules], f.coll.Maps[datapath.MoatMapPortRuleHits]
		idx := uint32(datapath.MoatPortClassPORT_CLASS_UDP)<<16 | 19
		if err := ports.Put(idx, datapath.MoatPortRule{Id: 7, Action: uint8(datapath.MoatRuleActionACTION_DROP)}); err != nil {
			t.Fatal(err)
		}
		defer ports.Put(idx, datapath.MoatPortRule{})
		f.add(ratelimit.Limit{Kind: ratelimit.Budget, Scope: scope(t, "udp"), PPS: 1, BurstPackets: 10})
		f.add(ratelimit.Limit{Kind: ratelimit.Source, Scope: scope(t, "udp"), PPS: 1, BurstPackets: 5, Block: ratelimit.Duration(time.Minute)})
		for i := range 50 {
			if got := f.send(udp4(netip.AddrFrom4([4]byte{10, 9, 0, byte(i)}), 19), 1); got != 0 {
				t.Fatalf("a datagram to udp/19 passed")
			}
		}
		if got := f.send(udp4(src4, 19), 20); got != 0 {
			t.Fatalf("%d datagrams to udp/19 passed", got)
		}
		if d := f.dropsFor(datapath.MoatVerdictReasonREASON_PORT_DROP); d != 70 {
			t.Errorf("port rule drops %d, want all 70", d)
		}
		var per []uint64
		if err := hits.Lookup(uint32(7), &per); err != nil {
			t.Fatal(err)
		}
		var n uint64
		for _, v := range per {
			n += v
		}
		if n != 70 {
			t.Errorf("port rule hits %d, want 70", n)
		}
		// The attack shape and the heavy hitters still see the flood.
		sh, err := f.rl.Shape(10)
		if err != nil {
			t.Fatal(err)
		}
		var toPort19 uint64
		for _, c := range sh.Ports {
			if c.Name == "udp/19" {
				toPort19 = c.Packets
			}
		}
		if toPort19 != 70 {
			t.Errorf("attack shape: %d packets to udp/19, want 70 (ports %+v)", toPort19, sh.Ports)
		}
		hh, err := f.rl.HeavyHitters()
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, h := range hh {
			if h.Source == netip.PrefixFrom(src4, 32) {
				found = h.Packets == 20 && h.Dropped == 20
			}
		}
		if !found {
			t.Errorf("heavy hitters %+v: want %v with 20 packets, all dropped", hh, src4)
		}
		// The budget and src4's limit are whole.
		if got := f.send(udp4(src4, 53), 3); got != 3 {
			t.Errorf("%d of 3 datagrams to udp/53 passed after the flood to a dropped port", got)
		}
		if err := f.coll.Maps[datapath.MoatMapDenyV4Hosts].Lookup(datapath.MoatHostV4{Addr: src4.As4()}, new(datapath.MoatPrefixRule)); err == nil {
			t.Errorf("%v auto-blocked for datagrams a port rule dropped", src4)
		}
	})

	t.Run("a limit loosened in place forgets the old rate's debt", func(t *testing.T) {
		cfg := defaults
		cfg.Gate = ratelimit.GateNone
		f.reset(cfg)
		replace := func(l ratelimit.Limit) {
			t.Helper()
			if err := f.rl.Add(l, true); err != nil {
				t.Fatal(err)
			}
		}
		src := ratelimit.Limit{Kind: ratelimit.Source, Scope: scope(t, "udp"), PPS: 1, BurstPackets: 30}
		f.add(src)
		if got := f.send(udp4(src4, 53), 40); got != 30 {
			t.Fatalf("%d passed, want the burst of 30", got)
		}
		// Replaced with the same rate and burst: the debt stays.
		replace(src)
		// (1 pps: a token more for each second the machine stalls.)
		if got := f.send(udp4(src4, 53), 5); got > 1 {
			t.Errorf("%d passed after a replace with the same rate, want none", got)
		}
		// A burst of 40 at the same rate tolerates more than the old
		// one: the debt of the 30 stays, and 10 more pass.
		src.BurstPackets = 40
		replace(src)
		if got := f.send(udp4(src4, 53), 20); got < 10 || got > 11 {
			t.Errorf("%d passed after raising the burst from 30 to 40, want 10", got)
		}
		src.PPS, src.BurstPackets = 1000, 100
		replace(src)
		if got := f.send(udp4(src4, 53), 10); got != 10 {
			t.Errorf("%d of 10 passed after loosening to 1000 pps, burst 100", got)
		}

		budget := ratelimit.Limit{Kind: ratelimit.Budget, Scope: scope(t, "udp/53"), PPS: 1, BurstPackets: 60}
		f.add(budget)
		if got := f.send(udp4(src4b, 53), 70); got != 60 {
			t.Fatalf("budget: %d passed, want the burst of 60", got)
		}
		budget.PPS = 100000
		replace(budget)
		if got := f.send(udp4(src4b, 53), 20); got != 20 {
			t.Errorf("budget: %d of 20 passed after loosening to 100k pps", got)
		}
	})

	t.Run("monitor mode: a source over its limit passes, counted, and is still auto-blocked", func(t *testing.T) {
		f.reset(defaults)
		settings := f.coll.Maps[datapath.MoatMapSettings]
		var set datapath.MoatRuntimeSettings
		if err := settings.Lookup(uint32(0), &set); err != nil {
			t.Fatal(err)
		}
		set.Monitor = 1
		if err := settings.Put(uint32(0), set); err != nil {
			t.Fatal(err)
		}
		defer func() {
			set.Monitor = 0
			settings.Put(uint32(0), set)
		}()
		f.add(ratelimit.Limit{Kind: ratelimit.Source, Scope: scope(t, "udp"), PPS: 100, BurstPackets: 4, Block: ratelimit.Duration(time.Minute)})
		if got := f.send(udp4(src4, 53), 100); got != 4 {
			t.Fatalf("%d passed by judgement, want the burst of 4", got)
		}
		if d := f.verdicts()[1]; d != 0 {
			t.Errorf("%d packets dropped in monitor mode", d)
		}
		if m := f.monitoredFor(datapath.MoatVerdictReasonREASON_RATELIMIT); m != 1 {
			t.Errorf("rate limit monitored %d, want 1 (then the denylist)", m)
		}
		if m := f.monitoredFor(datapath.MoatVerdictReasonREASON_DENYLIST); m != 95 {
			t.Errorf("denylist monitored %d, want 95", m)
		}
		var v datapath.MoatPrefixRule
		hosts := f.coll.Maps[datapath.MoatMapDenyV4Hosts]
		if err := hosts.Lookup(datapath.MoatHostV4{Addr: src4.As4()}, &v); err != nil {
			t.Fatalf("no auto-block entry for %v: %v", src4, err)
		}
		if v.Flags != 7 { // RULE_F_COMMENT | RULE_F_AUTO | RULE_F_MONITOR
			t.Errorf("auto-block flags %#x, want comment|auto|monitor", v.Flags)
		}
		// Monitor mode off: the trial's block is out of force at once.
		// The source is still over its limit: the limit drops its next
		// packet, and blocks it for real.
		set.Monitor = 0
		if err := settings.Put(uint32(0), set); err != nil {
			t.Fatal(err)
		}
		denied := f.dropsFor(datapath.MoatVerdictReasonREASON_DENYLIST)
		f.send(udp4(src4, 53), 1)
		if d := f.dropsFor(datapath.MoatVerdictReasonREASON_DENYLIST); d != denied {
			t.Errorf("monitor mode's auto-block dropped a packet after monitor mode")
		}
		if d := f.dropsFor(datapath.MoatVerdictReasonREASON_RATELIMIT); d != 1 {
			t.Errorf("rate-limit drops %d after monitor mode, want 1", d)
		}
		if err := hosts.Lookup(datapath.MoatHostV4{Addr: src4.As4()}, &v); err != nil || v.Flags != 3 {
			t.Errorf("auto-block after monitor mode %+v (%v): want flags comment|auto", v, err)
		}
	})

	t.Run("auto-block writes an expiring denylist entry with its reason", func(t *testing.T) {
		f.reset(defaults)
		block := 30 * time.Second
		f.add(ratelimit.Limit{Kind: ratelimit.Source, Scope: scope(t, "udp"), PPS: 100, BurstPackets: 4, Block: ratelimit.Duration(block)})
		before := bootNow(t)
		if got := f.send(udp4(src4, 53), 100); got != 4 {
			t.Fatalf("%d passed, want the burst of 4", got)
		}
		after := bootNow(t)
		var v datapath.MoatPrefixRule
		if err := f.coll.Maps[datapath.MoatMapDenyV4Hosts].Lookup(datapath.MoatHostV4{Addr: src4.As4()}, &v); err != nil {
			t.Fatalf("no denylist entry for %v: %v", src4, err)
		}
		if v.ExpiresNs < before+uint64(block) || v.ExpiresNs > after+uint64(block) {
			t.Errorf("expires at %d, want %d..%d", v.ExpiresNs, before+uint64(block), after+uint64(block))
		}
		if v.Prefixlen != 32 || v.Flags != 3 { // RULE_F_COMMENT | RULE_F_AUTO
			t.Errorf("entry %+v: want /32 with flags comment|auto", v)
		}
		// One drop by the limit; the denylist takes every later packet.
		if d := f.dropsFor(datapath.MoatVerdictReasonREASON_RATELIMIT); d != 1 {
			t.Errorf("rate-limit drops %d, want 1 (then the denylist)", d)
		}
		if d := f.dropsFor(datapath.MoatVerdictReasonREASON_DENYLIST); d != 95 {
			t.Errorf("denylist drops %d, want 95", d)
		}
		ck := datapath.MoatCommentKey{List: 1, Family: 4, Prefixlen: 32}
		copy(ck.Addr[:], src4.AsSlice())
		var c datapath.MoatComment
		if err := f.coll.Maps[datapath.MoatMapAutoReasons].Lookup(ck, &c); err != nil {
			t.Fatalf("no reason: %v", err)
		}
		if txt := cString(c.Text[:]); !strings.HasPrefix(txt, "auto-block on udp: over 100pps per source") {
			t.Errorf("reason %q", txt)
		}
		// The operators' comments keep their room.
		if err := f.coll.Maps[datapath.MoatMapComments].Lookup(ck, &c); !errors.Is(err, ebpf.ErrKeyNotExist) {
			t.Errorf("the auto-block wrote a comment (%v)", err)
		}
		ls, err := f.rl.Limits()
		if err != nil {
			t.Fatal(err)
		}
		if len(ls) != 1 || ls[0].Stats.Blocks != 1 || ls[0].Stats.Dropped != 1 || ls[0].Stats.Passed != 4 {
			t.Errorf("limit stats %+v", ls)
		}

		// The filter set the entry's summary bit and host bit itself: the
		// later drops above came from the denylist's host entry, which a
		// clear bit would skip.
		wantSummaryBit(t, f, src4)
		if !summaryBitIn(t, f, datapath.MoatMapDenyHostSummary, src4) {
			t.Errorf("host summary bit of %v is clear after its auto-block", src4)
		}

		// IPv6: the whole /64 is blocked, in the prefix trie.
		src6 := netip.MustParseAddr("2001:db8:7:8::1")
		before6 := f.dropsFor(datapath.MoatVerdictReasonREASON_DENYLIST)
		f.send(testpkt.UDPv6(src6, dst6, testpkt.UDP{SrcPort: 1, DstPort: 53, Payload: []byte("x")}), 100)
		k6 := datapath.MoatNetV6{Prefixlen: 64, Addr: netip.MustParseAddr("2001:db8:7:8::").As16()}
		if err := f.coll.Maps[datapath.MoatMapDenyV6Nets].Lookup(k6, &v); err != nil || v.Prefixlen != 64 {
			t.Errorf("IPv6 /64 entry: %+v, %v", v, err)
		}
		if d := f.dropsFor(datapath.MoatVerdictReasonREASON_DENYLIST) - before6; d != 95 {
			t.Errorf("IPv6 denylist drops %d, want 95", d)
		}
		wantSummaryBit(t, f, src6)
		if summaryBitIn(t, f, datapath.MoatMapDenyHostSummary, src6) {
			t.Errorf("host summary bit of %v is set for a /64 auto-block, which is a prefix", src6)
		}
	})

	t.Run("auto-block of an IPv6 /128 is a host entry with its host bit", func(t *testing.T) {
		f.reset(defaults)
		f.add(ratelimit.Limit{Kind: ratelimit.Source, Scope: scope(t, "udp"), PPS: 100, BurstPackets: 4, Block: ratelimit.Duration(time.Minute), IPv6Prefix: 128})
		a := netip.MustParseAddr("2001:db8:7:8::1")
		before := f.dropsFor(datapath.MoatVerdictReasonREASON_DENYLIST)
		f.send(testpkt.UDPv6(a, dst6, testpkt.UDP{SrcPort: 1, DstPort: 53, Payload: []byte("x")}), 100)
		var v datapath.MoatPrefixRule
		if err := f.coll.Maps[datapath.MoatMapDenyV6Hosts].Lookup(datapath.MoatHostV6{Addr: a.As16()}, &v); err != nil || v.Prefixlen != 128 {
			t.Errorf("IPv6 /128 host entry: %+v, %v", v, err)
		}
		// With the host summary in use, a missing host bit would skip
		// the host lookup and pass the later packets.
		if d := f.dropsFor(datapath.MoatVerdictReasonREASON_DENYLIST) - before; d != 95 {
			t.Errorf("IPv6 denylist drops %d, want 95", d)
		}
		if !summaryBitIn(t, f, datapath.MoatMapDenyHostSummary, a) {
			t.Errorf("host summary bit of %v is clear after its /128 auto-block", a)
		}
	})

	t.Run("auto-block of an IPv6 prefix shorter than /32", func(t *testing.T) {
		f.reset(defaults)
		f.add(ratelimit.Limit{Kind: ratelimit.Source, Scope: scope(t, "udp"), PPS: 100, BurstPackets: 4, Block: ratelimit.Duration(time.Minute), IPv6Prefix: 24})
		a := netip.MustParseAddr("2001:db8:7:8::1")
		f.send(testpkt.UDPv6(a, dst6, testpkt.UDP{SrcPort: 1, DstPort: 53, Payload: []byte("x")}), 10)
		// Another /32 inside the blocked /24: no bit of the summary covers
		// it, so the filter must have taken IPv6 out of the summary.
		b := netip.MustParseAddr("2001:d00:1::1")
		if got := f.send(testpkt.UDPv6(b, dst6, testpkt.UDP{SrcPort: 1, DstPort: 53, Payload: []byte("x")}), 10); got != 0 {
			t.Errorf("%d of 10 passed from %v, inside the blocked /24", got, b)
		}
		if d := f.dropsFor(datapath.MoatVerdictReasonREASON_DENYLIST); d != 15 {
			t.Errorf("denylist drops %d, want 5 + 10", d)
		}
	})

	t.Run("attack shape and heavy hitters", func(t *testing.T) {
		f.reset(defaults)
		f.send(syn4(src4, 443), 30)
		f.send(testpkt.UDPv4(src4b, dst4, testpkt.UDP{SrcPort: 1, DstPort: 53, Payload: make([]byte, 400)}), 20)
		sh, err := f.rl.Shape(3)
		if err != nil {
			t.Fatal(err)
		}
		wantCount(t, "SYN flags", sh.TCPFlags, "S", 30)
		wantCount(t, "SYN options", sh.SYNOptions, "mss,wscale,sack", 30)
		wantCount(t, "sizes", sh.Sizes, "<=64", 0)
		wantCount(t, "sizes", sh.Sizes, "65-128", 30) // 14+20+32 bytes
		wantCount(t, "sizes", sh.Sizes, "257-512", 20)
		wantCount(t, "ports", sh.Ports, "tcp/443", 30)
		wantCount(t, "ports", sh.Ports, "udp/53", 20)
		hh, err := f.rl.HeavyHitters()
		if err != nil {
			t.Fatal(err)
		}
		if len(hh) != 2 || hh[0].Source.Addr() != src4 || hh[0].Packets != 30 || hh[1].Packets != 20 {
			t.Errorf("heavy hitters %+v, want %v with 30 and %v with 20", hh, src4, src4b)
		}

		// The same through the metrics.
		reg := prometheus.NewRegistry()
		reg.MustRegister(ratelimit.NewCollector(f.rl, 5, 5))
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		found := map[string]float64{}
		for _, mf := range mfs {
			for _, m := range mf.GetMetric() {
				var ls []string // label values, in the order of the label names
				for _, l := range m.GetLabel() {
					ls = append(ls, l.GetValue())
				}
				v := m.GetGauge().GetValue() + m.GetCounter().GetValue()
				found[mf.GetName()+"{"+strings.Join(ls, ",")+"}"] = v
			}
		}
		for k, want := range map[string]float64{
			"moat_heavy_hitter_packets{10.1.2.3/32}":        30,
			"moat_attack_shape_packets_total{S,tcp_flags}":  30,
			"moat_attack_shape_packets_total{udp/53,port}":  20,
			"moat_attack_shape_packets_total{257-512,size}": 20,
		} {
			if found[k] != want {
				t.Errorf("metric %s = %v, want %v", k, found[k], want)
			}
		}

		// Off switches.
		f.reset(ratelimit.Config{Gate: ratelimit.GateSketch})
		f.send(syn4(src4, 443), 30)
		if sh, _ := f.rl.Shape(3); len(sh.TCPFlags) != 0 || len(sh.Ports) != 0 {
			t.Errorf("shape off, still counted: %+v", sh)
		}
		if hh, _ := f.rl.HeavyHitters(); len(hh) != 0 {
			t.Errorf("heavy hitters off, still sampled: %+v", hh)
		}

		// One packet in 16, on average: the gaps between samples are
		// uniform over 1..31, so 16,000 packets give 1,000 samples with
		// a standard deviation of about 18; the control plane scales
		// them by 16.
		cfg := defaults
		cfg.Sample = 16
		f.reset(cfg)
		f.send(syn4(src4, 443), 16000)
		hh, err = f.rl.HeavyHitters()
		if err != nil {
			t.Fatal(err)
		}
		if len(hh) == 1 {
			t.Logf("1 in 16 of 16000 packets: %d estimated", hh[0].Packets)
		}
		if len(hh) != 1 || hh[0].Packets < 16*900 || hh[0].Packets > 16*1100 {
			t.Errorf("sampling 1 in 16 of 16000 packets: %+v, want about 16000 (1000 samples)", hh)
		}
	})

	// A source enters the heavy-hitter map at its second sample, which
	// also counts the first; a spoofed flood's sources, each sampled
	// once, never enter it.
	t.Run("heavy-hitter gate", func(t *testing.T) {
		f.reset(defaults) // every packet sampled
		gate := f.coll.Maps[datapath.MoatMapHhGate]
		udp := func(src netip.Addr, payload int) []byte {
			return testpkt.UDPv4(src, dst4, testpkt.UDP{SrcPort: 1, DstPort: 53, Payload: make([]byte, payload)})
		}
		for i := range 3000 {
			f.send(udp(netip.AddrFrom4([4]byte{10, 200, byte(i >> 8), byte(i)}), 10), 1)
		}
		if hh, err := f.rl.HeavyHitters(); err != nil || len(hh) != 0 {
			t.Errorf("3000 sources sampled once each: heavy hitters %d (%v), want none", len(hh), err)
		}
		// 3000 fingerprints thrown at 4096 slots fill about 2126 of them
		// (4096 * (1 - e^(-3000/4096))), give or take 30.
		n := len(gateSlots(t, gate))
		t.Logf("3000 sources sampled once fill %d gate slots", n)
		if n < 1950 || n > 2300 {
			t.Errorf("3000 sources sampled once fill %d of %d gate slots, want about 2126", n, gate.MaxEntries())
		}

		// The second sample admits the source with both.
		clearGate(t, gate)
		short, long := udp(src4, 100), udp(src4, 300)
		f.send(short, 1)
		held := gateSlots(t, gate)
		if len(held) != 1 {
			t.Fatalf("one sample of a new source left %d gate slots filled, want 1", len(held))
		}
		if hh, _ := f.rl.HeavyHitters(); len(hh) != 0 {
			t.Errorf("after one sample: %+v, want no heavy hitter yet", hh)
		}
		f.send(long, 1)
		hh, err := f.rl.HeavyHitters()
		if err != nil {
			t.Fatal(err)
		}
		if len(hh) != 1 || hh[0].Source.Addr() != src4 || hh[0].Packets != 2 || hh[0].Bytes != uint64(len(short)+len(long)) {
			t.Fatalf("after two samples: %+v, want %v with 2 packets and %d bytes", hh, src4, len(short)+len(long))
		}
		if n := len(gateSlots(t, gate)); n != 0 {
			t.Errorf("the admitted source's sample is still in the gate (%d slots filled)", n)
		}

		// A sample another CPU left while this one made the entry is
		// taken back by the source's next sample, and not twice.
		for slot, v := range held {
			if err := gate.Put(slot, v); err != nil {
				t.Fatal(err)
			}
		}
		f.send(short, 2)
		if hh, _ = f.rl.HeavyHitters(); len(hh) != 1 || hh[0].Packets != 5 || hh[0].Bytes != uint64(3*len(short)+len(long)+len(short)) {
			t.Errorf("with a sample waiting in the gate, two more: %+v, want 5 packets, %d bytes", hh, 3*len(short)+len(long)+len(short))
		}

		// IPv6 sources are counted per /64, through the same gate.
		clearGate(t, gate)
		six := func(a string) []byte {
			return testpkt.UDPv6(netip.MustParseAddr(a), dst6, testpkt.UDP{SrcPort: 1, DstPort: 53, Payload: make([]byte, 50)})
		}
		f.send(six("2001:db8:5:6::1"), 1)
		if hh, _ = f.rl.HeavyHitters(); len(hh) != 1 {
			t.Errorf("after one IPv6 sample: %+v, want the IPv4 source alone", hh)
		}
		f.send(six("2001:db8:5:6::2"), 1) // the same /64
		hh, _ = f.rl.HeavyHitters()
		want6 := netip.MustParsePrefix("2001:db8:5:6::/64")
		found := false
		for _, h := range hh {
			if h.Source == want6 {
				found = true
				if h.Packets != 2 || h.Bytes != uint64(2*len(six("2001:db8:5:6::1"))) {
					t.Errorf("IPv6 /64 after two samples: %+v, want 2 packets", h)
				}
			}
		}
		if !found {
			t.Errorf("after two samples from one /64: %+v, want %v listed", hh, want6)
		}

		// A first sample that a limit dropped is counted as dropped.
		f.reset(ratelimit.Config{Gate: ratelimit.GateNone}) // no sampling yet
		f.add(ratelimit.Limit{Kind: ratelimit.Source, Scope: scope(t, "udp"), PPS: 1, BurstPackets: 1})
		if got := f.send(short, 1); got != 1 {
			t.Fatalf("the burst's packet: %d passed, want 1", got)
		}
		cfg := defaults
		cfg.Gate = ratelimit.GateNone
		if err := f.rl.Configure(cfg); err != nil {
			t.Fatal(err)
		}
		if got := f.send(short, 2); got != 0 {
			t.Fatalf("over the limit: %d of 2 passed, want 0", got)
		}
		if hh, _ = f.rl.HeavyHitters(); len(hh) != 1 || hh[0].Packets != 2 || hh[0].Dropped != 2 {
			t.Errorf("two dropped samples: %+v, want 2 packets, 2 dropped", hh)
		}
	})

	// A SYN's options are copied straight from the frame when the TCP
	// header starts in the first 256 bytes; behind a long IPv6 extension
	// header the copy goes through bpf_xdp_load_bytes. Both give the walk's
	// answer.
	t.Run("SYN options near and far from the frame's start", func(t *testing.T) {
		f.reset(defaults)
		src6 := netip.MustParseAddr("2001:db8:9::1")
		linux := []testpkt.TCPOption{testpkt.MSS(1440), testpkt.SACKPermitted(), testpkt.Timestamps(1, 0), testpkt.TCPNOP(), testpkt.WindowScale(7)}
		syn := testpkt.TCP{SYN: true, SrcPort: 40000, DstPort: 443, Options: linux}
		near := testpkt.Frame{Net: testpkt.IPv6{Src: src6, Dst: dst6}, L4: syn}.Bytes()
		far := testpkt.Frame{Net: testpkt.IPv6{Src: src6, Dst: dst6, Ext: []testpkt.IPv6Ext{
			testpkt.DestOpts{Options: []testpkt.IPv6TLV{{Type: 0x1e, Data: make([]byte, 240)}}}}}, L4: syn}.Bytes()
		if off := len(far) - 40; off <= 0xff {
			t.Fatalf("the TCP header starts at %d, want beyond 255", off)
		}
		f.send(near, 7)
		f.send(far, 5)
		sh, err := f.rl.Shape(3)
		if err != nil {
			t.Fatal(err)
		}
		wantCount(t, "SYN options", sh.SYNOptions, "mss,wscale,sack,ts", 12)
	})
}

func wantCount(t *testing.T, what string, cs []ratelimit.Count, name string, n uint64) {
	t.Helper()
	for _, c := range cs {
		if c.Name == name {
			if c.Packets != n {
				t.Errorf("%s %s: %d, want %d", what, name, c.Packets, n)
			}
			return
		}
	}
	if n != 0 {
		t.Errorf("%s: no %s in %+v, want %d", what, name, cs, n)
	}
}

func cString(b []int8) string {
	var s []byte
	for _, c := range b {
		if c == 0 {
			break
		}
		s = append(s, byte(c))
	}
	return string(s)
}
