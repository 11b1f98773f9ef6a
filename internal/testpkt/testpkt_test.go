package testpkt

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net/netip"
	"testing"

	"github.com/google/gopacket/layers"
)

var (
	src4 = netip.MustParseAddr("192.0.2.1")
	dst4 = netip.MustParseAddr("198.51.100.2")
	src6 = netip.MustParseAddr("2001:db8::1")
	dst6 = netip.MustParseAddr("2001:db8:1::2")
)

// sumsToZero reports whether a segment with its checksum filled in verifies.
func verifyL4(t *testing.T, src, dst netip.Addr, proto uint8, seg []byte) {
	t.Helper()
	if c := TransportChecksum(src, dst, proto, seg); c != 0 {
		t.Errorf("protocol %d checksum does not verify (residue %#04x)", proto, c)
	}
}

func TestTCPv4WithOptions(t *testing.T) {
	b := Frame{
		Tags: VLAN(7),
		Net:  IPv4{Src: src4, Dst: dst4, Options: []IPv4Option{RouterAlert(), IPv4NOP()}},
		L4: TCP{SrcPort: 40000, DstPort: 80, Seq: 1, SYN: true, Options: []layers.TCPOption{
			MSS(1460), SACKPermitted(), Timestamps(1, 0), TCPNOP(), WindowScale(7),
		}, Payload: []byte("hi")},
	}.Bytes()

	p := Decode(b)
	if p.ErrorLayer() != nil {
		t.Fatalf("decode: %v", p.ErrorLayer().Error())
	}
	q := p.Layer(layers.LayerTypeDot1Q).(*layers.Dot1Q)
	if q.VLANIdentifier != 7 || q.Type != layers.EthernetTypeIPv4 {
		t.Errorf("tag = %+v", q)
	}
	ip := p.Layer(layers.LayerTypeIPv4).(*layers.IPv4)
	if ip.IHL != 7 || ip.Protocol != layers.IPProtocolTCP || !bytes.Equal(ip.SrcIP, src4.AsSlice()) {
		t.Errorf("ip = IHL %d proto %v src %v", ip.IHL, ip.Protocol, ip.SrcIP)
	}
	if int(ip.Length) != len(b)-18 {
		t.Errorf("total length %d, frame carries %d", ip.Length, len(b)-18)
	}
	if IPv4HeaderChecksum(b[18:18+28]) != 0 {
		t.Error("IPv4 header checksum does not verify")
	}
	tcp := p.Layer(layers.LayerTypeTCP).(*layers.TCP)
	if !tcp.SYN || tcp.ACK || tcp.DstPort != 80 || tcp.DataOffset != 5+5 || string(tcp.Payload) != "hi" {
		t.Errorf("tcp = %+v", tcp)
	}
	verifyL4(t, src4, dst4, ProtoTCP, b[18+28:])
}

func TestIPv6ExtensionChain(t *testing.T) {
	chain := []IPv6Ext{
		HopByHop{Options: []IPv6TLV{{Type: 5, Data: []byte{0, 0}}}}, // router alert
		Routing{Type: 2, Addresses: []netip.Addr{dst6}},
		DestOpts{},
		Fragment{ID: 9},
		AH{SPI: 0x100, Seq: 1},
	}
	b := Frame{Net: IPv6{Src: src6, Dst: dst6, Ext: chain}, L4: UDP{SrcPort: 5353, DstPort: 53, Payload: []byte("q")}}.Bytes()

	// Walk the chain by hand, as the filter does.
	wantProto := []uint8{ProtoHopByHop, ProtoRouting, ProtoDstOpts, ProtoFragment, ProtoAH, ProtoUDP}
	wantLen := []int{8, 24, 8, 8, 24}
	if got := binary.BigEndian.Uint16(b[14+4:]); int(got) != len(b)-54 {
		t.Fatalf("payload length %d, frame carries %d", got, len(b)-54)
	}
	next, off := b[14+6], 54
	for i, want := range wantProto {
		if next != want {
			t.Fatalf("header %d is protocol %d, want %d", i, next, want)
		}
		if i == len(wantLen) {
			break
		}
		var n int
		switch next {
		case ProtoAH:
			n = (int(b[off+1]) + 2) * 4
		case ProtoFragment:
			n = 8
		default:
			n = (int(b[off+1]) + 1) * 8
		}
		if n != wantLen[i] {
			t.Errorf("header %d is %d bytes, want %d", i, n, wantLen[i])
		}
		next, off = b[off], off+n
	}
	if binary.BigEndian.Uint16(b[off+2:]) != 53 || binary.BigEndian.Uint16(b[off+4:]) != 9 {
		t.Errorf("udp header %x", b[off:off+8])
	}
	verifyL4(t, src6, dst6, ProtoUDP, b[off:])

	// gopacket reads the headers it knows (not routing type 2) the same way.
	b = Frame{Net: IPv6{Src: src6, Dst: dst6, Ext: []IPv6Ext{HopByHop{}, DestOpts{}, Fragment{}}}, L4: UDP{DstPort: 53}}.Bytes()
	p := Decode(b)
	if p.Layer(layers.LayerTypeIPv6Destination) == nil || p.Layer(layers.LayerTypeIPv6Fragment) == nil {
		t.Errorf("gopacket does not see the chain: %v", p)
	}
}

func TestQinQ(t *testing.T) {
	b := Frame{Tags: QinQ(100, 200), Net: IPv6{Src: src6, Dst: dst6}, L4: ICMPv6{Type: ICMPv6EchoRequest, ID: 1, Seq: 2}}.Bytes()
	if et := binary.BigEndian.Uint16(b[12:]); et != TPID8021AD {
		t.Errorf("outer TPID %#x", et)
	}
	if et := binary.BigEndian.Uint16(b[16:]); et != TPID8021Q {
		t.Errorf("inner TPID %#x", et)
	}
	if et := binary.BigEndian.Uint16(b[20:]); et != 0x86dd {
		t.Errorf("inner type %#x", et)
	}
	if vid := binary.BigEndian.Uint16(b[18:]) & 0xfff; vid != 200 {
		t.Errorf("inner VLAN %d", vid)
	}
	icmp := b[22+40:]
	if icmp[0] != ICMPv6EchoRequest || binary.BigEndian.Uint16(icmp[4:]) != 1 || binary.BigEndian.Uint16(icmp[6:]) != 2 {
		t.Errorf("icmpv6 %x", icmp)
	}
	verifyL4(t, src6, dst6, ProtoICMPv6, icmp)
}

func TestICMPv4(t *testing.T) {
	b := IP(src4, dst4, ICMPv4{Type: ICMPv4EchoRequest, ID: 3, Seq: 4, Payload: []byte("ping")})
	icmp := b[34:]
	if icmp[0] != ICMPv4EchoRequest {
		t.Errorf("type %d", icmp[0])
	}
	if fold(sum(0, icmp)) != 0xffff {
		t.Error("ICMP checksum does not verify")
	}
}

func TestShortFramesArePadded(t *testing.T) {
	b := UDPv4(src4, dst4, UDP{SrcPort: 1, DstPort: 2})
	if len(b) != 60 {
		t.Fatalf("frame is %d bytes, want 60", len(b))
	}
	if tl := binary.BigEndian.Uint16(b[16:]); tl != 28 {
		t.Errorf("total length %d, want 28 (padding is not part of the datagram)", tl)
	}
	verifyL4(t, src4, dst4, ProtoUDP, b[34:42])
}

func TestOverrides(t *testing.T) {
	b := Frame{Net: IPv4{Src: src4, Dst: dst4, IHL: 4, TotalLength: 1000}, L4: UDP{DstPort: 9, Length: 4, Payload: []byte("xxxx")}}.Bytes()
	if b[14]&0x0f != 4 || binary.BigEndian.Uint16(b[16:]) != 1000 {
		t.Errorf("ip header %x", b[14:34])
	}
	if IPv4HeaderChecksum(b[14:34]) != 0 {
		t.Error("IPv4 checksum not recomputed after override")
	}
	if binary.BigEndian.Uint16(b[38:]) != 4 {
		t.Errorf("udp length %d", binary.BigEndian.Uint16(b[38:]))
	}
	verifyL4(t, src4, dst4, ProtoUDP, b[34:46])

	b = Frame{Net: IPv6{Src: src6, Dst: dst6, PayloadLength: 999}, L4: TCP{DstPort: 22, DataOffset: 3}}.Bytes()
	if binary.BigEndian.Uint16(b[18:]) != 999 || b[54+12]>>4 != 3 {
		t.Errorf("overrides not applied: %x", b)
	}
	verifyL4(t, src6, dst6, ProtoTCP, b[54:])
}

func TestNonIP(t *testing.T) {
	arp := Frame{Net: ARP{SenderIP: src4, TargetIP: dst4}}.Bytes()
	a, ok := Decode(arp).Layer(layers.LayerTypeARP).(*layers.ARP)
	if !ok || a.Operation != layers.ARPRequest || !bytes.Equal(a.DstProtAddress, dst4.AsSlice()) {
		t.Errorf("arp = %+v", a)
	}
	lldp := Frame{Net: LLDP{Port: "veth0"}}.Bytes()
	l, ok := Decode(lldp).Layer(layers.LayerTypeLinkLayerDiscovery).(*layers.LinkLayerDiscovery)
	if !ok || string(l.PortID.ID) != "veth0" || l.TTL != 120 {
		t.Errorf("lldp = %+v", l)
	}
	if binary.BigEndian.Uint16(lldp[12:]) != 0x88cc {
		t.Errorf("lldp ethertype %#x", binary.BigEndian.Uint16(lldp[12:]))
	}
}

func TestErrors(t *testing.T) {
	for name, f := range map[string]Frame{
		"no network layer": {},
		"v6 addr in v4":    {Net: IPv4{Src: src6, Dst: dst4}},
		"v4 addr in v6":    {Net: IPv6{Src: src4, Dst: dst6}},
		"tcp over arp":     {Net: ARP{}, L4: TCP{}},
	} {
		if _, err := f.Build(); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

func ExampleTCPv4() {
	syn := TCPv4(netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2"),
		TCP{SYN: true, SrcPort: 40000, DstPort: 80, Options: []TCPOption{MSS(1460)}})
	tcp := Decode(syn).Layer(layers.LayerTypeTCP).(*layers.TCP)
	// 14 + 20 + 24 bytes, padded to the 60-byte Ethernet minimum.
	fmt.Println(len(syn), tcp.SYN, tcp.DstPort)
	// Output: 60 true 80(http)
}
