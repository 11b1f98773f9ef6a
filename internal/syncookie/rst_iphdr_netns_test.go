package syncookie

import (
	"errors"
	"io"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"golang.org/x/sys/unix"
)

// resetHeader is what a client sees of the IP header of the RST that
// ended its connection, and the flow label of the segment it answered.
type resetHeader struct {
	ttl, ds       uint8
	flow, ownFlow uint32
	reset         bool
}

// resetOfGoneConnection connects from the client to port on addr (the
// client's socket set by opt), has the server forget the connection
// without a word (TCP_REPAIR, then close), sends a segment from the
// client, and returns the IP header of the RST that came back, read with
// AF_PACKET on the client's interface. listening, if not nil, runs once
// the server's listener listens.
func resetOfGoneConnection(t *testing.T, s *shielded, network string, addr netip.Addr, port uint16,
	opt func(fd int) error, listening func()) resetHeader {
	t.Helper()
	ln := s.listenTCP(t, network, port, nil)
	defer ln.Close()
	if listening != nil {
		listening()
	}
	acc := make(chan net.Conn, 1)
	go func() {
		if c, err := ln.Accept(); err == nil {
			acc <- c
		}
	}()
	c, err := dialWith(s.lab.Client, network, addr, port, opt, 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var srv net.Conn
	select {
	case srv = <-acc:
	case <-time.After(3 * time.Second):
		t.Fatal("not accepted")
	}
	defer srv.Close()
	// A request and its answer, so that the client's next segment
	// acknowledges more than the handshake (segments right behind a
	// cookie's ACK pass as such).
	buf := make([]byte, 3)
	c.Write([]byte("one"))
	srv.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := io.ReadFull(srv, buf); err != nil {
		t.Fatal(err)
	}
	srv.Write([]byte("ok!"))
	c.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := io.ReadFull(c, buf); err != nil {
		t.Fatal(err)
	}
	forget(t, srv)
	frames := newFrameReader(t, s.lab.Client)
	c.SetDeadline(time.Now().Add(1500 * time.Millisecond))
	_, werr := c.Write([]byte("two"))
	var rerr error
	if werr == nil {
		_, rerr = c.Read(buf)
	}
	var got resetHeader
	got.reset = errors.Is(werr, syscall.ECONNRESET) || errors.Is(rerr, syscall.ECONNRESET)
	v6 := addr.Is6()
	frames.until(time.Second, func(pkt gopacket.Packet, tcp *layers.TCP, _ bool) bool {
		switch {
		case uint16(tcp.SrcPort) == port && tcp.RST && got.ttl == 0:
			got.ttl, got.ds, got.flow = ipHeader(pkt)
		case uint16(tcp.DstPort) == port && len(tcp.Payload) > 0 && v6 && got.ownFlow == 0:
			_, _, got.ownFlow = ipHeader(pkt)
		}
		return got.ttl != 0 && (!v6 || got.ownFlow != 0)
	})
	if got.ttl == 0 {
		t.Fatalf("no RST from %v (write %v, read %v)", netip.AddrPortFrom(addr, port), werr, rerr)
	}
	return got
}

// TestStrayAckResetIPHeaderAsTheKernels: the RST moat sends from XDP for a
// segment of a connection this host no longer has carries the IP header
// of the kernel's own RST for it: the namespace's hop limit
// (ip_default_ttl, the device's conf.DEV.hop_limit), whatever the
// listener set, the segment's DS field with its ECN bits clear, and over
// IPv6 the segment's flow label where the kernel reflects it
// (flowlabel_reflect) or a label of its own (auto labels), none without.
func TestStrayAckResetIPHeaderAsTheKernels(t *testing.T) {
	s := newShielded(t, ModeNever)
	port := uint16(labPort + 100)
	for _, tc := range []struct {
		name    string
		v6      bool
		sysctls [][2]string
		// sysctlsAfter are written once the listener listens: a
		// listener keeps the flow label choices of its making.
		sysctlsAfter [][2]string
		client       func(fd int) error
		// Labels of the kernel's own choosing are of the stateless
		// range (their top bit set).
		stateless bool
	}{
		{name: "ipv4 defaults"},
		{name: "ipv6 defaults", v6: true},
		{name: "ipv4 ip_default_ttl 99, client IP_TOS", sysctls: [][2]string{{"/proc/sys/net/ipv4/ip_default_ttl", "99"}},
			client: func(fd int) error { return unix.SetsockoptInt(fd, unix.IPPROTO_IP, unix.IP_TOS, 0x48) }},
		{name: "ipv6 device hop_limit 77, client IPV6_TCLASS", v6: true,
			sysctls: [][2]string{{"/proc/sys/net/ipv6/conf/" + s.lab.Server.Ifaces[0].Name + "/hop_limit", "77"}},
			client:  func(fd int) error { return unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_TCLASS, 0x48) }},
		// Bit 0 (established) makes listeners reflect labels, and the
		// kernel's RST is the listener's; bit 1 (resets) is for RSTs of
		// no socket.
		{name: "ipv6 flowlabel_reflect 1", v6: true, sysctls: [][2]string{{"/proc/sys/net/ipv6/flowlabel_reflect", "1"}}},
		{name: "ipv6 flowlabel_reflect 2", v6: true, sysctls: [][2]string{{"/proc/sys/net/ipv6/flowlabel_reflect", "2"}}},
		{name: "ipv6 flowlabel_state_ranges 1", v6: true, stateless: true,
			sysctls: [][2]string{{"/proc/sys/net/ipv6/flowlabel_reflect", "0"}, {"/proc/sys/net/ipv6/flowlabel_state_ranges", "1"}}},
		{name: "ipv6 auto_flowlabels 0", v6: true,
			sysctls: [][2]string{{"/proc/sys/net/ipv6/flowlabel_reflect", "0"}, {"/proc/sys/net/ipv6/auto_flowlabels", "0"}}},
		{name: "ipv6 listener made before flowlabel_reflect 1", v6: true,
			sysctls:      [][2]string{{"/proc/sys/net/ipv6/auto_flowlabels", "1"}, {"/proc/sys/net/ipv6/flowlabel_reflect", "0"}},
			sysctlsAfter: [][2]string{{"/proc/sys/net/ipv6/flowlabel_reflect", "1"}}},
		{name: "ipv6 listener made under flowlabel_reflect 1, turned off after", v6: true,
			sysctls:      [][2]string{{"/proc/sys/net/ipv6/auto_flowlabels", "1"}, {"/proc/sys/net/ipv6/flowlabel_reflect", "1"}},
			sysctlsAfter: [][2]string{{"/proc/sys/net/ipv6/flowlabel_reflect", "0"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Before each listener is made, and after.
			setAfter := func() { s.sysctls(t, tc.sysctlsAfter) }
			port++
			network := tcpNetwork(tc.v6)
			addr := s.serverAddr(network)
			s.protect(t, port, ModeNever)
			s.sysctls(t, tc.sysctls)
			kernel := resetOfGoneConnection(t, s, network, addr, port, tc.client, setAfter)
			s.protect(t, port, ModeAlways)
			before := portStatus(t, s.objs, port).ResetsSent
			s.sysctls(t, tc.sysctls)
			moat := resetOfGoneConnection(t, s, network, addr, port, tc.client, setAfter)
			after := portStatus(t, s.objs, port).ResetsSent
			t.Logf("kernel %+v, moat %+v", kernel, moat)
			if !kernel.reset || !moat.reset {
				t.Fatalf("connection reset: by the kernel's RST %t, by moat's %t", kernel.reset, moat.reset)
			}
			if after == before {
				t.Fatal("moat sent no RST: the RST was the kernel's")
			}
			if moat.ttl != kernel.ttl || moat.ds != kernel.ds {
				t.Errorf("moat's RST: hop limit %d, DS field %#x; the kernel's: %d, %#x", moat.ttl, moat.ds, kernel.ttl, kernel.ds)
			}
			if !tc.v6 {
				return
			}
			// The labels themselves are hashes: whether each is the
			// client's, none, or one of the stateless range.
			const stateless = 0x80000
			if (moat.flow == moat.ownFlow) != (kernel.flow == kernel.ownFlow) || (moat.flow == 0) != (kernel.flow == 0) ||
				tc.stateless && (moat.flow&stateless == 0 || kernel.flow&stateless == 0) {
				t.Errorf("flow labels: moat's RST %#x, the client's %#x; the kernel's RST %#x, the client's %#x",
					moat.flow, moat.ownFlow, kernel.flow, kernel.ownFlow)
			}
		})
	}
}
