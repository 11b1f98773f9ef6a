package ratelimit_test

import (
	"encoding/binary"
	"encoding/json"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/moat-shield/moat/internal/datapath"
	"github.com/moat-shield/moat/internal/ratelimit"
)

// hhCounts are a heavy hitter's counts, read by their JSON names.
type hhCounts struct {
	Packets   uint64 `json:"packets"`
	Dropped   uint64 `json:"dropped"`
	Monitored uint64 `json:"monitored"`
}

// heavyHitter returns src's counts among the heavy hitters, and whether it
// is there.
func (f *filter) heavyHitter(src netip.Addr) (hhCounts, bool) {
	f.tb.Helper()
	hh, err := f.rl.HeavyHitters()
	if err != nil {
		f.tb.Fatal(err)
	}
	for _, h := range hh {
		if h.Source != netip.PrefixFrom(src, 32) {
			continue
		}
		b, err := json.Marshal(h)
		if err != nil {
			f.tb.Fatal(err)
		}
		var c hhCounts
		if err := json.Unmarshal(b, &c); err != nil {
			f.tb.Fatal(err)
		}
		return c, true
	}
	return hhCounts{}, false
}

// TestMonitoredHeavyHitters: in monitor mode a heavy hitter's packets
// over a limit or budget, or to a port a rule drops, pass and count as
// monitored, not dropped, as the interface's counters have them;
// enforcing, the same packets are dropped and count as dropped. Every
// packet is sampled, so the counts are exact; the source's first sample
// waits in the gate, and counts as what became of it.
func TestMonitoredHeavyHitters(t *testing.T) {
	f := newFilter(t)
	t.Cleanup(func() { f.setMonitor(false) })
	ports := f.coll.Maps[datapath.MoatMapPortRules]
	dropPort := uint32(datapath.MoatPortClassPORT_CLASS_UDP)<<16 | 19
	cfg := ratelimit.Config{Shape: true, HeavyHitters: true, Sample: 1, Gate: ratelimit.GateNone}
	const sent = 20
	// 1 pps with a burst of 4: no token comes back while 20 packets run,
	// even on a loaded machine.
	for _, c := range []struct {
		name   string
		limit  *ratelimit.Limit
		port   bool // a port rule drops udp/19
		pkt    []byte
		over   uint64
		reason datapath.MoatVerdictReason
	}{
		{"source limit", &ratelimit.Limit{Kind: ratelimit.Source, Scope: scope(t, "udp"), PPS: 1, BurstPackets: 4},
			false, udp4(src4, 53), sent - 4, datapath.MoatVerdictReasonREASON_RATELIMIT},
		{"budget", &ratelimit.Limit{Kind: ratelimit.Budget, Scope: scope(t, "udp/53"), PPS: 1, BurstPackets: 4},
			false, udp4(src4, 53), sent - 4, datapath.MoatVerdictReasonREASON_BUDGET},
		{"port rule", nil, true, udp4(src4, 19), sent, datapath.MoatVerdictReasonREASON_PORT_DROP},
	} {
		for _, monitor := range []bool{true, false} {
			mode := "enforcing"
			if monitor {
				mode = "monitor mode"
			}
			t.Run(c.name+", "+mode, func(t *testing.T) {
				f.reset(cfg)
				f.setMonitor(monitor)
				if c.limit != nil {
					f.add(*c.limit)
				}
				if c.port {
					if err := ports.Put(dropPort, datapath.MoatPortRule{Id: 7, Action: uint8(datapath.MoatRuleActionACTION_DROP)}); err != nil {
						t.Fatal(err)
					}
					defer ports.Put(dropPort, datapath.MoatPortRule{})
				}
				passed := f.run(c.pkt, sent)
				h, ok := f.heavyHitter(src4)
				if !ok || h.Packets != sent {
					t.Fatalf("heavy hitter %v: %+v (listed: %v), want %d packets", src4, h, ok, sent)
				}
				if monitor {
					if passed != sent {
						t.Errorf("%d of %d passed in monitor mode, want all", passed, sent)
					}
					if h.Dropped != 0 || h.Monitored != c.over {
						t.Errorf("heavy hitter dropped %d, monitored %d in monitor mode; want 0 and %d", h.Dropped, h.Monitored, c.over)
					}
					if got := f.monitoredFor(c.reason); got != c.over {
						t.Errorf("interface counted %d monitored, want %d", got, c.over)
					}
					return
				}
				if passed != sent-int(c.over) {
					t.Errorf("%d of %d passed, want %d", passed, sent, sent-int(c.over))
				}
				if h.Dropped != c.over || h.Monitored != 0 {
					t.Errorf("heavy hitter dropped %d, monitored %d while enforcing; want %d and 0", h.Dropped, h.Monitored, c.over)
				}
				if got := f.dropsFor(c.reason); got != c.over {
					t.Errorf("interface counted %d drops, want %d", got, c.over)
				}
			})
		}
	}
}

// TestHeavyHittersOfAnOlderLayout: a heavy-hitter table pinned by a moat
// from before the monitored count (32-byte values) reads as it was, with
// nothing monitored, as `moat top` and the metrics read it from the pins
// (the metrics without shield.Open).
func TestHeavyHittersOfAnOlderLayout(t *testing.T) {
	spec, rl := unpinnedMaps(t)
	const oldSize = 32
	hs := spec.Maps[datapath.MoatMapHhSources]
	older, err := ebpf.NewMap(&ebpf.MapSpec{Type: hs.Type, KeySize: hs.KeySize, ValueSize: oldSize, MaxEntries: hs.MaxEntries})
	if err != nil {
		t.Fatal(err)
	}
	defer older.Close()
	rl.HHSources = older
	key := datapath.MoatRlSrcKey{Family: 4, Prefixlen: 32}
	copy(key.Addr[:], src4.AsSlice())
	val := make([]byte, oldSize)
	for i, n := range []uint64{30, 3000, 12, 1} { // packets, bytes, dropped, last_ns
		binary.NativeEndian.PutUint64(val[8*i:], n)
	}
	// Counts as sampled: 1 in 1. (A change of the sample empties the
	// table, so before the entry goes in.)
	if err := rl.Configure(ratelimit.Config{Shape: true, HeavyHitters: true, Sample: 1, Gate: ratelimit.GateNone}); err != nil {
		t.Fatal(err)
	}
	if err := older.Put(key, val); err != nil {
		t.Fatal(err)
	}
	hh, err := rl.HeavyHitters()
	if err != nil {
		t.Fatalf("read heavy hitters of the older layout: %v", err)
	}
	if len(hh) != 1 || hh[0].Source != netip.PrefixFrom(src4, 32) || hh[0].Packets != 30 || hh[0].Bytes != 3000 || hh[0].Dropped != 12 {
		t.Errorf("heavy hitters %+v, want %v with 30 packets, 3000 bytes, 12 dropped", hh, src4)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(ratelimit.NewCollector(rl, 5, 5))
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("metrics of the older layout: %v", err)
	}
	found := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			found[mf.GetName()] = m.GetGauge().GetValue()
		}
	}
	for name, want := range map[string]float64{"moat_heavy_hitter_packets": 30, "moat_heavy_hitter_dropped_packets": 12,
		"moat_heavy_hitter_monitored_packets": 0} {
		if got, ok := found[name]; !ok || got != want {
			t.Errorf("%s = %v (exported: %v), want %v", name, got, ok, want)
		}
	}
}
