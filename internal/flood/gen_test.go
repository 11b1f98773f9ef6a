package flood

import (
	"bytes"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/netip"
	"slices"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/rlimit"
	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"

	"github.com/moat-shield/moat/internal/testpkt"
)

var (
	testSrcMAC = net.HardwareAddr{0x02, 0, 0, 0, 0, 0x01}
	testDstMAC = net.HardwareAddr{0x02, 0, 0, 0, 0, 0x02}
)

func init() {
	_ = rlimit.RemoveMemlock()
	// Random ports would otherwise make gopacket decode some payloads as
	// DNS, DHCPv6, VXLAN and so on, and fail on bytes that are not theirs.
	for p := 0; p < 65536; p++ {
		layers.RegisterUDPPortLayerType(layers.UDPPort(p), gopacket.LayerTypePayload)
		layers.RegisterTCPPortLayerType(layers.TCPPort(p), gopacket.LayerTypePayload)
	}
}

// onesSum is the Internet checksum's one's complement sum, folded, written
// apart from the BPF code it checks.
func onesSum(parts ...[]byte) uint16 {
	var sum uint32
	for _, p := range parts {
		for i := 0; i+1 < len(p); i += 2 {
			sum += uint32(p[i])<<8 | uint32(p[i+1])
		}
		if len(p)%2 == 1 {
			sum += uint32(p[len(p)-1]) << 8
		}
	}
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	return uint16(sum)
}

// pseudoHeader is the part of the IP header that TCP, UDP and ICMPv6
// checksums cover.
func pseudoHeader(src, dst netip.Addr, proto uint8, length int) []byte {
	var b []byte
	b = append(b, src.AsSlice()...)
	b = append(b, dst.AsSlice()...)
	if src.Is4() {
		return append(b, 0, proto, byte(length>>8), byte(length))
	}
	return append(b, byte(length>>24), byte(length>>16), byte(length>>8), byte(length), 0, 0, 0, proto)
}

type genCase struct {
	kind       Kind
	sources    string
	dst        string
	vlan       uint16
	sequential bool
}

func genCases() []genCase {
	var cases []genCase
	for _, kind := range Kinds {
		for _, fam := range []struct{ random, seq, dst string }{
			{"198.19.0.0/16", "198.19.7.248/29", "198.18.2.1"},
			{"2001:db8:f00::/48", "2001:db8:f00::fff0/124", "2001:db8:2::1"},
		} {
			for _, vlan := range []uint16{0, 42} {
				cases = append(cases,
					genCase{kind, fam.random, fam.dst, vlan, false},
					genCase{kind, fam.seq, fam.dst, vlan, true})
			}
		}
	}
	// Prefixes whose host part spans several words of an IPv6 address, and
	// a single host.
	cases = append(cases,
		genCase{KindSYN, "2001:db8::/29", "2001:db8:2::1", 0, false},
		genCase{KindUDP, "2001:db8:f00::/60", "2001:db8:2::1", 0, true},
		genCase{KindUDP, "198.19.1.1/32", "198.18.2.1", 0, false},
		genCase{KindSYN, "0.0.0.0/0", "198.18.2.1", 0, false},
	)
	return cases
}

// TestGeneratorFrames runs the generator over its own output, as live mode
// does when the kernel recycles a page, and checks every frame it makes.
func TestGeneratorFrames(t *testing.T) {
	const frames = 40
	for _, tc := range genCases() {
		name := fmt.Sprintf("%s/%s/vlan%d/seq=%v", tc.kind, tc.sources, tc.vlan, tc.sequential)
		t.Run(name, func(t *testing.T) {
			cfg := Config{
				Kind: tc.kind, IfIndex: 1, SrcMAC: testSrcMAC, DstMAC: testDstMAC,
				Sources: netip.MustParsePrefix(tc.sources), Sequential: tc.sequential,
				Dst: netip.MustParseAddr(tc.dst), DstPort: 443, VLAN: tc.vlan,
			}
			if tc.kind == KindICMP || tc.kind == KindSYNRandomPort {
				cfg.DstPort = 0
			}
			tmpl, spec, err := prepare(&cfg)
			if err != nil {
				t.Fatal(err)
			}
			gen, err := newGenerator(spec, 0, 1, frames)
			if err != nil {
				t.Fatal(err)
			}
			defer gen.Close()

			in := tmpl.frame
			seen := map[string]map[uint64]bool{}
			note := func(field string, v uint64) {
				if seen[field] == nil {
					seen[field] = map[uint64]bool{}
				}
				seen[field][v] = true
			}
			for i := range frames {
				out := make([]byte, len(in)+256)
				ret, err := gen.prog.Run(&ebpf.RunOptions{Data: in, DataOut: out})
				if err != nil {
					t.Fatal(err)
				}
				if ret != 3 { // XDP_TX
					t.Fatalf("frame %d: verdict %d, want XDP_TX", i, ret)
				}
				out = slices.Clone(out[:len(in)])
				checkFrame(t, &cfg, tmpl, out, i, note)
				in = out
			}
			// The per-flow fields must actually vary.
			for field, vals := range seen {
				if len(vals) < frames/2 {
					t.Errorf("%s took only %d distinct values in %d frames", field, len(vals), frames)
				}
			}
			if n, err := gen.sent(); err != nil || n != frames {
				t.Errorf("sent counter = %d, %v; want %d", n, err, frames)
			}
			// Past its budget the instance drops, whatever the loader does.
			ret, err := gen.prog.Run(&ebpf.RunOptions{Data: in})
			if err != nil || ret != 1 {
				t.Errorf("over budget: verdict %d, %v; want XDP_DROP", ret, err)
			}
		})
	}
}

// checkFrame decodes one generated frame and checks it against cfg. note
// records the values of fields that should change per frame.
func checkFrame(t *testing.T, cfg *Config, tmpl *frameTemplate, frame []byte, i int, note func(string, uint64)) {
	t.Helper()
	pkt := gopacket.NewPacket(frame, layers.LayerTypeEthernet, gopacket.Default)
	if el := pkt.ErrorLayer(); el != nil {
		t.Fatalf("frame %d does not decode: %v", i, el.Error())
	}
	eth := pkt.Layer(layers.LayerTypeEthernet).(*layers.Ethernet)
	if !bytes.Equal(eth.SrcMAC, cfg.SrcMAC) || !bytes.Equal(eth.DstMAC, cfg.DstMAC) {
		t.Fatalf("frame %d: MACs %s > %s", i, eth.SrcMAC, eth.DstMAC)
	}
	if vl, ok := pkt.Layer(layers.LayerTypeDot1Q).(*layers.Dot1Q); ok != (cfg.VLAN != 0) || (ok && vl.VLANIdentifier != cfg.VLAN) {
		t.Fatalf("frame %d: VLAN tag %v, want ID %d", i, vl, cfg.VLAN)
	}

	var src, dst netip.Addr
	var proto uint8
	var l4 []byte
	if ip4, ok := pkt.Layer(layers.LayerTypeIPv4).(*layers.IPv4); ok {
		src, _ = netip.AddrFromSlice(ip4.SrcIP.To4())
		dst, _ = netip.AddrFromSlice(ip4.DstIP.To4())
		if onesSum(ip4.Contents) != 0xffff {
			t.Fatalf("frame %d: bad IPv4 header checksum %#04x", i, ip4.Checksum)
		}
		// Short frames carry Ethernet padding up to the 60-byte minimum.
		if want := max(60, int(tmpl.l3Off)+int(ip4.Length)); len(frame) != want {
			t.Fatalf("frame %d: IPv4 length %d", i, ip4.Length)
		}
		note("ip id", uint64(ip4.Id))
		proto, l4 = uint8(ip4.Protocol), ip4.Payload
	} else if ip6, ok := pkt.Layer(layers.LayerTypeIPv6).(*layers.IPv6); ok {
		src, _ = netip.AddrFromSlice(ip6.SrcIP)
		dst, _ = netip.AddrFromSlice(ip6.DstIP)
		proto, l4 = uint8(ip6.NextHeader), ip6.Payload
	} else {
		t.Fatalf("frame %d: no IP layer", i)
	}
	if dst != cfg.Dst {
		t.Fatalf("frame %d: destination %s, want %s", i, dst, cfg.Dst)
	}
	if !cfg.Sources.Contains(src) {
		t.Fatalf("frame %d: source %s outside %s", i, src, cfg.Sources)
	}
	if cfg.Sequential {
		if want := nthAddr(cfg.Sources, uint64(i)); src != want {
			t.Fatalf("frame %d: source %s, want %s (sequential)", i, src, want)
		}
	} else if cfg.Sources.Bits() < src.BitLen() {
		note("source", addrLow64(src))
	}

	// L4 checksum, computed here from scratch.
	sum := onesSum(l4)
	if proto != uint8(layers.IPProtocolICMPv4) {
		sum = onesSum(pseudoHeader(src, dst, proto, len(l4)), l4)
	}
	if sum != 0xffff {
		t.Fatalf("frame %d: bad L4 checksum (proto %d)", i, proto)
	}

	switch cfg.Kind {
	case KindSYN, KindSYNRandomPort:
		tcp := pkt.Layer(layers.LayerTypeTCP).(*layers.TCP)
		if !tcp.SYN || tcp.ACK || tcp.PSH || tcp.RST || tcp.FIN {
			t.Fatalf("frame %d: flags are not SYN only", i)
		}
		var kinds []layers.TCPOptionKind
		for _, o := range tcp.Options {
			kinds = append(kinds, o.OptionType)
			if o.OptionType == layers.TCPOptionKindTimestamps {
				note("tsval", uint64(binary.BigEndian.Uint32(o.OptionData)))
			}
		}
		want := []layers.TCPOptionKind{layers.TCPOptionKindMSS, layers.TCPOptionKindSACKPermitted,
			layers.TCPOptionKindTimestamps, layers.TCPOptionKindNop, layers.TCPOptionKindWindowScale}
		if !slices.Equal(kinds, want) {
			t.Fatalf("frame %d: TCP options %v, want %v", i, kinds, want)
		}
		note("sport", uint64(tcp.SrcPort))
		note("seq", uint64(tcp.Seq))
		if cfg.Kind == KindSYNRandomPort {
			note("dport", uint64(tcp.DstPort))
		} else if uint16(tcp.DstPort) != cfg.DstPort {
			t.Fatalf("frame %d: destination port %d", i, tcp.DstPort)
		}
	case KindACK, KindTLSHello:
		tcp := pkt.Layer(layers.LayerTypeTCP).(*layers.TCP)
		if !tcp.ACK || tcp.SYN || tcp.RST || tcp.FIN || tcp.PSH != (cfg.Kind == KindTLSHello) {
			t.Fatalf("frame %d: wrong TCP flags", i)
		}
		if uint16(tcp.DstPort) != cfg.DstPort {
			t.Fatalf("frame %d: destination port %d", i, tcp.DstPort)
		}
		note("sport", uint64(tcp.SrcPort))
		note("seq", uint64(tcp.Seq))
		note("ack", uint64(tcp.Ack))
		if cfg.Kind == KindTLSHello {
			checkClientHello(t, cfg, tcp.Payload, i == 0)
		}
	case KindUDP:
		udp := pkt.Layer(layers.LayerTypeUDP).(*layers.UDP)
		if uint16(udp.DstPort) != cfg.DstPort || len(udp.Payload) != cfg.PayloadSize {
			t.Fatalf("frame %d: UDP to port %d with %d bytes", i, udp.DstPort, len(udp.Payload))
		}
		if udp.Checksum == 0 {
			t.Fatalf("frame %d: UDP checksum left out", i)
		}
		note("sport", uint64(udp.SrcPort))
	case KindQUICInitial:
		udp := pkt.Layer(layers.LayerTypeUDP).(*layers.UDP)
		if uint16(udp.DstPort) != cfg.DstPort || len(udp.Payload) != 1200 {
			t.Fatalf("frame %d: UDP to port %d with %d bytes, want 1200 to %d", i, udp.DstPort, len(udp.Payload), cfg.DstPort)
		}
		checkQUICInitial(t, udp.Payload)
		note("sport", uint64(udp.SrcPort))
	case KindICMP:
		var id, seq uint16
		var payload []byte
		if icmp, ok := pkt.Layer(layers.LayerTypeICMPv4).(*layers.ICMPv4); ok {
			if icmp.TypeCode.Type() != layers.ICMPv4TypeEchoRequest {
				t.Fatalf("frame %d: ICMP type %v", i, icmp.TypeCode)
			}
			id, seq, payload = icmp.Id, icmp.Seq, icmp.Payload
		} else {
			icmp := pkt.Layer(layers.LayerTypeICMPv6).(*layers.ICMPv6)
			echo := pkt.Layer(layers.LayerTypeICMPv6Echo).(*layers.ICMPv6Echo)
			if icmp.TypeCode.Type() != layers.ICMPv6TypeEchoRequest {
				t.Fatalf("frame %d: ICMPv6 type %v", i, icmp.TypeCode)
			}
			// gopacket's echo layer keeps no payload; the ICMPv6 layer's
			// payload starts with the identifier and sequence.
			id, seq, payload = echo.Identifier, echo.SeqNumber, icmp.Payload[4:]
		}
		if int(seq) != i {
			t.Fatalf("frame %d: echo sequence %d", i, seq)
		}
		if len(payload) != cfg.PayloadSize {
			t.Fatalf("frame %d: echo payload of %d bytes", i, len(payload))
		}
		note("echo id", uint64(id))
	}
}

// nthAddr is the n-th address of p, wrapping around, counted in the low 64
// bits as the generator does.
func nthAddr(p netip.Prefix, n uint64) netip.Addr {
	p = p.Masked()
	host := new(big.Int).SetUint64(n)
	hostBits := p.Addr().BitLen() - p.Bits()
	if hostBits < 64 {
		host.Mod(host, new(big.Int).Lsh(big.NewInt(1), uint(hostBits)))
	}
	a := new(big.Int).SetBytes(p.Addr().AsSlice())
	a.Add(a, host)
	b := make([]byte, p.Addr().BitLen()/8)
	a.FillBytes(b)
	addr, _ := netip.AddrFromSlice(b)
	return addr
}

func addrLow64(a netip.Addr) uint64 {
	b := a.AsSlice()
	var v uint64
	for _, x := range b[max(0, len(b)-8):] {
		v = v<<8 | uint64(x)
	}
	return v
}

// checkClientHello checks that a payload is one TLS handshake record, and,
// once per test, that Go's TLS server accepts it as a ClientHello.
func checkClientHello(t *testing.T, cfg *Config, payload []byte, deep bool) {
	t.Helper()
	var rec layers.TLS
	if err := rec.DecodeFromBytes(payload, gopacket.NilDecodeFeedback); err != nil {
		t.Fatalf("payload is not TLS: %v", err)
	}
	if len(rec.Handshake) != 1 || len(rec.AppData)+len(rec.Alert)+len(rec.ChangeCipherSpec) != 0 {
		t.Fatalf("payload holds %d handshake records and others", len(rec.Handshake))
	}
	h := rec.Handshake[0]
	if h.ContentType != layers.TLSHandshake || int(h.Length) != len(payload)-5 {
		t.Fatalf("record type %v length %d of %d bytes", h.ContentType, h.Length, len(payload))
	}
	body := payload[5:]
	if body[0] != tlsHandshakeClientHello || int(body[1])<<16|int(body[2])<<8|int(body[3]) != len(body)-4 {
		t.Fatalf("handshake header % x does not describe a ClientHello of %d bytes", body[:4], len(body)-4)
	}
	if !deep {
		return
	}
	hello := serverView(t, payload)
	if hello.ServerName != cfg.ServerName {
		t.Errorf("SNI %q, want %q", hello.ServerName, cfg.ServerName)
	}
	if !slices.Contains(hello.SupportedVersions, tls.VersionTLS13) || !slices.Contains(hello.SupportedVersions, tls.VersionTLS12) {
		t.Errorf("supported versions %x", hello.SupportedVersions)
	}
	if !slices.Contains(hello.CipherSuites, tls.TLS_AES_128_GCM_SHA256) || !slices.Contains(hello.CipherSuites, tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256) {
		t.Errorf("cipher suites %x", hello.CipherSuites)
	}
	if !slices.Equal(hello.SupportedProtos, []string{"h2", "http/1.1"}) {
		t.Errorf("ALPN %q", hello.SupportedProtos)
	}
	if !slices.Contains(hello.SupportedCurves, tls.X25519) {
		t.Errorf("groups %v", hello.SupportedCurves)
	}
}

// serverView hands a record to crypto/tls's server and returns what it
// parsed from it.
func serverView(t *testing.T, record []byte) *tls.ClientHelloInfo {
	t.Helper()
	client, server := net.Pipe()
	defer server.Close()
	go func() {
		defer client.Close()
		client.Write(record)
		io.Copy(io.Discard, client) // the server's alert
	}()
	var hello *tls.ClientHelloInfo
	errStop := errors.New("seen")
	srv := tls.Server(server, &tls.Config{GetConfigForClient: func(chi *tls.ClientHelloInfo) (*tls.Config, error) {
		hello = chi
		return nil, errStop
	}})
	err := srv.Handshake()
	if hello == nil {
		t.Fatalf("crypto/tls rejected the ClientHello: %v", err)
	}
	return hello
}

func TestConfigRejects(t *testing.T) {
	good := Config{
		Kind: KindSYN, IfIndex: 1, SrcMAC: testSrcMAC, DstMAC: testDstMAC,
		Sources: netip.MustParsePrefix("198.19.0.0/16"), Dst: netip.MustParseAddr("198.18.2.1"), DstPort: 80,
	}
	if _, _, err := prepare(&good); err != nil {
		t.Fatalf("good config refused: %v", err)
	}
	for name, mutate := range map[string]func(*Config){
		"unknown kind":     func(c *Config) { c.Kind = "smurf" },
		"no dst mac":       func(c *Config) { c.DstMAC = nil },
		"family mismatch":  func(c *Config) { c.Dst = netip.MustParseAddr("2001:db8::1") },
		"no port":          func(c *Config) { c.DstPort = 0 },
		"payload for syn":  func(c *Config) { c.PayloadSize = 10 },
		"vlan 4095":        func(c *Config) { c.VLAN = 4095 },
		"oversized udp":    func(c *Config) { c.Kind, c.PayloadSize = KindUDP, 1473 },
		"no sources":       func(c *Config) { c.Sources = netip.Prefix{} },
		"negative threads": func(c *Config) { c.Threads = -1 },
	} {
		t.Run(name, func(t *testing.T) {
			c := good
			mutate(&c)
			if _, _, err := prepare(&c); err == nil {
				t.Errorf("accepted")
			}
		})
	}
	// The largest UDP payload that fits a 1500-byte IPv4 packet.
	c := good
	c.Kind, c.PayloadSize = KindUDP, 1472
	if _, _, err := prepare(&c); err != nil {
		t.Errorf("1472-byte UDP payload refused: %v", err)
	}
}

// TestGeneratorRestoresTemplate feeds the generator a page that a receiver
// rewrote into its reply, as a receiver answering with XDP_TX (moat's SYN
// cookies) does before the page returns to the live-frames pool: the next
// frame must still be the flood's SYN, not the reply sent on.
func TestGeneratorRestoresTemplate(t *testing.T) {
	cfg := Config{
		Kind: KindSYN, IfIndex: 1, SrcMAC: testSrcMAC, DstMAC: testDstMAC,
		Sources: netip.MustParsePrefix("198.19.0.0/16"), Dst: netip.MustParseAddr("198.18.2.1"), DstPort: 443,
	}
	tmpl, spec, err := prepare(&cfg)
	if err != nil {
		t.Fatal(err)
	}
	gen, err := newGenerator(spec, 0, 1, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer gen.Close()

	// The reply a SYN cookie receiver makes of the page: MACs, addresses
	// and ports swapped, SYN|ACK with an acknowledgment number.
	reply := testpkt.Frame{
		SrcMAC: testDstMAC, DstMAC: testSrcMAC,
		Net: testpkt.IPv4{Src: cfg.Dst, Dst: netip.MustParseAddr("198.19.3.4")},
		L4: testpkt.TCP{SYN: true, ACK: true, SrcPort: 443, DstPort: 40000, Seq: 7, Ack: 8,
			Options: []testpkt.TCPOption{testpkt.MSS(1460), testpkt.SACKPermitted(),
				testpkt.Timestamps(1, 2), testpkt.TCPNOP(), testpkt.WindowScale(7)}},
	}.Bytes()
	if len(reply) != len(tmpl.frame) {
		t.Fatalf("reply of %d bytes, template of %d: the test needs the page's length unchanged", len(reply), len(tmpl.frame))
	}
	out := make([]byte, len(reply)+256)
	ret, err := gen.prog.Run(&ebpf.RunOptions{Data: reply, DataOut: out})
	if err != nil {
		t.Fatal(err)
	}
	if ret != 3 { // XDP_TX
		t.Fatalf("verdict %d, want XDP_TX", ret)
	}
	checkFrame(t, &cfg, tmpl, out[:len(reply)], 0, func(string, uint64) {})
}

// checkQUICInitial reads a datagram as RFC 9000 17.2.2 lays out a
// version 1 Initial packet and checks that its fields fill it exactly.
func checkQUICInitial(t *testing.T, d []byte) {
	t.Helper()
	if d[0]&0xf0 != 0xc0 || binary.BigEndian.Uint32(d[1:5]) != 1 {
		t.Fatalf("first byte %#02x, version %#x: not a version 1 Initial", d[0], d[1:5])
	}
	off := 5
	for _, what := range []string{"destination", "source"} {
		n := int(d[off])
		if n > 20 {
			t.Fatalf("%s connection id of %d bytes", what, n)
		}
		off += 1 + n
	}
	if d[off] != 0 { // token length, a one-byte varint
		t.Fatalf("token length byte %#02x", d[off])
	}
	off++
	if d[off]>>6 != 1 {
		t.Fatalf("length is not a two-byte varint: %#02x", d[off])
	}
	length := int(d[off]&0x3f)<<8 | int(d[off+1])
	off += 2
	if pn := int(d[0]&3) + 1; off+length != len(d) || length < pn {
		t.Fatalf("length field %d at offset %d does not fill the %d-byte datagram", length, off, len(d))
	}
}
