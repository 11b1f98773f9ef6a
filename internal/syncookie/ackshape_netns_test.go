package syncookie

import (
	"net"
	"testing"
	"time"

	"github.com/google/gopacket/layers"

	"github.com/moat-shield/moat/internal/testpkt"
)

// TestThirdACKWithExtensionHeaders: the kernel completes a handshake whose
// third ACK carries IPv6 extension headers (hop-by-hop or destination
// options) or IPv4 options that its SYN did not: the stack walks them
// before TCP. Under moat the SYN is a plain one, which moat answers, and
// the ACK carrying the valid cookie must reach the kernel with its request
// socket: the tc acceptor used to take any IPv6 packet whose first header
// after IPv6 is not TCP for not IP and let it through without one, and the
// kernel, which has no request of its own, reset the client.
func TestThirdACKWithExtensionHeaders(t *testing.T) {
	s := newShielded(t, ModeAlways)
	_, accepted := echoServer(t, s.lab.Server)
	send := s.lab.Attacker.RawSender(t)
	catch := s.lab.Attacker.SynAckCatcher(t)
	ifc := s.lab.Attacker.Ifaces[0]
	pad := []testpkt.IPv6TLV{{Type: 1, Data: make([]byte, 4)}} // PadN

	for i, tc := range []struct {
		name string
		ack  testpkt.Network // the third ACK's network header; the SYN's is plain
	}{
		{"ipv6 plain", testpkt.IPv6{Src: ifc.IPv6.Addr(), Dst: ifc.PeerIPv6}},
		{"ipv6 hop-by-hop", testpkt.IPv6{Src: ifc.IPv6.Addr(), Dst: ifc.PeerIPv6,
			Ext: []testpkt.IPv6Ext{testpkt.HopByHop{Options: pad}}}},
		{"ipv6 destination options", testpkt.IPv6{Src: ifc.IPv6.Addr(), Dst: ifc.PeerIPv6,
			Ext: []testpkt.IPv6Ext{testpkt.DestOpts{Options: pad}}}},
		{"ipv4 options", testpkt.IPv4{Src: ifc.IPv4.Addr(), Dst: ifc.PeerIPv4,
			Options: []testpkt.IPv4Option{testpkt.IPv4NOP(), testpkt.IPv4NOP(), testpkt.IPv4NOP(), testpkt.IPv4NOP()}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			port := uint16(43000 + i)
			src, dst := ifc.IPv4.Addr(), ifc.PeerIPv4
			if _, ok := tc.ack.(testpkt.IPv6); ok {
				src, dst = ifc.IPv6.Addr(), ifc.PeerIPv6
			}
			before := s.status(t)
			send(testpkt.Frame{SrcMAC: ifc.MAC, DstMAC: ifc.PeerMAC, Net: testpkt.Net(src, dst),
				L4: testpkt.TCP{SrcPort: port, DstPort: labPort, SYN: true, Seq: clientISN,
					Options: []layers.TCPOption{testpkt.MSS(1400)}}}.Bytes())
			synack := catch(port)
			send(testpkt.Frame{SrcMAC: ifc.MAC, DstMAC: ifc.PeerMAC, Net: tc.ack,
				L4: testpkt.TCP{SrcPort: port, DstPort: labPort, ACK: true, Seq: clientISN + 1, Ack: synack.Seq + 1}}.Bytes())
			select {
			case c := <-accepted:
				if got := c.RemoteAddr().(*net.TCPAddr); got.Port != int(port) {
					t.Fatalf("accepted %v, want a connection from port %d", got, port)
				}
			case <-time.After(time.Second):
				t.Fatalf("the third ACK made no connection (status %+v)", s.status(t))
			}
			after := s.status(t)
			if after.CookiesIssued != before.CookiesIssued+1 || after.CookiesAccepted != before.CookiesAccepted+1 {
				t.Errorf("cookies issued %d->%d, accepted %d->%d: want one moat handshake",
					before.CookiesIssued, after.CookiesIssued, before.CookiesAccepted, after.CookiesAccepted)
			}
		})
	}
}
