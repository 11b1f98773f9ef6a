package syncookie

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/google/gopacket/layers"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/moat-shield/moat/internal/lab"
	"github.com/moat-shield/moat/internal/testpkt"
)

// TestForgedZeroKeyACKsRefused: after the first Rotate (generation 1, the
// state `moat syn protect` leaves) a blind attacker who never sent a SYN
// computes cookies with the all-zero key of slot 0. None may reach
// accept(); XDP drops them all.
func TestForgedZeroKeyACKsRefused(t *testing.T) {
	s := newShielded(t, ModeAlways)
	_, accepted := echoServer(t, s.lab.Server)
	send := s.lab.Attacker.RawSender(t)
	ifc := s.lab.Attacker.Ifaces[0]
	before := s.status(t)
	const n = 5
	for i := range n {
		src := netip.AddrFrom4([4]byte{198, 19, 7, byte(10 + i)})
		sport := uint16(30000 + i)
		isn := uint32(0x01020304 * (i + 1))
		meta := Meta(1460, true, 7, true, true, false, 0, false) // key bit 0: slot 0
		tuple := Tuple{netip.AddrPortFrom(src, sport), netip.AddrPortFrom(ifc.PeerIPv4, labPort)}
		send(testpkt.Frame{SrcMAC: ifc.MAC, DstMAC: ifc.PeerMAC,
			Net: testpkt.IPv4{Src: src, Dst: ifc.PeerIPv4},
			L4:  testpkt.TCP{SrcPort: sport, DstPort: labPort, Seq: isn + 1, Ack: Cookie(Key{}, tuple, isn, meta) + 1, ACK: true}}.Bytes())
	}
	deadline := time.Now().Add(2 * time.Second)
	for s.status(t).ACKsDropped-before.ACKsDropped < n && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	select {
	case c := <-accepted:
		t.Fatalf("the server accepted a forged connection from %v", c.RemoteAddr())
	case <-time.After(200 * time.Millisecond):
	}
	if st := s.status(t); st.ACKsDropped-before.ACKsDropped != n || st.CookiesAccepted != before.CookiesAccepted {
		t.Errorf("status %+v: want %d more ACKs dropped, none accepted", st, n)
	}
}

// TestTimeWaitReuse: the server closes first, so its socket sits in
// TIME_WAIT, and the client reconnects from the same port. The kernel must
// handle that SYN (the time-wait socket would swallow the third ACK of a
// moat handshake and the client would hang).
func TestTimeWaitReuse(t *testing.T) {
	s := newShielded(t, ModeAlways)
	var ln net.Listener
	var lc net.ListenConfig
	lc.SetMultipathTCP(false)
	if err := s.lab.Server.Do(func() (err error) {
		ln, err = lc.Listen(context.Background(), "tcp", fmt.Sprintf("[::]:%d", labPort))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("hi"))
			c.Close() // the server closes first: TIME_WAIT on the server
		}
	}()
	addr := netip.AddrPortFrom(s.lab.Client.Ifaces[0].PeerIPv4, labPort).String()
	d := net.Dialer{Timeout: 2 * time.Second, LocalAddr: &net.TCPAddr{Port: 45678},
		Control: func(_, _ string, c syscall.RawConn) error {
			var e error
			c.Control(func(fd uintptr) { e = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEADDR, 1) })
			return e
		}}
	for i := range 2 {
		var b []byte
		err := s.lab.Client.Do(func() error {
			c, err := d.Dial("tcp", addr)
			if err != nil {
				return err
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(2 * time.Second))
			b, err = io.ReadAll(c)
			return err
		})
		if err != nil || string(b) != "hi" {
			t.Fatalf("connection %d from the same port: read %q, %v", i, b, err)
		}
	}
	// The first handshake was moat's, the second the kernel's: its SYN
	// went on to the time-wait socket. A SYN-ACK lost on a loaded machine
	// makes the client send its first SYN again, which gets a cookie of
	// its own; both answer one handshake.
	if st := s.status(t); st.CookiesIssued < 1 || st.CookiesAccepted != 1 || st.SYNsPassed != 1 ||
		st.SYNs != st.CookiesIssued+st.SYNsPassed {
		t.Errorf("status %+v: want exactly one moat handshake, and the reused tuple's SYN left to the kernel", st)
	}
}

// TestLaterTcxProgramsRun: moat's tc program does not end the tcx chain,
// neither when it has nothing to decide nor when it hands the kernel a
// handshake, so a program attached after it (here one that drops
// everything, as an ingress firewall denying the client would) still
// runs: the server accepts no connection whose packets it drops. In
// always mode the SYN-ACK comes from XDP, so the client's connect() itself
// succeeds; the third ACK must meet the later program all the same.
func TestLaterTcxProgramsRun(t *testing.T) {
	for _, mode := range []Mode{ModeNever, ModeAlways} {
		t.Run(mode.String(), func(t *testing.T) {
			s := newShielded(t, mode)
			_, accepted := echoServer(t, s.lab.Server)
			ifc := s.lab.Server.Ifaces[0]
			drop, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.SchedCLS, License: "GPL",
				Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 2 /* TC_ACT_SHOT */), asm.Return()}})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { drop.Close() })
			if err := s.lab.Server.Do(func() error {
				l, err := link.AttachTCX(link.TCXOptions{Interface: ifc.Index, Program: drop, Attach: ebpf.AttachTCXIngress})
				if err != nil {
					return err
				}
				t.Cleanup(func() { l.Close() })
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			err = s.lab.Client.Do(func() error {
				c, err := net.DialTimeout("tcp", netip.AddrPortFrom(s.lab.Client.Ifaces[0].PeerIPv4, labPort).String(), time.Second)
				if err == nil {
					t.Cleanup(func() { c.Close() })
				}
				return err
			})
			if (err == nil) != (mode == ModeAlways) {
				t.Fatalf("connect: %v; want it to succeed only where XDP answers the SYN", err)
			}
			select {
			case c := <-accepted:
				t.Fatalf("server accepted %v although the tcx program after moat's drops every packet (status %+v)", c.RemoteAddr(), s.status(t))
			case <-time.After(time.Second):
			}
		})
	}
}

// TestHandshakeKeepsECN: a client that asks for ECN gets it through a moat
// handshake, on both sockets, while the server's namespace accepts ECN
// (net.ipv4.tcp_ecn 2, the default); once the server turns tcp_ecn off,
// moat agrees to no ECN, as the kernel would not.
func TestHandshakeKeepsECN(t *testing.T) {
	s := newShielded(t, ModeAlways)
	_, accepted := echoServer(t, s.lab.Server)
	setSysctl(t, s.lab.Client, "tcp_ecn", "1")
	for _, serverECN := range []string{"2", "0"} {
		setSysctl(t, s.lab.Server, "tcp_ecn", serverECN)
		for _, addr := range []netip.Addr{s.lab.Client.Ifaces[0].PeerIPv4, s.lab.Client.Ifaces[0].PeerIPv6} {
			before := s.status(t)
			c, srv := dialAccepted(t, s.lab.Client, addr, accepted)
			exchange(t, c, 4096)
			if st := s.status(t); st.CookiesAccepted != before.CookiesAccepted+1 {
				t.Fatalf("%s: not a moat handshake: %+v", addr, st)
			}
			const optECN = 8 // TCPI_OPT_ECN
			want := serverECN != "0"
			ci, si := tcpInfo(t, c), tcpInfo(t, srv)
			if ci.Options&optECN != 0 != want || si.Options&optECN != 0 != want {
				t.Errorf("%s, server tcp_ecn %s: client options %#x, server %#x, want ECN %v",
					addr, serverECN, ci.Options, si.Options, want)
			}
		}
	}
}

// TestRoutedConnectionsLeftAlone: the server routes between the client and
// the attacker's host and has a listener of its own on the protected port,
// bound to the wildcard address, which the socket lookup matches whatever
// the destination. A connection from the client to a service on the far
// host must reach that service, in both families, and carry data both
// ways: moat issues it no cookie (the ACK would be handed to the local
// listener and die in the forwarding path) and its ACK filter drops none
// of its ACKs.
func TestRoutedConnectionsLeftAlone(t *testing.T) {
	s := newShielded(t, ModeAlways)
	l := s.lab
	if err := l.Server.Do(func() error {
		for _, f := range []string{"/proc/sys/net/ipv4/ip_forward", "/proc/sys/net/ipv6/conf/all/forwarding"} {
			if err := os.WriteFile(f, []byte("1"), 0); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	cl, far := l.Client.Ifaces[0], l.Attacker.Ifaces[0]
	route := func(h *lab.Host, ifc lab.Iface, dst, via netip.Addr) {
		t.Helper()
		if err := h.Do(func() error {
			return netlink.RouteAdd(&netlink.Route{
				LinkIndex: ifc.Index,
				Dst:       &net.IPNet{IP: dst.AsSlice(), Mask: net.CIDRMask(dst.BitLen(), dst.BitLen())},
				Gw:        via.AsSlice(),
			})
		}); err != nil {
			t.Fatalf("route %s via %s on %s: %v", dst, via, h.Name, err)
		}
	}
	route(l.Client, cl, far.IPv4.Addr(), cl.PeerIPv4)
	route(l.Client, cl, far.IPv6.Addr(), cl.PeerIPv6)
	route(l.Attacker, far, cl.IPv4.Addr(), far.PeerIPv4)
	route(l.Attacker, far, cl.IPv6.Addr(), far.PeerIPv6)

	_, local := echoServer(t, l.Server)
	_, remote := echoServer(t, l.Attacker)
	for _, dst := range []netip.Addr{far.IPv4.Addr(), far.IPv6.Addr()} {
		c := dial(t, l.Client, dst)
		exchange(t, c, 1<<20)
		select {
		case <-remote:
		case <-local:
			t.Fatalf("%s: the server's own listener took a connection it routes", dst)
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: the far host accepted nothing", dst)
		}
	}
	st := s.status(t)
	if st.CookiesIssued != 0 || st.ACKsDropped != 0 || st.SYNsPassed < 2 {
		t.Errorf("routed connections: %d cookies issued, %d ACKs dropped, %d SYNs left to the kernel; want 0, 0 and at least 2",
			st.CookiesIssued, st.ACKsDropped, st.SYNsPassed)
	}
	// The server's own service on the same port still gets cookies.
	c := dial(t, l.Client, cl.PeerIPv4)
	exchange(t, c, 1<<16)
	if st := s.status(t); st.CookiesAccepted != 1 {
		t.Errorf("a connection to the server itself: %d cookies accepted, want 1", st.CookiesAccepted)
	}
}

// TestSettingsChangedDuringHandshake: the server's namespace turns a TCP
// option off between moat's SYN-ACK (which offered it) and the client's
// ACK. The kernel would refuse a request socket with SACK or timestamps
// turned off (and drops ECN itself); the connection does without them, as
// it can. Window
// scaling it cannot do without (each side would read the other's windows
// at another scale), nor take a request socket with tcp_syncookies 0: the
// acceptor counts an accept error, and the kernel answers the ACK.
func TestSettingsChangedDuringHandshake(t *testing.T) {
	s := newShielded(t, ModeAlways)
	_, accepted := echoServer(t, s.lab.Server)
	send := s.lab.Attacker.RawSender(t)
	catch := s.lab.Attacker.SynAckCatcher(t)
	ifc := s.lab.Attacker.Ifaces[0]

	for i, tc := range []struct {
		sysctl   string
		accepted bool
		want     uint8 // server socket options
		ecn      bool
	}{
		{"tcp_sack", true, optTimestamps | optWScale, true},
		{"tcp_timestamps", true, optSACK | optWScale, true},
		{"tcp_ecn", true, optTimestamps | optSACK | optWScale, false},
		{"tcp_window_scaling", false, 0, false},
		{"tcp_syncookies", false, 0, false},
	} {
		t.Run(tc.sysctl+" off", func(t *testing.T) {
			port := uint16(41000 + i)
			frame := func(tcp testpkt.TCP) []byte {
				tcp.SrcPort, tcp.DstPort = port, labPort
				return testpkt.Frame{SrcMAC: ifc.MAC, DstMAC: ifc.PeerMAC,
					Net: testpkt.IPv4{Src: ifc.IPv4.Addr(), Dst: ifc.PeerIPv4}, L4: tcp}.Bytes()
			}
			// Linux's options, and ECN asked for.
			send(frame(testpkt.TCP{SYN: true, ECE: true, CWR: true, Seq: clientISN, Options: []layers.TCPOption{
				testpkt.MSS(1460), testpkt.SACKPermitted(), testpkt.Timestamps(777, 0), testpkt.TCPNOP(), testpkt.WindowScale(7)}}))
			synack := catch(port)
			var tsval uint32
			for _, o := range synack.Options {
				if o.OptionType == layers.TCPOptionKindTimestamps {
					tsval = binary.BigEndian.Uint32(o.OptionData)
				}
			}
			if !synack.ECE || tsval == 0 {
				t.Fatalf("SYN-ACK without ECN or timestamps: %v", synack.Options)
			}

			setSysctl(t, s.lab.Server, tc.sysctl, "0")
			before := s.status(t)
			send(frame(testpkt.TCP{ACK: true, Seq: clientISN + 1, Ack: synack.Seq + 1,
				Options: []layers.TCPOption{testpkt.TCPNOP(), testpkt.TCPNOP(), testpkt.Timestamps(778, tsval)}}))

			var srv *net.TCPConn
			select {
			case srv = <-accepted:
			case <-time.After(time.Second):
			}
			after := s.status(t)
			if !tc.accepted {
				if srv != nil {
					t.Fatal("the server accepted a connection the kernel should have refused")
				}
				if after.AcceptErrors != before.AcceptErrors+1 || after.CookiesAccepted != before.CookiesAccepted {
					t.Fatalf("accept errors %d->%d, cookies accepted %d->%d: want one accept error",
						before.AcceptErrors, after.AcceptErrors, before.CookiesAccepted, after.CookiesAccepted)
				}
				return
			}
			if srv == nil {
				t.Fatalf("nothing accepted: %+v", after)
			}
			if after.CookiesAccepted != before.CookiesAccepted+1 || after.AcceptErrors != before.AcceptErrors {
				t.Fatalf("cookies accepted %d->%d, accept errors %d->%d",
					before.CookiesAccepted, after.CookiesAccepted, before.AcceptErrors, after.AcceptErrors)
			}
			const optECN = 8 // TCPI_OPT_ECN
			want := tc.want
			if tc.ecn {
				want |= optECN
			}
			if got := tcpInfo(t, srv).Options & (optTimestamps | optSACK | optWScale | optECN); got != want {
				t.Errorf("server socket options %#x, want %#x", got, want)
			}
		})
	}
}

// TestKernelCookieACKs: a handshake whose SYN-ACK the kernel sent with its
// own cookie (before moat turned to cookies, or for a SYN moat left to
// it) completes through the ACK filter; the same ACK with a cookie bit
// flipped is dropped in XDP and never reaches the kernel. The ACK that
// makes the kernel create a socket marks its tuple in the socket census
// (no passes run here, so only the data path marks); the dropped one does
// not.
func TestKernelCookieACKs(t *testing.T) {
	s := newShieldedNoCensus(t, ModeNever)
	census := censusTable(t, s.objs.SynCensus)
	census.Generation = 9
	_, accepted := echoServer(t, s.lab.Server)
	setSysctl(t, s.lab.Server, "tcp_syncookies", "2") // the kernel answers every SYN with a cookie
	send := s.lab.Attacker.RawSender(t)
	catch := s.lab.Attacker.SynAckCatcher(t)
	ifc := s.lab.Attacker.Ifaces[0]

	for i, tc := range []struct {
		name    string
		src     netip.Addr
		dst     netip.Addr
		flip    uint32
		accepts bool
	}{
		{"ipv4 valid", ifc.IPv4.Addr(), ifc.PeerIPv4, 0, true},
		{"ipv4 cookie bit flipped", ifc.IPv4.Addr(), ifc.PeerIPv4, 1 << 3, false},
		{"ipv6 valid", ifc.IPv6.Addr(), ifc.PeerIPv6, 0, true},
		{"ipv6 cookie bit flipped", ifc.IPv6.Addr(), ifc.PeerIPv6, 1 << 3, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			port := uint16(42000 + i)
			frame := func(tcp testpkt.TCP) []byte {
				tcp.SrcPort, tcp.DstPort = port, labPort
				return testpkt.Frame{SrcMAC: ifc.MAC, DstMAC: ifc.PeerMAC, Net: testpkt.Net(tc.src, tc.dst), L4: tcp}.Bytes()
			}
			if err := Protect(s.objs.SynPorts, s.objs.SynCounters, s.objs.SynCensus, labPort, ModeNever, 0); err != nil {
				t.Fatal(err)
			}
			// No timestamps: the kernel's cookie then lives in the
			// sequence number alone.
			send(frame(testpkt.TCP{SYN: true, Seq: clientISN, Options: []layers.TCPOption{testpkt.MSS(1400)}}))
			synack := catch(port)
			if st := s.status(t); st.CookiesIssued != 0 {
				t.Fatalf("moat answered a SYN in never mode: %+v", st)
			}

			if err := Protect(s.objs.SynPorts, s.objs.SynCounters, s.objs.SynCensus, labPort, ModeAlways, 0); err != nil {
				t.Fatal(err)
			}
			before := s.status(t)
			slot := CensusSlot(netip.AddrPortFrom(tc.src, port), netip.AddrPortFrom(tc.dst, labPort))
			clearCensusSlot(census, slot)
			send(frame(testpkt.TCP{ACK: true, Seq: clientISN + 1, Ack: (synack.Seq + 1) ^ tc.flip}))
			var srv *net.TCPConn
			select {
			case srv = <-accepted:
			case <-time.After(time.Second):
			}
			after := s.status(t)
			if tc.accepts {
				if srv == nil {
					t.Fatalf("the kernel's cookie ACK was not accepted: %+v", after)
				}
				if after.ACKsDropped != before.ACKsDropped {
					t.Errorf("acks dropped %d->%d", before.ACKsDropped, after.ACKsDropped)
				}
				if b := censusSlotBits(census, slot); b != 1<<(9%4) {
					t.Errorf("census slot of the new connection holds %04b, want the bit of generation 9", b)
				}
				return
			}
			if b := censusSlotBits(census, slot); b != 0 {
				t.Errorf("census slot of a dropped ACK holds %04b, want no mark", b)
			}
			if srv != nil {
				t.Fatal("an ACK with a forged kernel cookie was accepted")
			}
			if after.ACKsDropped != before.ACKsDropped+1 || after.CookiesRejected != before.CookiesRejected+1 {
				t.Errorf("acks dropped %d->%d, cookies rejected %d->%d: want the ACK dropped in XDP",
					before.ACKsDropped, after.ACKsDropped, before.CookiesRejected, after.CookiesRejected)
			}
		})
	}
}

// TestCookiesOutliveAModeChange: cookies a port issued in always mode come
// back in ACKs for a round trip after the operator moves the port to auto
// (no flood now) or never. The tc acceptor must still take them for the
// cookie lifetime; a port that never issued cookies takes none.
func TestCookiesOutliveAModeChange(t *testing.T) {
	s := newShieldedNoCensus(t, ModeAlways)
	key := Key{K0: 0x5eed5eed5eed5eed, K1: 0x0ddba11c0ffee000}
	if err := InstallKey(s.objs.SynKeys, s.objs.SynRotation, 2, key); err != nil {
		t.Fatal(err)
	}
	handshake := cookieHandshakes(t, s, key, 31000)
	protect := func(m Mode) {
		if err := Protect(s.objs.SynPorts, s.objs.SynCounters, s.objs.SynCensus, labPort, m, 0); err != nil {
			t.Fatal(err)
		}
	}
	if !handshake() {
		t.Fatal("always mode: a valid cookie was not accepted")
	}
	for _, m := range []Mode{ModeAuto, ModeNever} {
		protect(ModeAlways)
		protect(m)
		if !handshake() {
			t.Errorf("always, then %s: a cookie issued before the change was refused", m)
		}
	}
	// Unprotected, then auto with no flood: no cookie was ever issued,
	// and none is taken.
	protect(ModeOff)
	protect(ModeAuto)
	if handshake() {
		t.Error("a port that issued no cookie accepted one")
	}
}

// TestAutoCookiesEndAfterTheFlood: in auto mode the tc acceptor takes
// moat cookies during a flood and for the cookie lifetime after it, and
// then no more, also when no SYN came after the flood to clear its flag.
func TestAutoCookiesEndAfterTheFlood(t *testing.T) {
	s := newShieldedNoCensus(t, ModeAuto)
	key := Key{K0: 0x1122334455667788, K1: 0x99aabbccddeeff00}
	if err := InstallKey(s.objs.SynKeys, s.objs.SynRotation, 2, key); err != nil {
		t.Fatal(err)
	}
	// One SYN per second is a flood: the second SYN in a window starts one.
	if err := Protect(s.objs.SynPorts, s.objs.SynCounters, s.objs.SynCensus, labPort, ModeAuto, 1); err != nil {
		t.Fatal(err)
	}
	const hold, lifetime = 100 * time.Millisecond, 300 * time.Millisecond
	if err := Configure(s.objs.SynSettings, Config{Hold: hold, CookieLifetime: lifetime}); err != nil {
		t.Fatal(err)
	}
	handshake := cookieHandshakes(t, s, key, 32000)
	send := s.lab.Attacker.RawSender(t)
	for range 3 {
		send(spoofed(s.lab, testpkt.TCP{SYN: true, Seq: 1}))
	}
	deadline := time.Now().Add(time.Second)
	for !s.status(t).Flooding && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if !s.status(t).Flooding {
		t.Fatal("three SYNs at a threshold of 1/s started no flood")
	}
	if !handshake() {
		t.Fatal("during the flood: a valid cookie was not accepted")
	}
	time.Sleep(hold + lifetime + 200*time.Millisecond)
	if handshake() {
		t.Error("a cookie was accepted past the hold and the cookie lifetime, no SYN since the flood")
	}
}

// cookieHandshakes starts an echo server on the lab's port and returns a
// function that sends, from the attacker's own address and a new source
// port each time (counting up from sport), the third ACK of a handshake
// that moat answered with a cookie under key (generation 2), and says
// whether the server accepted that connection within a second.
func cookieHandshakes(t *testing.T, s *shielded, key Key, sport uint16) func() bool {
	t.Helper()
	_, accepted := echoServer(t, s.lab.Server)
	send := s.lab.Attacker.RawSender(t)
	ifc := s.lab.Attacker.Ifaces[0]
	return func() bool {
		sport++
		const isn = 0x0badcafe
		meta := Meta(1460, true, 7, true, true, false, 2, false)
		tuple := Tuple{netip.AddrPortFrom(ifc.IPv4.Addr(), sport), netip.AddrPortFrom(ifc.PeerIPv4, labPort)}
		send(testpkt.Frame{SrcMAC: ifc.MAC, DstMAC: ifc.PeerMAC,
			Net: testpkt.IPv4{Src: ifc.IPv4.Addr(), Dst: ifc.PeerIPv4},
			L4:  testpkt.TCP{SrcPort: sport, DstPort: labPort, Seq: isn + 1, Ack: Cookie(key, tuple, isn, meta) + 1, ACK: true}}.Bytes())
		select {
		case c := <-accepted:
			if got := c.RemoteAddr().(*net.TCPAddr).Port; got != int(sport) {
				t.Fatalf("accepted a connection from port %d, want %d", got, sport)
			}
			return true
		case <-time.After(time.Second):
			return false
		}
	}
}
