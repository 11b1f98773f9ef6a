package datapath

import (
	"errors"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// XDP return codes.
const (
	xdpAborted = 0
	xdpDrop    = 1
	xdpPass    = 2
)

func verdictName(v uint32) string {
	switch v {
	case xdpAborted:
		return "XDP_ABORTED"
	case xdpDrop:
		return "XDP_DROP"
	case xdpPass:
		return "XDP_PASS"
	}
	return fmt.Sprintf("XDP(%d)", v)
}

type list int

const (
	allowList list = iota
	denyList
)

// filterObjects is the XDP filter and every map of the collection. Only
// moat_filter is loaded: the tc programs beside it are not under test here.
type filterObjects struct {
	MoatFilter *ebpf.Program `ebpf:"moat_filter"`
	MoatMaps
}

// fixture is a freshly loaded filter with its own, unpinned maps, so tests
// neither see other tests' rules nor touch a running shield.
type fixture struct {
	tb   testing.TB
	objs filterObjects
	// What portRule wrote, for reset.
	portKeys []uint32
	portIDs  map[uint16]bool
}

func newFixture(tb testing.TB) *fixture {
	tb.Helper()
	f := &fixture{tb: tb, portIDs: map[uint16]bool{}}
	spec, err := LoadMoat()
	if err != nil {
		tb.Fatal(err)
	}
	if err := spec.LoadAndAssign(&f.objs, nil); err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			tb.Fatalf("load: %+v", ve)
		}
		tb.Fatalf("load: %v", err)
	}
	tb.Cleanup(func() {
		f.objs.MoatFilter.Close()
		f.objs.MoatMaps.Close()
	})
	return f
}

// bootNow is the clock that rule expiry is measured against.
func bootNow(tb testing.TB) uint64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		tb.Fatalf("clock_gettime: %v", err)
	}
	return uint64(ts.Nano())
}

// expiresIn returns a CLOCK_BOOTTIME deadline d from now; negative d gives a
// deadline in the past.
func (f *fixture) expiresIn(d time.Duration) uint64 {
	return uint64(int64(bootNow(f.tb)) + int64(d))
}

func (f *fixture) maps(l list, v6 bool) (hosts, nets *ebpf.Map) {
	m := &f.objs.MoatMaps
	switch {
	case l == allowList && !v6:
		return m.AllowV4Hosts, m.AllowV4Nets
	case l == allowList:
		return m.AllowV6Hosts, m.AllowV6Nets
	case !v6:
		return m.DenyV4Hosts, m.DenyV4Nets
	}
	return m.DenyV6Hosts, m.DenyV6Nets
}

// isHost says whether a prefix belongs in the exact-host map.
func isHost(p netip.Prefix) bool { return p.Bits() == p.Addr().BitLen() }

func hostKey(a netip.Addr) any {
	if a.Is4() {
		return MoatHostV4{Addr: a.As4()}
	}
	return MoatHostV6{Addr: a.As16()}
}

func netKey(p netip.Prefix) any {
	p = p.Masked()
	if p.Addr().Is4() {
		return MoatNetV4{Prefixlen: uint32(p.Bits()), Addr: p.Addr().As4()}
	}
	return MoatNetV6{Prefixlen: uint32(p.Bits()), Addr: p.Addr().As16()}
}

// add puts a rule in a list the way the control plane does: hosts in the
// hash map, other prefixes in the trie. expires is a CLOCK_BOOTTIME
// deadline, 0 for never.
func (f *fixture) add(l list, prefix string, expires uint64) {
	f.tb.Helper()
	p := netip.MustParsePrefix(prefix)
	if isHost(p) {
		f.addHost(l, p, expires)
	} else {
		f.addNet(l, p, expires)
	}
}

func (f *fixture) allow(prefix string) { f.tb.Helper(); f.add(allowList, prefix, 0) }
func (f *fixture) deny(prefix string)  { f.tb.Helper(); f.add(denyList, prefix, 0) }

// markAllow sets the allowlist's in-use bit of p's family, as the control
// plane does before adding allow entries.
func (f *fixture) markAllow(l list, p netip.Prefix) {
	f.tb.Helper()
	if l != allowList {
		return
	}
	var s MoatRuntimeSettings
	if err := f.objs.Settings.Lookup(uint32(0), &s); err != nil {
		f.tb.Fatalf("settings: %v", err)
	}
	if p.Addr().Is4() {
		s.AllowInUse |= uint32(MoatAllowInUseALLOW_IN_USE_V4)
	} else {
		s.AllowInUse |= uint32(MoatAllowInUseALLOW_IN_USE_V6)
	}
	if err := f.objs.Settings.Put(uint32(0), s); err != nil {
		f.tb.Fatalf("settings: %v", err)
	}
}

// markDeny sets the deny summary bits of p, as the control plane does
// before adding a deny entry.
func (f *fixture) markDeny(l list, p netip.Prefix) {
	f.tb.Helper()
	if l != denyList {
		return
	}
	marks := SummaryMarks{}
	marks.Add(p)
	for blk, w := range marks {
		var b MoatSummaryBlock
		if err := f.objs.DenySummary.Lookup(blk, &b); err != nil {
			f.tb.Fatalf("summary block %d: %v", blk, err)
		}
		for i := range b.W {
			b.W[i] |= w[i]
		}
		if err := f.objs.DenySummary.Put(blk, &b); err != nil {
			f.tb.Fatalf("summary block %d: %v", blk, err)
		}
	}
}

func (f *fixture) summaryState() MoatSummaryState {
	f.tb.Helper()
	var st MoatSummaryState
	if err := f.objs.DenySummaryState.Lookup(uint32(0), &st); err != nil {
		f.tb.Fatalf("summary state: %v", err)
	}
	return st
}

func (f *fixture) setSummaryState(st MoatSummaryState) {
	f.tb.Helper()
	if err := f.objs.DenySummaryState.Put(uint32(0), &st); err != nil {
		f.tb.Fatalf("summary state: %v", err)
	}
}

// clearSummary empties the deny summary and puts both families in use,
// as the control plane leaves it for an empty denylist.
func (f *fixture) clearSummary() {
	f.tb.Helper()
	if err := ClearSummaryBlocks(f.objs.DenySummary); err != nil {
		f.tb.Fatalf("clear summary: %v", err)
	}
	f.setSummaryState(MoatSummaryState{Ready: uint32(MoatDenySummaryFamilySUMMARY_V4 | MoatDenySummaryFamilySUMMARY_V6), Built: 1})
}

func (f *fixture) addHost(l list, p netip.Prefix, expires uint64) {
	f.tb.Helper()
	f.markAllow(l, p)
	f.markDeny(l, p)
	hosts, _ := f.maps(l, p.Addr().Is6())
	v := MoatPrefixRule{Prefixlen: uint32(p.Bits()), ExpiresNs: expires}
	if err := hosts.Put(hostKey(p.Addr()), v); err != nil {
		f.tb.Fatalf("put host %v: %v", p, err)
	}
}

// addNet puts a prefix in the trie, even a /32 or /128.
func (f *fixture) addNet(l list, p netip.Prefix, expires uint64) {
	f.tb.Helper()
	f.markAllow(l, p)
	f.markDeny(l, p)
	_, nets := f.maps(l, p.Addr().Is6())
	v := MoatPrefixRule{Prefixlen: uint32(p.Bits()), ExpiresNs: expires}
	if err := nets.Put(netKey(p), v); err != nil {
		f.tb.Fatalf("put net %v: %v", p, err)
	}
}

// addFlags puts a live entry with flags (RULE_F_*) where add would.
func (f *fixture) addFlags(l list, prefix string, flags uint32) {
	f.tb.Helper()
	p := netip.MustParsePrefix(prefix)
	f.markAllow(l, p)
	f.markDeny(l, p)
	hosts, nets := f.maps(l, p.Addr().Is6())
	m, k := nets, netKey(p)
	if isHost(p) {
		m, k = hosts, hostKey(p.Addr())
	}
	if err := m.Put(k, MoatPrefixRule{Prefixlen: uint32(p.Bits()), Flags: flags}); err != nil {
		f.tb.Fatalf("put %v: %v", p, err)
	}
}

// hits returns the hit counter of the rule for prefix, looked up where add
// put it (inTrie forces the trie for a full-length prefix).
func (f *fixture) hits(l list, prefix string, inTrie bool) uint64 {
	f.tb.Helper()
	p := netip.MustParsePrefix(prefix)
	hosts, nets := f.maps(l, p.Addr().Is6())
	var v MoatPrefixRule
	var err error
	if isHost(p) && !inTrie {
		err = hosts.Lookup(hostKey(p.Addr()), &v)
	} else {
		err = nets.Lookup(netKey(p), &v)
	}
	if err != nil {
		f.tb.Fatalf("lookup %v: %v", p, err)
	}
	return v.Hits
}

// portRule writes rule id with action over ports lo..hi of a class, as the
// control plane writes a range: the same id in every port it covers.
func (f *fixture) portRule(class MoatPortClass, lo, hi uint16, id uint16, action MoatRuleAction) {
	f.tb.Helper()
	var keys []uint32
	var vals []MoatPortRule
	for p := uint32(lo); p <= uint32(hi); p++ {
		keys = append(keys, uint32(class)<<16|p)
		vals = append(vals, MoatPortRule{Id: id, Action: uint8(action)})
	}
	if _, err := f.objs.PortRules.BatchUpdate(keys, vals, nil); err != nil {
		f.tb.Fatalf("port rule %d: %v", id, err)
	}
	f.portKeys = append(f.portKeys, keys...)
	f.portIDs[id] = true
}

func (f *fixture) portHits(id uint16) uint64 {
	f.tb.Helper()
	var per []uint64
	if err := f.objs.PortRuleHits.Lookup(uint32(id), &per); err != nil {
		f.tb.Fatalf("port hits %d: %v", id, err)
	}
	var n uint64
	for _, v := range per {
		n += v
	}
	return n
}

func (f *fixture) setPolicy(frag MoatFragmentPolicy, malformed MoatMalformedPolicy) {
	f.tb.Helper()
	var s MoatRuntimeSettings
	if err := f.objs.Settings.Lookup(uint32(0), &s); err != nil {
		f.tb.Fatalf("settings: %v", err)
	}
	s.Fragments, s.Malformed = uint32(frag), uint32(malformed)
	if err := f.objs.Settings.Put(uint32(0), s); err != nil {
		f.tb.Fatalf("settings: %v", err)
	}
}

// setMonitor turns monitor mode on or off, keeping the other settings.
func (f *fixture) setMonitor(on bool) {
	f.tb.Helper()
	var s MoatRuntimeSettings
	if err := f.objs.Settings.Lookup(uint32(0), &s); err != nil {
		f.tb.Fatalf("settings: %v", err)
	}
	s.Monitor = 0
	if on {
		s.Monitor = 1
	}
	if err := f.objs.Settings.Put(uint32(0), s); err != nil {
		f.tb.Fatalf("settings: %v", err)
	}
}

// monitoredSlot is the counters index of a reason's drops that monitor
// mode passed (bpf/include/moat_maps.h).
func monitoredSlot(r MoatVerdictReason) uint32 {
	return uint32(MoatVerdictReasonREASON_MAX)*2 + uint32(r)
}

// slotCounter sums one counters slot over CPUs.
func (f *fixture) slotCounter(idx uint32) MoatVerdictCounter {
	f.tb.Helper()
	var per []MoatVerdictCounter
	if err := f.objs.Counters.Lookup(idx, &per); err != nil {
		f.tb.Fatalf("counters[%d]: %v", idx, err)
	}
	var c MoatVerdictCounter
	for _, v := range per {
		c.Packets += v.Packets
		c.Bytes += v.Bytes
	}
	return c
}

// counter returns the packets and bytes counted for a reason and verdict,
// summed over CPUs.
func (f *fixture) counter(reason MoatVerdictReason, drop bool) MoatVerdictCounter {
	f.tb.Helper()
	idx := uint32(reason) * 2
	if drop {
		idx++
	}
	return f.slotCounter(idx)
}

// countedSlots returns every non-zero counter slot (pass, drop and
// monitored), so a test can check that a packet was counted once, under
// one reason.
func (f *fixture) countedSlots() map[uint32]MoatVerdictCounter {
	f.tb.Helper()
	out := map[uint32]MoatVerdictCounter{}
	for i := uint32(0); i < f.objs.Counters.MaxEntries(); i++ {
		if c := f.slotCounter(i); c.Packets != 0 {
			out[i] = c
		}
	}
	return out
}

// resetCounters zeroes every counter slot.
func (f *fixture) resetCounters() {
	f.tb.Helper()
	zero := make([]MoatVerdictCounter, ebpfPossibleCPUs(f.tb))
	for i := uint32(0); i < f.objs.Counters.MaxEntries(); i++ {
		if err := f.objs.Counters.Put(i, zero); err != nil {
			f.tb.Fatalf("reset counters: %v", err)
		}
	}
}

func ebpfPossibleCPUs(tb testing.TB) int {
	n, err := ebpf.PossibleCPU()
	if err != nil {
		tb.Fatalf("possible CPUs: %v", err)
	}
	return n
}

// run passes one frame through the filter and returns its verdict.
func (f *fixture) run(pkt []byte) uint32 {
	f.tb.Helper()
	ret, err := f.objs.MoatFilter.Run(&ebpf.RunOptions{Data: pkt})
	if err != nil {
		f.tb.Fatalf("run (%d bytes): %v", len(pkt), err)
	}
	return ret
}

// reset returns the fixture to the state of a fresh load: no prefix rules,
// no port rules, default settings, zero counters and hits. Loading the
// program takes the verifier far longer than this, so table tests share
// one load and reset between cases.
func (f *fixture) reset() {
	f.tb.Helper()
	m := &f.objs.MoatMaps
	for _, mp := range []*ebpf.Map{m.AllowV4Hosts, m.AllowV6Hosts, m.AllowV4Nets, m.AllowV6Nets,
		m.DenyV4Hosts, m.DenyV6Hosts, m.DenyV4Nets, m.DenyV6Nets} {
		var keys [][]byte
		var k []byte
		var v MoatPrefixRule
		it := mp.Iterate()
		for it.Next(&k, &v) {
			keys = append(keys, append([]byte(nil), k...))
		}
		if err := it.Err(); err != nil {
			f.tb.Fatalf("iterate %v: %v", mp, err)
		}
		for _, k := range keys {
			if err := mp.Delete(k); err != nil {
				f.tb.Fatalf("delete from %v: %v", mp, err)
			}
		}
	}
	if len(f.portKeys) > 0 {
		zero := make([]MoatPortRule, len(f.portKeys))
		if _, err := m.PortRules.BatchUpdate(f.portKeys, zero, nil); err != nil {
			f.tb.Fatalf("clear port rules: %v", err)
		}
		f.portKeys = nil
	}
	zeroHits := make([]uint64, ebpfPossibleCPUs(f.tb))
	for id := range f.portIDs {
		if err := m.PortRuleHits.Put(uint32(id), zeroHits); err != nil {
			f.tb.Fatalf("clear port hits: %v", err)
		}
	}
	f.portIDs = map[uint16]bool{}
	if err := f.objs.Settings.Put(uint32(0), MoatRuntimeSettings{}); err != nil { // allowlist empty again
		f.tb.Fatalf("settings: %v", err)
	}
	f.setPolicy(fragPass, malformedDrop)
	f.clearSummary()
	f.resetCounters()
}
