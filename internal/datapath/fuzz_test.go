package datapath

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
)

// fuzzDenied is the denylist of the fuzz fixture; the table's sources are
// inside it.
var fuzzDenied = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("2001:db8::/32")}

// frameSource reads a frame the way the filter is specified to: through at
// most MAX_VLAN_DEPTH (2) tags to the EtherType. It returns the source
// address when the IP header is whole (version right, IHL >= 5, header
// within the frame), and whether the frame is something other than IP.
func frameSource(pkt []byte) (src netip.Addr, whole, nonIP bool) {
	if len(pkt) < 14 {
		return netip.Addr{}, false, false
	}
	off, proto := 14, binary.BigEndian.Uint16(pkt[12:])
	for tags := 0; proto == 0x8100 || proto == 0x88a8; tags++ {
		if tags == 2 || len(pkt) < off+4 {
			return netip.Addr{}, false, false // malformed
		}
		proto = binary.BigEndian.Uint16(pkt[off+2:])
		off += 4
	}
	switch proto {
	case 0x0800:
		if len(pkt) < off+20 || pkt[off]>>4 != 4 || pkt[off]&0x0f < 5 || len(pkt) < off+int(pkt[off]&0x0f)*4 {
			return netip.Addr{}, false, false
		}
		return netip.AddrFrom4([4]byte(pkt[off+12 : off+16])), true, false
	case 0x86dd:
		if len(pkt) < off+40 || pkt[off]>>4 != 6 {
			return netip.Addr{}, false, false
		}
		return netip.AddrFrom16([16]byte(pkt[off+8 : off+24])), true, false
	}
	return netip.Addr{}, false, true
}

func (f *fixture) totalCounted() uint64 {
	var n uint64
	for _, c := range f.countedSlots() {
		n += c.Packets
	}
	return n
}

// FuzzFilter feeds arbitrary frames to the filter with a denylist, port
// rules and both malformed policies, and checks what must hold for any
// input: the program never aborts, returns only PASS or DROP, counts every
// packet exactly once, passes non-IP frames untouched, and never passes a
// packet from a denied source whose IP header is whole. The seeds (the
// table and the truncation frames) run in every plain `go test`.
func FuzzFilter(f *testing.F) {
	for _, tc := range filterCases() {
		f.Add(tc.pkt)
	}
	for _, fr := range truncationFrames() {
		f.Add(fr.pkt)
	}
	fx := newFixture(f)
	for _, p := range fuzzDenied {
		fx.add(denyList, p.String(), 0)
	}
	dropTCP22(fx)
	dropEcho(fx)
	fx.portRule(cUDP, 1000, 2000, 11, aAllow)

	f.Fuzz(func(t *testing.T, pkt []byte) {
		// The kernel refuses frames shorter than an Ethernet header and
		// longer than a page less its head and tail room.
		if len(pkt) < ethHdrLen || len(pkt) > 3000 {
			return
		}
		fx.tb = t
		src, whole, nonIP := frameSource(pkt)
		denied := false
		for _, p := range fuzzDenied {
			denied = denied || (whole && p.Contains(src))
		}
		for _, policy := range []MoatMalformedPolicy{malformedDrop, malformedPass} {
			fx.setPolicy(fragPass, policy)
			before := fx.totalCounted()
			got, err := fx.objs.MoatFilter.Run(&ebpf.RunOptions{Data: pkt})
			if err != nil {
				t.Fatalf("run: %v", err)
			}
			if got != xdpPass && got != xdpDrop {
				t.Fatalf("policy %d: verdict %s", policy, verdictName(got))
			}
			if denied && got == xdpPass {
				t.Errorf("policy %d: source %v is denied and its IP header whole, but the packet passed", policy, src)
			}
			if nonIP && (got != xdpPass || fx.counter(rNonIP, false).Packets == 0) {
				t.Errorf("policy %d: non-IP frame got %s", policy, verdictName(got))
			}
			if after := fx.totalCounted(); after != before+1 {
				t.Errorf("policy %d: counted %d packets, want 1", policy, after-before)
			}
		}
	})
}
