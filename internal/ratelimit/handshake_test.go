package ratelimit_test

import (
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/moat-shield/moat/internal/datapath"
	"github.com/moat-shield/moat/internal/ratelimit"
	"github.com/moat-shield/moat/internal/testpkt"
)

// clientHello returns the first record Go's TLS client writes: a whole
// ClientHello as a client sends it.
func clientHello(tb testing.TB) []byte {
	tb.Helper()
	client, server := net.Pipe()
	defer server.Close()
	go func() {
		c := tls.Client(client, &tls.Config{ServerName: "moat.test"})
		c.Handshake()
		c.Close()
	}()
	server.SetReadDeadline(time.Now().Add(5 * time.Second))
	hdr := make([]byte, 5)
	if _, err := io.ReadFull(server, hdr); err != nil {
		tb.Fatal(err)
	}
	body := make([]byte, int(hdr[3])<<8|int(hdr[4]))
	if _, err := io.ReadFull(server, body); err != nil {
		tb.Fatal(err)
	}
	if hdr[0] != 22 || body[0] != 1 {
		tb.Fatalf("first record % x… is not a ClientHello", append(hdr, body[:1]...))
	}
	return append(hdr, body...)
}

// scopeCase is a frame and whether a narrowed scope takes it.
type scopeCase struct {
	name  string
	pkt   []byte
	taken bool
}

// runScopeTable runs each case's frame 20 times through a budget of 5 on
// scope: a frame the scope takes is held to the 5, the others all pass.
func runScopeTable(t *testing.T, f *filter, scopeText string, cases []scopeCase) {
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f.reset(ratelimit.Config{Shape: true, HeavyHitters: true, Sample: 1, Gate: ratelimit.GateSketch})
			// 1 pps: no token comes back while the case runs.
			f.add(ratelimit.Limit{Kind: ratelimit.Budget, Scope: scope(t, scopeText), PPS: 1, BurstPackets: 5})
			want := 20
			if c.taken {
				want = 5
			}
			if got := f.send(c.pkt, 20); got != want {
				t.Errorf("%d of 20 passed, want %d", got, want)
			}
			if d, want := f.dropsFor(datapath.MoatVerdictReasonREASON_BUDGET), uint64(20-want); d != want {
				t.Errorf("budget drops %d, want %d", d, want)
			}
		})
	}
}

// TestTLSHelloScope runs segments of every shape through a +tls-hello
// budget: those it takes are held to its burst, the others all pass.
func TestTLSHelloScope(t *testing.T) {
	f := newFilter(t)
	hello := clientHello(t)
	src6 := netip.MustParseAddr("2001:db8:1::7")
	// The table's segments belong to these connections; a hello counts on
	// an established connection only.
	f.inNetns([2]netip.AddrPort{netip.AddrPortFrom(src4, 40000), netip.AddrPortFrom(dst4, 443)},
		[2]netip.AddrPort{netip.AddrPortFrom(src6, 40000), netip.AddrPortFrom(dst6, 443)})
	seg := func(payload []byte) testpkt.TCP {
		return testpkt.TCP{ACK: true, PSH: true, SrcPort: 40000, DstPort: 443, Seq: 1, Ack: 1, Payload: payload}
	}
	stranger := seg(hello) // a forged hello: no connection has its tuple
	stranger.SrcPort = 40001
	v4 := func(t testpkt.TCP) []byte { return testpkt.TCPv4(src4, dst4, t) }
	frame := func(fr testpkt.Frame) []byte {
		b, err := fr.Build()
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	// trailer is an IPv4 segment whose frame goes on past the datagram
	// with extra bytes, as Ethernet padding does.
	trailer := func(payload, extra []byte) []byte {
		return append(v4(seg(payload)), extra...)
	}
	withTS := seg(hello)
	withTS.Options = []testpkt.TCPOption{testpkt.TCPNOP(), testpkt.TCPNOP(), testpkt.Timestamps(1, 2)}
	tfo := seg(hello)
	tfo.SYN, tfo.ACK, tfo.PSH = true, false, false
	rst := seg(hello)
	rst.RST = true
	app := append([]byte{23, 3, 3, 0, 40}, make([]byte, 40)...)
	serverHello := append([]byte{22, 3, 3, 0, 40, 2}, make([]byte, 39)...)
	withVersion := func(major, minor byte) []byte { return append([]byte{22, major, minor}, hello[3:]...) }
	urgent := seg(append([]byte{0}, hello...)) // the stack drops the urgent byte and reads the hello
	urgent.URG = true

	runScopeTable(t, f, "tcp/443+tls-hello", []scopeCase{
		{"ClientHello, IPv4", v4(seg(hello)), true},
		{"ClientHello, IPv6", testpkt.TCPv6(src6, dst6, seg(hello)), true},
		{"ClientHello, VLAN", frame(testpkt.Frame{Tags: testpkt.VLAN(7), Net: testpkt.IPv4{Src: src4, Dst: dst4}, L4: seg(hello)}), true},
		{"ClientHello, QinQ, IPv6", frame(testpkt.Frame{Tags: testpkt.QinQ(1, 2), Net: testpkt.IPv6{Src: src6, Dst: dst6}, L4: seg(hello)}), true},
		{"ClientHello behind IPv4 options", frame(testpkt.Frame{Net: testpkt.IPv4{Src: src4, Dst: dst4, Options: []testpkt.IPv4Option{testpkt.RouterAlert()}}, L4: seg(hello)}), true},
		{"ClientHello behind IPv6 extension headers", frame(testpkt.Frame{Net: testpkt.IPv6{Src: src6, Dst: dst6, Ext: []testpkt.IPv6Ext{testpkt.HopByHop{}, testpkt.DestOpts{}}}, L4: seg(hello)}), true},
		{"ClientHello behind TCP timestamps", v4(withTS), true},
		{"record version 3.1, as most clients send", v4(seg(withVersion(3, 1))), true},
		{"record version 3.5, which servers take", v4(seg(withVersion(3, 5))), true},
		{"record version 3.255", v4(seg(withVersion(3, 255))), true},
		{"record version 0.0, which Go's crypto/tls takes", v4(seg(withVersion(0, 0))), true},
		{"a ClientHello behind an urgent byte", v4(urgent), true},
		{"two bytes of a record header of another version", v4(seg([]byte{22, 4})), true},
		{"the first byte of a record header alone", v4(seg([]byte{22})), true},
		{"three bytes of a record header", v4(seg([]byte{22, 3, 1})), true},
		{"five bytes of a record header, then padding that is not a ClientHello", trailer([]byte{22, 3, 3, 0, 40}, []byte{2}), true},
		{"a first IPv4 fragment that ends with the TCP header", frame(testpkt.Frame{Net: testpkt.IPv4{Src: src4, Dst: dst4, MF: true}, L4: seg(nil)}), true},
		{"a first IPv4 fragment with two bytes of a record header", frame(testpkt.Frame{Net: testpkt.IPv4{Src: src4, Dst: dst4, MF: true}, L4: seg([]byte{22, 3})}), true},
		{"a first IPv6 fragment that ends with the TCP header", frame(testpkt.Frame{Net: testpkt.IPv6{Src: src6, Dst: dst6, Ext: []testpkt.IPv6Ext{testpkt.Fragment{More: true, ID: 9}}}, L4: seg(nil)}), true},

		{"application data", v4(seg(app)), false},
		{"a ServerHello", v4(seg(serverHello)), false},
		{"the first byte of an application data record", v4(seg([]byte{23})), false},
		{"two bytes that no handshake record starts with", v4(seg([]byte{23, 3})), false},
		{"a pure ACK", v4(seg(nil)), false},
		{"a pure ACK whose padding looks like a ClientHello", trailer(nil, hello[:6]), false},
		{"a SYN", syn4(src4, 443), false},
		{"ClientHello in a Fast Open SYN", v4(tfo), false},
		{"a ClientHello on no connection", v4(stranger), false},
		{"an urgent segment on no connection", v4(func() testpkt.TCP { u := urgent; u.SrcPort = 40001; return u }()), false},
		{"a RST carrying a ClientHello", v4(rst), false},
		{"a ClientHello to another port", testpkt.TCPv4(src4, dst4, testpkt.TCP{ACK: true, SrcPort: 40000, DstPort: 444, Payload: hello}), false},
		{"a ClientHello in UDP to 443", testpkt.UDPv4(src4, dst4, testpkt.UDP{SrcPort: 40000, DstPort: 443, Payload: hello}), false},
		{"a non-first fragment of a ClientHello", frame(testpkt.Frame{Net: testpkt.IPv4{Src: src4, Dst: dst4, FragOff: 3, Protocol: testpkt.ProtoTCP}, L4: testpkt.Payload{Proto: testpkt.ProtoTCP, Data: hello[:64]}}), false},
	})
}

// quicLong returns a QUIC long-header packet padded to size bytes, as a
// client's first datagram is (RFC 9000 14.1): first byte b0, version,
// 8-byte connection ids, no token, a 4-byte packet number.
func quicLong(b0 byte, version uint32, size int) []byte {
	b := []byte{b0, byte(version >> 24), byte(version >> 16), byte(version >> 8), byte(version)}
	b = append(b, 8, 1, 2, 3, 4, 5, 6, 7, 8, 8, 9, 10, 11, 12, 13, 14, 15, 16, 0)
	rest := size - len(b) - 2
	b = append(b, 0x40|byte(rest>>8), byte(rest), 0, 0, 0, 1)
	return append(b, make([]byte, size-len(b))...)
}

// TestQUICInitialScope runs datagrams of every shape through a
// +quic-initial budget: those it takes are held to its burst, the others
// all pass.
func TestQUICInitialScope(t *testing.T) {
	f := newFilter(t)
	defaults := ratelimit.Config{Shape: true, HeavyHitters: true, Sample: 1, Gate: ratelimit.GateSketch}
	src6 := netip.MustParseAddr("2001:db8:1::7")
	dgram := func(payload []byte) testpkt.UDP {
		return testpkt.UDP{SrcPort: 50000, DstPort: 443, Payload: payload}
	}
	v4 := func(payload []byte) []byte { return testpkt.UDPv4(src4, dst4, dgram(payload)) }
	frame := func(fr testpkt.Frame) []byte {
		b, err := fr.Build()
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	initial := quicLong(0xc3, 1, 1200)

	runScopeTable(t, f, "udp/443+quic-initial", []scopeCase{
		{"v1 Initial, IPv4", v4(initial), true},
		{"v1 Initial, IPv6", testpkt.UDPv6(src6, dst6, dgram(initial)), true},
		{"v1 Initial, VLAN", frame(testpkt.Frame{Tags: testpkt.VLAN(7), Net: testpkt.IPv4{Src: src4, Dst: dst4}, L4: dgram(initial)}), true},
		{"v1 Initial behind IPv6 extension headers", frame(testpkt.Frame{Net: testpkt.IPv6{Src: src6, Dst: dst6, Ext: []testpkt.IPv6Ext{testpkt.HopByHop{}}}, L4: dgram(initial)}), true},
		{"v1 Initial with the fixed bit clear", v4(quicLong(0x83, 1, 1200)), true},
		{"v1 Initial shorter than a client may send", v4(quicLong(0xc3, 1, 100)), true},
		{"v2 Initial (type 1)", v4(quicLong(0xd3, 0x6b3343cf, 1200)), true},
		{"draft-29 Initial", v4(quicLong(0xc3, 0xff00001d, 1200)), true},
		{"a first IPv4 fragment with 3 bytes of UDP payload", frame(testpkt.Frame{Net: testpkt.IPv4{Src: src4, Dst: dst4, MF: true}, L4: testpkt.UDP{SrcPort: 50000, DstPort: 443, Payload: []byte{0xc3, 0, 0}, Length: 1208}}), true},

		{"v1 0-RTT (type 1)", v4(quicLong(0xd3, 1, 1200)), false},
		{"v1 Handshake (type 2)", v4(quicLong(0xe3, 1, 1200)), false},
		{"v1 Retry (type 3)", v4(quicLong(0xf0, 1, 1200)), false},
		{"v2 with type 0 (its 0-RTT)", v4(quicLong(0xc3, 0x6b3343cf, 1200)), false},
		{"version negotiation", v4(quicLong(0xc3, 0, 1200)), false},
		{"an unknown version", v4(quicLong(0xc3, 0x1a2a3a4a, 1200)), false},
		{"a short-header packet", v4(append([]byte{0x43}, make([]byte, 1199)...)), false},
		{"4 bytes of payload", v4([]byte{0xc3, 0, 0, 0}), false},
		{"an Initial to another port", testpkt.UDPv4(src4, dst4, testpkt.UDP{SrcPort: 50000, DstPort: 444, Payload: initial}), false},
		{"an Initial's bytes in TCP to 443", testpkt.TCPv4(src4, dst4, testpkt.TCP{ACK: true, SrcPort: 50000, DstPort: 443, Payload: initial[:1000]}), false},
		{"a non-first fragment of an Initial", frame(testpkt.Frame{Net: testpkt.IPv4{Src: src4, Dst: dst4, FragOff: 3, Protocol: testpkt.ProtoUDP}, L4: testpkt.Payload{Proto: testpkt.ProtoUDP, Data: initial[:64]}}), false},
	})

	t.Run("other datagrams fall to the udp budget", func(t *testing.T) {
		f.reset(defaults)
		f.add(ratelimit.Limit{Kind: ratelimit.Budget, Scope: scope(t, "udp/443+quic-initial"), PPS: 1, BurstPackets: 2})
		f.add(ratelimit.Limit{Kind: ratelimit.Budget, Scope: scope(t, "udp"), PPS: 1, BurstPackets: 6})
		if got := f.send(v4(initial), 20); got != 2 {
			t.Errorf("Initials: %d of 20 passed, want the Initial budget's 2", got)
		}
		if got := f.send(v4(quicLong(0xe3, 1, 1200)), 20); got != 6 {
			t.Errorf("Handshake packets: %d of 20 passed, want the udp budget's 6", got)
		}
	})
}

// TestQualifiedScopesFallThrough checks that a packet a +tls-hello or +syn
// limit does not take meets the next wider limit, and that a source over
// its ClientHello limit is blocked with a reason that names it.
func TestQualifiedScopesFallThrough(t *testing.T) {
	f := newFilter(t)
	f.inNetns([2]netip.AddrPort{netip.AddrPortFrom(src4, 40000), netip.AddrPortFrom(dst4, 443)})
	defaults := ratelimit.Config{Shape: true, HeavyHitters: true, Sample: 1, Gate: ratelimit.GateNone}
	hello := clientHello(t)
	seg := func(src netip.Addr, dport uint16, payload []byte) []byte {
		return testpkt.TCPv4(src, dst4, testpkt.TCP{ACK: true, PSH: true, SrcPort: 40000, DstPort: dport, Payload: payload})
	}

	t.Run("source limits", func(t *testing.T) {
		f.reset(defaults)
		// 1 pps: no token comes back while the case runs.
		f.add(ratelimit.Limit{Kind: ratelimit.Source, Scope: scope(t, "tcp/443+tls-hello"), PPS: 1, BurstPackets: 2})
		f.add(ratelimit.Limit{Kind: ratelimit.Source, Scope: scope(t, "tcp"), PPS: 1, BurstPackets: 7})
		if got := f.send(seg(src4, 443, hello), 20); got != 2 {
			t.Errorf("ClientHellos to 443: %d of 20 passed, want the hello limit's 2", got)
		}
		if got := f.send(seg(src4, 443, []byte("GET / HTTP/1.1\r\n\r\n")), 20); got != 7 {
			t.Errorf("other segments to 443: %d of 20 passed, want the tcp limit's 7", got)
		}
		if got := f.send(seg(src4b, 80, hello), 20); got != 7 {
			t.Errorf("ClientHellos to 80: %d of 20 passed, want the tcp limit's 7", got)
		}
	})

	t.Run("budgets", func(t *testing.T) {
		f.reset(defaults)
		f.add(ratelimit.Limit{Kind: ratelimit.Budget, Scope: scope(t, "tcp/80+syn"), PPS: 1, BurstPackets: 3})
		f.add(ratelimit.Limit{Kind: ratelimit.Budget, Scope: scope(t, "tcp"), PPS: 1, BurstPackets: 6})
		if got := f.send(syn4(src4, 80), 20); got != 3 {
			t.Errorf("SYNs to 80: %d of 20 passed, want the SYN budget's 3", got)
		}
		if got := f.send(seg(src4, 80, nil), 20); got != 6 {
			t.Errorf("ACKs to 80: %d of 20 passed, want the tcp budget's 6", got)
		}
	})

	t.Run("non-first fragments meet their protocol's limits, not a port's", func(t *testing.T) {
		f.reset(defaults)
		f.add(ratelimit.Limit{Kind: ratelimit.Source, Scope: scope(t, "udp/53"), PPS: 1, BurstPackets: 3})
		f.add(ratelimit.Limit{Kind: ratelimit.Budget, Scope: scope(t, "udp"), PPS: 1, BurstPackets: 5})
		f.add(ratelimit.Limit{Kind: ratelimit.Source, Scope: scope(t, "icmp"), PPS: 1, BurstPackets: 4})
		frag := func(proto uint8) []byte {
			b, err := testpkt.Frame{Net: testpkt.IPv4{Src: src4, Dst: dst4, FragOff: 185, Protocol: proto},
				L4: testpkt.Payload{Proto: proto, Data: make([]byte, 1400)}}.Build()
			if err != nil {
				t.Fatal(err)
			}
			return b
		}
		frag6, err := testpkt.Frame{Net: testpkt.IPv6{Src: netip.MustParseAddr("2001:db8:1::7"), Dst: dst6,
			Ext: []testpkt.IPv6Ext{testpkt.Fragment{Offset: 185, ID: 3}}},
			L4: testpkt.Payload{Proto: testpkt.ProtoUDP, Data: make([]byte, 1200)}}.Build()
		if err != nil {
			t.Fatal(err)
		}
		if got := f.send(frag(testpkt.ProtoUDP), 20); got != 5 {
			t.Errorf("UDP fragments: %d of 20 passed, want the udp budget's 5", got)
		}
		if got := f.send(frag6, 20); got != 0 {
			t.Errorf("IPv6 UDP fragments: %d of 20 passed, want the spent udp budget's 0", got)
		}
		if got := f.send(frag(testpkt.ProtoICMP), 20); got != 4 {
			t.Errorf("ICMP fragments: %d of 20 passed, want the icmp limit's 4", got)
		}
		if got := f.send(frag(testpkt.ProtoTCP), 20); got != 20 {
			t.Errorf("TCP fragments: %d of 20 passed, want all: no TCP limit", got)
		}
	})

	t.Run("a source over its ClientHello limit is blocked", func(t *testing.T) {
		f.reset(defaults)
		f.add(ratelimit.Limit{Kind: ratelimit.Source, Scope: scope(t, "tcp/443+tls-hello"), PPS: 20, BurstPackets: 3, Block: ratelimit.Duration(time.Minute)})
		// Data segments do not count against the hello limit, nor do
		// hellos forged from the source on no connection.
		if got := f.send(seg(src4, 443, []byte("data")), 20); got != 20 {
			t.Fatalf("data segments: %d of 20 passed", got)
		}
		forged := testpkt.TCPv4(src4, dst4, testpkt.TCP{ACK: true, PSH: true, SrcPort: 40001, DstPort: 443, Payload: hello})
		if got := f.send(forged, 50); got != 50 {
			t.Fatalf("forged ClientHellos: %d of 50 passed, want all (not counted)", got)
		}
		if got := f.send(seg(src4, 443, hello), 10); got != 3 {
			t.Fatalf("ClientHellos: %d of 10 passed, want 3", got)
		}
		// Now the denylist takes everything from the source.
		if got := f.send(seg(src4, 443, []byte("data")), 5); got != 0 {
			t.Errorf("after the block: %d of 5 data segments passed", got)
		}
		ck := datapath.MoatCommentKey{List: 1, Family: 4, Prefixlen: 32}
		copy(ck.Addr[:], src4.AsSlice())
		var cm datapath.MoatComment
		if err := f.coll.Maps[datapath.MoatMapAutoReasons].Lookup(ck, &cm); err != nil {
			t.Fatalf("no auto-block reason: %v", err)
		}
		if txt := cString(cm.Text[:]); !strings.Contains(txt, "tcp/443+tls-hello") {
			t.Errorf("auto-block reason %q does not name the scope", txt)
		}
	})
}

// BenchmarkHandshakeLimitCost reports the ns per packet that a
// +tls-hello or +quic-initial limit adds to a packet to its port, against
// the same packet with no limit, in one run. Run with
//
//	go test -run '^$' -bench HandshakeLimitCost -benchtime 1x ./internal/ratelimit/
func BenchmarkHandshakeLimitCost(b *testing.B) {
	f := newFilter(b)
	f.inNetns([2]netip.AddrPort{netip.AddrPortFrom(src4, 40000), netip.AddrPortFrom(dst4, 443)})
	off := ratelimit.Config{Gate: ratelimit.GateSample}
	seg := func(payload []byte) []byte {
		return testpkt.TCPv4(src4, dst4, testpkt.TCP{ACK: true, PSH: true, SrcPort: 40000, DstPort: 443, Payload: payload})
	}
	dgram := func(payload []byte) []byte {
		return testpkt.UDPv4(src4, dst4, testpkt.UDP{SrcPort: 50000, DstPort: 443, Payload: payload})
	}
	data := seg(append([]byte{23, 3, 3, 0, 100}, make([]byte, 100)...))
	ch := clientHello(b)
	hello := seg(ch)
	forged := testpkt.TCPv4(src4, dst4, testpkt.TCP{ACK: true, PSH: true, SrcPort: 40001, DstPort: 443, Payload: ch})
	short := dgram(append([]byte{0x43}, make([]byte, 100)...))
	initial := dgram(quicLong(0xc3, 1, 1200))
	helloBudget := ratelimit.Limit{Kind: ratelimit.Budget, Scope: mustScope("tcp/443+tls-hello"), PPS: 1000}
	initialBudget := ratelimit.Limit{Kind: ratelimit.Budget, Scope: mustScope("udp/443+quic-initial"), PPS: 1000}
	wide := ratelimit.Limit{Kind: ratelimit.Budget, Scope: mustScope("tcp"), PPS: 1e8}
	const reps = 2_000_000
	measure := func(pkt []byte, limits ...ratelimit.Limit) float64 {
		f.reset(off)
		if err := ratelimit.Apply(f.rl, limits); err != nil {
			b.Fatal(err)
		}
		var d time.Duration
		var err error
		f.in(func() { _, d, err = f.prog.Benchmark(pkt, reps, nil) })
		if err != nil {
			b.Fatal(err)
		}
		return float64(d) / float64(time.Nanosecond)
	}
	var out strings.Builder
	fmt.Fprintf(&out, "%-62s %8s %8s\n", "packet to port 443, limits", "ns/pkt", "added")
	for round := 0; round < 2; round++ {
		bd, bh, bs, bi := measure(data), measure(hello), measure(short), measure(initial)
		for _, r := range []struct {
			name     string
			ns, base float64
		}{
			{"TCP data segment, hello budget (not a hello: passes)", measure(data, helloBudget), bd},
			{"TCP data segment, a tcp budget alone", measure(data, wide), bd},
			{"TCP data segment, hello budget and a tcp budget (falls through)", measure(data, helloBudget, wide), bd},
			{"ClientHello, hello budget (over it: dropped; a socket lookup)", measure(hello, helloBudget), bh},
			{"forged ClientHello, no connection, hello budget (passes)", measure(forged, helloBudget), bh},
			{"QUIC short-header datagram, Initial budget (passes)", measure(short, initialBudget), bs},
			{"QUIC Initial, Initial budget (over it: dropped)", measure(initial, initialBudget), bi},
		} {
			fmt.Fprintf(&out, "%-62s %8.1f %+8.1f\n", r.name, r.ns, r.ns-r.base)
		}
		fmt.Fprintf(&out, "%-62s %8.1f / %.1f / %.1f / %.1f\n", "no limit: data / ClientHello / short / Initial", bd, bh, bs, bi)
	}
	b.Log("\n" + out.String())
}
