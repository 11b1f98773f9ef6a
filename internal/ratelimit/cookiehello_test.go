package ratelimit_test

import (
	"context"
	"encoding/binary"
	"net"
	"net/netip"
	"os"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/moat-shield/moat/internal/datapath"
	"github.com/moat-shield/moat/internal/lab"
	"github.com/moat-shield/moat/internal/ratelimit"
	"github.com/moat-shield/moat/internal/syncookie"
	"github.com/moat-shield/moat/internal/testpkt"
)

// TestTLSHelloOnCookieACK: under moat's SYN cookies only the listener owns
// the tuple of a handshake's third ACK, and a client that sends its hello
// there (TCP_DEFER_ACCEPT) gets the connection the stack makes from the
// cookie. Such a hello counts against a +tls-hello budget when the ACK
// returns the cookie of moat's SYN-ACK (rl_cookie_ack, then the rate
// limits a second time); one that returns another number is forged, and
// counts nothing.
func TestTLSHelloOnCookieACK(t *testing.T) {
	f := newFilter(t)
	hello := clientHello(t)
	// The pair gives the namespace its addresses; the listener on 443
	// stays open, and owns every tuple to it.
	f.inNetns([2]netip.AddrPort{netip.AddrPortFrom(src4, 40000), netip.AddrPortFrom(dst4, 8443)})
	// Plain TCP: moat leaves an MPTCP listener's SYNs (Go's default) to
	// the kernel.
	var lc net.ListenConfig
	lc.SetMultipathTCP(false)
	var ln net.Listener
	var err error
	f.in(func() { ln, err = lc.Listen(context.Background(), "tcp", netip.AddrPortFrom(dst4, 443).String()) })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })

	key, err := syncookie.NewKey()
	if err != nil {
		t.Fatal(err)
	}
	m := f.coll.Maps
	if err := syncookie.InstallKey(m[datapath.MoatMapSynKeys], m[datapath.MoatMapSynRotation], 1, key); err != nil {
		t.Fatal(err)
	}
	if err := syncookie.Protect(m[datapath.MoatMapSynPorts], m[datapath.MoatMapSynCounters], m[datapath.MoatMapSynCensus],
		443, syncookie.ModeAlways, 1); err != nil {
		t.Fatal(err)
	}

	const sport, isn = 40001, 1000
	// No timestamps: the third ACK then needs none to match the cookie.
	syn := testpkt.TCPv4(src4, dst4, testpkt.TCP{SYN: true, SrcPort: sport, DstPort: 443, Seq: isn,
		Options: []testpkt.TCPOption{testpkt.MSS(1460), testpkt.SACKPermitted(), testpkt.WindowScale(7)}})
	out := make([]byte, len(syn)+64)
	var ret uint32
	f.in(func() { ret, err = f.prog.Run(&ebpf.RunOptions{Data: syn, DataOut: out}) })
	if err != nil || ret != 3 {
		t.Fatalf("the SYN: verdict %d (%v), want XDP_TX", ret, err)
	}
	cookie := binary.BigEndian.Uint32(out[14+20+4:]) // the SYN-ACK's sequence number
	third := func(ack uint32) []byte {
		return testpkt.TCPv4(src4, dst4, testpkt.TCP{ACK: true, PSH: true, SrcPort: sport, DstPort: 443,
			Seq: isn + 1, Ack: ack, Payload: hello})
	}

	for _, c := range []struct {
		name  string
		ack   uint32
		taken bool
	}{
		{"the cookie returned", cookie + 1, true},
		{"another number", cookie + 2, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			f.reset(ratelimit.Config{Shape: true, HeavyHitters: true, Sample: 1, Gate: ratelimit.GateSketch})
			f.add(ratelimit.Limit{Kind: ratelimit.Budget, Scope: scope(t, "tcp/443+tls-hello"), PPS: 1, BurstPackets: 5})
			passed := f.send(third(c.ack), 20)
			drops := f.dropsFor(datapath.MoatVerdictReasonREASON_BUDGET)
			if c.taken && (passed != 5 || drops != 15) {
				t.Errorf("%d of 20 passed, %d budget drops; want 5 and 15", passed, drops)
			}
			// A forged ACK is the SYN defence's to drop; the budget never
			// sees it.
			if !c.taken && drops != 0 {
				t.Errorf("%d budget drops of a hello with a forged cookie, want 0", drops)
			}
		})
	}
}

// TestTLSHelloOnKernelCookieACK: as TestTLSHelloOnCookieACK, for a third
// ACK that returns the kernel's own SYN cookie (the kernel issued it
// before moat turned to cookies, or for a SYN moat left to it). The
// server's namespace has tcp_syncookies 2, so the kernel answers every
// SYN with a cookie and keeps no request socket: only the listener owns
// the tuple. A hello on the ACK that returns that cookie counts against
// the +tls-hello budget (rl_cookie_ack's kernel check), in both families;
// one with a cookie bit flipped is forged, and counts nothing. The filter
// runs in the server's namespace, on the frame as it would come in from
// the attacker's host, where the socket lookup finds the listener.
func TestTLSHelloOnKernelCookieACK(t *testing.T) {
	l := lab.NewT(t)
	f := newFilter(t)
	f.inLab(l.Server, l.Server.Ifaces[1])
	hello := clientHello(t)
	const port, isn = 443, 1000
	var lc net.ListenConfig
	lc.SetMultipathTCP(false)
	var ln net.Listener
	// The setting goes with the lab's namespace when the test ends.
	if err := l.Server.Do(func() (err error) {
		if err := os.WriteFile("/proc/sys/net/ipv4/tcp_syncookies", []byte("2"), 0); err != nil {
			return err
		}
		ln, err = lc.Listen(context.Background(), "tcp", netip.AddrPortFrom(netip.IPv6Unspecified(), port).String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })

	ifc := l.Attacker.Ifaces[0]
	for i, c := range []struct {
		name     string
		src, dst netip.Addr
		flip     uint32 // bits flipped in the cookie the ACK returns
		taken    bool
	}{
		{"ipv4 kernel cookie", ifc.IPv4.Addr(), ifc.PeerIPv4, 0, true},
		{"ipv4 cookie bit flipped", ifc.IPv4.Addr(), ifc.PeerIPv4, 1 << 3, false},
		{"ipv6 kernel cookie", ifc.IPv6.Addr(), ifc.PeerIPv6, 0, true},
		{"ipv6 cookie bit flipped", ifc.IPv6.Addr(), ifc.PeerIPv6, 1 << 3, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			sport := uint16(41000 + i)
			frame := func(tcp testpkt.TCP) []byte {
				tcp.SrcPort, tcp.DstPort = sport, port
				return testpkt.Frame{SrcMAC: ifc.MAC, DstMAC: ifc.PeerMAC, Net: testpkt.Net(c.src, c.dst), L4: tcp}.Bytes()
			}
			send := l.Attacker.RawSender(t)
			catch := l.Attacker.SynAckCatcher(t)
			// No timestamps: the kernel's cookie then lives in the
			// sequence number alone. The SYN goes to the server's stack:
			// no program is attached there.
			send(frame(testpkt.TCP{SYN: true, Seq: isn, Options: []testpkt.TCPOption{testpkt.MSS(1400)}}))
			cookie := catch(sport).Seq
			third := frame(testpkt.TCP{ACK: true, PSH: true, Seq: isn + 1, Ack: (cookie + 1) ^ c.flip, Payload: hello})

			f.reset(ratelimit.Config{Shape: true, HeavyHitters: true, Sample: 1, Gate: ratelimit.GateSketch})
			f.add(ratelimit.Limit{Kind: ratelimit.Budget, Scope: scope(t, "tcp/443+tls-hello"), PPS: 1, BurstPackets: 5})
			passed := f.send(third, 20)
			drops := f.dropsFor(datapath.MoatVerdictReasonREASON_BUDGET)
			if c.taken && (passed != 5 || drops != 15) {
				t.Errorf("%d of 20 passed, %d budget drops; want 5 and 15", passed, drops)
			}
			// The port is not in cookie mode: nothing else drops the
			// forged ACK here, and the budget never sees it.
			if !c.taken && (passed != 20 || drops != 0) {
				t.Errorf("%d of 20 passed, %d budget drops of a hello with a forged cookie; want 20 and 0", passed, drops)
			}
		})
	}
}
