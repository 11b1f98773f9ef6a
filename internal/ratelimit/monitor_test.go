package ratelimit_test

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/moat-shield/moat/internal/datapath"
	"github.com/moat-shield/moat/internal/ratelimit"
	"github.com/moat-shield/moat/internal/testpkt"
)

// setMonitor turns monitor mode on or off in the filter's settings.
func (f *filter) setMonitor(on bool) {
	f.tb.Helper()
	settings := f.coll.Maps[datapath.MoatMapSettings]
	var set datapath.MoatRuntimeSettings
	if err := settings.Lookup(uint32(0), &set); err != nil {
		f.tb.Fatal(err)
	}
	set.Monitor = 0
	if on {
		set.Monitor = 1
	}
	if err := settings.Put(uint32(0), set); err != nil {
		f.tb.Fatal(err)
	}
}

// run runs pkt n times through the program and returns how many times it
// let the packet through (XDP_PASS), whatever the counters say.
func (f *filter) run(pkt []byte, n int) (passed int) {
	f.tb.Helper()
	var err error
	f.in(func() {
		for range n {
			var ret uint32
			if ret, err = f.prog.Run(f.runOptions(pkt)); err != nil {
				return
			}
			if ret == xdpPass {
				passed++
			}
		}
	})
	if err != nil {
		f.tb.Fatalf("run: %v", err)
	}
	return passed
}

const xdpPass = 2

// monitoredOf is what a limit counted as over its limit but passed in
// monitor mode.
func monitoredOf(s ratelimit.RuleStats) (pkts, bytes uint64) {
	return s.Monitored, s.MonitoredBytes
}

// TestMonitoredLimitCounters: in monitor mode the packets over a limit
// pass and land in the limit's monitored counters, not in its drops, as
// the interface's counters have them; enforcing, the same packets are
// dropped and counted as drops.
func TestMonitoredLimitCounters(t *testing.T) {
	f := newFilter(t)
	t.Cleanup(func() { f.setMonitor(false) })
	// A ClientHello counts against a +tls-hello limit on a connection only.
	f.inNetns([2]netip.AddrPort{netip.AddrPortFrom(src4, 40000), netip.AddrPortFrom(dst4, 443)})
	hello := testpkt.TCPv4(src4, dst4, testpkt.TCP{ACK: true, PSH: true, SrcPort: 40000, DstPort: 443, Seq: 1, Ack: 1,
		Payload: clientHello(t)})
	cfg := ratelimit.Config{Shape: true, HeavyHitters: true, Sample: 1, Gate: ratelimit.GateNone}
	// 1 pps with a burst of 4: no token comes back while 20 packets run,
	// even on a loaded machine.
	for _, c := range []struct {
		name   string
		limit  ratelimit.Limit
		pkt    []byte
		reason datapath.MoatVerdictReason
	}{
		{"source limit", ratelimit.Limit{Kind: ratelimit.Source, Scope: scope(t, "udp"), PPS: 1, BurstPackets: 4},
			udp4(src4, 53), datapath.MoatVerdictReasonREASON_RATELIMIT},
		{"budget", ratelimit.Limit{Kind: ratelimit.Budget, Scope: scope(t, "udp/53"), PPS: 1, BurstPackets: 4},
			udp4(src4, 53), datapath.MoatVerdictReasonREASON_BUDGET},
		{"SYN budget", ratelimit.Limit{Kind: ratelimit.Budget, Scope: scope(t, "tcp/80+syn"), PPS: 1, BurstPackets: 4},
			syn4(src4, 80), datapath.MoatVerdictReasonREASON_BUDGET},
		{"TLS hello budget", ratelimit.Limit{Kind: ratelimit.Budget, Scope: scope(t, "tcp/443+tls-hello"), PPS: 1, BurstPackets: 4},
			hello, datapath.MoatVerdictReasonREASON_BUDGET},
	} {
		for _, monitor := range []bool{true, false} {
			mode := "enforcing"
			if monitor {
				mode = "monitor mode"
			}
			t.Run(c.name+", "+mode, func(t *testing.T) {
				f.reset(cfg)
				f.setMonitor(monitor)
				f.add(c.limit)
				const sent, burst, over = 20, 4, 16
				passed := f.run(c.pkt, sent)
				ls, err := f.rl.Limits()
				if err != nil || len(ls) != 1 {
					t.Fatalf("limits %+v (%v), want the one added", ls, err)
				}
				st, n := ls[0].Stats, uint64(len(c.pkt))
				mon, monBytes := monitoredOf(st)
				if st.Passed != burst || st.PassedBytes != burst*n {
					t.Errorf("limit passed %d packets, %d bytes; want the burst of %d, %d bytes", st.Passed, st.PassedBytes, burst, burst*n)
				}
				if monitor {
					if passed != sent {
						t.Errorf("%d of %d passed in monitor mode, want all", passed, sent)
					}
					if st.Dropped != 0 || st.DroppedBytes != 0 {
						t.Errorf("limit dropped %d packets, %d bytes in monitor mode; want none", st.Dropped, st.DroppedBytes)
					}
					if mon != over || monBytes != over*n {
						t.Errorf("limit monitored %d packets, %d bytes; want %d, %d bytes", mon, monBytes, over, over*n)
					}
					if got := f.monitoredFor(c.reason); got != over {
						t.Errorf("interface counted %d monitored, want %d", got, over)
					}
					if got := f.dropsFor(c.reason); got != 0 {
						t.Errorf("interface counted %d drops in monitor mode", got)
					}
					return
				}
				if passed != burst {
					t.Errorf("%d of %d passed, want the burst of %d", passed, sent, burst)
				}
				if st.Dropped != over || st.DroppedBytes != over*n {
					t.Errorf("limit dropped %d packets, %d bytes; want %d, %d bytes", st.Dropped, st.DroppedBytes, over, over*n)
				}
				if mon != 0 || monBytes != 0 {
					t.Errorf("limit monitored %d packets, %d bytes while enforcing; want none", mon, monBytes)
				}
				if got := f.dropsFor(c.reason); got != over {
					t.Errorf("interface counted %d drops, want %d", got, over)
				}
			})
		}
	}
}

// TestRuleStatsOfAnOlderLayout: counters pinned by a moat from before the
// monitored fields (64-byte values) read as they were, with nothing
// monitored, as the metrics read them from the pins without shield.Open.
func TestRuleStatsOfAnOlderLayout(t *testing.T) {
	_, rl := unpinnedMaps(t)
	if err := rl.Add(ratelimit.Limit{Kind: ratelimit.Budget, Scope: scope(t, "udp/53"), PPS: 10}, false); err != nil {
		t.Fatal(err)
	}
	const oldSize = 64
	older, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.PerCPUArray, KeySize: 4, ValueSize: oldSize,
		MaxEntries: rl.Stats.MaxEntries()})
	if err != nil {
		t.Fatal(err)
	}
	defer older.Close()
	rl.Stats = older
	ncpu := ebpf.MustPossibleCPU()
	vals := make([][]byte, ncpu)
	for cpu := range vals {
		vals[cpu] = make([]byte, oldSize)
		for i, n := range []uint64{3, 300, 5, 500, 0, 0, 0, 0} { // passed, its bytes, dropped, its bytes
			binary.NativeEndian.PutUint64(vals[cpu][8*i:], n)
		}
	}
	if err := older.Update(uint32(1), vals, ebpf.UpdateAny); err != nil {
		t.Fatal(err)
	}
	ls, err := rl.Limits()
	if err != nil {
		t.Fatalf("read counters of the older layout: %v", err)
	}
	n := uint64(ncpu)
	want := ratelimit.RuleStats{Passed: 3 * n, PassedBytes: 300 * n, Dropped: 5 * n, DroppedBytes: 500 * n}
	if len(ls) != 1 || ls[0].Stats != want {
		t.Errorf("limits %+v, want one with %+v", ls, want)
	}
}

// unpinnedMaps makes the rate limits' maps afresh, unpinned and closed
// when t ends, for tests that put maps of an older layout in their place.
func unpinnedMaps(t *testing.T) (*ebpf.CollectionSpec, ratelimit.Maps) {
	t.Helper()
	spec, err := datapath.LoadMoat()
	if err != nil {
		t.Fatal(err)
	}
	maps := map[string]*ebpf.Map{}
	for _, name := range ratelimit.MapNames {
		m, err := ebpf.NewMap(spec.Maps[name])
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close() })
		maps[name] = m
	}
	rl, err := ratelimit.NewMaps(func(n string) *ebpf.Map { return maps[n] })
	if err != nil {
		t.Fatal(err)
	}
	return spec, rl
}
