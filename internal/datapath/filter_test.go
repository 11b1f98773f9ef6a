package datapath

import (
	"net/netip"
	"strconv"
	"testing"
	"time"

	"github.com/moat-shield/moat/internal/testpkt"
)

var (
	src4     = netip.MustParseAddr("10.1.2.3")
	dst4     = netip.MustParseAddr("192.0.2.10")
	src6     = netip.MustParseAddr("2001:db8:1:2::3")
	dst6     = netip.MustParseAddr("2001:db8:ff::10")
	wildSrc4 = netip.MustParseAddr("203.0.113.7") // in no rule of any test
)

// Short names for the table.
const (
	rPass      = MoatVerdictReasonREASON_PASS
	rNonIP     = MoatVerdictReasonREASON_NON_IP
	rAllow     = MoatVerdictReasonREASON_ALLOWLIST
	rDeny      = MoatVerdictReasonREASON_DENYLIST
	rPortDrop  = MoatVerdictReasonREASON_PORT_DROP
	rPortAllow = MoatVerdictReasonREASON_PORT_ALLOW
	rFragment  = MoatVerdictReasonREASON_FRAGMENT
	rMalformed = MoatVerdictReasonREASON_MALFORMED

	cTCP    = MoatPortClassPORT_CLASS_TCP
	cUDP    = MoatPortClassPORT_CLASS_UDP
	cICMP   = MoatPortClassPORT_CLASS_ICMP
	cICMPv6 = MoatPortClassPORT_CLASS_ICMPV6

	aDrop  = MoatRuleActionACTION_DROP
	aAllow = MoatRuleActionACTION_ALLOW
	aNone  = MoatRuleActionACTION_NONE

	fragPass      = MoatFragmentPolicyFRAGMENTS_PASS
	fragDrop      = MoatFragmentPolicyFRAGMENTS_DROP
	malformedDrop = MoatMalformedPolicyMALFORMED_DROP
	malformedPass = MoatMalformedPolicyMALFORMED_PASS
)

// Packet shorthands.
func tcp4(dport uint16) []byte {
	return testpkt.TCPv4(src4, dst4, testpkt.TCP{SYN: true, SrcPort: 40000, DstPort: dport})
}
func tcp6(dport uint16) []byte {
	return testpkt.TCPv6(src6, dst6, testpkt.TCP{SYN: true, SrcPort: 40000, DstPort: dport})
}
func udp4(dport uint16) []byte {
	return testpkt.UDPv4(src4, dst4, testpkt.UDP{SrcPort: 5353, DstPort: dport, Payload: []byte("data")})
}
func udp6(dport uint16) []byte {
	return testpkt.UDPv6(src6, dst6, testpkt.UDP{SrcPort: 5353, DstPort: dport, Payload: []byte("data")})
}
func tcp4From(src netip.Addr, dport uint16) []byte {
	return testpkt.TCPv4(src, dst4, testpkt.TCP{SYN: true, SrcPort: 40000, DstPort: dport})
}

// v6ext builds TCP/IPv6 to port 22 behind the given extension headers.
func v6ext(ext ...testpkt.IPv6Ext) []byte {
	return testpkt.Frame{
		Net: testpkt.IPv6{Src: src6, Dst: dst6, Ext: ext},
		L4:  testpkt.TCP{SYN: true, SrcPort: 40000, DstPort: 22},
	}.Bytes()
}

func v4frag(src netip.Addr, mf bool, off uint16, l4 testpkt.Transport) []byte {
	return testpkt.Frame{Net: testpkt.IPv4{Src: src, Dst: dst4, ID: 77, MF: mf, FragOff: off}, L4: l4}.Bytes()
}

func v6frag(src netip.Addr, more bool, off uint16, l4 testpkt.Transport) []byte {
	return testpkt.Frame{
		Net: testpkt.IPv6{Src: src, Dst: dst6, Ext: []testpkt.IPv6Ext{testpkt.Fragment{Offset: off, More: more, ID: 77}}},
		L4:  l4,
	}.Bytes()
}

// fragData is the middle of a TCP stream: no header, just bytes.
var fragData = testpkt.Payload{Proto: testpkt.ProtoTCP, Data: make([]byte, 64)}

// hit is the expected hit count of one prefix rule after the packet.
type hit struct {
	list   list
	prefix string
	trie   bool // a full-length prefix that was put in the trie
	n      uint64
}

type filterCase struct {
	name    string
	pkt     []byte
	setup   func(f *fixture)
	verdict uint32
	reason  MoatVerdictReason
	hits    []hit
	portHit map[uint16]uint64 // port rule id -> hits
}

func drop(name string, pkt []byte, reason MoatVerdictReason, setup func(*fixture)) filterCase {
	return filterCase{name: name, pkt: pkt, setup: setup, verdict: xdpDrop, reason: reason}
}

func pass(name string, pkt []byte, reason MoatVerdictReason, setup func(*fixture)) filterCase {
	return filterCase{name: name, pkt: pkt, setup: setup, verdict: xdpPass, reason: reason}
}

// Setups used by many cases.
func denySrc(f *fixture)   { f.deny("10.0.0.0/8"); f.deny("2001:db8::/32") }
func dropTCP22(f *fixture) { f.portRule(cTCP, 22, 22, 1, aDrop) }
func dropUDP53(f *fixture) { f.portRule(cUDP, 53, 53, 2, aDrop) }

// mappedSource writes the source of an untagged IPv6 frame as the
// IPv4-mapped address of v4 (testpkt builds no such frame), or, with
// first, as an address that only ends like one.
func mappedSource(frame []byte, v4 string, first ...byte) []byte {
	a := netip.AddrFrom16(netip.MustParseAddr("::ffff:" + v4).As16()).As16()
	copy(a[:], first)
	copy(frame[14+8:14+24], a[:])
	return frame
}

// udpLengthZero sets the UDP length field of an untagged frame without
// IPv6 extension headers or IPv4 options to 0.
func udpLengthZero(frame []byte) []byte {
	l4 := 14 + 20
	if frame[12] == 0x86 && frame[13] == 0xdd {
		l4 = 14 + 40
	}
	frame[l4+4], frame[l4+5] = 0, 0
	return frame
}

// jumbogram is an untagged IPv6 frame with a hop-by-hop header, with or
// without the jumbo option, and a payload length of 0 (RFC 2675).
func jumbogram(l4 testpkt.Transport, option bool) []byte {
	var hbh testpkt.HopByHop
	if option {
		hbh.Options = []testpkt.IPv6TLV{{Type: 0xc2, Data: []byte{0, 1, 0, 0}}}
	}
	return payloadLengthZero(testpkt.Frame{Net: testpkt.IPv6{Src: src6, Dst: dst6, Ext: []testpkt.IPv6Ext{hbh}}, L4: l4}.Bytes())
}

// payloadLengthZero sets the IPv6 payload length of an untagged frame to 0.
func payloadLengthZero(frame []byte) []byte {
	frame[14+4], frame[14+5] = 0, 0
	return frame
}

// totalLengthZero sets the IPv4 total length of an untagged frame to 0.
func totalLengthZero(frame []byte) []byte {
	frame[14+2], frame[14+3] = 0, 0
	return frame
}

func fragDropPolicy(f *fixture) { f.setPolicy(fragDrop, malformedDrop) }
func malformedPassPolicy(f *fixture) {
	f.setPolicy(fragPass, malformedPass)
}
func both(a, b func(*fixture)) func(*fixture) { return func(f *fixture) { a(f); b(f) } }

// expired returns a setup that adds a rule whose deadline passed a second ago.
func expired(l list, prefix string) func(*fixture) {
	return func(f *fixture) { f.add(l, prefix, f.expiresIn(-time.Second)) }
}

func filterCases() []filterCase {
	ipv6Bytes := tcp6(80)[14:]
	ipv4Bytes := tcp4(80)[14:]
	threeTags := []testpkt.Tag{{TPID: testpkt.TPID8021AD, VLAN: 1}, {VLAN: 2}, {VLAN: 3}}
	// 16 bytes of payload keep every frame above the 60-byte Ethernet
	// minimum, so a length field one past the datagram is past the frame.
	tcpOpts := testpkt.TCP{SYN: true, SrcPort: 40000, DstPort: 22, Payload: make([]byte, 16)}

	cases := []filterCase{
		// Not IP: passed untouched, whatever the rules say.
		pass("arp", testpkt.Frame{Net: testpkt.ARP{SenderIP: src4, TargetIP: dst4}}.Bytes(), rNonIP, denySrc),
		pass("lldp", testpkt.Frame{Net: testpkt.LLDP{Port: "eth0"}}.Bytes(), rNonIP, denySrc),
		pass("unknown ethertype", testpkt.Frame{Net: testpkt.EtherPayload{Type: 0x88b5, Data: make([]byte, 46)}}.Bytes(), rNonIP, nil),
		pass("arp in vlan", testpkt.Frame{Tags: testpkt.VLAN(5), Net: testpkt.ARP{SenderIP: src4}}.Bytes(), rNonIP, nil),

		// No rule matches.
		pass("tcp4 no rules", tcp4(80), rPass, nil),
		pass("tcp6 no rules", tcp6(80), rPass, nil),
		pass("udp4 padded frame", testpkt.UDPv4(src4, dst4, testpkt.UDP{DstPort: 9}), rPass, dropTCP22),
		pass("esp6 has no ports", testpkt.IP(src6, dst6, testpkt.Payload{Proto: testpkt.ProtoESP, Data: make([]byte, 32)}), rPass, nil),
		pass("ipv6 no next header", testpkt.Frame{Net: testpkt.IPv6{Src: src6, Dst: dst6}}.Bytes(), rPass, nil),

		// VLAN tags are looked through, up to MAX_VLAN_DEPTH.
		drop("vlan tcp4 denied", testpkt.Frame{Tags: testpkt.VLAN(10), Net: testpkt.IPv4{Src: src4, Dst: dst4}, L4: tcpOpts}.Bytes(), rDeny, denySrc),
		drop("vlan tcp4 port", testpkt.Frame{Tags: testpkt.VLAN(10), Net: testpkt.IPv4{Src: src4, Dst: dst4}, L4: tcpOpts}.Bytes(), rPortDrop, dropTCP22),
		drop("qinq tcp6 denied", testpkt.Frame{Tags: testpkt.QinQ(100, 200), Net: testpkt.IPv6{Src: src6, Dst: dst6}, L4: tcpOpts}.Bytes(), rDeny, denySrc),
		drop("qinq tcp6 port", testpkt.Frame{Tags: testpkt.QinQ(100, 200), Net: testpkt.IPv6{Src: src6, Dst: dst6}, L4: tcpOpts}.Bytes(), rPortDrop, dropTCP22),
		pass("qinq no rules", testpkt.Frame{Tags: testpkt.QinQ(100, 200), Net: testpkt.IPv4{Src: src4, Dst: dst4}, L4: tcpOpts}.Bytes(), rPass, nil),
		drop("three tags", testpkt.Frame{Tags: threeTags, Net: testpkt.IPv4{Src: src4, Dst: dst4}, L4: tcpOpts}.Bytes(), rMalformed, nil),
		// A third tag hides the packet from every rule, and a host with
		// stacked VLAN devices would deliver it: no policy passes it.
		drop("three tags, malformed pass", testpkt.Frame{Tags: threeTags, Net: testpkt.IPv4{Src: src4, Dst: dst4}, L4: tcpOpts}.Bytes(), rMalformed, malformedPassPolicy),
		drop("vlan tag cut short", testpkt.Frame{Tags: testpkt.VLAN(10), Net: testpkt.IPv4{Src: src4, Dst: dst4}, L4: tcpOpts}.Bytes()[:16], rMalformed, nil),

		// IPv4 header checks.
		drop("ipv4 options denied", testpkt.Frame{Net: testpkt.IPv4{Src: src4, Dst: dst4, Options: []testpkt.IPv4Option{testpkt.RouterAlert()}}, L4: tcpOpts}.Bytes(), rDeny, denySrc),
		drop("ipv4 options port", testpkt.Frame{Net: testpkt.IPv4{Src: src4, Dst: dst4, Options: []testpkt.IPv4Option{testpkt.RouterAlert(), testpkt.IPv4NOP()}}, L4: tcpOpts}.Bytes(), rPortDrop, dropTCP22),
		drop("ipv4 ihl 4", testpkt.Frame{Net: testpkt.IPv4{Src: src4, Dst: dst4, IHL: 4}, L4: tcpOpts}.Bytes(), rMalformed, nil),
		drop("ipv4 ihl past total length", testpkt.Frame{Net: testpkt.IPv4{Src: src4, Dst: dst4, IHL: 15}, L4: tcpOpts}.Bytes(), rMalformed, nil),
		drop("ipv4 total length past frame", testpkt.Frame{Net: testpkt.IPv4{Src: src4, Dst: dst4, TotalLength: 57}, L4: tcpOpts}.Bytes(), rMalformed, nil),
		drop("ipv4 total length below header", testpkt.Frame{Net: testpkt.IPv4{Src: src4, Dst: dst4, TotalLength: 19}, L4: tcpOpts}.Bytes(), rMalformed, nil),
		drop("ipv4 total length cuts tcp", testpkt.Frame{Net: testpkt.IPv4{Src: src4, Dst: dst4, TotalLength: 30}, L4: tcpOpts}.Bytes(), rMalformed, nil),
		drop("ipv6 under ipv4 ethertype", testpkt.Frame{Net: testpkt.EtherPayload{Type: 0x0800, Data: ipv6Bytes}}.Bytes(), rMalformed, nil),
		drop("ipv4 under ipv6 ethertype", testpkt.Frame{Net: testpkt.EtherPayload{Type: 0x86dd, Data: append(ipv4Bytes, make([]byte, 20)...)}}.Bytes(), rMalformed, nil),

		// IPv6 extension headers are walked to the upper layer: the port
		// rule must see TCP port 22 behind each of them.
		drop("ipv6 hop-by-hop", v6ext(testpkt.HopByHop{}), rPortDrop, dropTCP22),
		drop("ipv6 routing", v6ext(testpkt.Routing{Type: 2, Addresses: []netip.Addr{dst6}}), rPortDrop, dropTCP22),
		drop("ipv6 destination options", v6ext(testpkt.DestOpts{Options: []testpkt.IPv6TLV{{Type: 0x1e, Data: make([]byte, 10)}}}), rPortDrop, dropTCP22),
		drop("ipv6 ah", v6ext(testpkt.AH{SPI: 1, Seq: 1}), rPortDrop, dropTCP22),
		drop("ipv6 atomic fragment", v6ext(testpkt.Fragment{ID: 1}), rPortDrop, dropTCP22),
		drop("ipv6 chain of 8", v6ext(chain(8)...), rPortDrop, dropTCP22),
		drop("ipv6 chain of 9", v6ext(chain(9)...), rMalformed, nil),
		drop("ipv6 chain of 9, malformed pass", v6ext(chain(9)...), rMalformed, both(dropTCP22, malformedPassPolicy)),
		drop("ipv6 chain of 9 allowed, malformed pass", v6ext(chain(9)...), rMalformed, both(func(f *fixture) { f.allow("2001:db8::/32") }, malformedPassPolicy)),
		drop("ipv6 ext past payload length", testpkt.Frame{Net: testpkt.IPv6{Src: src6, Dst: dst6, PayloadLength: 4, Ext: []testpkt.IPv6Ext{testpkt.HopByHop{}}}, L4: tcpOpts}.Bytes(), rMalformed, nil),
		drop("ipv6 payload length past frame", testpkt.Frame{Net: testpkt.IPv6{Src: src6, Dst: dst6, PayloadLength: 37}, L4: tcpOpts}.Bytes(), rMalformed, nil),
		// An IPv4-mapped source would be judged by the IPv6 lists while a
		// dual-stack socket answers the IPv4 host it names.
		drop("ipv6 ipv4-mapped source", mappedSource(udp6(9), "10.1.2.3"), rMalformed, nil),
		drop("ipv6 ipv4-mapped source of a denied host, malformed pass", mappedSource(udp6(9), "10.1.2.3"), rMalformed, both(denySrc, malformedPassPolicy)),
		pass("ipv6 source that only ends like a mapped one", mappedSource(udp6(9), "10.1.2.3", 0x20, 0x01), rPass, nil),
		// UDP length 0 over IPv6 is the whole payload (RFC 2675): the
		// stack delivers it, so its ports are judged.
		drop("udp6 length 0, malformed pass", udpLengthZero(udp6(53)), rPortDrop, both(dropUDP53, malformedPassPolicy)),
		drop("udp4 length 0", udpLengthZero(udp4(53)), rMalformed, dropUDP53),
		// Payload length 0 before a hop-by-hop header is a jumbogram (RFC
		// 2675; BIG TCP builds them): the stack does not trim it, jumbo
		// option or not, and takes what the frame holds, so its ports are
		// judged.
		drop("ipv6 jumbogram udp, malformed pass", jumbogram(testpkt.UDP{SrcPort: 5353, DstPort: 53, Payload: []byte("data")}, false),
			rPortDrop, both(dropUDP53, malformedPassPolicy)),
		drop("ipv6 jumbogram syn with the jumbo option, malformed pass", jumbogram(testpkt.TCP{SYN: true, SrcPort: 40000, DstPort: 22}, true),
			rPortDrop, both(dropTCP22, malformedPassPolicy)),
		pass("ipv6 jumbogram udp", jumbogram(testpkt.UDP{SrcPort: 5353, DstPort: 9, Payload: []byte("data")}, true), rPass, dropUDP53),
		drop("ipv6 jumbogram udp from a denied source", jumbogram(testpkt.UDP{SrcPort: 5353, DstPort: 9, Payload: []byte("data")}, false), rDeny, denySrc),
		// Without hop-by-hop, the stack trims it to the fixed header.
		drop("ipv6 payload length 0", payloadLengthZero(udp6(9)), rMalformed, nil),
		// IPv4 total length 0: GRO's aggregates past 64 KiB (BIG TCP), in
		// generic mode; the stack takes their length from the skb, and
		// drops such a frame from the wire. Judged by what it holds.
		drop("ipv4 total length 0, malformed pass", totalLengthZero(udp4(53)), rPortDrop, both(dropUDP53, malformedPassPolicy)),
		pass("ipv4 total length 0", totalLengthZero(tcp4(80)), rPass, dropTCP22),
		// A first fragment whose extension chain breaks off goes on in
		// the next fragment, where the stack finds the ports.
		drop("ipv6 first fragment, chain cut, malformed pass", testpkt.Frame{Net: testpkt.IPv6{Src: src6, Dst: dst6, PayloadLength: 16,
			Ext: []testpkt.IPv6Ext{testpkt.Fragment{More: true, ID: 7}, testpkt.DestOpts{}, testpkt.DestOpts{}}}, L4: tcpOpts}.Bytes()[:14+40+16], rMalformed,
			both(dropTCP22, malformedPassPolicy)),
		drop("ipv6 payload length cuts tcp", testpkt.Frame{Net: testpkt.IPv6{Src: src6, Dst: dst6, PayloadLength: 19}, L4: tcpOpts}.Bytes(), rMalformed, nil),

		// Fragments: port rules apply to first fragments only, source
		// rules to all.
		drop("ipv4 first fragment port", v4frag(src4, true, 0, tcpOpts), rPortDrop, dropTCP22),
		drop("ipv4 tiny first fragment", v4frag(src4, true, 0, testpkt.Payload{Proto: testpkt.ProtoTCP, Data: make([]byte, 8)}), rMalformed, dropTCP22),
		pass("ipv4 non-first fragment pass", v4frag(src4, true, 185, fragData), rFragment, dropTCP22),
		pass("ipv4 last fragment pass", v4frag(src4, false, 185, fragData), rFragment, dropTCP22),
		drop("ipv4 non-first fragment drop", v4frag(src4, true, 185, fragData), rFragment, fragDropPolicy),
		drop("ipv4 non-first fragment denied", v4frag(src4, true, 185, fragData), rDeny, denySrc),
		pass("ipv4 non-first fragment allowed", v4frag(src4, true, 185, fragData), rAllow, both(fragDropPolicy, func(f *fixture) { f.allow("10.1.2.0/24") })),
		drop("ipv4 offset 1 tcp", v4frag(src4, true, 1, fragData), rMalformed, nil),
		// Packets the stack reassembles or walks whole while the filter
		// cannot see their ports or flags: dropped whatever the malformed
		// policy, or a drop rule for the port they reach would be skipped.
		drop("ipv4 offset 1 tcp, malformed pass", v4frag(src4, true, 1, fragData), rMalformed, both(dropTCP22, malformedPassPolicy)),
		drop("ipv4 offset 1 tcp allowed, malformed pass", v4frag(src4, true, 1, fragData), rMalformed, both(func(f *fixture) { f.allow("10.1.2.0/24") }, malformedPassPolicy)),
		drop("ipv4 tiny first fragment, malformed pass", v4frag(src4, true, 0, testpkt.Payload{Proto: testpkt.ProtoTCP, Data: make([]byte, 8)}), rMalformed, both(dropTCP22, malformedPassPolicy)),
		drop("ipv4 first fragment cutting tcp options, malformed pass", v4frag(src4, true, 0, testpkt.TCP{DstPort: 22, SYN: true, DataOffset: 15}), rMalformed, both(dropTCP22, malformedPassPolicy)),
		drop("ipv4 tiny first udp fragment, malformed pass", v4frag(src4, true, 0, testpkt.Payload{Proto: testpkt.ProtoUDP, Data: make([]byte, 4)}), rMalformed, malformedPassPolicy),
		drop("ipv4 tiny first icmp fragment, malformed pass", v4frag(src4, true, 0, testpkt.Payload{Proto: testpkt.ProtoICMP, Data: []byte{8, 0, 0, 0}}), rMalformed, malformedPassPolicy),
		drop("ipv6 first fragment without tcp header, malformed pass", v6frag(src6, true, 0, testpkt.Payload{Proto: testpkt.ProtoTCP, Data: make([]byte, 12)}), rMalformed, both(dropTCP22, malformedPassPolicy)),
		// The same header cut short in a whole packet is one the stack
		// discards too: the policy decides.
		pass("tcp data offset past segment, malformed pass", testpkt.TCPv4(src4, dst4, testpkt.TCP{DstPort: 22, SYN: true, DataOffset: 15}), rMalformed, both(dropTCP22, malformedPassPolicy)),
		pass("ipv6 atomic fragment without tcp header, malformed pass", v6frag(src6, false, 0, testpkt.Payload{Proto: testpkt.ProtoTCP, Data: make([]byte, 12)}), rMalformed, malformedPassPolicy),
		pass("ipv4 offset 1 udp", v4frag(src4, true, 1, testpkt.Payload{Proto: testpkt.ProtoUDP, Data: make([]byte, 16)}), rFragment, nil),
		drop("ipv6 first fragment port", v6frag(src6, true, 0, tcpOpts), rPortDrop, dropTCP22),
		drop("ipv6 first fragment without tcp header", v6frag(src6, true, 0, testpkt.Payload{Proto: testpkt.ProtoTCP, Data: make([]byte, 12)}), rMalformed, nil),
		pass("ipv6 non-first fragment pass", v6frag(src6, true, 100, fragData), rFragment, dropTCP22),
		drop("ipv6 non-first fragment drop", v6frag(src6, false, 100, fragData), rFragment, fragDropPolicy),
		drop("ipv6 non-first fragment denied", v6frag(src6, true, 100, fragData), rDeny, denySrc),

		// L4 header checks.
		drop("tcp data offset 4", testpkt.TCPv4(src4, dst4, testpkt.TCP{DstPort: 80, DataOffset: 4}), rMalformed, nil),
		drop("tcp data offset past frame", testpkt.TCPv4(src4, dst4, testpkt.TCP{DstPort: 80, DataOffset: 15}), rMalformed, nil),
		drop("udp length 4", testpkt.UDPv6(src6, dst6, testpkt.UDP{DstPort: 53, Length: 4}), rMalformed, nil),
		drop("icmp cut short", testpkt.IP(src4, dst4, testpkt.Payload{Proto: testpkt.ProtoICMP, Data: []byte{8, 0, 0, 0}}), rMalformed, nil),
		drop("icmpv6 cut short", testpkt.IP(src6, dst6, testpkt.Payload{Proto: testpkt.ProtoICMPv6, Data: []byte{128, 0, 0, 0}}), rMalformed, nil),

		// Malformed policy: with pass, the source rules still apply when
		// the IP header is whole.
		pass("malformed pass", testpkt.Frame{Net: testpkt.IPv4{Src: src4, Dst: dst4, IHL: 4}, L4: tcpOpts}.Bytes(), rMalformed, both(denySrc, malformedPassPolicy)),
		drop("malformed l4 denied, malformed pass", testpkt.TCPv4(src4, dst4, testpkt.TCP{DstPort: 80, DataOffset: 4}), rDeny, both(denySrc, malformedPassPolicy)),
		drop("truncated ipv4 denied, malformed pass", testpkt.Frame{Net: testpkt.IPv4{Src: src4, Dst: dst4, TotalLength: 1000}, L4: tcpOpts}.Bytes(), rDeny, both(denySrc, malformedPassPolicy)),
		drop("truncated ipv6 denied, malformed pass", testpkt.Frame{Net: testpkt.IPv6{Src: src6, Dst: dst6, PayloadLength: 1000}, L4: tcpOpts}.Bytes(), rDeny, both(denySrc, malformedPassPolicy)),
		pass("malformed l4 allowed, malformed pass", testpkt.TCPv4(src4, dst4, testpkt.TCP{DstPort: 80, DataOffset: 4}), rAllow, both(func(f *fixture) { f.allow("10.1.2.3/32") }, malformedPassPolicy)),
		drop("malformed l4 allowed, malformed drop", testpkt.TCPv4(src4, dst4, testpkt.TCP{DstPort: 80, DataOffset: 4}), rMalformed, func(f *fixture) { f.allow("10.1.2.3/32") }),

		// Ports and ICMP types.
		drop("tcp4 port drop", tcp4(22), rPortDrop, dropTCP22),
		drop("tcp6 port drop", tcp6(22), rPortDrop, dropTCP22),
		pass("tcp4 other port", tcp4(23), rPass, dropTCP22),
		pass("udp same number as tcp rule", udp4(22), rPass, dropTCP22),
		pass("tcp4 port allow", tcp4(443), rPortAllow, func(f *fixture) { f.portRule(cTCP, 443, 443, 2, aAllow) }),
		drop("udp4 port drop", udp4(53), rPortDrop, func(f *fixture) { f.portRule(cUDP, 53, 53, 3, aDrop) }),
		drop("udp6 port drop", udp6(53), rPortDrop, func(f *fixture) { f.portRule(cUDP, 53, 53, 3, aDrop) }),
		pass("udp6 port allow", udp6(123), rPortAllow, func(f *fixture) { f.portRule(cUDP, 123, 123, 4, aAllow) }),
		pass("port rule with no action", tcp4(25), rPass, func(f *fixture) { f.portRule(cTCP, 25, 25, 5, aNone) }),
		drop("icmp echo request drop", testpkt.IP(src4, dst4, testpkt.ICMPv4{Type: testpkt.ICMPv4EchoRequest, ID: 1}), rPortDrop, dropEcho),
		pass("icmp echo reply", testpkt.IP(src4, dst4, testpkt.ICMPv4{Type: testpkt.ICMPv4EchoReply, ID: 1}), rPass, dropEcho),
		drop("icmpv6 echo request drop", testpkt.IP(src6, dst6, testpkt.ICMPv6{Type: testpkt.ICMPv6EchoRequest, ID: 1}), rPortDrop, dropEcho),
		pass("icmpv6 echo reply", testpkt.IP(src6, dst6, testpkt.ICMPv6{Type: testpkt.ICMPv6EchoReply, ID: 1}), rPass, dropEcho),
		pass("icmpv6 over ipv4 has no type rules", testpkt.IP(src4, dst4, testpkt.ICMPv6{Type: testpkt.ICMPv6EchoRequest}), rPass, dropEcho),
		pass("icmp over ipv6 has no type rules", testpkt.IP(src6, dst6, testpkt.ICMPv4{Type: testpkt.ICMPv4EchoRequest}), rPass, dropEcho),
		drop("port allow does not beat deny", tcp4(443), rDeny, both(denySrc, func(f *fixture) { f.portRule(cTCP, 443, 443, 2, aAllow) })),
		pass("allowlisted skips port drop", tcp4(22), rAllow, both(dropTCP22, func(f *fixture) { f.allow("10.0.0.0/8") })),
	}
	// Port ranges: one id in every port of the range.
	for _, p := range []struct {
		port uint16
		in   bool
	}{{999, false}, {1000, true}, {1500, true}, {2000, true}, {2001, false}} {
		setup := func(f *fixture) { f.portRule(cTCP, 1000, 2000, 7, aDrop); f.portRule(cUDP, 3000, 4000, 8, aAllow) }
		c := pass("tcp range port "+strconv.Itoa(int(p.port)), tcp4(p.port), rPass, setup)
		u := pass("udp range port "+strconv.Itoa(int(p.port)+2000), udp6(p.port+2000), rPass, setup)
		if p.in {
			c.verdict, c.reason, c.portHit = xdpDrop, rPortDrop, map[uint16]uint64{7: 1, 8: 0}
		}
		if p.in {
			u.reason, u.portHit = rPortAllow, map[uint16]uint64{8: 1, 7: 0}
		}
		cases = append(cases, c, u)
	}
	cases = append(cases, prefixCases()...)
	cases = append(cases, summaryCases()...)
	return cases
}

func dropEcho(f *fixture) {
	f.portRule(cICMP, testpkt.ICMPv4EchoRequest, testpkt.ICMPv4EchoRequest, 9, aDrop)
	f.portRule(cICMPv6, testpkt.ICMPv6EchoRequest, testpkt.ICMPv6EchoRequest, 10, aDrop)
}

// chain returns n extension headers, cycling through every kind that may
// repeat in a chain the filter has to walk.
func chain(n int) []testpkt.IPv6Ext {
	kinds := []testpkt.IPv6Ext{testpkt.HopByHop{}, testpkt.DestOpts{}, testpkt.Routing{Type: 2, Addresses: []netip.Addr{dst6}}, testpkt.AH{}, testpkt.Fragment{}}
	var out []testpkt.IPv6Ext
	for i := 0; i < n; i++ {
		out = append(out, kinds[i%len(kinds)])
	}
	return out
}

// prefixCases cover the address lists: precedence, longest prefix, host map
// against trie, and expiry.
func prefixCases() []filterCase {
	a, d := allowList, denyList
	return []filterCase{
		{name: "allow host beats deny /8", pkt: tcp4(80), verdict: xdpPass, reason: rAllow,
			setup: func(f *fixture) { f.allow("10.1.2.3/32"); f.deny("10.0.0.0/8") },
			hits:  []hit{{a, "10.1.2.3/32", false, 1}, {d, "10.0.0.0/8", false, 0}}},
		{name: "allow /24 inside deny /8", pkt: tcp4(80), verdict: xdpPass, reason: rAllow,
			setup: func(f *fixture) { f.allow("10.1.2.0/24"); f.deny("10.0.0.0/8") },
			hits:  []hit{{a, "10.1.2.0/24", false, 1}, {d, "10.0.0.0/8", false, 0}}},
		{name: "deny /32 inside allow /16: allowlist first", pkt: tcp4(80), verdict: xdpPass, reason: rAllow,
			setup: func(f *fixture) { f.allow("10.1.0.0/16"); f.deny("10.1.2.3/32") },
			hits:  []hit{{a, "10.1.0.0/16", false, 1}, {d, "10.1.2.3/32", false, 0}}},
		{name: "deny neighbour of allowed host", pkt: tcp4From(netip.MustParseAddr("10.1.2.4"), 80), verdict: xdpDrop, reason: rDeny,
			setup: func(f *fixture) { f.allow("10.1.2.3/32"); f.deny("10.0.0.0/8") },
			hits:  []hit{{a, "10.1.2.3/32", false, 0}, {d, "10.0.0.0/8", false, 1}}},
		{name: "deny longest of /8 /16 /24", pkt: tcp4(80), verdict: xdpDrop, reason: rDeny,
			setup: func(f *fixture) { f.deny("10.0.0.0/8"); f.deny("10.1.0.0/16"); f.deny("10.1.2.0/24") },
			hits:  []hit{{d, "10.1.2.0/24", false, 1}, {d, "10.1.0.0/16", false, 0}, {d, "10.0.0.0/8", false, 0}}},
		{name: "allow longest of /8 /24", pkt: tcp4(80), verdict: xdpPass, reason: rAllow,
			setup: func(f *fixture) { f.allow("10.0.0.0/8"); f.allow("10.1.2.0/24") },
			hits:  []hit{{a, "10.1.2.0/24", false, 1}, {a, "10.0.0.0/8", false, 0}}},
		{name: "deny host map before trie", pkt: tcp4(80), verdict: xdpDrop, reason: rDeny,
			setup: func(f *fixture) { f.deny("10.1.2.3/32"); f.deny("10.1.2.0/24") },
			hits:  []hit{{d, "10.1.2.3/32", false, 1}, {d, "10.1.2.0/24", false, 0}}},
		{name: "deny /32 held in the trie", pkt: tcp4(80), verdict: xdpDrop, reason: rDeny,
			setup: func(f *fixture) { f.addNet(d, netip.MustParsePrefix("10.1.2.3/32"), 0); f.deny("10.0.0.0/8") },
			hits:  []hit{{d, "10.1.2.3/32", true, 1}, {d, "10.0.0.0/8", false, 0}}},
		{name: "deny v6 host", pkt: tcp6(80), verdict: xdpDrop, reason: rDeny,
			setup: func(f *fixture) { f.deny("2001:db8:1:2::3/128"); f.deny("2001:db8::/32") },
			hits:  []hit{{d, "2001:db8:1:2::3/128", false, 1}, {d, "2001:db8::/32", false, 0}}},
		{name: "deny v6 /64 inside /32", pkt: tcp6(80), verdict: xdpDrop, reason: rDeny,
			setup: func(f *fixture) { f.deny("2001:db8:1:2::/64"); f.deny("2001:db8::/32") },
			hits:  []hit{{d, "2001:db8:1:2::/64", false, 1}, {d, "2001:db8::/32", false, 0}}},
		{name: "allow v6 /48 beats deny v6 host", pkt: tcp6(80), verdict: xdpPass, reason: rAllow,
			setup: func(f *fixture) { f.allow("2001:db8:1::/48"); f.deny("2001:db8:1:2::3/128") },
			hits:  []hit{{a, "2001:db8:1::/48", false, 1}, {d, "2001:db8:1:2::3/128", false, 0}}},
		{name: "v4 rule does not match v6", pkt: tcp6(80), verdict: xdpPass, reason: rPass,
			setup: func(f *fixture) { f.deny("0.0.0.0/1"); f.deny("10.1.2.3/32") }},
		{name: "other source passes", pkt: tcp4From(wildSrc4, 80), verdict: xdpPass, reason: rPass, setup: denySrc},

		// Expiry.
		{name: "expired deny host falls through", pkt: tcp4(80), verdict: xdpPass, reason: rPass,
			setup: expired(d, "10.1.2.3/32"), hits: []hit{{d, "10.1.2.3/32", false, 0}}},
		{name: "live deny host with deadline", pkt: tcp4(80), verdict: xdpDrop, reason: rDeny,
			setup: func(f *fixture) { f.add(d, "10.1.2.3/32", f.expiresIn(time.Hour)) },
			hits:  []hit{{d, "10.1.2.3/32", false, 1}}},
		{name: "expired deny host, live /8", pkt: tcp4(80), verdict: xdpDrop, reason: rDeny,
			setup: both(expired(d, "10.1.2.3/32"), denySrc),
			hits:  []hit{{d, "10.1.2.3/32", false, 0}, {d, "10.0.0.0/8", false, 1}}},
		{name: "expired /16 must not shadow live /8", pkt: tcp4(80), verdict: xdpDrop, reason: rDeny,
			setup: both(expired(d, "10.1.0.0/16"), func(f *fixture) { f.deny("10.0.0.0/8") }),
			hits:  []hit{{d, "10.1.0.0/16", false, 0}, {d, "10.0.0.0/8", false, 1}}},
		{name: "expired /24 and /16 over live /8", pkt: tcp4(80), verdict: xdpDrop, reason: rDeny,
			setup: both(both(expired(d, "10.1.2.0/24"), expired(d, "10.1.0.0/16")), func(f *fixture) { f.deny("10.0.0.0/8") }),
			hits:  []hit{{d, "10.1.2.0/24", false, 0}, {d, "10.1.0.0/16", false, 0}, {d, "10.0.0.0/8", false, 1}}},
		{name: "expired /16 alone", pkt: tcp4(80), verdict: xdpPass, reason: rPass, setup: expired(d, "10.1.0.0/16")},
		{name: "expired deny-all", pkt: tcp4(80), verdict: xdpPass, reason: rPass, setup: expired(d, "0.0.0.0/0")},
		{name: "expired v6 deny-all", pkt: tcp6(80), verdict: xdpPass, reason: rPass, setup: expired(d, "::/0")},
		{name: "expired v6 /64 over live /32", pkt: tcp6(80), verdict: xdpDrop, reason: rDeny,
			setup: both(expired(d, "2001:db8:1:2::/64"), func(f *fixture) { f.deny("2001:db8::/32") }),
			hits:  []hit{{d, "2001:db8:1:2::/64", false, 0}, {d, "2001:db8::/32", false, 1}}},
		{name: "expired allow host, deny /8", pkt: tcp4(80), verdict: xdpDrop, reason: rDeny,
			setup: both(expired(a, "10.1.2.3/32"), denySrc), hits: []hit{{a, "10.1.2.3/32", false, 0}}},
		{name: "expired allow /24 over live allow /16", pkt: tcp4(80), verdict: xdpPass, reason: rAllow,
			setup: both(expired(a, "10.1.2.0/24"), func(f *fixture) { f.allow("10.1.0.0/16"); f.deny("10.0.0.0/8") }),
			hits:  []hit{{a, "10.1.2.0/24", false, 0}, {a, "10.1.0.0/16", false, 1}}},
		// However many expired entries lie in a row, the walk goes on
		// below them to a live entry or none.
		{name: "three expired deny prefixes fall through", pkt: tcp4(80), verdict: xdpPass, reason: rPass,
			setup: expiredChain(d, "10.1.2.0/24", "10.1.0.0/20", "10.1.0.0/16")},
		{name: "four expired deny prefixes fall through", pkt: tcp4(80), verdict: xdpPass, reason: rPass,
			setup: expiredChain(d, "10.1.2.0/28", "10.1.2.0/24", "10.1.0.0/20", "10.1.0.0/16"),
			hits:  []hit{{d, "10.1.0.0/16", false, 0}}},
		{name: "every length expired, deny /0 live", pkt: tcp4(80), verdict: xdpDrop, reason: rDeny,
			setup: both(expiredLengths(d, "10.1.2.3", 1, 32), func(f *fixture) { f.deny("0.0.0.0/0") }),
			hits:  []hit{{d, "0.0.0.0/0", false, 1}, {d, "10.1.2.3/32", true, 0}}},
		{name: "every v6 length expired, deny /0 live", pkt: tcp6(80), verdict: xdpDrop, reason: rDeny,
			setup: both(expiredLengths(d, "2001:db8:1:2::3", 1, 128), func(f *fixture) { f.deny("::/0") }),
			hits:  []hit{{d, "::/0", false, 1}}},
		{name: "every v6 length expired, nothing live", pkt: tcp6(80), verdict: xdpPass, reason: rPass,
			setup: expiredLengths(d, "2001:db8:1:2::3", 0, 128)},
		{name: "every v6 length expired in the allowlist, allow /16 live", pkt: tcp6(80), verdict: xdpPass, reason: rAllow,
			setup: both(expiredLengths(a, "2001:db8:1:2::3", 17, 128), func(f *fixture) { f.allow("2001::/16"); f.deny("2001:db8::/32") }),
			hits:  []hit{{a, "2001::/16", false, 1}, {d, "2001:db8::/32", false, 0}}},
		{name: "four expired allow prefixes over live allow /8", pkt: tcp4(80), verdict: xdpPass, reason: rAllow,
			setup: both(expiredChain(a, "10.1.2.0/28", "10.1.2.0/24", "10.1.0.0/20", "10.1.0.0/16"), func(f *fixture) { f.allow("10.0.0.0/8"); f.deny("10.0.0.0/8") }),
			hits:  []hit{{a, "10.0.0.0/8", false, 1}, {a, "10.1.0.0/16", false, 0}, {d, "10.0.0.0/8", false, 0}}},
		{name: "three expired allow prefixes over live allow", pkt: tcp4(80), verdict: xdpPass, reason: rAllow,
			setup: both(expiredChain(a, "10.1.2.0/24", "10.1.0.0/20", "10.1.0.0/16"), func(f *fixture) { f.allow("10.0.0.0/8"); f.deny("10.0.0.0/8") }),
			hits:  []hit{{a, "10.0.0.0/8", false, 1}}},
	}
}

// summaryCases cover the deny summary: every other case runs with it in use
// and its bits set as the control plane sets them; these check that a clear
// bit does skip the lookups, and the ways the summary is taken out of use.
func summaryCases() []filterCase {
	d := denyList
	// unmarked puts a deny entry without its summary bits, which only a
	// bug (or a filter of an older version) would do.
	unmarked := func(prefix string) func(*fixture) {
		return func(f *fixture) {
			p := netip.MustParsePrefix(prefix)
			hosts, nets := f.maps(d, p.Addr().Is6())
			m, k := nets, netKey(p)
			if isHost(p) {
				m, k = hosts, hostKey(p.Addr())
			}
			if err := m.Put(k, MoatPrefixRule{Prefixlen: uint32(p.Bits())}); err != nil {
				f.tb.Fatal(err)
			}
		}
	}
	notReady := func(fam MoatDenySummaryFamily) func(*fixture) {
		return func(f *fixture) {
			st := f.summaryState()
			st.Ready &^= uint32(fam)
			f.setSummaryState(st)
		}
	}
	// wideV6 sets the flag the filter sets when it auto-blocks an IPv6
	// prefix shorter than /32.
	wideV6 := func(f *fixture) {
		b := MoatSummaryBlock{}
		b.W[0] = uint64(MoatDenySummaryFamilySUMMARY_V6)
		if err := f.objs.DenySummary.Put(uint32(0), &b); err != nil {
			f.tb.Fatal(err)
		}
	}
	return []filterCase{
		{name: "summary: clear bit skips the deny lookups", pkt: tcp4(80), verdict: xdpPass, reason: rPass,
			setup: unmarked("10.1.2.3/32"), hits: []hit{{d, "10.1.2.3/32", false, 0}}},
		{name: "summary: clear bit skips the v6 deny lookups", pkt: tcp6(80), verdict: xdpPass, reason: rPass,
			setup: unmarked("2001:db8:1:2::/64"), hits: []hit{{d, "2001:db8:1:2::/64", false, 0}}},
		{name: "summary: bit of the neighbour /24 does not cover", pkt: tcp4(80), verdict: xdpPass, reason: rPass,
			setup: both(unmarked("10.1.2.3/32"), func(f *fixture) { f.deny("10.1.3.0/24") })},
		{name: "summary: v4 not ready, looked up", pkt: tcp4(80), verdict: xdpDrop, reason: rDeny,
			setup: both(unmarked("10.1.2.3/32"), notReady(MoatDenySummaryFamilySUMMARY_V4)), hits: []hit{{d, "10.1.2.3/32", false, 1}}},
		{name: "summary: v6 not ready, looked up", pkt: tcp6(80), verdict: xdpDrop, reason: rDeny,
			setup: both(unmarked("2001:db8:1:2::/64"), notReady(MoatDenySummaryFamilySUMMARY_V6))},
		{name: "summary: v6 not ready leaves v4 in use", pkt: tcp4(80), verdict: xdpPass, reason: rPass,
			setup: both(unmarked("10.1.2.3/32"), notReady(MoatDenySummaryFamilySUMMARY_V6))},
		{name: "summary: wide v6 auto-block flag, looked up", pkt: tcp6(80), verdict: xdpDrop, reason: rDeny,
			setup: both(unmarked("2001:db8::/24"), wideV6)},
		{name: "summary: v4 /12 marks each /24", pkt: tcp4(80), verdict: xdpDrop, reason: rDeny,
			setup: func(f *fixture) { f.deny("10.0.0.0/12") }, hits: []hit{{d, "10.0.0.0/12", false, 1}}},
		{name: "summary: v4 /4 marks a run of 2^20 /24s", pkt: tcp4(80), verdict: xdpDrop, reason: rDeny,
			setup: func(f *fixture) { f.deny("0.0.0.0/4") }, hits: []hit{{d, "0.0.0.0/4", false, 1}}},
		{name: "summary: v4 /0 marks every /24", pkt: tcp4From(wildSrc4, 80), verdict: xdpDrop, reason: rDeny,
			setup: func(f *fixture) { f.deny("0.0.0.0/0") }},
		{name: "summary: v6 /24 marks each hashed /32", pkt: tcp6(80), verdict: xdpDrop, reason: rDeny,
			setup: func(f *fixture) { f.deny("2001:d00::/24") }, hits: []hit{{d, "2001:d00::/24", false, 1}}},
		{name: "summary: v6 /8 marks every v6 bit", pkt: tcp6(80), verdict: xdpDrop, reason: rDeny,
			setup: func(f *fixture) { f.deny("2000::/8") }},
	}
}

// expiredLengths puts an expired entry of every length from..to that
// covers addr in list l's trie.
func expiredLengths(l list, addr string, from, to int) func(*fixture) {
	return func(f *fixture) {
		a := netip.MustParseAddr(addr)
		for n := from; n <= to; n++ {
			f.addNet(l, netip.PrefixFrom(a, n).Masked(), f.expiresIn(-time.Second))
		}
	}
}

func expiredChain(l list, prefixes ...string) func(*fixture) {
	return func(f *fixture) {
		for _, p := range prefixes {
			f.add(l, p, f.expiresIn(-time.Second))
		}
	}
}

// TestFilter runs every case through the filter, with the maps cleared
// between cases, and checks the verdict, the one counter slot it must land in
// (packets 1, bytes the frame length), and the rule hit counters.
func TestFilter(t *testing.T) {
	runFilterCases(t, false)
}

// TestFilterMonitorMode runs the same table in monitor mode: every packet
// a case drops passes and is counted in its reason's monitored slot, with
// the same rule hits; every packet a case passes is judged and counted as
// before.
func TestFilterMonitorMode(t *testing.T) {
	runFilterCases(t, true)
}

func runFilterCases(t *testing.T, monitor bool) {
	f := newFixture(t)
	for _, tc := range filterCases() {
		t.Run(tc.name, func(t *testing.T) {
			f.tb = t
			f.reset()
			if tc.setup != nil {
				tc.setup(f)
			}
			wantVerdict := tc.verdict
			idx := uint32(tc.reason) * 2
			if tc.verdict == xdpDrop {
				idx++
			}
			if monitor {
				f.setMonitor(true)
				if tc.verdict == xdpDrop {
					wantVerdict, idx = xdpPass, monitoredSlot(tc.reason)
				}
			}
			got := f.run(tc.pkt)
			if got != wantVerdict {
				t.Errorf("verdict %s, want %s", verdictName(got), verdictName(wantVerdict))
			}
			slots := f.countedSlots()
			want := MoatVerdictCounter{Packets: 1, Bytes: uint64(len(tc.pkt))}
			if len(slots) != 1 || slots[idx] != want {
				t.Errorf("counters %v, want only slot %d (reason %d) = %+v", slots, idx, tc.reason, want)
			}
			for _, h := range tc.hits {
				if n := f.hits(h.list, h.prefix, h.trie); n != h.n {
					t.Errorf("hits of %v in list %d = %d, want %d", h.prefix, h.list, n, h.n)
				}
			}
			for id, n := range tc.portHit {
				if got := f.portHits(id); got != n {
					t.Errorf("port rule %d hits %d, want %d", id, got, n)
				}
			}
			if tc.reason == rPortDrop || tc.reason == rPortAllow {
				if len(tc.portHit) == 0 && f.totalPortHits() != 1 {
					t.Errorf("port rule hits %d, want 1", f.totalPortHits())
				}
			} else if n := f.totalPortHits(); n != 0 {
				t.Errorf("a port rule counted %d hits on a packet it did not decide", n)
			}
		})
	}
}

// totalPortHits sums the hits of every port rule id used in the table.
func (f *fixture) totalPortHits() uint64 {
	var n uint64
	for id := uint16(1); id <= 10; id++ {
		n += f.portHits(id)
	}
	return n
}

// TestCountersAccumulate checks that counters and hits add up over several
// packets of different sizes, not just flip from 0 to 1.
func TestCountersAccumulate(t *testing.T) {
	f := newFixture(t)
	f.deny("10.0.0.0/8")
	var bytes uint64
	for i := 0; i < 5; i++ {
		pkt := testpkt.UDPv4(src4, dst4, testpkt.UDP{DstPort: 9, Payload: make([]byte, 100*i)})
		bytes += uint64(len(pkt))
		if v := f.run(pkt); v != xdpDrop {
			t.Fatalf("packet %d: %s", i, verdictName(v))
		}
	}
	if c := f.counter(rDeny, true); c.Packets != 5 || c.Bytes != bytes {
		t.Errorf("deny counter %+v, want 5 packets %d bytes", c, bytes)
	}
	if h := f.hits(denyList, "10.0.0.0/8", false); h != 5 {
		t.Errorf("hits %d, want 5", h)
	}
}

// TestMonitorModeEntries: an auto-block written in monitor mode
// (RULE_F_MONITOR) is in force only while moat monitors. Out of it, the
// lookup goes on past the entry as past an expired one: to a live prefix
// that covers it, in the host map and in the trie walk alike.
func TestMonitorModeEntries(t *testing.T) {
	const auto, trial = 2, 4 // RULE_F_AUTO, RULE_F_MONITOR
	f := newFixture(t)
	flagged := func(prefix string) func(*fixture) {
		return func(f *fixture) { f.addFlags(denyList, prefix, auto|trial) }
	}
	for _, c := range []struct {
		name    string
		pkt     []byte
		setup   func(*fixture)
		monitor bool
		verdict uint32
		slot    uint32
		hit     hit
	}{
		{"host, monitoring", tcp4(80), flagged("10.1.2.3/32"), true, xdpPass, monitoredSlot(rDeny), hit{denyList, "10.1.2.3/32", false, 1}},
		{"host, enforcing", tcp4(80), flagged("10.1.2.3/32"), false, xdpPass, uint32(rPass) * 2, hit{denyList, "10.1.2.3/32", false, 0}},
		{"host over a live /8, enforcing", tcp4(80), both(flagged("10.1.2.3/32"), func(f *fixture) { f.deny("10.0.0.0/8") }),
			false, xdpDrop, uint32(rDeny)*2 + 1, hit{denyList, "10.0.0.0/8", false, 1}},
		{"v6 /64 over a live /32, enforcing", tcp6(80), both(flagged("2001:db8:1:2::/64"), func(f *fixture) { f.deny("2001:db8::/32") }),
			false, xdpDrop, uint32(rDeny)*2 + 1, hit{denyList, "2001:db8::/32", false, 1}},
		{"v6 /56 and /64 over nothing, enforcing", tcp6(80), both(flagged("2001:db8:1:2::/64"), flagged("2001:db8:1::/56")),
			false, xdpPass, uint32(rPass) * 2, hit{denyList, "2001:db8:1::/56", false, 0}},
		{"v6 /64, monitoring", tcp6(80), flagged("2001:db8:1:2::/64"), true, xdpPass, monitoredSlot(rDeny), hit{denyList, "2001:db8:1:2::/64", false, 1}},
	} {
		t.Run(c.name, func(t *testing.T) {
			f.tb = t
			f.reset()
			c.setup(f)
			f.setMonitor(c.monitor)
			if got := f.run(c.pkt); got != c.verdict {
				t.Errorf("verdict %s, want %s", verdictName(got), verdictName(c.verdict))
			}
			want := MoatVerdictCounter{Packets: 1, Bytes: uint64(len(c.pkt))}
			if slots := f.countedSlots(); len(slots) != 1 || slots[c.slot] != want {
				t.Errorf("counters %v, want only slot %d = %+v", slots, c.slot, want)
			}
			if n := f.hits(c.hit.list, c.hit.prefix, c.hit.trie); n != c.hit.n {
				t.Errorf("hits of %s = %d, want %d", c.hit.prefix, n, c.hit.n)
			}
		})
	}
}
