package flood

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
)

// Kind names an attack.
type Kind string

const (
	KindSYN           Kind = "syn"             // TCP SYN with the options a Linux client sends
	KindACK           Kind = "ack"             // TCP ACK with random sequence and ack numbers
	KindUDP           Kind = "udp"             // UDP datagrams of PayloadSize bytes
	KindICMP          Kind = "icmp"            // ICMP or ICMPv6 echo requests
	KindSYNRandomPort Kind = "syn-random-port" // SYN to a random destination port per frame
	KindTLSHello      Kind = "tls-hello"       // a TLS ClientHello as PSH|ACK on a fresh 4-tuple per frame
	KindQUICInitial   Kind = "quic-initial"    // a QUIC v1 client Initial of 1200 bytes from a fresh source port per frame
)

// Kinds lists every attack kind, in the order the CLI documents them.
var Kinds = []Kind{KindSYN, KindACK, KindUDP, KindICMP, KindSYNRandomPort, KindTLSHello, KindQUICInitial}

// Default payload sizes: a UDP datagram that makes a 64-byte IPv4 frame
// with FCS, and the 56 bytes of data that ping sends.
const (
	DefaultUDPPayload  = 18
	DefaultICMPPayload = 56
	// DefaultServerName is the SNI of tls-hello floods.
	DefaultServerName = "moat.test"
	// maxIPPacket keeps frames within a standard 1500-byte MTU.
	maxIPPacket = 1500
)

const (
	templateTTL    = 64
	templateWindow = 64240
	templateWScale = 7
)

// frameTemplate is the frame the generator rewrites, and what the BPF
// program needs to know about its layout.
type frameTemplate struct {
	frame    []byte
	family   uint8
	l4proto  uint8
	l3Off    uint16
	tsvalOff uint16 // offset of TSval in the TCP header, 0 without timestamps
	rewrite  FloodRewriteField
}

// buildTemplate lays out the first frame of a flood. Its source is the
// prefix's first address; the program rewrites it and the per-flow fields.
func buildTemplate(cfg *Config) (*frameTemplate, error) {
	src := cfg.Sources.Masked().Addr()
	t := &frameTemplate{l3Off: 14}

	eth := &layers.Ethernet{SrcMAC: cfg.SrcMAC, DstMAC: cfg.DstMAC}
	var l3Type layers.EthernetType
	var net gopacket.NetworkLayer
	var ls []gopacket.SerializableLayer
	if cfg.Dst.Is4() {
		t.family = 4
		l3Type = layers.EthernetTypeIPv4
		ip := &layers.IPv4{
			Version: 4, IHL: 5, TTL: templateTTL,
			SrcIP: src.AsSlice(), DstIP: cfg.Dst.AsSlice(),
		}
		switch cfg.Kind {
		case KindUDP:
			ip.Protocol = layers.IPProtocolUDP
		case KindQUICInitial:
			ip.Protocol = layers.IPProtocolUDP
			ip.Flags = layers.IPv4DontFragment // QUIC forbids fragmentation
		case KindICMP:
			ip.Protocol = layers.IPProtocolICMPv4
		default:
			ip.Protocol = layers.IPProtocolTCP
			ip.Flags = layers.IPv4DontFragment // as Linux sends TCP
		}
		net = ip
		t.rewrite |= FloodRewriteFieldFLOOD_REWRITE_IP_ID
	} else {
		t.family = 6
		l3Type = layers.EthernetTypeIPv6
		ip := &layers.IPv6{
			Version: 6, HopLimit: templateTTL,
			SrcIP: src.AsSlice(), DstIP: cfg.Dst.AsSlice(),
		}
		switch cfg.Kind {
		case KindUDP, KindQUICInitial:
			ip.NextHeader = layers.IPProtocolUDP
		case KindICMP:
			ip.NextHeader = layers.IPProtocolICMPv6
		default:
			ip.NextHeader = layers.IPProtocolTCP
		}
		net = ip
	}

	ls = append(ls, eth)
	if cfg.VLAN != 0 {
		eth.EthernetType = layers.EthernetTypeDot1Q
		ls = append(ls, &layers.Dot1Q{VLANIdentifier: cfg.VLAN, Type: l3Type})
		t.l3Off += 4
	} else {
		eth.EthernetType = l3Type
	}
	ls = append(ls, net.(gopacket.SerializableLayer))

	const sport = 32768 // replaced per frame
	switch cfg.Kind {
	case KindSYN, KindSYNRandomPort:
		mss := uint16(1460)
		if t.family == 6 {
			mss = 1440
		}
		tcp := &layers.TCP{
			SrcPort: sport, DstPort: layers.TCPPort(cfg.DstPort),
			SYN: true, Window: templateWindow,
			// Linux's order: MSS, SACK permitted, timestamps, NOP, window scale.
			Options: []layers.TCPOption{
				{OptionType: layers.TCPOptionKindMSS, OptionLength: 4, OptionData: []byte{byte(mss >> 8), byte(mss)}},
				{OptionType: layers.TCPOptionKindSACKPermitted, OptionLength: 2},
				{OptionType: layers.TCPOptionKindTimestamps, OptionLength: 10, OptionData: make([]byte, 8)},
				{OptionType: layers.TCPOptionKindNop},
				{OptionType: layers.TCPOptionKindWindowScale, OptionLength: 3, OptionData: []byte{templateWScale}},
			},
		}
		tcp.SetNetworkLayerForChecksum(net)
		ls = append(ls, tcp)
		t.l4proto = uint8(layers.IPProtocolTCP)
		t.rewrite |= FloodRewriteFieldFLOOD_REWRITE_SPORT | FloodRewriteFieldFLOOD_REWRITE_SEQ | FloodRewriteFieldFLOOD_REWRITE_TSVAL
		if cfg.Kind == KindSYNRandomPort {
			t.rewrite |= FloodRewriteFieldFLOOD_REWRITE_DPORT
		}
	case KindACK, KindTLSHello:
		tcp := &layers.TCP{
			SrcPort: sport, DstPort: layers.TCPPort(cfg.DstPort),
			ACK: true, Window: 502, // a scaled window, as mid-connection
		}
		tcp.SetNetworkLayerForChecksum(net)
		ls = append(ls, tcp)
		if cfg.Kind == KindTLSHello {
			tcp.PSH = true
			hello, err := clientHello(cfg.ServerName)
			if err != nil {
				return nil, err
			}
			ls = append(ls, gopacket.Payload(hello))
		}
		t.l4proto = uint8(layers.IPProtocolTCP)
		t.rewrite |= FloodRewriteFieldFLOOD_REWRITE_SPORT | FloodRewriteFieldFLOOD_REWRITE_SEQ | FloodRewriteFieldFLOOD_REWRITE_ACK
	case KindUDP, KindQUICInitial:
		udp := &layers.UDP{SrcPort: sport, DstPort: layers.UDPPort(cfg.DstPort)}
		udp.SetNetworkLayerForChecksum(net)
		payload := payloadPattern(cfg.PayloadSize)
		if cfg.Kind == KindQUICInitial {
			payload = quicInitial()
		}
		ls = append(ls, udp, gopacket.Payload(payload))
		t.l4proto = uint8(layers.IPProtocolUDP)
		t.rewrite |= FloodRewriteFieldFLOOD_REWRITE_SPORT
	case KindICMP:
		if t.family == 4 {
			ls = append(ls, &layers.ICMPv4{
				TypeCode: layers.CreateICMPv4TypeCode(layers.ICMPv4TypeEchoRequest, 0),
			})
			t.l4proto = uint8(layers.IPProtocolICMPv4)
		} else {
			icmp := &layers.ICMPv6{
				TypeCode: layers.CreateICMPv6TypeCode(layers.ICMPv6TypeEchoRequest, 0),
			}
			icmp.SetNetworkLayerForChecksum(net)
			ls = append(ls, icmp, &layers.ICMPv6Echo{})
			t.l4proto = uint8(layers.IPProtocolICMPv6)
		}
		ls = append(ls, gopacket.Payload(payloadPattern(cfg.PayloadSize)))
		t.rewrite |= FloodRewriteFieldFLOOD_REWRITE_ICMP_ECHO
	default:
		return nil, fmt.Errorf("unknown kind %q", cfg.Kind)
	}

	buf := gopacket.NewSerializeBuffer()
	opts := gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}
	if err := gopacket.SerializeLayers(buf, opts, ls...); err != nil {
		return nil, fmt.Errorf("build template: %w", err)
	}
	t.frame = buf.Bytes()

	l3Len := len(t.frame) - int(t.l3Off)
	if l3Len > maxIPPacket {
		return nil, fmt.Errorf("IP packet of %d bytes exceeds %d: lower the payload size", l3Len, maxIPPacket)
	}
	if t.rewrite&FloodRewriteFieldFLOOD_REWRITE_TSVAL != 0 {
		off, err := findTSval(t.frame[t.l4Off():])
		if err != nil {
			return nil, err
		}
		t.tsvalOff = off
	}
	return t, nil
}

func (t *frameTemplate) l4Off() int {
	if t.family == 4 {
		return int(t.l3Off) + 20
	}
	return int(t.l3Off) + 40
}

// findTSval returns the offset of the timestamp value in a TCP header.
func findTSval(tcp []byte) (uint16, error) {
	if len(tcp) < 20 {
		return 0, errors.New("TCP header truncated")
	}
	end := int(tcp[12]>>4) * 4
	for i := 20; i < end && i < len(tcp); {
		switch tcp[i] {
		case byte(layers.TCPOptionKindEndList):
			return 0, errors.New("no timestamp option")
		case byte(layers.TCPOptionKindNop):
			i++
			continue
		case byte(layers.TCPOptionKindTimestamps):
			return uint16(i + 2), nil
		}
		if i+1 >= len(tcp) || tcp[i+1] < 2 {
			return 0, errors.New("bad TCP option")
		}
		i += int(tcp[i+1])
	}
	return 0, errors.New("no timestamp option")
}

// payloadPattern fills a payload with a counting pattern, which is easy to
// spot in a capture and does not compress away.
func payloadPattern(n int) []byte {
	p := make([]byte, n)
	for i := range p {
		p[i] = byte(i)
	}
	return p
}

// hostMask returns the source prefix as base and host mask, four words
// each, as the BPF program compares them: in the CPU's byte order of the
// packet's bytes. IPv4 uses word 0.
func hostMask(p netip.Prefix) (base, mask [4]uint32) {
	p = p.Masked()
	var addr, m [16]byte
	width := 128
	if p.Addr().Is4() {
		a := p.Addr().As4()
		copy(addr[:4], a[:])
		width = 32
	} else {
		addr = p.Addr().As16()
	}
	for i := p.Bits(); i < width; i++ {
		m[i/8] |= 0x80 >> (i % 8)
	}
	for i := range 4 {
		base[i] = binary.NativeEndian.Uint32(addr[4*i:])
		mask[i] = binary.NativeEndian.Uint32(m[4*i:])
	}
	return base, mask
}

// hardwareAddrOK reports whether a MAC address has Ethernet's length.
func hardwareAddrOK(a net.HardwareAddr) bool { return len(a) == 6 }

// quicInitial is the datagram of a quic-initial flood: a QUIC version 1
// long header of type Initial (RFC 9000 17.2.2) with 8-byte connection
// ids, no token and a 4-byte packet number, padded to the 1200 bytes a
// client's Initial datagram must have. The payload is not encrypted with
// the Initial keys: a server spends the key derivation and a failed
// decryption on it, which is what such a flood costs it.
func quicInitial() []byte {
	const size = 1200
	b := []byte{0xc3, 0, 0, 0, 1, // long header, fixed bit, Initial, 4-byte packet number; version 1
		8, 0x6d, 0x6f, 0x61, 0x74, 0x64, 0x63, 0x69, 0x64, // destination connection id
		8, 0x6d, 0x6f, 0x61, 0x74, 0x73, 0x63, 0x69, 0x64, // source connection id
		0} // no token
	rest := size - len(b) - 2 // the length field counts the packet number and payload
	b = append(b, 0x40|byte(rest>>8), byte(rest), 0, 0, 0, 0)
	return append(b, payloadPattern(size-len(b))...)
}
