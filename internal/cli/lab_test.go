package cli_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/moat-shield/moat/internal/cli"
	"github.com/moat-shield/moat/internal/lab"
	"github.com/moat-shield/moat/internal/rules"
)

// Waits of the traffic checks. A packet that is let through arrives within
// a millisecond on veth, so the "blocked" waits only need to cover a
// scheduler hiccup on a loaded machine; the "passes" waits are generous
// because they end as soon as the packet arrives.
const (
	blockedWait = 300 * time.Millisecond // UDP: silence this long means dropped
	connectWait = time.Second            // TCP: a dropped SYN times out after this
	passWait    = 3 * time.Second
	cmdTimeout  = 20 * time.Second
)

// shieldLab is a lab with moat's pins under its own root and sockets
// listening in the server namespace.
type shieldLab struct {
	t    *testing.T
	lab  *lab.Lab
	root string

	tcpPort uint16
	udp     [2]*udpSink // two ports, for port rules
}

func newShieldLab(t *testing.T) *shieldLab {
	t.Helper()
	l := lab.NewT(t)
	sl := &shieldLab{t: t, lab: l, root: newRoot(t)}
	err := l.Server.Do(func() error {
		ln, err := net.Listen("tcp", "[::]:0") // dual stack: both families
		if err != nil {
			return err
		}
		t.Cleanup(func() { ln.Close() })
		sl.tcpPort = uint16(ln.Addr().(*net.TCPAddr).Port)
		// The kernel completes handshakes without Accept; accepting only
		// keeps the backlog from filling up.
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				c.Close()
			}
		}()
		for i := range sl.udp {
			if sl.udp[i], err = listenUDP(t); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("listen in the server namespace: %v", err)
	}
	return sl
}

// moat runs the real binary in the server namespace.
func (sl *shieldLab) moat(args ...string) result {
	sl.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), cmdTimeout)
	defer cancel()
	cmd := sl.lab.Server.Command(ctx, moatBin, append(append([]string{}, args...), "--root", sl.root)...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		sl.t.Fatalf("run moat %s: %v", strings.Join(args, " "), err)
	}
	return result{code, out.String(), errb.String()}
}

func (sl *shieldLab) mustMoat(args ...string) result {
	sl.t.Helper()
	r := sl.moat(args...)
	if r.code != 0 {
		sl.t.Fatalf("moat %s: %v", strings.Join(args, " "), r)
	}
	return r
}

// moatJSON runs a --json command and decodes its output into v.
func (sl *shieldLab) moatJSON(v any, args ...string) {
	sl.t.Helper()
	r := sl.mustMoat(append(args, "--json")...)
	if err := json.Unmarshal([]byte(r.stdout), v); err != nil {
		sl.t.Fatalf("moat %s --json: %v\n%s", strings.Join(args, " "), err, r.stdout)
	}
}

func (sl *shieldLab) stats() map[string]cli.StatsReport {
	sl.t.Helper()
	var reports []cli.StatsReport
	sl.moatJSON(&reports, "stats")
	out := map[string]cli.StatsReport{}
	for _, r := range reports {
		out[r.Iface] = r
	}
	return out
}

func (sl *shieldLab) status() cli.Status {
	sl.t.Helper()
	var st cli.Status
	sl.moatJSON(&st, "status")
	return st
}

func (sl *shieldLab) list() rules.Ruleset {
	sl.t.Helper()
	var rs rules.Ruleset
	sl.moatJSON(&rs, "list")
	return rs
}

// Addresses of the lab, named by who has them.
func (sl *shieldLab) clientV4() netip.Addr   { return sl.lab.Client.Ifaces[0].IPv4.Addr() }
func (sl *shieldLab) attackerV4() netip.Addr { return sl.lab.Attacker.Ifaces[0].IPv4.Addr() }
func (sl *shieldLab) attackerV6() netip.Addr { return sl.lab.Attacker.Ifaces[0].IPv6.Addr() }

// serverAddr is the server's address on the link to h in the given family.
func (sl *shieldLab) serverAddr(h *lab.Host, v6 bool) netip.Addr {
	ifc := h.Ifaces[0]
	if v6 {
		return ifc.PeerIPv6
	}
	return ifc.PeerIPv4
}

// connect opens a TCP connection from h to the server's listener.
func (sl *shieldLab) connect(h *lab.Host, v6 bool, timeout time.Duration) error {
	dst := netip.AddrPortFrom(sl.serverAddr(h, v6), sl.tcpPort)
	return h.Do(func() error {
		c, err := net.DialTimeout("tcp", dst.String(), timeout)
		if err == nil {
			c.Close()
		}
		return err
	})
}

func (sl *shieldLab) expectConnect(h *lab.Host, v6 bool) {
	sl.t.Helper()
	if err := sl.connect(h, v6, passWait); err != nil {
		sl.t.Fatalf("TCP from %s (IPv6 %v) should pass: %v", h.Name, v6, err)
	}
}

func (sl *shieldLab) expectNoConnect(h *lab.Host, v6 bool) {
	sl.t.Helper()
	if err := sl.connect(h, v6, connectWait); err == nil {
		sl.t.Fatalf("TCP from %s (IPv6 %v) connected, want it dropped", h.Name, v6)
	}
}

// udpSink counts the datagrams one server socket receives, by payload.
type udpSink struct {
	port uint16
	mu   sync.Mutex
	got  map[string]bool
}

// listenUDP opens a dual-stack UDP socket; it must run inside the server's
// namespace (in Do).
func listenUDP(t *testing.T) (*udpSink, error) {
	pc, err := net.ListenPacket("udp", "[::]:0")
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { pc.Close() })
	// Floods that a limit lets through arrive in bursts: a default-sized
	// buffer would drop datagrams the tests count, which is not moat's
	// doing. FORCE, as root, goes past net.core.rmem_max.
	if rc, err := pc.(*net.UDPConn).SyscallConn(); err == nil {
		rc.Control(func(fd uintptr) {
			unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 16<<20)
		})
	}
	s := &udpSink{port: uint16(pc.LocalAddr().(*net.UDPAddr).Port), got: map[string]bool{}}
	go func() {
		buf := make([]byte, 2048)
		for {
			n, _, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			s.mu.Lock()
			s.got[string(buf[:n])] = true
			s.mu.Unlock()
		}
	}()
	return s, nil
}

// waitFor tells whether payload arrives within d.
func (s *udpSink) waitFor(payload string, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for {
		s.mu.Lock()
		ok := s.got[payload]
		s.mu.Unlock()
		if ok || time.Now().After(deadline) {
			return ok
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// token returns a payload that no other datagram of the test carries.
func token(what string) string {
	var b [6]byte
	rand.Read(b[:])
	return what + "-" + hex.EncodeToString(b[:])
}

// sendUDP sends one datagram from h to sink's port on the server and
// returns its payload.
func (sl *shieldLab) sendUDP(h *lab.Host, v6 bool, sink *udpSink) string {
	sl.t.Helper()
	payload := token(h.Name)
	dst := netip.AddrPortFrom(sl.serverAddr(h, v6), sink.port)
	err := h.Do(func() error {
		c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(dst))
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Write([]byte(payload))
		return err
	})
	if err != nil {
		sl.t.Fatalf("send UDP from %s: %v", h.Name, err)
	}
	return payload
}

func (sl *shieldLab) expectUDP(h *lab.Host, v6 bool, sink *udpSink) {
	sl.t.Helper()
	if p := sl.sendUDP(h, v6, sink); !sink.waitFor(p, passWait) {
		sl.t.Fatalf("UDP from %s (IPv6 %v) to port %d should pass", h.Name, v6, sink.port)
	}
}

func (sl *shieldLab) expectNoUDP(h *lab.Host, v6 bool, sink *udpSink) {
	sl.t.Helper()
	if p := sl.sendUDP(h, v6, sink); sink.waitFor(p, blockedWait) {
		sl.t.Fatalf("UDP from %s (IPv6 %v) to port %d arrived, want it dropped", h.Name, v6, sink.port)
	}
}

// ping sends one ICMP echo request from h to the server over a raw socket
// and waits for the matching reply.
func (sl *shieldLab) ping(h *lab.Host, timeout time.Duration) error {
	src, dst := h.Ifaces[0].IPv4.Addr(), h.Ifaces[0].PeerIPv4
	var b [2]byte
	rand.Read(b[:])
	id := uint16(b[0])<<8 | uint16(b[1])
	echo := &layers.ICMPv4{TypeCode: layers.CreateICMPv4TypeCode(layers.ICMPv4TypeEchoRequest, 0), Id: id, Seq: 1}
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{ComputeChecksums: true},
		echo, gopacket.Payload("moat ping")); err != nil {
		return err
	}
	var conn net.PacketConn
	if err := h.Do(func() (err error) {
		conn, err = net.ListenPacket("ip4:icmp", src.String())
		return err
	}); err != nil {
		return fmt.Errorf("raw ICMP socket in %s: %w", h.Name, err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(timeout))
	if _, err := conn.WriteTo(buf.Bytes(), &net.IPAddr{IP: dst.AsSlice()}); err != nil {
		return err
	}
	rb := make([]byte, 1500)
	for {
		n, _, err := conn.ReadFrom(rb)
		if err != nil {
			return err
		}
		p := gopacket.NewPacket(rb[:n], layers.LayerTypeICMPv4, gopacket.Default)
		if r, ok := p.Layer(layers.LayerTypeICMPv4).(*layers.ICMPv4); ok &&
			r.TypeCode.Type() == layers.ICMPv4TypeEchoReply && r.Id == id {
			return nil
		}
	}
}

// xdpAttached asks the kernel whether an XDP program is on a server
// interface.
func (sl *shieldLab) xdpAttached(iface string) bool {
	sl.t.Helper()
	var on bool
	err := sl.lab.Server.Do(func() error {
		l, err := netlink.LinkByName(iface)
		if err != nil {
			return err
		}
		x := l.Attrs().Xdp
		on = x != nil && x.Attached
		return nil
	})
	if err != nil {
		sl.t.Fatalf("read %s: %v", iface, err)
	}
	return on
}

func (sl *shieldLab) ifaces() (toClient, toAttacker string) {
	return sl.lab.Server.Ifaces[0].Name, sl.lab.Server.Ifaces[1].Name
}

// TestLabDenyAllowPorts drives the filter on both server interfaces through
// separate runs of the binary: every rule is written by one process and
// enforced after it has exited.
func TestLabDenyAllowPorts(t *testing.T) {
	t.Parallel()
	sl := newShieldLab(t)
	toClient, toAttacker := sl.ifaces()
	c, a := sl.lab.Client, sl.lab.Attacker
	udp, udp2 := sl.udp[0], sl.udp[1]

	r := sl.mustMoat("attach", toClient, toAttacker)
	if !strings.Contains(r.stdout, "attached to "+toClient) || !strings.Contains(r.stdout, "attached to "+toAttacker) {
		t.Fatalf("attach output:\n%s", r.stdout)
	}
	if !sl.xdpAttached(toClient) || !sl.xdpAttached(toAttacker) {
		t.Fatal("attach left an interface without XDP")
	}
	// Everything passes before any rule.
	sl.expectConnect(a, false)
	sl.expectConnect(c, false)
	sl.expectUDP(a, true, udp)

	t.Run("deny", func(t *testing.T) {
		sl.t = t
		sl.mustMoat("block", sl.attackerV4().String(), sl.attackerV6().String())
		sl.expectNoConnect(a, false)
		sl.expectNoConnect(a, true)
		sl.expectNoUDP(a, false, udp)
		sl.expectNoUDP(a, true, udp)
		sl.expectConnect(c, false)
		sl.expectConnect(c, true)
		sl.expectUDP(c, false, udp)

		// The same rules guard the other interface: cut the client's /24
		// off, and its IPv6 address still passes.
		sl.mustMoat("block", netip.PrefixFrom(sl.clientV4(), 24).Masked().String())
		sl.expectNoConnect(c, false)
		sl.expectNoUDP(c, false, udp)
		sl.expectConnect(c, true)
	})

	t.Run("rules outlive the process", func(t *testing.T) {
		sl.t = t
		rs := sl.list()
		var deny []string
		for _, e := range rs.Deny {
			deny = append(deny, e.Prefix.String())
		}
		want := []string{"198.18.1.0/24", sl.attackerV4().String() + "/32", sl.attackerV6().String() + "/128"}
		if strings.Join(deny, " ") != strings.Join(want, " ") {
			t.Fatalf("deny list %v, want %v", deny, want)
		}
		for _, e := range rs.Deny {
			if e.Hits == 0 {
				t.Errorf("deny %s has no hits after dropping traffic", e.Prefix)
			}
		}
		sl.expectNoUDP(a, false, udp)
	})

	t.Run("stats count drops per interface", func(t *testing.T) {
		sl.t = t
		const n = 5
		before := sl.stats()
		for i := 0; i < n; i++ {
			sl.sendUDP(a, false, udp)
		}
		time.Sleep(blockedWait) // let them reach the filter
		after := sl.stats()
		deny := func(s map[string]cli.StatsReport, iface string) uint64 {
			return s[iface].ByReason["denylist"].Dropped.Packets
		}
		if d := deny(after, toAttacker) - deny(before, toAttacker); d < n {
			t.Errorf("%s denylist drops grew by %d, want at least %d", toAttacker, d, n)
		}
		if d := deny(after, toClient) - deny(before, toClient); d != 0 {
			t.Errorf("%s denylist drops grew by %d while only the attacker sent", toClient, d)
		}
		if after[toAttacker].Dropped.Bytes <= before[toAttacker].Dropped.Bytes {
			t.Errorf("dropped bytes did not grow on %s", toAttacker)
		}
		if before[toClient].ByReason["denylist"].Dropped.Packets == 0 {
			t.Errorf("%s counted no denylist drops after the client was blocked", toClient)
		}
	})

	t.Run("allow beats deny", func(t *testing.T) {
		sl.t = t
		sl.mustMoat("allow", sl.clientV4().String())
		sl.expectConnect(c, false)
		sl.expectUDP(c, false, udp)
		sl.mustMoat("disallow", sl.clientV4().String())
		sl.expectNoUDP(c, false, udp)
	})

	t.Run("unblock restores", func(t *testing.T) {
		sl.t = t
		sl.mustMoat("unblock", "198.18.1.0/24", sl.attackerV4().String(), sl.attackerV6().String())
		sl.expectConnect(a, false)
		sl.expectConnect(a, true)
		sl.expectConnect(c, false)
		sl.expectUDP(a, false, udp)
	})

	t.Run("port drop", func(t *testing.T) {
		sl.t = t
		spec := fmt.Sprintf("udp/%d", udp.port)
		sl.mustMoat("port", "drop", spec)
		sl.expectNoUDP(c, false, udp)
		sl.expectNoUDP(c, true, udp)
		sl.expectUDP(c, false, udp2)
		sl.expectConnect(c, false) // same port number, other protocol
		sl.mustMoat("port", "remove", spec)
		sl.expectUDP(c, false, udp)
	})

	t.Run("ICMP type", func(t *testing.T) {
		sl.t = t
		if err := sl.ping(c, passWait); err != nil {
			t.Fatalf("ping before the rule: %v", err)
		}
		sl.mustMoat("port", "drop", "icmp/echo-request")
		if err := sl.ping(c, connectWait); err == nil {
			t.Fatal("ping answered with icmp/echo-request dropped")
		}
		if err := sl.ping(a, connectWait); err == nil {
			t.Fatal("ping from the attacker answered with icmp/echo-request dropped")
		}
		rs := sl.list()
		if len(rs.Ports) != 1 || rs.Ports[0].Spec.String() != "icmp/echo-request" || rs.Ports[0].Hits < 2 {
			t.Fatalf("port rules %+v, want icmp/echo-request with 2 or more hits", rs.Ports)
		}
		sl.mustMoat("port", "remove", "icmp/8")
		if err := sl.ping(c, passWait); err != nil {
			t.Fatalf("ping after the rule was removed: %v", err)
		}
	})
}

// TestLabReattachDetach replaces the program in place, then detaches one
// interface at a time.
func TestLabReattachDetach(t *testing.T) {
	t.Parallel()
	sl := newShieldLab(t)
	toClient, toAttacker := sl.ifaces()
	c, a := sl.lab.Client, sl.lab.Attacker
	udp := sl.udp[0]

	sl.mustMoat("attach", toClient, toAttacker)
	sl.mustMoat("block", sl.attackerV4().String())
	sl.expectUDP(c, false, udp)
	sl.expectNoUDP(a, false, udp)

	t.Run("reattach in place", func(t *testing.T) {
		sl.t = t
		st1 := sl.status()
		stats1 := sl.stats()
		r := sl.mustMoat("attach", toClient, toAttacker)
		if strings.Count(r.stdout, "replaced the program on") != 2 {
			t.Fatalf("re-attach output:\n%s", r.stdout)
		}
		st2 := sl.status()
		stats2 := sl.stats()
		if len(st1.Interfaces) != 2 || len(st2.Interfaces) != 2 {
			t.Fatalf("status interfaces before %+v after %+v", st1.Interfaces, st2.Interfaces)
		}
		for i := range st1.Interfaces {
			b, n := st1.Interfaces[i], st2.Interfaces[i]
			if !n.Present || n.Mode != b.Mode || n.Ifindex != b.Ifindex {
				t.Errorf("%s: before %+v after %+v", b.Iface, b, n)
			}
			if n.LinkID != b.LinkID || n.LinkID == 0 {
				t.Errorf("%s: link id %d -> %d, want it kept", b.Iface, b.LinkID, n.LinkID)
			}
			if n.ProgramID == b.ProgramID {
				t.Errorf("%s: program id %d kept, want a new program", b.Iface, b.ProgramID)
			}
		}
		// Counters carry over: nothing is lost, and the new program keeps
		// counting in the same map.
		for _, iface := range []string{toClient, toAttacker} {
			b, n := stats1[iface], stats2[iface]
			if b.Passed.Packets+b.Dropped.Packets == 0 {
				t.Fatalf("%s counted nothing before re-attach", iface)
			}
			if n.Passed.Packets < b.Passed.Packets || n.Dropped.Packets < b.Dropped.Packets {
				t.Errorf("%s counters went back: %+v -> %+v", iface, b, n)
			}
		}
		sl.expectNoUDP(a, false, udp)
		sl.expectUDP(c, false, udp)
		stats3 := sl.stats()
		if d := stats3[toAttacker].ByReason["denylist"].Dropped.Packets - stats2[toAttacker].ByReason["denylist"].Dropped.Packets; d < 1 {
			t.Errorf("the new program counted no drop on %s", toAttacker)
		}
		if mode := sl.moat("attach", "--mode", "generic", toClient); mode.code != 2 {
			t.Errorf("changing the mode in place: %v", mode)
		}
	})

	t.Run("detach one", func(t *testing.T) {
		sl.t = t
		sl.mustMoat("detach", toClient)
		if sl.xdpAttached(toClient) {
			t.Fatalf("XDP still on %s after detach", toClient)
		}
		if !sl.xdpAttached(toAttacker) {
			t.Fatalf("XDP gone from %s after detaching %s", toAttacker, toClient)
		}
		st := sl.status()
		if len(st.Interfaces) != 1 || st.Interfaces[0].Iface != toAttacker || st.Rules.Deny != 1 {
			t.Fatalf("status after detaching one: %+v", st)
		}
		sl.expectNoUDP(a, false, udp)
		sl.expectUDP(c, false, udp)
	})

	t.Run("detach last", func(t *testing.T) {
		sl.t = t
		r := sl.mustMoat("detach", toAttacker)
		if !strings.Contains(r.stdout, "removed rules and pins") {
			t.Errorf("detach output:\n%s", r.stdout)
		}
		if st := pinnedState(t, sl.root); st != "" {
			t.Fatalf("pins left after the last detach:\n%s", st)
		}
		if sl.xdpAttached(toClient) || sl.xdpAttached(toAttacker) {
			t.Fatal("XDP still attached after the last detach")
		}
		sl.expectUDP(a, false, udp)
		if st := sl.status(); len(st.Interfaces) != 0 {
			t.Fatalf("status after the last detach: %+v", st)
		}
	})
}

// TestLabTTL checks that a timed entry stops blocking on its own and that
// expire then removes it.
func TestLabTTL(t *testing.T) {
	t.Parallel()
	sl := newShieldLab(t)
	toClient, toAttacker := sl.ifaces()
	a := sl.lab.Attacker
	udp := sl.udp[0]
	sl.mustMoat("attach", toClient, toAttacker)

	const ttl = 2 * time.Second
	start := time.Now()
	sl.mustMoat("block", "--ttl", ttl.String(), "--comment", "short", sl.attackerV4().String())
	if time.Since(start) < ttl-blockedWait {
		sl.expectNoUDP(a, false, udp)
	}
	var passedAt time.Duration
	for deadline := start.Add(ttl + 3*time.Second); time.Now().Before(deadline); {
		if p := sl.sendUDP(a, false, udp); udp.waitFor(p, 100*time.Millisecond) {
			passedAt = time.Since(start)
			break
		}
	}
	if passedAt == 0 {
		t.Fatalf("a %s entry still blocks after %s", ttl, time.Since(start))
	}
	if passedAt < ttl-time.Second {
		t.Fatalf("a %s entry stopped blocking after only %s", ttl, passedAt)
	}

	rs := sl.list()
	if len(rs.Deny) != 1 || rs.Deny[0].Expires == nil || rs.Deny[0].Comment != "short" {
		t.Fatalf("expired entry before expire: %+v", rs.Deny)
	}
	if r := sl.mustMoat("expire"); !strings.Contains(r.stdout, "removed 1 expired") {
		t.Fatalf("expire output:\n%s", r.stdout)
	}
	if rs := sl.list(); len(rs.Deny) != 0 {
		t.Fatalf("deny list after expire: %+v", rs.Deny)
	}
	if r := sl.mustMoat("expire"); !strings.Contains(r.stdout, "removed 0 expired") {
		t.Fatalf("second expire output:\n%s", r.stdout)
	}
}

// TestLabMultiAttachRefusedWhole checks that an attach naming a missing
// interface after a good one attaches to neither.
func TestLabMultiAttachRefusedWhole(t *testing.T) {
	t.Parallel()
	sl := newShieldLab(t)
	toClient, _ := sl.ifaces()
	r := sl.moat("attach", toClient, "moat-nx0")
	checkUsageError(t, r, "no interface")
	if sl.xdpAttached(toClient) {
		t.Fatalf("%s was attached by a refused command", toClient)
	}
	if st := pinnedState(t, sl.root); st != "" {
		t.Fatalf("a refused attach left state behind:\n%s", st)
	}
}

// TestLabAttachTaken attaches a second moat root to an interface that the
// first one holds: the second is refused as a usage error, leaves nothing
// behind, and the first keeps its program.
func TestLabAttachTaken(t *testing.T) {
	t.Parallel()
	sl := newShieldLab(t)
	toClient, _ := sl.ifaces()
	sl.mustMoat("attach", toClient)
	before := sl.status()

	other := &shieldLab{t: t, lab: sl.lab, root: newRoot(t)}
	for _, mode := range []string{"", "native", "generic"} {
		t.Run("mode "+mode, func(t *testing.T) {
			other.t = t
			args := []string{"attach", toClient}
			if mode != "" {
				args = append(args, "--mode", mode)
			}
			r := other.moat(args...)
			checkUsageError(t, r, toClient)
			if st := pinnedState(t, other.root); st != "" {
				t.Fatalf("a refused attach left state behind:\n%s", st)
			}
		})
	}
	sl.t = t
	after := sl.status()
	if len(after.Interfaces) != 1 || after.Interfaces[0].LinkID != before.Interfaces[0].LinkID ||
		after.Interfaces[0].ProgramID != before.Interfaces[0].ProgramID || !after.Interfaces[0].Present {
		t.Fatalf("the first root's attachment changed: %+v -> %+v", before.Interfaces, after.Interfaces)
	}
}

// TestLabMonitorMode: with monitor mode on, a denylisted source's TCP and
// UDP reach the server, counted as monitored under the denylist and with
// hits on its entry; a port rule's drops pass the same way; status and
// policy say so; off again, the same rules drop.
func TestLabMonitorMode(t *testing.T) {
	t.Parallel()
	sl := newShieldLab(t)
	toClient, toAttacker := sl.ifaces()
	a, c := sl.lab.Attacker, sl.lab.Client
	udp, udp2 := sl.udp[0], sl.udp[1]
	sl.mustMoat("attach", toClient, toAttacker)
	sl.mustMoat("block", sl.attackerV4().String())
	sl.mustMoat("port", "drop", fmt.Sprintf("udp/%d", udp2.port))
	sl.expectNoUDP(a, false, udp)
	sl.expectNoUDP(c, false, udp2)

	if r := sl.mustMoat("policy", "monitor", "on"); !strings.Contains(r.stdout, "monitor on") {
		t.Fatalf("policy output:\n%s", r.stdout)
	}
	if r := sl.mustMoat("status"); !strings.Contains(r.stdout, "MONITOR MODE") {
		t.Errorf("status does not say monitor mode:\n%s", r.stdout)
	}
	if st := sl.status(); !st.Settings.Monitor {
		t.Errorf("status --json settings %+v: want monitor", st.Settings)
	}
	before := sl.stats()[toAttacker].ByReason["denylist"]
	sl.expectConnect(a, false)
	sl.expectUDP(a, false, udp)
	sl.expectUDP(c, false, udp2)
	after := sl.stats()
	deny := after[toAttacker].ByReason["denylist"]
	if deny.Dropped != before.Dropped {
		t.Errorf("denylist dropped %d more packets in monitor mode", deny.Dropped.Packets-before.Dropped.Packets)
	}
	// The SYN, the handshake's ACK and at least the UDP datagram.
	if deny.Monitored.Packets < 3 || after[toAttacker].Monitored.Packets < deny.Monitored.Packets {
		t.Errorf("denylist monitored %+v, interface %+v: want the connection and datagram counted", deny.Monitored, after[toAttacker].Monitored)
	}
	if m := after[toClient].ByReason["port_drop"].Monitored.Packets; m != 1 {
		t.Errorf("port_drop monitored %d packets, want the one datagram", m)
	}
	if rs := sl.list(); len(rs.Deny) != 1 || rs.Deny[0].Hits < 3 {
		t.Errorf("deny list %+v: want the entry's hits counted in monitor mode", rs.Deny)
	}

	sl.mustMoat("policy", "monitor", "off")
	sl.expectNoConnect(a, false)
	sl.expectNoUDP(a, false, udp)
	sl.expectNoUDP(c, false, udp2)
	if r := sl.mustMoat("status"); strings.Contains(r.stdout, "MONITOR MODE") {
		t.Errorf("status still says monitor mode:\n%s", r.stdout)
	}
}

// greeter starts a plain TCP listener in the server's namespace (Go's
// default is MPTCP, whose SYNs moat leaves to the kernel) that writes
// "hello" to each client and closes, and returns its port: a client whose
// handshake the server reset reads ECONNRESET instead.
func (sl *shieldLab) greeter(t *testing.T) uint16 {
	t.Helper()
	var ln net.Listener
	lc := net.ListenConfig{}
	lc.SetMultipathTCP(false)
	if err := sl.lab.Server.Do(func() (err error) {
		ln, err = lc.Listen(context.Background(), "tcp", "[::]:0")
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
			c.Write([]byte("hello"))
			c.Close()
		}
	}()
	return uint16(ln.Addr().(*net.TCPAddr).Port)
}

// readGreeting connects from the client's namespace to a greeter and
// reads its greeting whole.
func (sl *shieldLab) readGreeting(dst netip.Addr, port uint16) error {
	return sl.lab.Client.Do(func() error {
		c, err := net.DialTimeout("tcp", netip.AddrPortFrom(dst, port).String(), 2*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(2 * time.Second))
		b, err := io.ReadAll(c)
		if err == nil && string(b) != "hello" {
			err = fmt.Errorf("read %q", b)
		}
		return err
	})
}
