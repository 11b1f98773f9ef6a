// Package testpkt builds Ethernet frames for tests: VLAN tags, IPv4 with
// options and fragments, IPv6 with extension headers, TCP with options, UDP,
// ICMP, ICMPv6, ARP and LLDP, with correct lengths and checksums.
//
// A frame is described layer by layer and serialised with gopacket:
//
//	pkt := testpkt.TCPv4(src, dst, testpkt.TCP{SYN: true, DstPort: 80})
//
//	pkt := testpkt.Frame{
//		Tags: testpkt.QinQ(100, 200),
//		Net:  testpkt.IPv6{Src: src, Dst: dst, Ext: []testpkt.IPv6Ext{testpkt.HopByHop{}}},
//		L4:   testpkt.UDP{SrcPort: 5000, DstPort: 53, Payload: []byte("query")},
//	}.Bytes()
//
// Fields that tests of malformed packets need to get wrong (IPv4 IHL and
// total length, IPv6 payload length, TCP data offset, UDP length) can be
// overridden; every checksum is then recomputed so that the override is the
// only thing wrong with the packet.
package testpkt

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
)

// Default addresses of frames that do not name their own.
var (
	DefaultSrcMAC = net.HardwareAddr{0x02, 0x00, 0x00, 0x00, 0x00, 0x01}
	DefaultDstMAC = net.HardwareAddr{0x02, 0x00, 0x00, 0x00, 0x00, 0x02}
)

// Tag protocol identifiers.
const (
	TPID8021Q  uint16 = 0x8100 // customer VLAN tag
	TPID8021AD uint16 = 0x88a8 // service (outer, QinQ) tag
)

// Tag is one VLAN tag.
type Tag struct {
	TPID     uint16 // TPID8021Q when zero
	VLAN     uint16 // 12-bit VLAN identifier
	Priority uint8
}

// VLAN returns one 802.1Q tag.
func VLAN(id uint16) []Tag { return []Tag{{TPID: TPID8021Q, VLAN: id}} }

// QinQ returns an 802.1ad service tag followed by an 802.1Q customer tag.
func QinQ(outer, inner uint16) []Tag {
	return []Tag{{TPID: TPID8021AD, VLAN: outer}, {TPID: TPID8021Q, VLAN: inner}}
}

// Frame is an Ethernet frame described layer by layer.
type Frame struct {
	SrcMAC, DstMAC net.HardwareAddr // DefaultSrcMAC/DefaultDstMAC when nil
	Tags           []Tag            // outermost first
	Net            Network          // IPv4, IPv6, ARP, LLDP or EtherPayload
	L4             Transport        // TCP, UDP, ICMPv4, ICMPv6, Payload or nil; only under IPv4/IPv6
}

// Network is what an Ethernet frame carries: IPv4, IPv6, ARP, LLDP or
// EtherPayload.
type Network interface{ etherType() uint16 }

// Transport is what an IP packet carries: TCP, UDP, ICMPv4, ICMPv6 or
// Payload.
type Transport interface{ ipProto() uint8 }

// IPv4 is an IPv4 header.
type IPv4 struct {
	Src, Dst netip.Addr
	TTL      uint8 // 64 when zero
	TOS      uint8
	ID       uint16
	DF, MF   bool   // don't fragment, more fragments
	FragOff  uint16 // fragment offset in 8-byte units
	Options  []IPv4Option
	Protocol uint8 // taken from L4 when zero

	// Overrides for malformed-packet tests; zero means computed.
	IHL         uint8  // header length field, in 32-bit words
	TotalLength uint16 // total length field
}

// IPv4Option is one IPv4 header option; the header is padded to a multiple
// of 4 bytes with end-of-list bytes.
type IPv4Option = layers.IPv4Option

// RouterAlert returns the IPv4 router alert option (RFC 2113).
func RouterAlert() IPv4Option {
	return IPv4Option{OptionType: 148, OptionLength: 4, OptionData: []byte{0, 0}}
}

// IPv4NOP returns the one-byte no-operation option.
func IPv4NOP() IPv4Option { return IPv4Option{OptionType: 1} }

// IPv6 is an IPv6 header with its extension headers.
type IPv6 struct {
	Src, Dst     netip.Addr
	HopLimit     uint8 // 64 when zero
	TrafficClass uint8
	FlowLabel    uint32
	Ext          []IPv6Ext // extension headers in order

	// Override for malformed-packet tests; zero means computed.
	PayloadLength uint16
}

// ARP is an Ethernet/IPv4 ARP message.
type ARP struct {
	Op                   uint16 // 1 request, 2 reply; 1 when zero
	SenderMAC, TargetMAC net.HardwareAddr
	SenderIP, TargetIP   netip.Addr
}

// LLDP is a minimal LLDP data unit (chassis ID, port ID, TTL).
type LLDP struct {
	ChassisMAC net.HardwareAddr
	Port       string
	TTL        uint16
}

// EtherPayload is an arbitrary EtherType with raw contents.
type EtherPayload struct {
	Type uint16
	Data []byte
}

// TCP is a TCP header and payload.
type TCP struct {
	SrcPort, DstPort                       uint16
	Seq, Ack                               uint32
	SYN, ACK, FIN, RST, PSH, URG, ECE, CWR bool
	Window                                 uint16 // 65535 when zero
	Options                                []TCPOption
	Payload                                []byte

	// Override for malformed-packet tests; zero means computed.
	DataOffset uint8 // in 32-bit words
}

// UDP is a UDP header and payload.
type UDP struct {
	SrcPort, DstPort uint16
	Payload          []byte

	// Override for malformed-packet tests; zero means computed.
	Length uint16
}

// ICMPv4 is an ICMP message; ID and Seq fill the 4-byte rest of header.
type ICMPv4 struct {
	Type, Code uint8
	ID, Seq    uint16
	Payload    []byte
}

// ICMPv6 is an ICMPv6 message; ID and Seq fill the 4-byte rest of header.
type ICMPv6 struct {
	Type, Code uint8
	ID, Seq    uint16
	Payload    []byte
}

// Payload is raw upper-layer bytes with a protocol number, e.g. the data of
// a non-first fragment, or a protocol that has no builder here.
type Payload struct {
	Proto uint8
	Data  []byte
}

// IP protocol numbers used by this package and its users.
const (
	ProtoHopByHop = 0
	ProtoICMP     = 1
	ProtoTCP      = 6
	ProtoUDP      = 17
	ProtoRouting  = 43
	ProtoFragment = 44
	ProtoESP      = 50
	ProtoAH       = 51
	ProtoICMPv6   = 58
	ProtoNoNext   = 59
	ProtoDstOpts  = 60
)

// ICMP types used by tests.
const (
	ICMPv4EchoReply   = 0
	ICMPv4EchoRequest = 8
	ICMPv6EchoRequest = 128
	ICMPv6EchoReply   = 129
)

func (IPv4) etherType() uint16           { return uint16(layers.EthernetTypeIPv4) }
func (IPv6) etherType() uint16           { return uint16(layers.EthernetTypeIPv6) }
func (ARP) etherType() uint16            { return uint16(layers.EthernetTypeARP) }
func (LLDP) etherType() uint16           { return uint16(layers.EthernetTypeLinkLayerDiscovery) }
func (e EtherPayload) etherType() uint16 { return e.Type }

func (TCP) ipProto() uint8       { return ProtoTCP }
func (UDP) ipProto() uint8       { return ProtoUDP }
func (ICMPv4) ipProto() uint8    { return ProtoICMP }
func (ICMPv6) ipProto() uint8    { return ProtoICMPv6 }
func (p Payload) ipProto() uint8 { return p.Proto }

// TCPv4 returns an Ethernet/IPv4/TCP frame.
func TCPv4(src, dst netip.Addr, t TCP) []byte {
	return Frame{Net: IPv4{Src: src, Dst: dst}, L4: t}.Bytes()
}

// TCPv6 returns an Ethernet/IPv6/TCP frame.
func TCPv6(src, dst netip.Addr, t TCP) []byte {
	return Frame{Net: IPv6{Src: src, Dst: dst}, L4: t}.Bytes()
}

// UDPv4 returns an Ethernet/IPv4/UDP frame.
func UDPv4(src, dst netip.Addr, u UDP) []byte {
	return Frame{Net: IPv4{Src: src, Dst: dst}, L4: u}.Bytes()
}

// UDPv6 returns an Ethernet/IPv6/UDP frame.
func UDPv6(src, dst netip.Addr, u UDP) []byte {
	return Frame{Net: IPv6{Src: src, Dst: dst}, L4: u}.Bytes()
}

// IP returns a frame carrying l4 over IPv4 or IPv6, whichever src is.
func IP(src, dst netip.Addr, l4 Transport) []byte {
	return Frame{Net: Net(src, dst), L4: l4}.Bytes()
}

// Net is a plain IPv4 or IPv6 header from src to dst, whichever src is.
func Net(src, dst netip.Addr) Network {
	if src.Is4() {
		return IPv4{Src: src, Dst: dst}
	}
	return IPv6{Src: src, Dst: dst}
}

// Bytes serialises the frame and panics on error: frames in tests are
// literals, so an error is a bug in the test.
func (f Frame) Bytes() []byte {
	b, err := f.Build()
	if err != nil {
		panic(fmt.Sprintf("testpkt: %v", err))
	}
	return b
}

// Build serialises the frame.
func (f Frame) Build() ([]byte, error) {
	if f.Net == nil {
		return nil, fmt.Errorf("frame has no network layer")
	}
	var ls []gopacket.SerializableLayer

	eth := &layers.Ethernet{SrcMAC: f.SrcMAC, DstMAC: f.DstMAC}
	if eth.SrcMAC == nil {
		eth.SrcMAC = DefaultSrcMAC
	}
	if eth.DstMAC == nil {
		eth.DstMAC = DefaultDstMAC
		if _, ok := f.Net.(LLDP); ok {
			eth.DstMAC = net.HardwareAddr{0x01, 0x80, 0xc2, 0x00, 0x00, 0x0e}
		}
	}
	ls = append(ls, eth)
	// Each tag's type field names what follows it.
	next := &eth.EthernetType
	for _, t := range f.Tags {
		tpid := t.TPID
		if tpid == 0 {
			tpid = TPID8021Q
		}
		*next = layers.EthernetType(tpid)
		q := &layers.Dot1Q{VLANIdentifier: t.VLAN, Priority: t.Priority}
		ls = append(ls, q)
		next = &q.Type
	}
	*next = layers.EthernetType(f.Net.etherType())

	// Markers record how many bytes follow them, to find the L3 and L4
	// offsets for the overrides below.
	var l3Len, l4Len int
	ls = append(ls, marker{&l3Len})

	var nl gopacket.NetworkLayer
	switch n := f.Net.(type) {
	case IPv4:
		ip, err := n.layer(f.L4)
		if err != nil {
			return nil, err
		}
		nl = ip
		ls = append(ls, ip)
	case IPv6:
		ip, err := n.layer()
		if err != nil {
			return nil, err
		}
		nl = ip
		ls = append(ls, ip)
		// The chain of next-header fields runs from the IPv6 header
		// through every extension to the upper layer.
		setNext := func(p uint8) { ip.NextHeader = layers.IPProtocol(p) }
		for _, e := range n.Ext {
			setNext(e.extProto())
			l, sn := e.layer()
			ls = append(ls, l)
			setNext = sn
		}
		setNext(upperProto(f.L4))
	case ARP:
		ls = append(ls, n.layer())
	case LLDP:
		ls = append(ls, n.layer())
	case EtherPayload:
		ls = append(ls, gopacket.Payload(n.Data))
	default:
		return nil, fmt.Errorf("unknown network layer %T", f.Net)
	}
	if f.L4 != nil && nl == nil {
		return nil, fmt.Errorf("%T cannot carry %T", f.Net, f.L4)
	}

	ls = append(ls, marker{&l4Len})
	if f.L4 != nil {
		l4, err := transportLayers(f.L4, nl)
		if err != nil {
			return nil, err
		}
		ls = append(ls, l4...)
	}

	buf := gopacket.NewSerializeBuffer()
	opts := gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}
	if err := gopacket.SerializeLayers(buf, opts, ls...); err != nil {
		return nil, err
	}
	out := append([]byte(nil), buf.Bytes()...)
	// Ethernet pads short frames to 60 bytes, so offsets count from the
	// front; the IP datagram ends l3Len bytes after its start.
	l3 := 14 + 4*len(f.Tags)
	l4 := l3 + l3Len - l4Len
	if err := f.applyOverrides(out[:l3+l3Len], l3, l4); err != nil {
		return nil, err
	}
	return out, nil
}

func upperProto(l4 Transport) uint8 {
	if l4 == nil {
		return ProtoNoNext
	}
	return l4.ipProto()
}

func (n IPv4) layer(l4 Transport) (*layers.IPv4, error) {
	if !n.Src.Is4() || !n.Dst.Is4() {
		return nil, fmt.Errorf("IPv4 needs IPv4 addresses, have %v -> %v", n.Src, n.Dst)
	}
	ip := &layers.IPv4{
		Version:    4,
		TOS:        n.TOS,
		Id:         n.ID,
		TTL:        n.TTL,
		FragOffset: n.FragOff,
		Protocol:   layers.IPProtocol(n.Protocol),
		SrcIP:      n.Src.AsSlice(),
		DstIP:      n.Dst.AsSlice(),
		Options:    n.Options,
	}
	if ip.TTL == 0 {
		ip.TTL = 64
	}
	if n.DF {
		ip.Flags |= layers.IPv4DontFragment
	}
	if n.MF {
		ip.Flags |= layers.IPv4MoreFragments
	}
	if ip.Protocol == 0 && l4 != nil {
		ip.Protocol = layers.IPProtocol(l4.ipProto())
	}
	return ip, nil
}

func (n IPv6) layer() (*layers.IPv6, error) {
	// IPv4-mapped addresses are IPv6 addresses on the wire (an attacker
	// may send them); plain IPv4 ones are a mistake.
	if !n.Src.Is6() || !n.Dst.Is6() {
		return nil, fmt.Errorf("IPv6 needs IPv6 addresses, have %v -> %v", n.Src, n.Dst)
	}
	ip := &layers.IPv6{
		Version:      6,
		TrafficClass: n.TrafficClass,
		FlowLabel:    n.FlowLabel,
		HopLimit:     n.HopLimit,
		SrcIP:        n.Src.AsSlice(),
		DstIP:        n.Dst.AsSlice(),
	}
	if ip.HopLimit == 0 {
		ip.HopLimit = 64
	}
	return ip, nil
}

func (a ARP) layer() *layers.ARP {
	op := a.Op
	if op == 0 {
		op = layers.ARPRequest
	}
	smac, tmac := a.SenderMAC, a.TargetMAC
	if smac == nil {
		smac = DefaultSrcMAC
	}
	if tmac == nil {
		tmac = net.HardwareAddr{0, 0, 0, 0, 0, 0}
	}
	sip, tip := a.SenderIP, a.TargetIP
	if !sip.IsValid() {
		sip = netip.IPv4Unspecified()
	}
	if !tip.IsValid() {
		tip = netip.IPv4Unspecified()
	}
	return &layers.ARP{
		AddrType:          layers.LinkTypeEthernet,
		Protocol:          layers.EthernetTypeIPv4,
		HwAddressSize:     6,
		ProtAddressSize:   4,
		Operation:         op,
		SourceHwAddress:   smac,
		SourceProtAddress: sip.AsSlice(),
		DstHwAddress:      tmac,
		DstProtAddress:    tip.AsSlice(),
	}
}

func (l LLDP) layer() *layers.LinkLayerDiscovery {
	mac := l.ChassisMAC
	if mac == nil {
		mac = DefaultSrcMAC
	}
	port := l.Port
	if port == "" {
		port = "eth0"
	}
	ttl := l.TTL
	if ttl == 0 {
		ttl = 120
	}
	return &layers.LinkLayerDiscovery{
		ChassisID: layers.LLDPChassisID{Subtype: layers.LLDPChassisIDSubTypeMACAddr, ID: mac},
		PortID:    layers.LLDPPortID{Subtype: layers.LLDPPortIDSubtypeIfaceName, ID: []byte(port)},
		TTL:       ttl,
	}
}

func transportLayers(l4 Transport, nl gopacket.NetworkLayer) ([]gopacket.SerializableLayer, error) {
	switch t := l4.(type) {
	case TCP:
		tcp := &layers.TCP{
			SrcPort: layers.TCPPort(t.SrcPort), DstPort: layers.TCPPort(t.DstPort),
			Seq: t.Seq, Ack: t.Ack,
			SYN: t.SYN, ACK: t.ACK, FIN: t.FIN, RST: t.RST, PSH: t.PSH, URG: t.URG, ECE: t.ECE, CWR: t.CWR,
			Window:  t.Window,
			Options: t.Options,
		}
		if tcp.Window == 0 {
			tcp.Window = 65535
		}
		if err := tcp.SetNetworkLayerForChecksum(nl); err != nil {
			return nil, err
		}
		return []gopacket.SerializableLayer{tcp, gopacket.Payload(t.Payload)}, nil
	case UDP:
		udp := &layers.UDP{SrcPort: layers.UDPPort(t.SrcPort), DstPort: layers.UDPPort(t.DstPort)}
		if err := udp.SetNetworkLayerForChecksum(nl); err != nil {
			return nil, err
		}
		return []gopacket.SerializableLayer{udp, gopacket.Payload(t.Payload)}, nil
	case ICMPv4:
		if _, ok := nl.(*layers.IPv4); !ok {
			// Still buildable as raw bytes; the filter must cope with it.
			return rawICMP(t.Type, t.Code, t.ID, t.Seq, t.Payload), nil
		}
		ic := &layers.ICMPv4{
			TypeCode: layers.CreateICMPv4TypeCode(t.Type, t.Code),
			Id:       t.ID, Seq: t.Seq,
		}
		return []gopacket.SerializableLayer{ic, gopacket.Payload(t.Payload)}, nil
	case ICMPv6:
		ip6, ok := nl.(*layers.IPv6)
		if !ok {
			return rawICMP(t.Type, t.Code, t.ID, t.Seq, t.Payload), nil
		}
		ic := &layers.ICMPv6{TypeCode: layers.CreateICMPv6TypeCode(t.Type, t.Code)}
		if err := ic.SetNetworkLayerForChecksum(ip6); err != nil {
			return nil, err
		}
		// gopacket's ICMPv6 layer is only the first 4 bytes; the rest of
		// header goes in front of the payload so that the checksum covers it.
		rest := make([]byte, 4, 4+len(t.Payload))
		binary.BigEndian.PutUint16(rest, t.ID)
		binary.BigEndian.PutUint16(rest[2:], t.Seq)
		return []gopacket.SerializableLayer{ic, gopacket.Payload(append(rest, t.Payload...))}, nil
	case Payload:
		return []gopacket.SerializableLayer{gopacket.Payload(t.Data)}, nil
	}
	return nil, fmt.Errorf("unknown transport layer %T", l4)
}

// rawICMP is an ICMP-shaped header without a checksum, for ICMP carried by
// the wrong IP version.
func rawICMP(typ, code uint8, id, seq uint16, payload []byte) []gopacket.SerializableLayer {
	h := make([]byte, 8, 8+len(payload))
	h[0], h[1] = typ, code
	binary.BigEndian.PutUint16(h[4:], id)
	binary.BigEndian.PutUint16(h[6:], seq)
	return []gopacket.SerializableLayer{gopacket.Payload(append(h, payload...))}
}

// marker prepends nothing; it records how many bytes follow it.
type marker struct{ n *int }

func (m marker) LayerType() gopacket.LayerType { return gopacket.LayerTypePayload }
func (m marker) SerializeTo(b gopacket.SerializeBuffer, _ gopacket.SerializeOptions) error {
	*m.n = len(b.Bytes())
	return nil
}

// applyOverrides writes the deliberately wrong length fields and recomputes
// the checksums they invalidate. b ends where the IP datagram ends.
func (f Frame) applyOverrides(b []byte, l3, l4 int) error {
	l4Changed := false
	switch n := f.Net.(type) {
	case IPv4:
		hdr := b[l3 : l3+int(b[l3]&0x0f)*4]
		if n.IHL != 0 {
			b[l3] = 0x40 | n.IHL&0x0f
		}
		if n.TotalLength != 0 {
			binary.BigEndian.PutUint16(b[l3+2:], n.TotalLength)
		}
		if n.IHL != 0 || n.TotalLength != 0 {
			hdr[10], hdr[11] = 0, 0
			binary.BigEndian.PutUint16(hdr[10:], ^fold(sum(0, hdr)))
		}
	case IPv6:
		if n.PayloadLength != 0 {
			binary.BigEndian.PutUint16(b[l3+4:], n.PayloadLength)
		}
	}
	switch t := f.L4.(type) {
	case TCP:
		if t.DataOffset != 0 {
			b[l4+12] = t.DataOffset<<4 | b[l4+12]&0x0f
			l4Changed = true
		}
	case UDP:
		if t.Length != 0 {
			binary.BigEndian.PutUint16(b[l4+4:], t.Length)
			l4Changed = true
		}
	}
	if !l4Changed {
		return nil
	}
	src, dst := l3Addrs(f.Net)
	csumOff := 16
	if f.L4.ipProto() == ProtoUDP {
		csumOff = 6
	}
	seg := b[l4:]
	seg[csumOff], seg[csumOff+1] = 0, 0
	c := TransportChecksum(src, dst, f.L4.ipProto(), seg)
	if c == 0 && f.L4.ipProto() == ProtoUDP {
		c = 0xffff // zero means "no checksum" in UDP
	}
	binary.BigEndian.PutUint16(seg[csumOff:], c)
	return nil
}

func l3Addrs(n Network) (netip.Addr, netip.Addr) {
	switch n := n.(type) {
	case IPv4:
		return n.Src, n.Dst
	case IPv6:
		return n.Src, n.Dst
	}
	return netip.Addr{}, netip.Addr{}
}

// TransportChecksum returns the Internet checksum of an upper-layer segment
// (with its checksum field zeroed) and the IPv4 or IPv6 pseudo header. A
// segment whose checksum field is filled in sums to zero.
func TransportChecksum(src, dst netip.Addr, proto uint8, seg []byte) uint16 {
	var s uint32
	s = sum(s, src.AsSlice())
	s = sum(s, dst.AsSlice())
	var tail [8]byte
	if src.Is4() {
		binary.BigEndian.PutUint16(tail[0:], uint16(proto))
		binary.BigEndian.PutUint16(tail[2:], uint16(len(seg)))
		s = sum(s, tail[:4])
	} else {
		binary.BigEndian.PutUint32(tail[0:], uint32(len(seg)))
		tail[7] = proto
		s = sum(s, tail[:])
	}
	return ^fold(sum(s, seg))
}

// IPv4HeaderChecksum returns the checksum of an IPv4 header; a header with a
// correct checksum gives zero.
func IPv4HeaderChecksum(hdr []byte) uint16 { return ^fold(sum(0, hdr)) }

func sum(s uint32, b []byte) uint32 {
	for i := 0; i+1 < len(b); i += 2 {
		s += uint32(b[i])<<8 | uint32(b[i+1])
	}
	if len(b)%2 == 1 {
		s += uint32(b[len(b)-1]) << 8
	}
	return s
}

func fold(s uint32) uint16 {
	for s > 0xffff {
		s = s>>16 + s&0xffff
	}
	return uint16(s)
}

// Decode parses a frame with gopacket, for tests that inspect what a program
// sent back.
func Decode(b []byte) gopacket.Packet {
	return gopacket.NewPacket(b, layers.LayerTypeEthernet, gopacket.Default)
}
