package lab

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// ioTimeout bounds every socket wait so a broken lab fails fast instead of
// hanging the suite.
const ioTimeout = 3 * time.Second

// listenTCP opens a listener on addr (port 0) inside h.
func listenTCP(t *testing.T, h *Host, addr netip.Addr) net.Listener {
	t.Helper()
	var ln net.Listener
	err := h.Do(func() (err error) {
		ln, err = net.Listen("tcp", netip.AddrPortFrom(addr, 0).String())
		return err
	})
	if err != nil {
		t.Fatalf("listen in %s: %v", h.Name, err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

// echoOnce accepts one connection, checks its peer, and echoes what it reads.
func echoOnce(ln net.Listener, wantPeer netip.Addr) <-chan error {
	done := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			done <- err
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(ioTimeout))
		peer := c.RemoteAddr().(*net.TCPAddr).AddrPort().Addr().Unmap()
		if peer != wantPeer {
			done <- errors.New("accepted connection from " + peer.String() + ", want " + wantPeer.String())
			return
		}
		buf := make([]byte, 64)
		n, err := c.Read(buf)
		if err != nil {
			done <- err
			return
		}
		_, err = c.Write(buf[:n])
		done <- err
	}()
	return done
}

// tcpRoundTrip connects from h (bound to local) to ln and checks the echo.
func tcpRoundTrip(t *testing.T, h *Host, local netip.Addr, ln net.Listener) {
	t.Helper()
	server := ln.Addr().(*net.TCPAddr).AddrPort()
	done := echoOnce(ln, local)
	var c net.Conn
	err := h.Do(func() (err error) {
		d := net.Dialer{Timeout: ioTimeout, LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(local, 0))}
		if local.Is6() && !h.owns(local) {
			d.Control = freebind
		}
		c, err = d.Dial("tcp", server.String())
		return err
	})
	if err != nil {
		t.Fatalf("dial %s from %s in %s: %v", server, local, h.Name, err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(ioTimeout))
	msg := []byte("hello from " + local.String())
	if _, err := c.Write(msg); err != nil {
		t.Fatalf("write: %v", err)
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatalf("read echo: %v", err)
	}
	if !bytes.Equal(got, msg) {
		t.Fatalf("echo = %q, want %q", got, msg)
	}
	if err := <-done; err != nil {
		t.Fatalf("server side: %v", err)
	}
}

// udpRoundTrip sends one datagram from local in `from` to server in `to`,
// checks the source the server sees, and checks the reply comes back.
func udpRoundTrip(t *testing.T, from *Host, local netip.Addr, to *Host, server netip.Addr) {
	t.Helper()
	var srv, cli net.PacketConn
	if err := to.Do(func() (err error) {
		srv, err = net.ListenPacket("udp", netip.AddrPortFrom(server, 0).String())
		return err
	}); err != nil {
		t.Fatalf("listen in %s: %v", to.Name, err)
	}
	defer srv.Close()
	if err := from.Do(func() (err error) {
		lc := net.ListenConfig{}
		if local.Is6() && !from.owns(local) {
			lc.Control = freebind
		}
		cli, err = lc.ListenPacket(context.Background(), "udp", netip.AddrPortFrom(local, 0).String())
		return err
	}); err != nil {
		t.Fatalf("bind %s in %s: %v", local, from.Name, err)
	}
	defer cli.Close()
	deadline := time.Now().Add(ioTimeout)
	srv.SetDeadline(deadline)
	cli.SetDeadline(deadline)

	msg := []byte("datagram from " + local.String())
	if _, err := cli.WriteTo(msg, srv.LocalAddr()); err != nil {
		t.Fatalf("send: %v", err)
	}
	buf := make([]byte, 128)
	n, src, err := srv.ReadFrom(buf)
	if err != nil {
		t.Fatalf("server receive: %v", err)
	}
	if got := src.(*net.UDPAddr).AddrPort().Addr().Unmap(); got != local {
		t.Fatalf("server saw source %s, want %s", got, local)
	}
	if !bytes.Equal(buf[:n], msg) {
		t.Fatalf("server got %q, want %q", buf[:n], msg)
	}
	if _, err := srv.WriteTo([]byte("reply"), src); err != nil {
		t.Fatalf("server reply: %v", err)
	}
	n, _, err = cli.ReadFrom(buf)
	if err != nil {
		t.Fatalf("reply to %s did not come back: %v", local, err)
	}
	if string(buf[:n]) != "reply" {
		t.Fatalf("reply = %q", buf[:n])
	}
}

// owns reports whether addr is configured on one of h's interfaces (as
// opposed to a spoofed address the attacker only routes locally).
func (h *Host) owns(addr netip.Addr) bool {
	for _, ifc := range h.Ifaces {
		if ifc.IPv4.Addr() == addr || ifc.IPv6.Addr() == addr {
			return true
		}
	}
	return false
}

// freebind lets an IPv6 socket bind an address that only an AnyIP route
// makes local.
func freebind(network, address string, c syscall.RawConn) error {
	var serr error
	err := c.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_IPV6, unix.IPV6_FREEBIND, 1)
	})
	return errors.Join(err, serr)
}

func TestTopology(t *testing.T) {
	l := NewT(t)
	if len(l.Server.Ifaces) != 2 || len(l.Client.Ifaces) != 1 || len(l.Attacker.Ifaces) != 1 {
		t.Fatalf("iface counts: server %d client %d attacker %d", len(l.Server.Ifaces), len(l.Client.Ifaces), len(l.Attacker.Ifaces))
	}
	for _, pair := range []struct {
		name      string
		near, far Iface
	}{
		{"server-client", l.Server.Ifaces[0], l.Client.Ifaces[0]},
		{"server-attacker", l.Server.Ifaces[1], l.Attacker.Ifaces[0]},
	} {
		n, f := pair.near, pair.far
		if !bytes.Equal(n.PeerMAC, f.MAC) || !bytes.Equal(f.PeerMAC, n.MAC) || len(n.MAC) != 6 {
			t.Errorf("%s: MACs %s/%s, peers %s/%s", pair.name, n.MAC, f.MAC, n.PeerMAC, f.PeerMAC)
		}
		if n.PeerIPv4 != f.IPv4.Addr() || f.PeerIPv4 != n.IPv4.Addr() || n.PeerIPv6 != f.IPv6.Addr() || f.PeerIPv6 != n.IPv6.Addr() {
			t.Errorf("%s: peer addresses do not match: %+v / %+v", pair.name, n, f)
		}
	}
	// Indexes and MACs must be what the kernel reports inside each namespace.
	for _, h := range []*Host{l.Server, l.Client, l.Attacker} {
		for _, ifc := range h.Ifaces {
			err := h.Do(func() error {
				ni, err := net.InterfaceByName(ifc.Name)
				if err != nil {
					return err
				}
				if ni.Index != ifc.Index || !bytes.Equal(ni.HardwareAddr, ifc.MAC) || ni.Flags&net.FlagUp == 0 {
					t.Errorf("%s/%s: kernel says index %d mac %s flags %v, lab says %d %s", h.Name, ifc.Name, ni.Index, ni.HardwareAddr, ni.Flags, ifc.Index, ifc.MAC)
				}
				return nil
			})
			if err != nil {
				t.Fatalf("%s/%s: %v", h.Name, ifc.Name, err)
			}
		}
	}
}

func TestTraffic(t *testing.T) {
	l := NewT(t)
	srv, cli, atk := l.Server, l.Client, l.Attacker
	t.Run("tcp client to server v4", func(t *testing.T) {
		tcpRoundTrip(t, cli, cli.Ifaces[0].IPv4.Addr(), listenTCP(t, srv, srv.Ifaces[0].IPv4.Addr()))
	})
	t.Run("tcp client to server v6", func(t *testing.T) {
		tcpRoundTrip(t, cli, cli.Ifaces[0].IPv6.Addr(), listenTCP(t, srv, srv.Ifaces[0].IPv6.Addr()))
	})
	t.Run("udp attacker to server v4", func(t *testing.T) {
		udpRoundTrip(t, atk, atk.Ifaces[0].IPv4.Addr(), srv, srv.Ifaces[1].IPv4.Addr())
	})
	t.Run("udp attacker to server v6", func(t *testing.T) {
		udpRoundTrip(t, atk, atk.Ifaces[0].IPv6.Addr(), srv, srv.Ifaces[1].IPv6.Addr())
	})
	// A reply to a forged source must come back to the attacker, so that a
	// counting program there sees e.g. the SYN-ACKs of a SYN flood.
	t.Run("udp spoofed v4", func(t *testing.T) {
		udpRoundTrip(t, atk, netip.MustParseAddr("198.19.3.4"), srv, srv.Ifaces[1].IPv4.Addr())
	})
	t.Run("udp spoofed v6", func(t *testing.T) {
		udpRoundTrip(t, atk, netip.MustParseAddr("2001:db8:f00:1::34"), srv, srv.Ifaces[1].IPv6.Addr())
	})
	t.Run("tcp spoofed v4", func(t *testing.T) {
		tcpRoundTrip(t, atk, netip.MustParseAddr("198.19.200.9"), listenTCP(t, srv, srv.Ifaces[1].IPv4.Addr()))
	})
	t.Run("tcp spoofed v6", func(t *testing.T) {
		tcpRoundTrip(t, atk, netip.MustParseAddr("2001:db8:f00:ff::9"), listenTCP(t, srv, srv.Ifaces[1].IPv6.Addr()))
	})
	// The client has no route to the attacker's link: the two links meet
	// only at the server, which does not route between them.
	t.Run("no forwarding", func(t *testing.T) {
		err := cli.Do(func() error {
			c, err := net.DialTimeout("udp", "198.18.2.2:9", time.Second)
			if err == nil {
				c.Close()
			}
			return err
		})
		if !errors.Is(err, unix.ENETUNREACH) {
			t.Fatalf("client dialling the attacker link: err = %v, want ENETUNREACH", err)
		}
	})
}

func TestDoSocketStaysInNamespace(t *testing.T) {
	l := NewT(t)
	orig, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer orig.Close()
	want, err := netns.GetFromPath(l.Server.NSPath)
	if err != nil {
		t.Fatal(err)
	}
	defer want.Close()

	var ln net.Listener
	err = l.Server.Do(func() error {
		cur, err := netns.Get()
		if err != nil {
			return err
		}
		defer cur.Close()
		if !cur.Equal(want) {
			t.Errorf("inside Do the thread is in %s, want %s", cur, want)
		}
		ln, err = net.Listen("tcp", "198.18.1.1:0")
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	// A panic inside fn must not leak the namespace switch either.
	func() {
		defer func() { recover() }()
		l.Server.Do(func() error { panic("boom") })
	}()

	cur, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer cur.Close()
	if !cur.Equal(orig) {
		t.Fatalf("after Do the goroutine's thread is in %s, want the original %s", cur, orig)
	}
	if _, err := netlink.LinkByName(ifServerToClient); err == nil {
		t.Fatalf("%s visible outside the lab namespace", ifServerToClient)
	}
	// The listener was made inside Do; accepting and echoing now happens
	// outside, and the client still reaches it over the lab link.
	tcpRoundTrip(t, l.Client, l.Client.Ifaces[0].IPv4.Addr(), ln)
}

func TestOffloadsAndCommand(t *testing.T) {
	l := NewT(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, tc := range []struct {
		h      *Host
		txCsum string
	}{{l.Server, "on"}, {l.Client, "off"}, {l.Attacker, "off"}} {
		for _, ifc := range tc.h.Ifaces {
			out, err := tc.h.Command(ctx, "ethtool", "-k", ifc.Name).CombinedOutput()
			if err != nil {
				t.Fatalf("ethtool -k %s in %s: %v\n%s", ifc.Name, tc.h.Name, err, out)
			}
			for _, want := range []string{"generic-receive-offload: on", "tx-checksumming: " + tc.txCsum} {
				if !strings.Contains(string(out), want) {
					t.Errorf("%s/%s: ethtool -k lacks %q", tc.h.Name, ifc.Name, want)
				}
			}
		}
	}
	// Command must keep the host's /sys so bpffs pins stay reachable.
	var host unix.Statfs_t
	if err := unix.Statfs("/sys/fs/bpf", &host); err != nil || host.Type != unix.BPF_FS_MAGIC {
		t.Log("no bpffs on /sys/fs/bpf on the host; skipping the /sys check")
		return
	}
	out, err := l.Server.Command(ctx, "stat", "-f", "-c", "%t", "/sys/fs/bpf").Output()
	if err != nil {
		t.Fatalf("stat in %s: %v", l.Server.Name, err)
	}
	if got := strings.TrimSpace(string(out)); got != "cafe4a11" {
		t.Fatalf("/sys/fs/bpf inside Command has fs type %s, want bpffs (cafe4a11)", got)
	}
	out, err = l.Server.Command(ctx, "cat", "/proc/self/net/dev").Output()
	if err != nil || !strings.Contains(string(out), ifServerToAttacker+":") {
		t.Fatalf("Command did not run in the server namespace: %v\n%s", err, out)
	}
}

func TestCloseRemovesEverything(t *testing.T) {
	l, err := New("lab-close")
	if errors.Is(err, ErrUnsupported) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	// Hold the server namespace open past Close, as a leaked socket would,
	// to check that Close deletes the links rather than relying on the
	// namespace dying.
	held, err := netns.GetFromPath(l.Server.NSPath)
	if err != nil {
		l.Close()
		t.Fatal(err)
	}
	defer held.Close()
	paths := []string{l.Server.NSPath, l.Client.NSPath, l.Attacker.NSPath}
	if err := l.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	for _, p := range paths {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s still exists after Close (stat err %v)", p, err)
		}
	}
	nh, err := netlink.NewHandleAt(held)
	if err != nil {
		t.Fatal(err)
	}
	defer nh.Close()
	links, err := nh.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	for _, link := range links {
		if link.Type() == "veth" {
			t.Errorf("veth %s survives Close", link.Attrs().Name)
		}
	}
	if err := l.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if err := l.Server.Do(func() error { return nil }); err == nil {
		t.Fatal("Do on a closed lab succeeded")
	}
}

func TestTwoLabsSideBySide(t *testing.T) {
	a, b := NewT(t), NewT(t)
	if a.Server.Name == b.Server.Name {
		t.Fatalf("two labs share namespace name %s", a.Server.Name)
	}
	// Both use the same addresses; each exchange must stay in its own lab.
	for _, l := range []*Lab{a, b} {
		udpRoundTrip(t, l.Attacker, l.Attacker.Ifaces[0].IPv4.Addr(), l.Server, l.Server.Ifaces[1].IPv4.Addr())
		tcpRoundTrip(t, l.Client, l.Client.Ifaces[0].IPv6.Addr(), listenTCP(t, l.Server, l.Server.Ifaces[0].IPv6.Addr()))
	}
}

func TestNewCloseRepeated(t *testing.T) {
	for i := range 2 {
		l, err := New("lab-again")
		if errors.Is(err, ErrUnsupported) {
			t.Skip(err)
		}
		if err != nil {
			t.Fatalf("round %d: New: %v", i, err)
		}
		t.Cleanup(func() { l.Close() }) // only matters if a check below fails
		// One datagram each way on both links, straight after New and with
		// no retry: New must return only once every veth end can transmit.
		udpRoundTrip(t, l.Client, l.Client.Ifaces[0].IPv4.Addr(), l.Server, l.Server.Ifaces[0].IPv4.Addr())
		udpRoundTrip(t, l.Attacker, l.Attacker.Ifaces[0].IPv6.Addr(), l.Server, l.Server.Ifaces[1].IPv6.Addr())
		if err := l.Close(); err != nil {
			t.Fatalf("round %d: Close: %v", i, err)
		}
	}
}

func TestNewRejectsBadPrefix(t *testing.T) {
	for _, p := range []string{"", "a/b", "with space", strings.Repeat("x", 33)} {
		if l, err := New(p); err == nil {
			l.Close()
			t.Errorf("New(%q) succeeded", p)
		}
	}
}

// quietWindow is how long TestQuiet watches an idle lab; the kernel's own
// IPv6 chatter after link-up lasted up to about a second without the fix.
const quietWindow = 1500 * time.Millisecond

// Tests that count packets at the server rely on an idle lab sending
// nothing: no ARP/NDP (static neighbours), no DAD, no router solicitations,
// no multicast listener reports.
func TestQuiet(t *testing.T) {
	l := NewT(t)
	counters := func() map[string][2]uint64 {
		c := map[string][2]uint64{}
		for _, h := range []*Host{l.Server, l.Client, l.Attacker} {
			nh, err := h.handle()
			if err != nil {
				t.Fatal(err)
			}
			for _, ifc := range h.Ifaces {
				link, err := nh.LinkByIndex(ifc.Index)
				if err != nil {
					t.Fatal(err)
				}
				st := link.Attrs().Statistics
				c[h.Name+"/"+ifc.Name] = [2]uint64{st.RxPackets, st.TxPackets}
			}
			nh.Close()
		}
		return c
	}
	time.Sleep(quietWindow)
	for name, c := range counters() {
		if c != [2]uint64{} {
			t.Errorf("%s: idle lab counted rx %d tx %d packets", name, c[0], c[1])
		}
	}
}

// TestCloseAfterIPNetnsAdd: on a host where netnsDir is no mount point yet,
// an `ip netns add` while a lab ran bound netnsDir onto itself above the
// lab's namespace mounts; Close then unmounted their copies, and the
// namespaces and their files outlived the lab. The test runs again in a
// mount namespace of its own in which netnsDir is a plain directory, as on
// a fresh host.
func TestCloseAfterIPNetnsAdd(t *testing.T) {
	if os.Getenv("MOAT_LAB_FRESH_NETNS_DIR") == "" {
		if _, err := exec.LookPath("ip"); err != nil {
			t.Skip("no ip command (iproute2)")
		}
		script := "while mountpoint -q " + netnsDir + "; do umount -l " + netnsDir + " || exit 1; done; " +
			`exec "$0" -test.run '^TestCloseAfterIPNetnsAdd$' -test.count=1 -test.v`
		cmd := exec.Command("unshare", "--mount", "--propagation", "private", "sh", "-c", script, os.Args[0])
		cmd.Env = append(os.Environ(), "MOAT_LAB_FRESH_NETNS_DIR=1")
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "--- PASS: TestCloseAfterIPNetnsAdd") {
			t.Fatalf("in a mount namespace of its own: %v\n%s", err, out)
		}
		return
	}
	l, err := New("lab-ipns")
	if errors.Is(err, ErrUnsupported) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	paths := []string{l.Server.NSPath, l.Client.NSPath, l.Attacker.NSPath}
	other := filepath.Base(l.Server.NSPath) + "-ip"
	if out, err := exec.Command("ip", "netns", "add", other).CombinedOutput(); err != nil {
		l.Close()
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	defer exec.Command("ip", "netns", "del", other).Run()
	if err := l.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	for _, p := range paths {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s outlived the lab (stat: %v)", p, err)
		}
	}
}
