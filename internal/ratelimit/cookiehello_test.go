package ratelimit_test

import (
	"encoding/binary"
	"net"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/moat-shield/moat/internal/datapath"
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
	var ln *net.TCPListener
	var err error
	f.in(func() { ln, err = net.ListenTCP("tcp", net.TCPAddrFromAddrPort(netip.AddrPortFrom(dst4, 443))) })
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
