package flood

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/moat-shield/moat/internal/testpkt"
)

// TestCounterSlots runs flood_count over one frame of every kind and
// checks the slot it counts and its verdict: malformed frames and ones
// whose headers the parser will not look through (a third VLAN tag, an
// IPv4 TCP fragment at offset 8 bytes) count as malformed; frames for the
// kept address pass whatever the pass setting.
func TestCounterSlots(t *testing.T) {
	src, dst, keep := netip.MustParseAddr("198.19.0.1"), netip.MustParseAddr("198.18.2.1"), netip.MustParseAddr("198.18.2.2")
	syn := testpkt.TCP{SrcPort: 40000, DstPort: 80, SYN: true}
	threeTags := []testpkt.Tag{{TPID: testpkt.TPID8021AD, VLAN: 1}, {TPID: testpkt.TPID8021Q, VLAN: 2}, {TPID: testpkt.TPID8021Q, VLAN: 3}}
	cases := []struct {
		name  string
		frame []byte
		slot  FloodCountSlot
		pass  bool // XDP_PASS rather than XDP_DROP
	}{
		{"syn", testpkt.TCPv4(src, dst, syn), FloodCountSlotFLOOD_COUNT_TCP_SYN, false},
		{"syn-ack", testpkt.TCPv4(src, dst, testpkt.TCP{SrcPort: 80, DstPort: 40000, SYN: true, ACK: true}), FloodCountSlotFLOOD_COUNT_TCP_OTHER, false},
		{"udp", testpkt.UDPv4(src, dst, testpkt.UDP{SrcPort: 53, DstPort: 9}), FloodCountSlotFLOOD_COUNT_UDP, false},
		{"icmpv6", testpkt.IP(netip.MustParseAddr("2001:db8::1"), netip.MustParseAddr("2001:db8::2"), testpkt.ICMPv6{Type: testpkt.ICMPv6EchoRequest}), FloodCountSlotFLOOD_COUNT_ICMP, false},
		{"arp", testpkt.Frame{Net: testpkt.ARP{SenderIP: src, TargetIP: dst}}.Bytes(), FloodCountSlotFLOOD_COUNT_OTHER, false},
		{"tcp cut short", testpkt.IP(src, dst, testpkt.Payload{Proto: testpkt.ProtoTCP, Data: make([]byte, 6)}), FloodCountSlotFLOOD_COUNT_MALFORMED, false},
		{"three tags", testpkt.Frame{Tags: threeTags, Net: testpkt.IPv4{Src: src, Dst: dst}, L4: syn}.Bytes(), FloodCountSlotFLOOD_COUNT_MALFORMED, false},
		{"tcp at offset 8 bytes", testpkt.Frame{Net: testpkt.IPv4{Src: src, Dst: dst, ID: 7, FragOff: 1}, L4: testpkt.Payload{Proto: testpkt.ProtoTCP, Data: make([]byte, 16)}}.Bytes(), FloodCountSlotFLOOD_COUNT_MALFORMED, false},
		{"syn to the kept address", testpkt.TCPv4(src, keep, syn), FloodCountSlotFLOOD_COUNT_TCP_SYN, true},
	}

	spec, err := LoadFlood()
	if err != nil {
		t.Fatal(err)
	}
	k := keep.As4()
	if err := spec.Variables[FloodVarCfgCountKeepV4].Set(binary.NativeEndian.Uint32(k[:])); err != nil {
		t.Fatal(err)
	}
	var objs struct {
		Prog   *ebpf.Program `ebpf:"flood_count"`
		Counts *ebpf.Map     `ebpf:"flood_counts"`
	}
	if err := spec.LoadAndAssign(&objs, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { objs.Prog.Close(); objs.Counts.Close() })
	count := func(slot FloodCountSlot) uint64 {
		var perCPU []uint64
		if err := objs.Counts.Lookup(uint32(slot), &perCPU); err != nil {
			t.Fatal(err)
		}
		var n uint64
		for _, v := range perCPU {
			n += v
		}
		return n
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var before [FloodCountSlotFLOOD_COUNT_MAX]uint64
			for s := range before {
				before[s] = count(FloodCountSlot(s))
			}
			ret, err := objs.Prog.Run(&ebpf.RunOptions{Data: c.frame})
			if err != nil {
				t.Fatal(err)
			}
			if want := map[bool]uint32{false: 1, true: 2}[c.pass]; ret != want {
				t.Errorf("verdict %d, want %d", ret, want)
			}
			for s := range before {
				want := before[s]
				if FloodCountSlot(s) == c.slot {
					want++
				}
				if got := count(FloodCountSlot(s)); got != want {
					t.Errorf("slot %d: %d, want %d", s, got, want)
				}
			}
		})
	}
}
