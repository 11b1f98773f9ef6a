package syncookie

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/cilium/ebpf/link"
	"github.com/google/gopacket/layers"
	"golang.org/x/sys/unix"

	"github.com/moat-shield/moat/internal/datapath"
	"github.com/moat-shield/moat/internal/lab"
	"github.com/moat-shield/moat/internal/testpkt"
)

const labPort = 8080

// shielded is a lab whose server runs moat (XDP filter and tc acceptor) on
// both of its interfaces, with fresh keys.
type shielded struct {
	lab  *lab.Lab
	objs *datapath.MoatObjects
}

// newShielded protects labPort in mode on the server of a new lab, with
// census passes taken in the server's namespace every second and trusted
// before it returns, as under the daemon.
func newShielded(t *testing.T, mode Mode) *shielded {
	t.Helper()
	s := newShieldedNoCensus(t, mode)
	c, err := NewCensus(s.objs.MoatSynCensus, s.objs.SynCensus)
	if err != nil {
		t.Fatal(err)
	}
	stop, err := c.Start(time.Second, s.lab.Server.Do, func(_ CensusPass, err error) {
		if err != nil {
			t.Errorf("census pass: %v", err)
		}
	})
	if err != nil {
		c.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stop()
		c.Close()
	})
	return s
}

// newShieldedNoCensus is newShielded without census passes: every SYN and
// ACK pays the socket lookup, unless the test takes passes itself.
func newShieldedNoCensus(t *testing.T, mode Mode) *shielded {
	t.Helper()
	l := lab.NewT(t)
	objs := loadObjects(t)
	if _, err := Rotate(objs.SynKeys, objs.SynRotation); err != nil {
		t.Fatal(err)
	}
	if err := Protect(objs.SynPorts, objs.SynCounters, objs.SynCensus, labPort, mode, 0); err != nil {
		t.Fatal(err)
	}
	var links []link.Link
	err := l.Server.Do(func() error {
		if _, err := CheckSysctls(); err != nil {
			return err
		}
		if err := Configure(objs.SynSettings, Config{}); err != nil {
			return err
		}
		for _, ifc := range l.Server.Ifaces {
			x, err := link.AttachXDP(link.XDPOptions{Program: objs.MoatFilter, Interface: ifc.Index})
			if err != nil {
				return fmt.Errorf("attach xdp to %s: %w", ifc.Name, err)
			}
			links = append(links, x)
			tc, err := AttachTC(objs.MoatSynAccept, ifc.Index)
			if err != nil {
				return err
			}
			links = append(links, tc)
		}
		return nil
	})
	t.Cleanup(func() {
		for _, k := range links {
			k.Close()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	// SYN-ACKs leave the server by XDP_TX, which a veth delivers only to
	// a peer running an XDP program.
	l.Client.AttachPassXDPT(t)
	l.Attacker.AttachPassXDPT(t)
	sh := &shielded{lab: l, objs: objs}
	// On failure, the counters say which half of the handshake broke.
	t.Cleanup(func() {
		if t.Failed() {
			st, _ := Status(objs.SynPorts, objs.SynCounters)
			t.Logf("syn status: %+v", st)
		}
	})
	return sh
}

func (s *shielded) status(t *testing.T) PortStatus {
	t.Helper()
	st, err := Status(s.objs.SynPorts, s.objs.SynCounters)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range st {
		if p.Port == labPort {
			return p
		}
	}
	t.Fatalf("tcp/%d missing from status", labPort)
	return PortStatus{}
}

// echoServer listens on the server (both families) and echoes every byte
// on each accepted connection; accepted connections are sent on conns.
func echoServer(t *testing.T, h *lab.Host) (net.Listener, <-chan *net.TCPConn) {
	t.Helper()
	var ln net.Listener
	// Go enables MPTCP on listeners by default, and moat leaves an MPTCP
	// listener's SYNs to the kernel (TestMPTCPListenerConnects).
	var lc net.ListenConfig
	lc.SetMultipathTCP(false)
	if err := h.Do(func() (err error) {
		ln, err = lc.Listen(context.Background(), "tcp", fmt.Sprintf("[::]:%d", labPort))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	conns := make(chan *net.TCPConn, 16)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns <- c.(*net.TCPConn)
			go func() {
				defer c.Close()
				io.Copy(c, c)
			}()
		}
	}()
	return ln, conns
}

func dial(t *testing.T, h *lab.Host, addr netip.Addr) *net.TCPConn {
	t.Helper()
	var c net.Conn
	if err := h.Do(func() (err error) {
		c, err = net.DialTimeout("tcp", netip.AddrPortFrom(addr, labPort).String(), 5*time.Second)
		return err
	}); err != nil {
		t.Fatalf("connect to %s: %v", addr, err)
	}
	t.Cleanup(func() { c.Close() })
	return c.(*net.TCPConn)
}

// dialAccepted connects from h to addr and returns both ends: the client's
// connection and the server's, as the echo server accepted it.
func dialAccepted(t *testing.T, h *lab.Host, addr netip.Addr, accepted <-chan *net.TCPConn) (c, srv *net.TCPConn) {
	t.Helper()
	c = dial(t, h, addr)
	select {
	case srv = <-accepted:
	case <-time.After(5 * time.Second):
		t.Fatal("server accepted nothing")
	}
	return c, srv
}

// exchange sends n random bytes and reads them back through the echo
// server: data flows both ways, enough to need window scaling.
func exchange(t *testing.T, c *net.TCPConn, n int) {
	t.Helper()
	out := make([]byte, n)
	rand.Read(out)
	c.SetDeadline(time.Now().Add(10 * time.Second))
	errc := make(chan error, 1)
	go func() {
		_, err := c.Write(out)
		errc <- err
	}()
	in := make([]byte, n)
	if _, err := io.ReadFull(c, in); err != nil {
		t.Fatalf("read echo: %v", err)
	}
	if err := <-errc; err != nil {
		t.Fatalf("write: %v", err)
	}
	if !bytes.Equal(in, out) {
		t.Fatal("echo differs")
	}
}

// sockInfo is what the tests read from TCP_INFO.
type sockInfo struct {
	*unix.TCPInfo
	sndWScale, rcvWScale uint8 // tcpi_snd_wscale:4, tcpi_rcv_wscale:4, which x/sys leaves out
}

func tcpInfo(t *testing.T, c *net.TCPConn) sockInfo {
	t.Helper()
	raw, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var info sockInfo
	var ierr error
	if err := raw.Control(func(fd uintptr) {
		info.TCPInfo, ierr = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
		if ierr != nil {
			return
		}
		var b [8]byte
		n := uint32(len(b))
		if _, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, fd, unix.IPPROTO_TCP, unix.TCP_INFO,
			uintptr(unsafe.Pointer(&b[0])), uintptr(unsafe.Pointer(&n)), 0); e != 0 {
			ierr = e
			return
		}
		info.sndWScale, info.rcvWScale = b[6]&0xf, b[6]>>4
	}); err != nil {
		t.Fatal(err)
	}
	if ierr != nil {
		t.Fatal(ierr)
	}
	return info
}

const (
	optTimestamps = 1 // TCPI_OPT_TIMESTAMPS
	optSACK       = 2
	optWScale     = 4
)

// TestHandshakeKeepsOptions connects a Linux client through moat cookies
// and checks that the server's socket has what the client offered.
func TestHandshakeKeepsOptions(t *testing.T) {
	s := newShielded(t, ModeAlways)
	_, accepted := echoServer(t, s.lab.Server)
	serverIf := s.lab.Client.Ifaces[0]

	for _, tc := range []struct {
		name       string
		addr       netip.Addr
		timestamps bool
	}{
		{"ipv4", serverIf.PeerIPv4, true},
		{"ipv6", serverIf.PeerIPv6, true},
		{"ipv4 client without timestamps", serverIf.PeerIPv4, false},
		{"ipv6 client without timestamps", serverIf.PeerIPv6, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			val := "1"
			if !tc.timestamps {
				val = "0"
			}
			if err := s.lab.Client.Do(func() error {
				return os.WriteFile("/proc/sys/net/ipv4/tcp_timestamps", []byte(val), 0)
			}); err != nil {
				t.Fatal(err)
			}
			before := s.status(t)
			c, srv := dialAccepted(t, s.lab.Client, tc.addr, accepted)
			exchange(t, c, 1<<20)

			after := s.status(t)
			if after.CookiesIssued != before.CookiesIssued+1 || after.CookiesAccepted != before.CookiesAccepted+1 {
				t.Fatalf("cookies issued %d->%d, accepted %d->%d: the handshake did not go through moat",
					before.CookiesIssued, after.CookiesIssued, before.CookiesAccepted, after.CookiesAccepted)
			}

			ci, si := tcpInfo(t, c), tcpInfo(t, srv)
			wantOpts := uint8(optSACK | optWScale)
			if tc.timestamps {
				wantOpts |= optTimestamps
			}
			if si.Options&(optTimestamps|optSACK|optWScale) != wantOpts {
				t.Errorf("server socket options %#x, want %#x", si.Options, wantOpts)
			}
			if ci.Options&(optTimestamps|optSACK|optWScale) != wantOpts {
				t.Errorf("client socket options %#x, want %#x", ci.Options, wantOpts)
			}
			// Window scale: what the client offered is what the server
			// scales its sends by, and the client got moat's, which the
			// server scales its windows by (TestHandshakeFollowsTheListener
			// checks that it is the kernel's).
			if si.sndWScale != ci.rcvWScale || si.rcvWScale != ci.sndWScale || si.rcvWScale == 0 {
				t.Errorf("window scale: server snd %d rcv %d, client snd %d rcv %d",
					si.sndWScale, si.rcvWScale, ci.sndWScale, ci.rcvWScale)
			}
			// MSS: the client advertised 1460 (IPv4) or 1440 (IPv6) on a
			// 1500-byte MTU, both table entries; both sides count it less
			// the timestamp option when that is on.
			wantMSS := uint32(1460)
			if tc.addr.Is6() {
				wantMSS = 1440
			}
			if tc.timestamps {
				wantMSS -= 12
			}
			if si.Snd_mss != wantMSS || ci.Advmss != wantMSS {
				t.Errorf("server send MSS %d, client advertised %d, want %d", si.Snd_mss, ci.Advmss, wantMSS)
			}
		})
	}
	if err := s.lab.Client.Do(func() error {
		return os.WriteFile("/proc/sys/net/ipv4/tcp_timestamps", []byte("1"), 0)
	}); err != nil {
		t.Fatal(err)
	}
}

// spoofed returns a frame from a random address of the lab's spoofed range
// to the server's attacker-side address.
func spoofed(l *lab.Lab, tcp testpkt.TCP) []byte {
	ifc := l.Attacker.Ifaces[0]
	var r [8]byte
	rand.Read(r[:])
	src := l.SpoofV4.Addr().As4()
	src[2], src[3] = r[0], r[1]|1
	tcp.SrcPort = 1024 + binary.BigEndian.Uint16(r[2:])%60000
	tcp.DstPort = labPort
	return testpkt.Frame{
		SrcMAC: ifc.MAC, DstMAC: ifc.PeerMAC,
		Net: testpkt.IPv4{Src: netip.AddrFrom4(src), Dst: ifc.PeerIPv4},
		L4:  tcp,
	}.Bytes()
}

// TestAckFloodDropped sends ACKs with random sequence numbers from spoofed
// sources while an established connection keeps exchanging data.
func TestAckFloodDropped(t *testing.T) {
	s := newShielded(t, ModeAlways)
	_, accepted := echoServer(t, s.lab.Server)
	c := dial(t, s.lab.Client, s.lab.Client.Ifaces[0].PeerIPv4)
	<-accepted
	exchange(t, c, 4096)

	send := s.lab.Attacker.RawSender(t)
	const flood = 10000
	before := s.status(t)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		var r [8]byte
		for i := 0; i < flood; i++ {
			rand.Read(r[:])
			send(spoofed(s.lab, testpkt.TCP{ACK: true,
				Seq: binary.BigEndian.Uint32(r[:]), Ack: binary.BigEndian.Uint32(r[4:]),
				Options: []layers.TCPOption{testpkt.TCPNOP(), testpkt.TCPNOP(), testpkt.Timestamps(1, 2)}}))
		}
	}()
	// The established connection works during the flood...
	for i := 0; i < 20; i++ {
		exchange(t, c, 4096)
	}
	wg.Wait()
	// ...and after it.
	exchange(t, c, 4096)
	after := s.status(t)
	// A random ACK with timestamps passes moat's check with probability
	// 2^-30 (22 cookie bits, 8 in TSecr), 2^-22 without: one or two lucky
	// ones must not fail the test, more would mean the filter leaks.
	if got := after.ACKsDropped - before.ACKsDropped; got > flood || got < flood-2 {
		t.Errorf("dropped %d of %d flood ACKs", got, flood)
	}
}

// TestAutoModeUnderSynFlood floods SYNs from spoofed sources: the port
// turns to cookies, a client still connects (through a cookie), and after
// the flood and the hold time SYNs go to the kernel again.
func TestAutoModeUnderSynFlood(t *testing.T) {
	s := newShielded(t, ModeAuto)
	// 400 SYN/s is 20 per CPU per 100 ms window on 2 CPUs: far below what
	// the generator sends, far above the test's own connections.
	if err := Protect(s.objs.SynPorts, s.objs.SynCounters, s.objs.SynCensus, labPort, ModeAuto, 400); err != nil {
		t.Fatal(err)
	}
	if err := Configure(s.objs.SynSettings, Config{Hold: 500 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	_, accepted := echoServer(t, s.lab.Server)
	addr := s.lab.Client.Ifaces[0].PeerIPv4

	// No flood: the kernel does the handshake.
	c := dial(t, s.lab.Client, addr)
	<-accepted
	exchange(t, c, 4096)
	if st := s.status(t); st.Flooding || st.CookiesIssued != 0 {
		t.Fatalf("before the flood: %+v", st)
	}

	send := s.lab.Attacker.RawSender(t)
	// Frames are built up front so the generator is limited by the
	// kernel, not by packet building.
	var synFlood [512][]byte
	for i := range synFlood {
		var r [4]byte
		rand.Read(r[:])
		synFlood[i] = spoofed(s.lab, testpkt.TCP{SYN: true, Seq: binary.BigEndian.Uint32(r[:]),
			Options: []layers.TCPOption{testpkt.MSS(1460)}})
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			for _, f := range synFlood {
				send(f)
			}
			select {
			case <-stop:
				return
			default:
			}
		}
	}()
	deadline := time.Now().Add(5 * time.Second)
	for !s.status(t).Flooding {
		if time.Now().After(deadline) {
			close(stop)
			wg.Wait()
			t.Fatalf("no flood detected: %+v", s.status(t))
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond)
	during := s.status(t)
	c2 := dial(t, s.lab.Client, addr)
	<-accepted
	exchange(t, c2, 4096)
	st := s.status(t)
	close(stop)
	wg.Wait()
	if !st.Flooding || st.CookiesAccepted != during.CookiesAccepted+1 {
		t.Errorf("the client's connection during the flood was not a cookie handshake: %+v", st)
	}
	if during.CookiesIssued == 0 {
		t.Errorf("flooding but no cookies issued: %+v", during)
	}

	// After the hold time the next SYN goes to the kernel again.
	time.Sleep(700 * time.Millisecond)
	beforeAfter := s.status(t)
	c3 := dial(t, s.lab.Client, addr)
	<-accepted
	exchange(t, c3, 4096)
	st = s.status(t)
	if st.Flooding || st.CookiesIssued != beforeAfter.CookiesIssued {
		t.Errorf("after the flood: %+v (before %+v)", st, beforeAfter)
	}
	if !st.LastChange.After(during.LastChange) {
		t.Errorf("last change %v not after %v", st.LastChange, during.LastChange)
	}
}

// setSysctl writes net.ipv4.name in h's namespace and restores the value
// it had when the test ends. It then waits out a jiffy (at most 10 ms):
// the data path reads the settings once per jiffy per CPU and port.
func setSysctl(t *testing.T, h *lab.Host, name, val string) {
	t.Helper()
	path := "/proc/sys/net/ipv4/" + name
	var old []byte
	if err := h.Do(func() (err error) {
		if old, err = os.ReadFile(path); err != nil {
			return err
		}
		return os.WriteFile(path, []byte(val), 0)
	}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond)
	t.Cleanup(func() {
		h.Do(func() error { return os.WriteFile(path, old, 0) })
		time.Sleep(20 * time.Millisecond)
	})
}

// TestHandshakeFollowsServerSysctls turns off, in the server's namespace
// and after moat is running, each TCP option the kernel lets an operator
// turn off. The kernel refuses a request socket with an option its
// namespace turned off, so moat must stop offering it in the SYN-ACK, as
// the kernel's own SYN-ACKs do, and the handshake must still go through
// moat. With tcp_syncookies 0 the kernel would ignore moat's request
// socket: moat leaves the SYNs to the kernel.
func TestHandshakeFollowsServerSysctls(t *testing.T) {
	s := newShielded(t, ModeAlways)
	_, accepted := echoServer(t, s.lab.Server)
	serverIf := s.lab.Client.Ifaces[0]

	for _, tc := range []struct {
		sysctl string
		lost   uint8 // the option the connection must not have
		byMoat bool  // the handshake goes through a moat cookie
	}{
		{"tcp_sack", optSACK, true},
		{"tcp_timestamps", optTimestamps, true},
		{"tcp_window_scaling", optWScale, true},
		{"tcp_syncookies", 0, false},
	} {
		for _, addr := range []netip.Addr{serverIf.PeerIPv4, serverIf.PeerIPv6} {
			t.Run(fmt.Sprintf("%s off ipv%d", tc.sysctl, map[bool]int{true: 4, false: 6}[addr.Is4()]), func(t *testing.T) {
				setSysctl(t, s.lab.Server, tc.sysctl, "0")
				before := s.status(t)
				c, srv := dialAccepted(t, s.lab.Client, addr, accepted)
				exchange(t, c, 1<<20)
				after := s.status(t)
				if after.AcceptErrors != before.AcceptErrors {
					t.Errorf("accept errors %d->%d", before.AcceptErrors, after.AcceptErrors)
				}
				issued, took := after.CookiesIssued-before.CookiesIssued, after.CookiesAccepted-before.CookiesAccepted
				if tc.byMoat && (issued != 1 || took != 1) {
					t.Fatalf("cookies issued +%d, accepted +%d: the handshake did not go through moat", issued, took)
				}
				if !tc.byMoat && (issued != 0 || took != 0 || after.SYNsPassed != before.SYNsPassed+1) {
					t.Fatalf("cookies issued +%d, accepted +%d, syns passed +%d: want the kernel to have the SYN",
						issued, took, after.SYNsPassed-before.SYNsPassed)
				}
				want := uint8(optTimestamps|optSACK|optWScale) &^ tc.lost
				ci, si := tcpInfo(t, c), tcpInfo(t, srv)
				if got := si.Options & (optTimestamps | optSACK | optWScale); got != want {
					t.Errorf("server socket options %#x, want %#x", got, want)
				}
				if got := ci.Options & (optTimestamps | optSACK | optWScale); got != want {
					t.Errorf("client socket options %#x, want %#x", got, want)
				}
			})
		}
	}
}
