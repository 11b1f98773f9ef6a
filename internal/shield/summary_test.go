package shield_test

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"

	"github.com/moat-shield/moat/internal/datapath"
	"github.com/moat-shield/moat/internal/shield"
	"github.com/moat-shield/moat/internal/testpkt"
)

const (
	summaryV4 = uint32(datapath.MoatDenySummaryFamilySUMMARY_V4)
	summaryV6 = uint32(datapath.MoatDenySummaryFamilySUMMARY_V6)
	// Both families ready in the summary and in the host summary.
	summaryAll = summaryV4 | summaryV6 |
		uint32(datapath.MoatDenySummaryFamilySUMMARY_V4HOSTS|datapath.MoatDenySummaryFamilySUMMARY_V6HOSTS)
	xdpDrop = 1
	xdpPass = 2
)

func summaryBit(t *testing.T, s *shield.Shield, a netip.Addr) bool {
	t.Helper()
	return bitIn(t, s, datapath.MoatMapDenySummary, a)
}

// bitIn is a's bit in the summary map name.
func bitIn(t *testing.T, s *shield.Shield, name string, a netip.Addr) bool {
	t.Helper()
	blk, w, mask := datapath.SummaryLocation(a)
	var b datapath.MoatSummaryBlock
	if err := s.Map(name).Lookup(blk, &b); err != nil {
		t.Fatal(err)
	}
	return b.W[w]&mask != 0
}

// hostSummaryBit is the bit of a in the host summary.
func hostSummaryBit(t *testing.T, s *shield.Shield, a netip.Addr) bool {
	t.Helper()
	return bitIn(t, s, datapath.MoatMapDenyHostSummary, a)
}

func summaryState(t *testing.T, s *shield.Shield) shield.SummaryState {
	t.Helper()
	st, err := s.DenySummary()
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// verdictFrom runs a TCP SYN from src through the filter loaded on s's maps.
func verdictFrom(t *testing.T, prog *ebpf.Program, src netip.Addr) uint32 {
	t.Helper()
	var pkt []byte
	tcp := testpkt.TCP{SYN: true, SrcPort: 40000, DstPort: 80}
	if src.Is4() {
		pkt = testpkt.TCPv4(src, netip.MustParseAddr("192.0.2.1"), tcp)
	} else {
		pkt = testpkt.TCPv6(src, netip.MustParseAddr("2001:db8:ff::1"), tcp)
	}
	ret, err := prog.Run(&ebpf.RunOptions{Data: pkt})
	if err != nil {
		t.Fatal(err)
	}
	return ret
}

// TestDenySummaryFollowsTheList checks that the control plane keeps the
// summary's rule (a ready family has the bit of every denied address set)
// through adds, wide prefixes and rebuilds, and that the filter on the
// shield's maps drops what the list holds and nothing else.
func TestDenySummaryFollowsTheList(t *testing.T) {
	s := openFresh(t)
	prog := s.LoadFilter(t)
	if st := summaryState(t, s); st.Built == 0 || st.Ready != summaryAll {
		t.Fatalf("fresh state: summary %+v, want built with both families ready", st)
	}
	if err := s.Add(shield.DenyList, entries("198.51.100.7/32", "203.0.0.0/16", "192.0.2.64/30",
		"2a00:1:aa::/48", "2001:d00::/24"), shield.Strict); err != nil {
		t.Fatal(err)
	}
	denied := []string{"198.51.100.7", "203.0.0.1", "203.0.255.254", "203.0.128.9", "192.0.2.66",
		"2a00:1:aa:1::1", "2001:d00::1", "2001:dff:ffff::1", "2001:d80:1::5"}
	for _, a := range denied {
		addr := netip.MustParseAddr(a)
		if !summaryBit(t, s, addr) {
			t.Errorf("summary bit of denied %s is clear", a)
		}
		if v := verdictFrom(t, prog, addr); v != xdpDrop {
			t.Errorf("%s: verdict %d, want drop", a, v)
		}
	}
	passed := []string{"198.51.101.7", "203.1.0.1", "192.0.2.1", "2a00:1:ab::1", "2001:e00::1", "2001:cff::1"}
	for _, a := range passed {
		if v := verdictFrom(t, prog, netip.MustParseAddr(a)); v != xdpPass {
			t.Errorf("%s: verdict %d, want pass", a, v)
		}
	}
	if !summaryBit(t, s, netip.MustParseAddr("192.0.2.1")) || summaryBit(t, s, netip.MustParseAddr("203.1.0.1")) {
		t.Error("the /30 should mark its /24, and nothing should mark 203.1.0.0/24")
	}

	// A /4 marks a run of 2^20 /24s; removing it (a broad prefix) rebuilds
	// the summary at once, with the bits of what is left and none of what
	// was removed.
	if err := s.Add(shield.DenyList, entries("64.0.0.0/4"), shield.Strict); err != nil {
		t.Fatal(err)
	}
	if v := verdictFrom(t, prog, netip.MustParseAddr("77.1.2.3")); v != xdpDrop || !summaryBit(t, s, netip.MustParseAddr("77.1.2.3")) {
		t.Errorf("77.1.2.3 under the /4: verdict %d, or no bit", v)
	}
	if err := s.RemovePrefixes(shield.DenyList, []netip.Prefix{pfx("64.0.0.0/4"), pfx("198.51.100.7/32")}); err != nil {
		t.Fatal(err)
	}
	if st := summaryState(t, s); st.Ready != summaryAll || st.Removed != 0 {
		t.Fatalf("after removing the /4: %+v, want a rebuild", st)
	}
	if summaryBit(t, s, netip.MustParseAddr("77.1.2.3")) {
		t.Error("the removed /4's bits survived the rebuild")
	}
	if summaryBit(t, s, netip.MustParseAddr("198.51.100.7")) {
		t.Error("the removed host's bit survived the rebuild")
	}
	for _, a := range denied[1:] {
		addr := netip.MustParseAddr(a)
		if !summaryBit(t, s, addr) || verdictFrom(t, prog, addr) != xdpDrop {
			t.Errorf("%s lost its bit or its drop in the rebuild", a)
		}
	}
	if v := verdictFrom(t, prog, netip.MustParseAddr("198.51.100.7")); v != xdpPass {
		t.Errorf("removed host: verdict %d, want pass", v)
	}
}

// TestDenySummaryRebuildsAfterManyRemovals checks that removals rebuild the
// summary once enough entries have gone, clearing their bits.
func TestDenySummaryRebuildsAfterManyRemovals(t *testing.T) {
	s := openFresh(t)
	var es []shield.Entry
	var ps []netip.Prefix
	for i := range shield.SummaryRebuildAfter {
		p := netip.PrefixFrom(netip.AddrFrom4([4]byte{100, 64, byte(i >> 8), byte(i)}), 32)
		es, ps = append(es, shield.Entry{Prefix: p}), append(ps, p)
	}
	if err := s.Add(shield.DenyList, es, shield.Strict); err != nil {
		t.Fatal(err)
	}
	if !summaryBit(t, s, ps[len(ps)-1].Addr()) {
		t.Fatal("added host has no bit")
	}
	if err := s.RemovePrefixes(shield.DenyList, ps[:len(ps)-1]); err != nil {
		t.Fatal(err)
	}
	if st := summaryState(t, s); st.Removed != uint64(len(ps)-1) {
		t.Fatalf("removed %d, summary counts %d", len(ps)-1, st.Removed)
	}
	if !summaryBit(t, s, ps[0].Addr()) {
		t.Fatal("below the threshold, removals should leave their bits")
	}
	if err := s.RemovePrefixes(shield.DenyList, ps[len(ps)-1:]); err != nil {
		t.Fatal(err)
	}
	st := summaryState(t, s)
	if st.Removed != 0 || st.Ready != summaryAll {
		t.Fatalf("after %d removals: %+v, want a rebuild", len(ps), st)
	}
	for _, p := range []netip.Prefix{ps[0], ps[len(ps)-1]} {
		if summaryBit(t, s, p.Addr()) {
			t.Errorf("bit of removed %s survived the rebuild", p)
		}
	}
}

// TestOpenBuildsTheSummaryOfOlderState checks the upgrade from state pinned
// before the summary existed: Open builds it from the denylist.
func TestOpenBuildsTheSummaryOfOlderState(t *testing.T) {
	s := openFresh(t)
	root := s.Root()
	if err := s.Add(shield.DenyList, entries("198.51.100.0/24", "2001:db8:bb::/48"), shield.Strict); err != nil {
		t.Fatal(err)
	}
	s.Close()
	for _, name := range []string{datapath.MoatMapDenySummary, datapath.MoatMapDenySummaryState} {
		if err := os.Remove(filepath.Join(root, "maps", name)); err != nil {
			t.Fatal(err)
		}
	}
	s, err := shield.Open(root)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if st := summaryState(t, s); st.Built == 0 || st.Ready != summaryAll {
		t.Fatalf("summary after the upgrade: %+v", st)
	}
	prog := s.LoadFilter(t)
	for _, a := range []string{"198.51.100.9", "2001:db8:bb:1::1"} {
		addr := netip.MustParseAddr(a)
		if !summaryBit(t, s, addr) || verdictFrom(t, prog, addr) != xdpDrop {
			t.Errorf("%s: not marked or not dropped after the upgrade", a)
		}
	}
}

// TestOlderFilterKeepsTheSummaryOff checks an upgrade with filters of an
// older moat still attached: they add auto-blocks without summary bits, so
// the summary stays out of use until the last of them is replaced, and is
// then built with every entry added meanwhile.
func TestOlderFilterKeepsTheSummaryOff(t *testing.T) {
	// A filter of a moat before the summary uses neither map; one of a
	// moat before the host summary uses deny_summary alone, and adds
	// auto-blocks without their host bits.
	for _, c := range []struct {
		name string
		uses []string
	}{
		{"before the summary", nil},
		{"before the host summary", []string{datapath.MoatMapDenySummary}},
	} {
		t.Run(c.name, func(t *testing.T) { olderFilterKeepsTheSummaryOff(t, c.uses) })
	}
}

// olderProgram is an XDP program that passes everything and references
// the shield's maps named uses, as a filter of an older moat would.
func olderProgram(t *testing.T, s *shield.Shield, uses []string) *ebpf.Program {
	t.Helper()
	var insns asm.Instructions
	for _, name := range uses {
		insns = append(insns, asm.LoadMapPtr(asm.R1, s.Map(name).FD()))
	}
	insns = append(insns, asm.Mov.Imm(asm.R0, xdpPass), asm.Return())
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.XDP, License: "GPL", Instructions: insns})
	if err != nil {
		t.Fatal(err)
	}
	return prog
}

func olderFilterKeepsTheSummaryOff(t *testing.T, uses []string) {
	s := openFresh(t)
	a, _ := vethPair(t)
	if _, err := s.Attach(a, shield.ModeGeneric); err != nil {
		t.Fatal(err)
	}
	if in, err := s.SummaryInUse(); err != nil || in != summaryV4|summaryV6 {
		t.Fatalf("after attach: in use %#x, %v", in, err)
	}
	// Pin, in place of the filter, a program of an older moat.
	older := olderProgram(t, s, uses)
	defer older.Close()
	pin := filepath.Join(s.Root(), "ifaces", a, "prog")
	if err := os.Remove(pin); err != nil {
		t.Fatal(err)
	}
	if err := older.Pin(pin); err != nil {
		t.Fatal(err)
	}
	root := s.Root()
	s.Close()

	s, err := shield.Open(root)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if st := summaryState(t, s); st.Built != 0 || st.Ready != 0 {
		t.Fatalf("with an older filter attached: summary %+v, want out of use", st)
	}
	if err := s.Add(shield.DenyList, entries("198.51.100.0/24"), shield.Strict); err != nil {
		t.Fatal(err)
	}
	// moat rebuild-summary refuses, as a user error naming the interface.
	err = s.RebuildDenySummary()
	var ue *shield.UserError
	if !errors.As(err, &ue) || !strings.Contains(err.Error(), a) {
		t.Fatalf("rebuild with an older filter attached: %v, want a user error naming %s", err, a)
	}
	if st := summaryState(t, s); st.Built != 0 || st.Ready != 0 {
		t.Fatalf("the refused rebuild left the summary %+v", st)
	}
	if _, err := s.Attach(a, shield.ModeAuto); err != nil {
		t.Fatal(err)
	}
	if st := summaryState(t, s); st.Built == 0 || st.Ready != summaryAll {
		t.Fatalf("after replacing the older filter: summary %+v, want built and in use", st)
	}
	if !summaryBit(t, s, netip.MustParseAddr("198.51.100.9")) {
		t.Error("the entry added while the summary was out of use has no bit")
	}
}

// TestIPv6AutoBlockFlagClearedByItsRemoval checks that removing an IPv6
// entry shorter than /32 while the data path's flag is set rebuilds the
// summary, bringing IPv6 back.
func TestIPv6AutoBlockFlagClearedByItsRemoval(t *testing.T) {
	s := openFresh(t)
	// What the filter does for an auto-block of a /24: the flag, then the
	// entry (written here as the control plane would).
	flags := datapath.MoatSummaryBlock{}
	flags.W[0] = uint64(summaryV6)
	if err := s.Map(datapath.MoatMapDenySummary).Put(uint32(0), &flags); err != nil {
		t.Fatal(err)
	}
	if err := s.Add(shield.DenyList, entries("2001:d00::/24"), shield.Strict); err != nil {
		t.Fatal(err)
	}
	if in, _ := s.SummaryInUse(); in != summaryV4 {
		t.Fatalf("with the flag set: in use %#x, want IPv4 only", in)
	}
	if err := s.RemovePrefixes(shield.DenyList, []netip.Prefix{pfx("2001:d00::/24")}); err != nil {
		t.Fatal(err)
	}
	if in, _ := s.SummaryInUse(); in != summaryV4|summaryV6 {
		t.Fatalf("after removing the /24: in use %#x, want both", in)
	}
	if summaryBit(t, s, netip.MustParseAddr("2001:d00::1")) {
		t.Error("the removed /24 left its bits")
	}
}

// TestHostSummarySkipsTheHostLookupOnlyWhereNoHostIs: the host summary has
// the bit of every address with a host entry, so a source that a prefix
// covers is dropped without its host lookup where no host entry can be,
// and each packet is still counted on the most specific entry: the host's
// where there is one, the prefix's otherwise.
func TestHostSummarySkipsTheHostLookupOnlyWhereNoHostIs(t *testing.T) {
	s := openFresh(t)
	prog := s.LoadFilter(t)
	if err := s.Add(shield.DenyList, entries("198.51.100.0/24", "198.51.100.7/32", "203.0.113.9/32",
		"192.0.2.0/24", "2001:db8:1::/48", "2001:db8:1::7/128"), shield.Strict); err != nil {
		t.Fatal(err)
	}
	for a, want := range map[string]bool{
		"198.51.100.7": true, "198.51.100.200": true, // the host's /24
		"203.0.113.9":   true,
		"192.0.2.5":     false,                            // a prefix alone
		"2001:db8:1::7": true, "2001:db8:1:ffff::1": true, // the host's hashed /32
		"2001:db8:2::1": true, // the same /32
		"2001:db9::1":   false,
	} {
		if got := hostSummaryBit(t, s, netip.MustParseAddr(a)); got != want {
			t.Errorf("host summary bit of %s: %v, want %v", a, got, want)
		}
	}

	// Each source is dropped and counted on its most specific entry.
	for src, entry := range map[string]string{
		"198.51.100.7":       "198.51.100.7/32",
		"198.51.100.8":       "198.51.100.0/24",
		"203.0.113.9":        "203.0.113.9/32",
		"192.0.2.5":          "192.0.2.0/24",
		"2001:db8:1::7":      "2001:db8:1::7/128",
		"2001:db8:1:ffff::9": "2001:db8:1::/48",
	} {
		before := hitsOf(t, s, entry)
		if v := verdictFrom(t, prog, netip.MustParseAddr(src)); v != xdpDrop {
			t.Errorf("%s: verdict %d, want drop", src, v)
		}
		if got := hitsOf(t, s, entry) - before; got != 1 {
			t.Errorf("%s: %d hits on %s, want 1", src, got, entry)
		}
	}

	// The skip itself: a host entry written past the control plane, so
	// without its bit, is not looked up; the prefix takes the packet.
	hosts := s.Map(datapath.MoatMapDenyV4Hosts)
	key := datapath.MoatHostV4{Addr: netip.MustParseAddr("192.0.2.77").As4()}
	if err := hosts.Put(key, datapath.MoatPrefixRule{Prefixlen: 32}); err != nil {
		t.Fatal(err)
	}
	before := hitsOf(t, s, "192.0.2.0/24")
	if v := verdictFrom(t, prog, netip.MustParseAddr("192.0.2.77")); v != xdpDrop {
		t.Errorf("192.0.2.77: verdict %d, want drop", v)
	}
	if got := hitsOf(t, s, "192.0.2.0/24") - before; got != 1 {
		t.Errorf("192.0.2.77, a host entry without its host bit: %d hits on the /24, want 1 (the host lookup skipped)", got)
	}
	// The same in IPv6, in a hashed /32 with no host entry.
	if err := s.Add(shield.DenyList, entries("2001:db9:5::/48"), shield.Strict); err != nil {
		t.Fatal(err)
	}
	k6 := datapath.MoatHostV6{Addr: netip.MustParseAddr("2001:db9:5::77").As16()}
	if err := s.Map(datapath.MoatMapDenyV6Hosts).Put(k6, datapath.MoatPrefixRule{Prefixlen: 128}); err != nil {
		t.Fatal(err)
	}
	before = hitsOf(t, s, "2001:db9:5::/48")
	if v := verdictFrom(t, prog, netip.MustParseAddr("2001:db9:5::77")); v != xdpDrop {
		t.Errorf("2001:db9:5::77: verdict %d, want drop", v)
	}
	if got := hitsOf(t, s, "2001:db9:5::/48") - before; got != 1 {
		t.Errorf("2001:db9:5::77, a host entry without its host bit: %d hits on the /48, want 1", got)
	}

	// A rebuild reads the list and sets the host's bit: from then on the
	// host entry takes its packets.
	if err := s.RebuildDenySummary(); err != nil {
		t.Fatal(err)
	}
	if !hostSummaryBit(t, s, netip.MustParseAddr("192.0.2.77")) {
		t.Fatal("after a rebuild the host entry 192.0.2.77 has no host bit")
	}
	before = hitsOf(t, s, "192.0.2.77/32")
	verdictFrom(t, prog, netip.MustParseAddr("192.0.2.77"))
	if got := hitsOf(t, s, "192.0.2.77/32") - before; got != 1 {
		t.Errorf("192.0.2.77 after the rebuild: %d hits on its host entry, want 1", got)
	}
}

// hitsOf is the hit counter of the denylist entry p.
func hitsOf(t *testing.T, s *shield.Shield, p string) uint64 {
	t.Helper()
	es, err := s.Entries(shield.DenyList)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range es {
		if e.Prefix == netip.MustParsePrefix(p) {
			return e.Hits
		}
	}
	t.Fatalf("no denylist entry %s", p)
	return 0
}

// TestOpenAddsTheHostSummaryToOlderState: state a moat before the host
// summary built (format 1, the two main families ready, no host summary
// pinned) is rebuilt by Open with the host summary, and host entries
// inside a denied prefix keep their packets.
func TestOpenAddsTheHostSummaryToOlderState(t *testing.T) {
	s := openFresh(t)
	root := s.Root()
	if err := s.Add(shield.DenyList, entries("198.51.100.0/24", "198.51.100.7/32",
		"2001:db8:1::/48", "2001:db8:1::7/128"), shield.Strict); err != nil {
		t.Fatal(err)
	}
	if err := s.Map(datapath.MoatMapDenySummaryState).Put(uint32(0),
		shield.SummaryState{Ready: summaryV4 | summaryV6, Built: 1}); err != nil {
		t.Fatal(err)
	}
	s.Close()
	if err := os.Remove(filepath.Join(root, "maps", datapath.MoatMapDenyHostSummary)); err != nil {
		t.Fatal(err)
	}

	s, err := shield.Open(root)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if st := summaryState(t, s); st.Built != 2 || st.Ready != summaryAll {
		t.Fatalf("summary after the upgrade: %+v, want built in format 2 with host bits ready", st)
	}
	prog := s.LoadFilter(t)
	for src, entry := range map[string]string{
		"198.51.100.7":  "198.51.100.7/32",
		"198.51.100.8":  "198.51.100.0/24",
		"2001:db8:1::7": "2001:db8:1::7/128",
	} {
		a := netip.MustParseAddr(src)
		if !hostSummaryBit(t, s, a) {
			t.Errorf("%s: no host bit after the upgrade", src)
		}
		before := hitsOf(t, s, entry)
		if v := verdictFrom(t, prog, a); v != xdpDrop {
			t.Errorf("%s: verdict %d, want drop", src, v)
		}
		if got := hitsOf(t, s, entry) - before; got != 1 {
			t.Errorf("%s: %d hits on %s, want 1", src, got, entry)
		}
	}
}

// TestSummaryOutOfUseWhenItCannotBeChecked: when Open cannot tell whether
// every attached filter keeps the summary (here an interface's pinned
// program is not a program), it takes the summary out of use rather than
// leave the filter trusting bits it no longer vouches for, and says why.
func TestSummaryOutOfUseWhenItCannotBeChecked(t *testing.T) {
	s := openFresh(t)
	root := s.Root()
	if st := summaryState(t, s); st.Ready != summaryAll {
		t.Fatalf("fresh state: summary %+v", st)
	}
	odd, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 4, MaxEntries: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer odd.Close()
	dir := filepath.Join(root, "ifaces", "ghost")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := odd.Pin(filepath.Join(dir, "prog")); err != nil {
		t.Fatal(err)
	}
	s.Close()

	s, err = shield.Open(root)
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	defer s.Close()
	if s.SummaryErr == nil {
		t.Error("no summary error reported")
	}
	if st := summaryState(t, s); st.Built != 0 || st.Ready != 0 {
		t.Errorf("summary %+v after a failed check, want out of use", st)
	}
}
