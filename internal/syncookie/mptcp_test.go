package syncookie

import (
	"context"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/google/gopacket/layers"

	"github.com/moat-shield/moat/internal/lab"
	"github.com/moat-shield/moat/internal/testpkt"
)

// TestSynToMPTCPListener: the kernel refuses a moat cookie handshake to
// an MPTCP listener (bpf_sk_assign_tcp_reqsk fails, and the client is
// reset), so every SYN to one passes to the kernel untouched, even one
// that moat would not answer (with data), counted in mptcp_syns and
// syns_passed, while an ACK that fits no socket there is still dropped.
// Test runs beside an MPTCP listener in a scratch namespace, IPv4 and
// IPv6 (the listener is dual-stack).
func TestSynToMPTCPListener(t *testing.T) {
	objs := setup(t)
	linux := []layers.TCPOption{testpkt.MSS(1460), testpkt.SACKPermitted(), testpkt.Timestamps(777, 0), testpkt.TCPNOP(), testpkt.WindowScale(7)}
	frames := [][]byte{
		synFrame(nil, client4, server4, testpkt.TCP{Options: linux}),
		synFrame(nil, client6, server6, testpkt.TCP{Options: linux}),
		// A Fast Open SYN, which moat would not answer: for a plain
		// listener dropped in cookie mode, for this one the kernel's.
		synFrame(nil, client4, server4, testpkt.TCP{Options: linux, Payload: []byte("GET /")}),
		ackFrame(client4, server4, protectedPort, clientISN+1, 0x5eed, false),
	}
	var lc net.ListenConfig
	lc.SetMultipathTCP(true)
	rets, outs := verdictsBeside(t, objs.MoatFilter, lc, frames)
	if rets == nil {
		return
	}
	checkPassedAsIs(t, frames, rets, outs, []uint32{2, 2, 2, 1}) // XDP_PASS for the SYNs, XDP_DROP for the ACK
	st, err := Status(objs.SynPorts, objs.SynCounters)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range st {
		if p.Port != protectedPort {
			continue
		}
		if p.SYNs != 3 || p.MPTCPSYNs != 3 || p.SYNsPassed != 3 || p.SYNsDropped != 0 || p.CookiesIssued != 0 || p.ACKsDropped != 1 {
			t.Errorf("counters %+v: want 3 SYNs, all passed for MPTCP, no cookie, 1 ACK dropped", p)
		}
	}
}

// TestMPTCPListenerConnects: under always mode, clients of an MPTCP
// listener (Go's default) connect and exchange data, over plain TCP and
// over MPTCP, with the kernel making the handshakes (also with its own
// cookies, whose third ACKs pass moat's ACK filter); while a plain
// listener that replaces it gets moat's cookies again. Before, every
// connection to an MPTCP listener was reset: moat answered the SYN, and
// the kernel refused the cookie handshake.
func TestMPTCPListenerConnects(t *testing.T) {
	s := newShielded(t, ModeAlways)
	serve := func(t *testing.T, mptcp bool) net.Listener {
		var lc net.ListenConfig
		lc.SetMultipathTCP(mptcp)
		var ln net.Listener
		if err := s.lab.Server.Do(func() (err error) {
			ln, err = lc.Listen(context.Background(), "tcp", netip.AddrPortFrom(netip.IPv6Unspecified(), labPort).String())
			return err
		}); err != nil {
			t.Fatal(err)
		}
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				go func() {
					defer c.Close()
					c.SetDeadline(time.Now().Add(5 * time.Second))
					buf := make([]byte, 5)
					if _, err := io.ReadFull(c, buf); err == nil {
						c.Write(append([]byte("re: "), buf...))
					}
				}()
			}
		}()
		return ln
	}
	exchange := func(t *testing.T, network string, mptcp bool) {
		t.Helper()
		addr := s.lab.Client.Ifaces[0].PeerIPv4
		if network == "tcp6" {
			addr = s.lab.Client.Ifaces[0].PeerIPv6
		}
		var d net.Dialer
		d.SetMultipathTCP(mptcp)
		d.Timeout = 3 * time.Second
		var got []byte
		var used bool
		err := s.lab.Client.Do(func() error {
			c, err := d.Dial(network, netip.AddrPortFrom(addr, labPort).String())
			if err != nil {
				return err
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(3 * time.Second))
			if used, err = c.(*net.TCPConn).MultipathTCP(); err != nil {
				return err
			}
			if _, err := c.Write([]byte("hello")); err != nil {
				return err
			}
			got, err = io.ReadAll(c)
			return err
		})
		if err != nil {
			t.Fatalf("%s client (MPTCP %t): %v", network, mptcp, err)
		}
		if string(got) != "re: hello" {
			t.Fatalf("%s client (MPTCP %t): got %q", network, mptcp, got)
		}
		if used != mptcp {
			t.Errorf("%s client asked for MPTCP %t, connection uses it: %t", network, mptcp, used)
		}
	}

	ln := serve(t, true)
	before := s.status(t)
	for _, c := range []struct {
		network string
		mptcp   bool
	}{{"tcp4", false}, {"tcp4", true}, {"tcp6", false}, {"tcp6", true}} {
		exchange(t, c.network, c.mptcp)
	}
	after := s.status(t)
	// A client that sends its SYN again counts it again.
	if n := after.MPTCPSYNs - before.MPTCPSYNs; n < 4 || after.CookiesIssued != before.CookiesIssued || after.AcceptErrors != before.AcceptErrors {
		t.Errorf("MPTCP listener: %d SYNs counted for it, cookies issued %d -> %d, accept errors %d -> %d; want 4 or more, and no cookies",
			n, before.CookiesIssued, after.CookiesIssued, before.AcceptErrors, after.AcceptErrors)
	}

	// With the kernel's cookies for every SYN, the third ACKs carry them
	// through moat's ACK filter.
	setSysctl(t, s.lab.Server, "tcp_syncookies", "2")
	kernelCookies := func() uint64 {
		var c map[string]uint64
		if err := s.lab.Server.Do(func() (err error) { c, err = lab.NetCounters(); return err }); err != nil {
			t.Fatal(err)
		}
		return c["TcpExt.SyncookiesRecv"]
	}
	before, recv := s.status(t), kernelCookies()
	exchange(t, "tcp4", false)
	exchange(t, "tcp6", true)
	after = s.status(t)
	if n := kernelCookies() - recv; n < 2 || after.CookiesRejected != before.CookiesRejected || after.ACKsDropped != before.ACKsDropped {
		t.Errorf("kernel cookies to the MPTCP listener: %d received by the kernel (want 2 or more), cookies rejected %d -> %d, ACKs dropped %d -> %d",
			n, before.CookiesRejected, after.CookiesRejected, before.ACKsDropped, after.ACKsDropped)
	}
	ln.Close()

	// The data path keeps what it found of a listener for a jiffy.
	time.Sleep(50 * time.Millisecond)
	ln = serve(t, false)
	defer ln.Close()
	before = s.status(t)
	exchange(t, "tcp4", false)
	after = s.status(t)
	if after.CookiesAccepted != before.CookiesAccepted+1 || after.MPTCPSYNs != before.MPTCPSYNs {
		t.Errorf("plain listener after it: cookies accepted %d -> %d, MPTCP SYNs %d -> %d; want a moat handshake",
			before.CookiesAccepted, after.CookiesAccepted, before.MPTCPSYNs, after.MPTCPSYNs)
	}
}
