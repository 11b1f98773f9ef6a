package syncookie

import (
	"bytes"
	"io"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/google/gopacket/layers"
	"golang.org/x/sys/unix"

	"github.com/moat-shield/moat/internal/testpkt"
)

// md5Option is a TCP-MD5 signature option (RFC 2385): kind 19, 18 bytes.
func md5Option() layers.TCPOption {
	return layers.TCPOption{OptionType: 19, OptionLength: 18, OptionData: bytes.Repeat([]byte{0xab}, 16)}
}

// setMD5Key gives the socket fd a TCP-MD5 key for peer.
func setMD5Key(fd int, peer netip.Addr, key string) error {
	sig := unix.TCPMD5Sig{Keylen: uint16(len(key))}
	copy(sig.Key[:], key)
	if peer.Is4() {
		sa := (*unix.RawSockaddrInet4)(unsafe.Pointer(&sig.Addr))
		sa.Family = unix.AF_INET
		sa.Addr = peer.As4()
	} else {
		sa := (*unix.RawSockaddrInet6)(unsafe.Pointer(&sig.Addr))
		sa.Family = unix.AF_INET6
		sa.Addr = peer.As16()
	}
	return unix.SetsockoptTCPMD5Sig(fd, unix.IPPROTO_TCP, unix.TCP_MD5SIG, &sig)
}

// TestSignedSyn: a SYN signed with TCP-MD5 needs a signed SYN-ACK, which
// only the kernel can make. For a listener holding a key it passes to the
// kernel untouched; for a listener with none the kernel would drop it, and
// cookie mode drops it too. Test runs in a scratch namespace, IPv4 and
// IPv6, signature first or after Linux's options.
func TestSignedSyn(t *testing.T) {
	linuxThenMD5 := []layers.TCPOption{testpkt.MSS(1460), testpkt.SACKPermitted(), testpkt.Timestamps(777, 0), testpkt.TCPNOP(), testpkt.TCPNOP(), md5Option()}
	md5First := []layers.TCPOption{md5Option(), testpkt.TCPNOP(), testpkt.TCPNOP(), testpkt.MSS(1460)}
	frames := [][]byte{
		synFrame(nil, client4, server4, testpkt.TCP{Options: linuxThenMD5}),
		synFrame(nil, client6, server6, testpkt.TCP{Options: md5First}),
	}
	for _, tc := range []struct {
		name    string
		key     bool
		want    uint32 // for every frame
		passed  uint64
		dropped uint64
	}{
		{"listener with a key", true, 2, 2, 0},
		{"listener without keys", false, 1, 0, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs := setup(t)
			var lc net.ListenConfig
			lc.SetMultipathTCP(false)
			lc.Control = func(_, _ string, c syscall.RawConn) error {
				var err error
				if tc.key {
					c.Control(func(fd uintptr) { err = setMD5Key(int(fd), client6, "moat-test-key") })
				}
				return err
			}
			rets, outs := verdictsBeside(t, objs.MoatFilter, lc, frames)
			if rets == nil {
				return
			}
			checkPassedAsIs(t, frames, rets, outs, []uint32{tc.want, tc.want})
			st, err := Status(objs.SynPorts, objs.SynCounters)
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range st {
				if p.Port == protectedPort && (p.SYNs != 2 || p.CookiesIssued != 0 || p.SYNsPassed != tc.passed || p.SYNsDropped != tc.dropped) {
					t.Errorf("counters %+v: want 2 SYNs, no cookie, %d passed, %d dropped", p, tc.passed, tc.dropped)
				}
			}
		})
	}
}

// TestMD5SessionConnects: a TCP-MD5 session (as BGP's on port 179) to a
// protected port in always mode: the client's signed SYN goes to the
// kernel, which answers it signed, and the session carries data both ways,
// over IPv4 and IPv6. moat used to answer the SYN with an unsigned
// SYN-ACK, which the client drops: no session could be made.
func TestMD5SessionConnects(t *testing.T) {
	s := newShielded(t, ModeAlways)
	ifc := s.lab.Client.Ifaces[0]
	const key = "bgp-session-key"
	for _, network := range []string{"tcp4", "tcp6"} {
		t.Run(network, func(t *testing.T) {
			client, server := ifc.IPv4.Addr(), ifc.PeerIPv4
			if network == "tcp6" {
				client, server = ifc.IPv6.Addr(), ifc.PeerIPv6
			}
			ln := s.listenTCP(t, network, labPort, func(fd int) error { return setMD5Key(fd, client, key) })
			t.Cleanup(func() { ln.Close() })
			go func() {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				defer c.Close()
				c.SetDeadline(time.Now().Add(5 * time.Second))
				buf := make([]byte, 4)
				if _, err := io.ReadFull(c, buf); err == nil {
					c.Write([]byte("OPEN"))
				}
			}()
			before := s.status(t)
			d := net.Dialer{Timeout: 3 * time.Second}
			d.SetMultipathTCP(false)
			d.Control = func(_, _ string, c syscall.RawConn) error {
				var err error
				c.Control(func(fd uintptr) { err = setMD5Key(int(fd), server, key) })
				return err
			}
			var got []byte
			err := s.lab.Client.Do(func() error {
				c, err := d.Dial(network, netip.AddrPortFrom(server, labPort).String())
				if err != nil {
					return err
				}
				defer c.Close()
				c.SetDeadline(time.Now().Add(3 * time.Second))
				if _, err := c.Write([]byte("OPEN")); err != nil {
					return err
				}
				got, err = io.ReadAll(c)
				return err
			})
			after := s.status(t)
			if err != nil || string(got) != "OPEN" {
				t.Fatalf("signed session: %q, %v (syn status %+v)", got, err, after)
			}
			if after.CookiesIssued != before.CookiesIssued || after.SYNsPassed == before.SYNsPassed {
				t.Errorf("cookies issued %d -> %d, SYNs passed %d -> %d: want the SYN left to the kernel",
					before.CookiesIssued, after.CookiesIssued, before.SYNsPassed, after.SYNsPassed)
			}
		})
	}
}
