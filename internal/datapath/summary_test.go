package datapath

import (
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
)

func (m SummaryMarks) has(a netip.Addr) bool {
	blk, w, mask := SummaryLocation(a)
	b := m[blk]
	return b != nil && b[w]&mask != 0
}

func (m SummaryMarks) count() int {
	n := 0
	for _, b := range m {
		for _, w := range b {
			for ; w != 0; w &= w - 1 {
				n++
			}
		}
	}
	return n
}

// TestSummaryMarks checks the bits each prefix length marks, at the edges
// of the summary's units (IPv4 /24, IPv6 /32) and of the broad prefixes.
func TestSummaryMarks(t *testing.T) {
	v6Bits := int(summaryV6Blocks) << summaryBlockShift
	cases := []struct {
		prefix  string
		bits    int      // bits set; -1: not checked (hash collisions)
		in, out []string // addresses whose bit must be set, and clear
	}{
		{"192.0.2.7/32", 1, []string{"192.0.2.7", "192.0.2.200"}, []string{"192.0.3.7", "192.0.1.255"}},
		{"192.0.2.0/24", 1, []string{"192.0.2.0", "192.0.2.255"}, []string{"192.0.3.0"}},
		{"192.0.2.0/23", 2, []string{"192.0.2.0", "192.0.3.255"}, []string{"192.0.4.0", "192.0.1.255"}},
		{"10.0.0.0/8", 1 << 16, []string{"10.0.0.0", "10.128.7.1", "10.255.255.255"}, []string{"9.255.255.255", "11.0.0.0"}},
		{"8.0.0.0/7", 1 << 17, []string{"8.0.0.0", "9.255.255.255"}, []string{"10.0.0.0", "7.255.255.255"}},
		{"64.0.0.0/4", 1 << 20, []string{"64.0.0.1", "79.255.255.255"}, []string{"80.0.0.0", "63.255.255.255"}},
		{"0.0.0.0/0", 1 << 24, []string{"0.0.0.0", "255.255.255.255", "203.0.113.9"}, nil},
		{"2001:db8:1:2::3/128", 1, []string{"2001:db8:1:2::3", "2001:db8:ffff::1"}, nil},
		{"2001:db8::/32", 1, []string{"2001:db8::", "2001:db8:ffff:ffff::1"}, nil},
		{"2001:db8::/31", -1, []string{"2001:db8::1", "2001:db9:ffff::1"}, nil},
		{"2001::/16", -1, []string{"2001::1", "2001:ffff:1::1", "2001:db8::1"}, nil},
		{"2000::/15", v6Bits, []string{"2000::1", "2001:db8::1", "3fff::1"}, nil},
		{"::/0", v6Bits, []string{"::1", "fe80::1"}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.prefix, func(t *testing.T) {
			m := SummaryMarks{}
			m.Add(netip.MustParsePrefix(tc.prefix))
			if n := m.count(); tc.bits >= 0 && n != tc.bits {
				t.Errorf("%d bits set, want %d", n, tc.bits)
			}
			for _, a := range tc.in {
				if !m.has(netip.MustParseAddr(a)) {
					t.Errorf("bit of %s is clear", a)
				}
			}
			for _, a := range tc.out {
				if m.has(netip.MustParseAddr(a)) {
					t.Errorf("bit of %s is set", a)
				}
			}
		})
	}
}

// TestDenySummaryOr runs the control plane's bit writers, of the summary
// and of the host summary: each ORs into its own map, leaving the bits
// already set, and refuses a block past the map.
func TestDenySummaryOr(t *testing.T) {
	spec, err := LoadMoat()
	if err != nil {
		t.Fatal(err)
	}
	coll, err := ebpf.NewCollection(spec)
	if err != nil {
		t.Fatal(err)
	}
	defer coll.Close()
	for _, c := range []struct{ prog, summary, other string }{
		{MoatProgDenySummaryOr, MoatMapDenySummary, MoatMapDenyHostSummary},
		{MoatProgDenyHostSummaryOr, MoatMapDenyHostSummary, MoatMapDenySummary},
	} {
		t.Run(c.prog, func(t *testing.T) {
			or, summary, other := coll.Programs[c.prog], coll.Maps[c.summary], coll.Maps[c.other]
			for _, m := range []*ebpf.Map{summary, other} {
				if err := ClearSummaryBlocks(m); err != nil {
					t.Fatal(err)
				}
			}
			var have MoatSummaryBlock
			have.W[3], have.W[63] = 0b0101, 1<<63
			if err := summary.Put(uint32(7), &have); err != nil {
				t.Fatal(err)
			}
			args := MoatSummaryOrArgs{Block: 7}
			args.W[3], args.W[0] = 0b1010, 1
			if ret, err := or.Run(&ebpf.RunOptions{Context: args}); err != nil || ret != 0 {
				t.Fatalf("run: %d, %v", ret, err)
			}
			var got MoatSummaryBlock
			if err := summary.Lookup(uint32(7), &got); err != nil {
				t.Fatal(err)
			}
			want := have
			want.W[3], want.W[0] = 0b1111, 1
			if got != want {
				t.Errorf("block after the OR: words 0, 3, 63 = %#x %#x %#x, want %#x %#x %#x",
					got.W[0], got.W[3], got.W[63], want.W[0], want.W[3], want.W[63])
			}
			if err := other.Lookup(uint32(7), &got); err != nil || got != (MoatSummaryBlock{}) {
				t.Errorf("%s block 7 after writing %s: %v, %v; want untouched", c.other, c.summary, got.W[:4], err)
			}
			args.Block = uint32(MoatDenySummaryGeometrySUMMARY_BLOCKS)
			if ret, err := or.Run(&ebpf.RunOptions{Context: args}); err != nil || int32(ret) != -1 {
				t.Errorf("block past the map: %d, %v; want -1", int32(ret), err)
			}
		})
	}
}
