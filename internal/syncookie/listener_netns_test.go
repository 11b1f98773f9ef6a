package syncookie

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// TestHandshakeFollowsTheListener: a moat cookie handshake gives both
// sockets what a kernel handshake to the same listener gives: the
// listener's TCP_MAXSEG bounds the MSS announced to the client and the
// MSS the server sends with, and the SYN-ACK announces the window the
// kernel's would (SO_RCVBUF, TCP_WINDOW_CLAMP on the listener), which the
// server's socket then takes, and the window scale the kernel's would
// (those options, the namespace's tcp_rmem, net.core.rmem_max). moat used
// to announce its fixed MSS, a window of 65535 and a window scale of 7
// whatever the listener. A TCP_MAXSEG below the
// family's least MSS (536 for IPv4, 1220 for IPv6) is the one
// difference: the server sends segments of that least MSS, where the
// kernel's handshake gives it the TCP_MAXSEG (the client still sends the
// TCP_MAXSEG, as announced).
func TestHandshakeFollowsTheListener(t *testing.T) {
	s := newShielded(t, ModeAlways)
	const plainPort = labPort + 1 // unprotected: the kernel's handshake
	maxseg := func(mss int) func(fd int) error {
		return func(fd int) error { return unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_MAXSEG, mss) }
	}
	rcvbuf := func(n int) func(fd int) error {
		return func(fd int) error { return unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, n) }
	}
	clamp := func(n int) func(fd int) error {
		return func(fd int) error { return unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_WINDOW_CLAMP, n) }
	}
	for _, tc := range []struct {
		name    string
		network string // tcp4 or tcp6
		opt     func(fd int) error
		rmem    string // the server namespace's net.ipv4.tcp_rmem meanwhile, if set
		// srvMSS, when set, is the MSS the server's socket takes after a
		// moat handshake, where it cannot be the kernel's: the kfunc takes
		// no MSS below 536 (IPv4) or 1220 (IPv6), which a TCP_MAXSEG below
		// that caps at.
		srvMSS uint32
	}{
		{"no option", "tcp4", nil, "", 0},
		{"TCP_MAXSEG 1000", "tcp4", maxseg(1000), "", 0},
		{"TCP_MAXSEG 300", "tcp4", maxseg(300), "", 536},
		{"SO_RCVBUF 4096", "tcp4", rcvbuf(4096), "", 0},
		{"SO_RCVBUF 1 MiB", "tcp4", rcvbuf(1 << 20), "", 0},
		{"TCP_WINDOW_CLAMP 8192", "tcp4", clamp(8192), "", 0},
		{"TCP_WINDOW_CLAMP 300000", "tcp4", clamp(300000), "", 0},
		// The window scale of the larger of tcp_rmem's maximum and
		// net.core.rmem_max (a global sysctl the test leaves alone: the
		// first row is decided by it where it is above 256 KiB, as on
		// the machines here, by tcp_rmem with Linux's default of 208 KiB).
		{"tcp_rmem up to 256 KiB", "tcp4", nil, "4096 131072 262144", 0},
		{"tcp_rmem up to 64 MiB", "tcp4", nil, "4096 131072 67108864", 0},
		{"ipv6 no option", "tcp6", nil, "", 0},
		// Above IPv4's least MSS, below IPv6's.
		{"ipv6 TCP_MAXSEG 1000", "tcp6", maxseg(1000), "", 1220},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.rmem != "" {
				setSysctl(t, s.lab.Server, "tcp_rmem", tc.rmem)
			}
			type res struct{ cli, srv sockInfo }
			got := map[uint16]res{}
			for _, port := range []uint16{labPort, plainPort} {
				ln := s.listenTCP(t, tc.network, port, tc.opt)
				acc := make(chan *net.TCPConn, 1)
				go func() {
					c, err := ln.Accept()
					if err == nil {
						acc <- c.(*net.TCPConn)
					}
				}()
				before := s.status(t)
				c := s.dialTCP(t, tc.network, port)
				var srv *net.TCPConn
				select {
				case srv = <-acc:
				case <-time.After(5 * time.Second):
					t.Fatal("not accepted")
				}
				after := s.status(t)
				if port == labPort && after.CookiesAccepted != before.CookiesAccepted+1 {
					t.Fatalf("not a moat handshake")
				}
				got[port] = res{tcpInfo(t, c.(*net.TCPConn)), tcpInfo(t, srv)}
				c.Close()
				srv.Close()
				ln.Close()
			}
			m, k := got[labPort], got[plainPort]
			t.Logf("moat:   client snd_mss %d snd_wnd %d | server snd_mss %d advmss %d rcv_wnd %d",
				m.cli.Snd_mss, m.cli.Snd_wnd, m.srv.Snd_mss, m.srv.Advmss, m.srv.Rcv_wnd)
			t.Logf("kernel: client snd_mss %d snd_wnd %d | server snd_mss %d advmss %d rcv_wnd %d",
				k.cli.Snd_mss, k.cli.Snd_wnd, k.srv.Snd_mss, k.srv.Advmss, k.srv.Rcv_wnd)
			if m.cli.Snd_mss != k.cli.Snd_mss {
				t.Errorf("client may send segments of %d bytes after a moat handshake, %d after the kernel's", m.cli.Snd_mss, k.cli.Snd_mss)
			}
			if tc.srvMSS != 0 {
				// snd_mss is the MSS less the timestamp option.
				want := tc.srvMSS
				if m.srv.Options&optTimestamps != 0 {
					want -= 12
				}
				if m.srv.Snd_mss != want {
					t.Errorf("server sends segments of %d bytes after a moat handshake, want %d (the kfunc's least MSS, %d, less options)",
						m.srv.Snd_mss, want, tc.srvMSS)
				}
			} else if m.srv.Snd_mss != k.srv.Snd_mss {
				t.Errorf("server sends segments of %d bytes after a moat handshake, %d after the kernel's", m.srv.Snd_mss, k.srv.Snd_mss)
			}
			if m.cli.Snd_wnd != k.cli.Snd_wnd {
				t.Errorf("the client was told a window of %d by moat's SYN-ACK, %d by the kernel's", m.cli.Snd_wnd, k.cli.Snd_wnd)
			}
			if m.cli.Snd_wnd > m.srv.Rcv_wnd+uint32(m.srv.Advmss) {
				t.Errorf("the client was told a window of %d, the server's socket takes %d", m.cli.Snd_wnd, m.srv.Rcv_wnd)
			}
			t.Logf("window scale: moat %d (client told %d), kernel %d (client told %d)",
				m.srv.rcvWScale, m.cli.sndWScale, k.srv.rcvWScale, k.cli.sndWScale)
			if m.srv.rcvWScale != k.srv.rcvWScale || m.cli.sndWScale != m.srv.rcvWScale {
				t.Errorf("window scale %d after a moat handshake (client told %d), %d after the kernel's",
					m.srv.rcvWScale, m.cli.sndWScale, k.srv.rcvWScale)
			}
		})
	}
}

// TestWindowScaleSettingReachesTheSocket: with the window scale set
// (Config.WScale), the SYN-ACK announces it and the tc half hands the
// kernel the same one on the third ACK, so the server's socket scales its
// window as the client was told. Checked with TCP_INFO on both ends, for a
// scale below the listener's (10 on these machines) and one above, over
// IPv4 and IPv6, with a megabyte each way to show the connection works at
// that scale.
func TestWindowScaleSettingReachesTheSocket(t *testing.T) {
	s := newShielded(t, ModeAlways)
	for _, tc := range []struct {
		network string
		wscale  uint8
	}{{"tcp4", 3}, {"tcp4", 13}, {"tcp6", 5}} {
		t.Run(fmt.Sprintf("%s scale %d", tc.network, tc.wscale), func(t *testing.T) {
			s.configure(t, Config{WScale: tc.wscale})
			before := s.status(t)
			c, srv := s.connect(t, tc.network)
			if after := s.status(t); after.CookiesAccepted != before.CookiesAccepted+1 {
				t.Fatalf("cookies accepted %d -> %d: not a moat handshake", before.CookiesAccepted, after.CookiesAccepted)
			}
			cli, sv := tcpInfo(t, c), tcpInfo(t, srv)
			if cli.sndWScale != tc.wscale || sv.rcvWScale != tc.wscale {
				t.Errorf("client told window scale %d, server's socket scales by %d; want both %d",
					cli.sndWScale, sv.rcvWScale, tc.wscale)
			}

			const size = 1 << 20
			payload := make([]byte, size)
			for i := range payload {
				payload[i] = byte(i * 7)
			}
			_ = c.SetDeadline(time.Now().Add(10 * time.Second))
			_ = srv.SetDeadline(time.Now().Add(10 * time.Second))
			echoed := make(chan error, 1)
			go func() {
				buf := make([]byte, size)
				if _, err := io.ReadFull(srv, buf); err != nil {
					echoed <- fmt.Errorf("server read: %w", err)
					return
				}
				_, err := srv.Write(buf)
				echoed <- err
			}()
			if _, err := c.Write(payload); err != nil {
				t.Fatalf("client write: %v", err)
			}
			back := make([]byte, size)
			if _, err := io.ReadFull(c, back); err != nil {
				t.Fatalf("client read: %v", err)
			}
			if err := <-echoed; err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(back, payload) {
				t.Fatal("the megabyte came back changed")
			}
		})
	}
}

// TestFirstFlightWithinTheWindow: a listener with a small SO_RCVBUF; the
// client writes its first flight right after connect(). It keeps within
// the window moat's SYN-ACK announced, as after the kernel's: no
// retransmission. Told 65535, it sent past the server's real window and
// sent 8 segments again.
func TestFirstFlightWithinTheWindow(t *testing.T) {
	s := newShielded(t, ModeAlways)
	const plainPort = labPort + 1
	retrans := map[uint16]uint32{}
	for _, port := range []uint16{labPort, plainPort} {
		ln := s.listenTCP(t, "tcp4", port, func(fd int) error { return unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 4096) })
		done := make(chan int, 1)
		go func() {
			c, err := ln.Accept()
			if err != nil {
				done <- -1
				return
			}
			defer c.Close()
			time.Sleep(300 * time.Millisecond)
			buf := make([]byte, 1<<16)
			n := 0
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			for n < 14000 {
				m, err := c.Read(buf)
				n += m
				if err != nil {
					break
				}
			}
			done <- n
		}()
		c := s.dialTCP(t, "tcp4", port)
		c.(*net.TCPConn).SetNoDelay(true)
		c.Write(make([]byte, 14000))
		if n := <-done; n != 14000 {
			t.Fatalf("port %d: server read %d", port, n)
		}
		retrans[port] = tcpInfo(t, c.(*net.TCPConn)).Total_retrans
		c.Close()
		ln.Close()
	}
	t.Logf("client retransmissions: after moat's handshake %d, after the kernel's %d", retrans[labPort], retrans[plainPort])
	if retrans[labPort] > retrans[plainPort] {
		t.Errorf("client retransmitted %d segments after moat's handshake, %d after the kernel's", retrans[labPort], retrans[plainPort])
	}
}

// TestHandshakeFitsTheDeviceMTU: the server's device has an MTU of 1400.
// moat's SYN-ACK announces the MSS that fits it (1360), as the kernel's
// does: the client's full-sized segments reach the server. With 1460
// announced they were larger than the device takes, and lost.
func TestHandshakeFitsTheDeviceMTU(t *testing.T) {
	s := newShielded(t, ModeAlways)
	if err := s.lab.Server.Do(func() error {
		l, err := netlink.LinkByName(s.lab.Server.Ifaces[0].Name)
		if err != nil {
			return err
		}
		return netlink.LinkSetMTU(l, 1400)
	}); err != nil {
		t.Fatal(err)
	}
	const plainPort = labPort + 1
	for _, port := range []uint16{plainPort, labPort} {
		ln := s.listenTCP(t, "tcp4", port, nil)
		got := make(chan int64, 1)
		go func() {
			c, err := ln.Accept()
			if err != nil {
				got <- -1
				return
			}
			defer c.Close()
			c.SetReadDeadline(time.Now().Add(3 * time.Second))
			n, _ := io.Copy(io.Discard, c)
			got <- n
		}()
		c := s.dialTCP(t, "tcp4", port)
		ci := tcpInfo(t, c.(*net.TCPConn))
		c.SetWriteDeadline(time.Now().Add(2 * time.Second))
		c.Write(make([]byte, 100000))
		c.Close()
		n := <-got
		t.Logf("port %d (moat: %v): client snd_mss %d, server received %d of 100000 bytes in 3 s", port, port == labPort, ci.Snd_mss, n)
		if n != 100000 {
			t.Errorf("port %d: server received %d bytes", port, n)
		}
		ln.Close()
	}
}

// listenTCP opens a listener on port in the server's namespace, on every
// address of network's family (tcp4 or tcp6), with opt (if any) applied
// to its socket before it listens. MPTCP is off: moat leaves an MPTCP
// listener's SYNs to the kernel.
func (s *shielded) listenTCP(t *testing.T, network string, port uint16, opt func(fd int) error) net.Listener {
	t.Helper()
	lcfg := net.ListenConfig{Control: socketOpt(opt)}
	lcfg.SetMultipathTCP(false)
	wildcard := netip.IPv4Unspecified()
	if network == "tcp6" {
		wildcard = netip.IPv6Unspecified()
	}
	var ln net.Listener
	if err := s.lab.Server.Do(func() (err error) {
		ln, err = lcfg.Listen(context.Background(), network, netip.AddrPortFrom(wildcard, port).String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return ln
}

// dialTCP connects from the client to port on the server over network
// (tcp4 or tcp6).
func (s *shielded) dialTCP(t *testing.T, network string, port uint16) net.Conn {
	t.Helper()
	addr := s.serverAddr(network)
	var c net.Conn
	if err := s.lab.Client.Do(func() (err error) {
		c, err = net.DialTimeout(network, netip.AddrPortFrom(addr, port).String(), 5*time.Second)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return c
}

// configure writes c as the SYN settings for the rest of the test, and
// the defaults back after it.
func (s *shielded) configure(t *testing.T, c Config) {
	t.Helper()
	if err := s.lab.Server.Do(func() error { return Configure(s.objs.SynSettings, c) }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.lab.Server.Do(func() error { return Configure(s.objs.SynSettings, Config{}) }); err != nil {
			t.Error(err)
		}
	})
}

// connect opens a listener on labPort over network, connects to it from
// the client and accepts: the client's end and the server's, closed with
// the listener when the test ends.
func (s *shielded) connect(t *testing.T, network string) (c, srv *net.TCPConn) {
	t.Helper()
	ln := s.listenTCP(t, network, labPort, nil)
	t.Cleanup(func() { ln.Close() })
	acc := make(chan *net.TCPConn, 1)
	go func() {
		if c, err := ln.Accept(); err == nil {
			acc <- c.(*net.TCPConn)
		}
	}()
	c = s.dialTCP(t, network, labPort).(*net.TCPConn)
	t.Cleanup(func() { c.Close() })
	select {
	case srv = <-acc:
	case <-time.After(5 * time.Second):
		t.Fatal("not accepted")
	}
	t.Cleanup(func() { srv.Close() })
	return c, srv
}
