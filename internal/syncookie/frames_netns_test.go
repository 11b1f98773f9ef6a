package syncookie

import (
	"net"
	"net/netip"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"golang.org/x/sys/unix"

	"github.com/moat-shield/moat/internal/lab"
)

// frameReader reads the frames that h's first interface sends and takes
// in (AF_PACKET), from the moment it is made to the end of the test.
type frameReader struct{ fd int }

func newFrameReader(t *testing.T, h *lab.Host) *frameReader {
	t.Helper()
	var fd int
	if err := h.Do(func() (err error) {
		fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, int(hostToNet16(unix.ETH_P_ALL)))
		if err != nil {
			return err
		}
		return unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: hostToNet16(unix.ETH_P_ALL), Ifindex: h.Ifaces[0].Index})
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	tv := unix.NsecToTimeval(int64(100 * time.Millisecond))
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		t.Fatal(err)
	}
	return &frameReader{fd: fd}
}

// until hands fn each TCP segment read (its packet, its TCP layer, and
// whether the interface sent it) until fn returns true, or for d.
func (r *frameReader) until(d time.Duration, fn func(pkt gopacket.Packet, tcp *layers.TCP, sent bool) bool) {
	buf := make([]byte, 2048)
	for deadline := time.Now().Add(d); time.Now().Before(deadline); {
		n, from, err := unix.Recvfrom(r.fd, buf, 0)
		if err != nil {
			continue
		}
		pkt := gopacket.NewPacket(buf[:n], layers.LayerTypeEthernet, gopacket.Default)
		tcp, ok := pkt.Layer(layers.LayerTypeTCP).(*layers.TCP)
		if !ok {
			continue
		}
		ll, _ := from.(*unix.SockaddrLinklayer)
		if fn(pkt, tcp, ll != nil && ll.Pkttype == unix.PACKET_OUTGOING) {
			return
		}
	}
}

// ipHeader is a segment's hop limit, DS field and (IPv6) flow label.
func ipHeader(pkt gopacket.Packet) (ttl, ds uint8, flow uint32) {
	if ip6, ok := pkt.Layer(layers.LayerTypeIPv6).(*layers.IPv6); ok {
		return ip6.HopLimit, ip6.TrafficClass, ip6.FlowLabel
	}
	if ip4, ok := pkt.Layer(layers.LayerTypeIPv4).(*layers.IPv4); ok {
		return ip4.TTL, ip4.TOS, 0
	}
	return 0, 0, 0
}

// forget has the server's end of a connection vanish without a word, as
// after a reboot: TCP_REPAIR, then close, which sends nothing.
func forget(t *testing.T, srv net.Conn) {
	t.Helper()
	raw, err := srv.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var serr error
	raw.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_REPAIR, 1) })
	if serr != nil {
		t.Fatalf("TCP_REPAIR: %v", serr)
	}
	srv.Close()
}

// protect protects port in mode m (auto mode's default threshold).
func (s *shielded) protect(t *testing.T, port uint16, m Mode) {
	t.Helper()
	if err := Protect(s.objs.SynPorts, s.objs.SynCounters, s.objs.SynCensus, port, m, 0); err != nil {
		t.Fatal(err)
	}
}

// serverAddr is the server's address on the client's link in network's
// family (tcp4 or tcp6).
func (s *shielded) serverAddr(network string) netip.Addr {
	if network == "tcp6" {
		return s.lab.Client.Ifaces[0].PeerIPv6
	}
	return s.lab.Client.Ifaces[0].PeerIPv4
}

// sysctl writes a sysctl of the server's namespace, which goes with the lab.
func (s *shielded) sysctl(t *testing.T, path, val string) {
	t.Helper()
	if err := s.lab.Server.Do(func() error { return os.WriteFile(path, []byte(val), 0) }); err != nil {
		t.Fatal(err)
	}
}

// sysctls writes each {path, value} of scs in the server's namespace, in
// order.
func (s *shielded) sysctls(t *testing.T, scs [][2]string) {
	t.Helper()
	for _, sc := range scs {
		s.sysctl(t, sc[0], sc[1])
	}
}

// tcpNetwork is the Go network of a TCP socket of one family: tcp6 or
// tcp4.
func tcpNetwork(v6 bool) string {
	if v6 {
		return "tcp6"
	}
	return "tcp4"
}

// socketOpt is a net.Dialer's or net.ListenConfig's Control that applies
// opt (if any) to the socket before it connects or listens.
func socketOpt(opt func(fd int) error) func(_, _ string, c syscall.RawConn) error {
	return func(_, _ string, c syscall.RawConn) error {
		var err error
		if opt != nil {
			c.Control(func(fd uintptr) { err = opt(int(fd)) })
		}
		return err
	}
}

// dialWith connects from h to addr:port over network (tcp, tcp4 or
// tcp6), plain TCP, with opt applied to the client's socket.
func dialWith(h *lab.Host, network string, addr netip.Addr, port uint16, opt func(fd int) error, timeout time.Duration) (net.Conn, error) {
	var c net.Conn
	err := h.Do(func() (err error) {
		d := net.Dialer{Timeout: timeout, Control: socketOpt(opt)}
		d.SetMultipathTCP(false)
		c, err = d.Dial(network, netip.AddrPortFrom(addr, port).String())
		return err
	})
	return c, err
}

func hostToNet16(v uint16) uint16 { return v<<8 | v>>8 }
