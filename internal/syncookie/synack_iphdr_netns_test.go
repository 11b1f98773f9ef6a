package syncookie

import (
	"net/netip"
	"testing"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"golang.org/x/sys/unix"

	"github.com/moat-shield/moat/internal/lab"
)

// synAckHeader is what a client sees of the IP header of the SYN-ACK it
// got, and the flow label of its own packets of the connection.
type synAckHeader struct {
	ttl, ds       uint8
	flow, ownFlow uint32
	connected     bool
}

// firstSynAck connects from the client to port on addr with opt applied to
// the client's socket, and returns the IP header of the first SYN-ACK that
// came back (a frame of the client's own interface, read with AF_PACKET).
func firstSynAck(t *testing.T, h *lab.Host, addr netip.Addr, port uint16, opt func(fd int) error) synAckHeader {
	t.Helper()
	frames := newFrameReader(t, h)
	var got synAckHeader
	c, err := dialWith(h, "tcp", addr, port, opt, 2*time.Second)
	got.connected = err == nil
	if c != nil {
		c.Write([]byte("x"))
		defer c.Close()
	}
	v6 := addr.Is6()
	frames.until(time.Second, func(pkt gopacket.Packet, tcp *layers.TCP, _ bool) bool {
		switch {
		case uint16(tcp.SrcPort) == port && tcp.SYN && tcp.ACK && got.ttl == 0:
			got.ttl, got.ds, got.flow = ipHeader(pkt)
		case uint16(tcp.DstPort) == port && !tcp.SYN && v6 && got.ownFlow == 0:
			_, _, got.ownFlow = ipHeader(pkt)
		}
		return got.ttl != 0 && (!v6 || got.ownFlow != 0 || !got.connected)
	})
	if got.ttl == 0 {
		t.Fatalf("no SYN-ACK from %v", netip.AddrPortFrom(addr, port))
	}
	return got
}

// TestSynAckIPHeaderAsTheKernels: moat's SYN-ACK carries the IP header the
// kernel's own would: the listener's hop limit (IP_TTL, IPV6_UNICAST_HOPS)
// or the namespace's (ip_default_ttl) or the device's
// (conf.DEV.hop_limit), the listener's DS field (IP_TOS, IPV6_TCLASS) or
// the SYN's (tcp_reflect_tos), and over IPv6 the SYN's flow label where
// listeners reflect it (flowlabel_reflect) or a label of its own (auto
// labels). With 64 and 0 whatever the listener, a GTSM peer (RFC 5082,
// IP_MINTTL 255), which the kernel's SYN-ACK reaches, never connected.
func TestSynAckIPHeaderAsTheKernels(t *testing.T) {
	s := newShielded(t, ModeNever)
	port := uint16(labPort)
	const reflect, autoLabels = "/proc/sys/net/ipv6/flowlabel_reflect", "/proc/sys/net/ipv6/auto_flowlabels"
	for _, tc := range []struct {
		name     string
		v6       bool
		sysctls  [][2]string
		listener func(fd int) error
		// sysctlsAfter are written once the listener listens: a
		// listener keeps the flow label choices of its making.
		sysctlsAfter [][2]string
		client       func(fd int) error
		reflectsFl   bool
		stateless    bool // labels of the kernel's own choosing have their top bit set
	}{
		{name: "ipv4 defaults"},
		{name: "ipv6 defaults", v6: true},
		{name: "ipv4 GTSM: IP_TTL 255, IP_TOS, peer IP_MINTTL 255",
			listener: func(fd int) error {
				unix.SetsockoptInt(fd, unix.IPPROTO_IP, unix.IP_TOS, 0x28)
				return unix.SetsockoptInt(fd, unix.IPPROTO_IP, unix.IP_TTL, 255)
			},
			client: func(fd int) error { return unix.SetsockoptInt(fd, unix.IPPROTO_IP, unix.IP_MINTTL, 255) }},
		{name: "ipv6 GTSM: IPV6_UNICAST_HOPS 255, IPV6_TCLASS, peer IPV6_MINHOPCOUNT 255", v6: true,
			listener: func(fd int) error {
				unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_TCLASS, 0x28)
				return unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_UNICAST_HOPS, 255)
			},
			client: func(fd int) error { return unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_MINHOPCOUNT, 255) }},
		{name: "ipv4 ip_default_ttl 99", sysctls: [][2]string{{"/proc/sys/net/ipv4/ip_default_ttl", "99"}}},
		{name: "ipv6 device hop_limit 77", v6: true,
			sysctls: [][2]string{{"/proc/sys/net/ipv6/conf/" + s.lab.Server.Ifaces[0].Name + "/hop_limit", "77"}}},
		{name: "ipv4 tcp_reflect_tos", sysctls: [][2]string{{"/proc/sys/net/ipv4/tcp_reflect_tos", "1"}},
			client: func(fd int) error { return unix.SetsockoptInt(fd, unix.IPPROTO_IP, unix.IP_TOS, 0x48) }},
		{name: "ipv6 tcp_reflect_tos", v6: true, sysctls: [][2]string{{"/proc/sys/net/ipv4/tcp_reflect_tos", "1"}},
			client: func(fd int) error { return unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_TCLASS, 0x48) }},
		{name: "ipv6 flowlabel_reflect", v6: true, reflectsFl: true,
			sysctls: [][2]string{{"/proc/sys/net/ipv6/flowlabel_reflect", "1"}}},
		{name: "ipv6 flowlabel_state_ranges", v6: true, stateless: true,
			sysctls: [][2]string{{"/proc/sys/net/ipv6/flowlabel_reflect", "0"}, {"/proc/sys/net/ipv6/flowlabel_state_ranges", "1"}}},
		// Rows from here set both flow label sysctls, before the
		// listener is made and, where the row says, after.
		{name: "ipv6 listener made before flowlabel_reflect", v6: true,
			sysctls:      [][2]string{{reflect, "0"}, {autoLabels, "1"}},
			sysctlsAfter: [][2]string{{reflect, "1"}}},
		{name: "ipv6 listener made under flowlabel_reflect, turned off after", v6: true, reflectsFl: true,
			sysctls:      [][2]string{{reflect, "1"}, {autoLabels, "1"}},
			sysctlsAfter: [][2]string{{reflect, "0"}}},
		{name: "ipv6 listener opted out of auto flow labels (IPV6_AUTOFLOWLABEL 0)", v6: true,
			sysctls:  [][2]string{{reflect, "0"}, {autoLabels, "1"}},
			listener: func(fd int) error { return unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_AUTOFLOWLABEL, 0) }},
		{name: "ipv6 listener opted out, auto_flowlabels 3 (forced)", v6: true,
			sysctls:  [][2]string{{reflect, "0"}, {autoLabels, "3"}},
			listener: func(fd int) error { return unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_AUTOFLOWLABEL, 0) }},
		{name: "ipv6 auto_flowlabels 2, listener opted in (IPV6_AUTOFLOWLABEL 1)", v6: true,
			sysctls:  [][2]string{{reflect, "0"}, {autoLabels, "2"}},
			listener: func(fd int) error { return unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_AUTOFLOWLABEL, 1) }},
		{name: "ipv6 auto_flowlabels 0", v6: true,
			sysctls: [][2]string{{reflect, "0"}, {autoLabels, "0"}}},
		{name: "ipv6 auto_flowlabels 0, listener opted in (IPV6_AUTOFLOWLABEL 1)", v6: true,
			sysctls:  [][2]string{{reflect, "0"}, {autoLabels, "0"}},
			listener: func(fd int) error { return unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_AUTOFLOWLABEL, 1) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s.sysctls(t, tc.sysctls)
			port++
			network := tcpNetwork(tc.v6)
			addr := s.serverAddr(network)
			ln := s.listenTCP(t, network, port, tc.listener)
			defer ln.Close()
			s.sysctls(t, tc.sysctlsAfter)
			go func() {
				for {
					c, err := ln.Accept()
					if err != nil {
						return
					}
					c.Close()
				}
			}()
			s.protect(t, port, ModeNever)
			kernel := firstSynAck(t, s.lab.Client, addr, port, tc.client)
			s.protect(t, port, ModeAlways)
			before := portStatus(t, s.objs, port).CookiesIssued
			moat := firstSynAck(t, s.lab.Client, addr, port, tc.client)
			after := portStatus(t, s.objs, port).CookiesIssued
			t.Logf("kernel %+v, moat %+v", kernel, moat)
			if !kernel.connected {
				t.Fatal("the kernel's handshake failed")
			}
			if !moat.connected {
				t.Error("the client did not connect through moat's SYN-ACK")
			}
			if after == before {
				t.Fatal("moat issued no cookie: the SYN-ACK was the kernel's")
			}
			if moat.ttl != kernel.ttl || moat.ds != kernel.ds {
				t.Errorf("moat's SYN-ACK: hop limit %d, DS field %#x; the kernel's: %d, %#x", moat.ttl, moat.ds, kernel.ttl, kernel.ds)
			}
			if !tc.v6 {
				return
			}
			if tc.reflectsFl && (moat.flow != moat.ownFlow || kernel.flow != kernel.ownFlow) {
				t.Errorf("flow labels: moat's SYN-ACK %#x, the client's %#x; the kernel's SYN-ACK %#x, the client's %#x",
					moat.flow, moat.ownFlow, kernel.flow, kernel.ownFlow)
			}
			if (moat.flow == 0) != (kernel.flow == 0) {
				t.Errorf("flow labels: moat's SYN-ACK %#x, the kernel's %#x (one has none)", moat.flow, kernel.flow)
			}
			// A label of the host's own is the client's only by a chance
			// of one in 2^20.
			if !tc.reflectsFl && (moat.flow != 0 && moat.flow == moat.ownFlow || kernel.flow != 0 && kernel.flow == kernel.ownFlow) {
				t.Errorf("flow labels reflected: moat's SYN-ACK %#x, the client's %#x; the kernel's SYN-ACK %#x, the client's %#x",
					moat.flow, moat.ownFlow, kernel.flow, kernel.ownFlow)
			}
			if tc.stateless && (moat.flow&0x80000 == 0 || kernel.flow&0x80000 == 0) {
				t.Errorf("flow labels outside the stateless range: moat's SYN-ACK %#x, the kernel's %#x", moat.flow, kernel.flow)
			}
		})
	}
}
