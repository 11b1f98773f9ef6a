package syncookie

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/moat-shield/moat/internal/datapath"
	"github.com/moat-shield/moat/internal/testpkt"
)

// censusTable maps the whole census value for a test, which may then set
// its header and marks directly (the control plane itself writes only the
// header, field by field).
func censusTable(t testing.TB, m *ebpf.Map) *datapath.MoatSynCensusTable {
	t.Helper()
	page := os.Getpagesize()
	size := (int(unsafe.Sizeof(datapath.MoatSynCensusTable{})) + page - 1) / page * page
	mem, err := unix.Mmap(m.FD(), 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatalf("map the census: %v", err)
	}
	t.Cleanup(func() { unix.Munmap(mem) })
	return (*datapath.MoatSynCensusTable)(unsafe.Pointer(&mem[0]))
}

// markCensusSlot sets a census slot's bit of generation gen, as syn_census_mark does.
func markCensusSlot(c *datapath.MoatSynCensusTable, slot, gen uint32) {
	c.Marks[slot/16] |= 1 << (slot%16*4 + gen%4)
}

// censusSlotBits is a census slot's 4 bits: bit g % 4 for a mark of generation g.
func censusSlotBits(c *datapath.MoatSynCensusTable, slot uint32) uint64 {
	return c.Marks[slot/16] >> (slot % 16 * 4) & 0xf
}

// clearCensusSlot clears a census slot's bits.
func clearCensusSlot(c *datapath.MoatSynCensusTable, slot uint32) {
	c.Marks[slot/16] &^= 0xf << (slot % 16 * 4)
}

// synOf is a plain SYN from client to server.
func synOf(client, server netip.AddrPort) []byte {
	f := testpkt.Frame{L4: testpkt.TCP{SrcPort: client.Port(), DstPort: server.Port(), Seq: clientISN, SYN: true}}
	if client.Addr().Is6() {
		f.Net = testpkt.IPv6{Src: client.Addr(), Dst: server.Addr()}
	} else {
		f.Net = testpkt.IPv4{Src: client.Addr(), Dst: server.Addr()}
	}
	return f.Bytes()
}

func TestCensusLayout(t *testing.T) {
	var c *datapath.MoatSynCensusTable // for sizes and offsets only
	if len(c.Marks)*16 != censusSlots {
		t.Fatalf("%d words of marks (16 slots each), CensusSlot assumes %d slots", len(c.Marks), censusSlots)
	}
	if off := unsafe.Offsetof(c.Marks); off%8 != 0 {
		t.Fatalf("marks at offset %d: the control plane's atomic ANDs need them 8-aligned", off)
	}
}

// TestCensusClearsOlderGenerations: once the pass of generation g is done,
// every slot keeps the bits of g and g-1 (the census floor) and loses the
// two others, whose marks are older than the floor; and a mark the data
// path sets meanwhile in the same words (an atomic OR of g's bit, as
// syn_census_mark does) is never lost to the clearing.
func TestCensusClearsOlderGenerations(t *testing.T) {
	objs := loadObjects(t)
	mc, err := mapCensus(objs.SynCensus)
	if err != nil {
		t.Fatal(err)
	}
	defer mc.close()
	for gen := uint32(1); gen <= 9; gen++ {
		for i := range mc.marks {
			mc.marks[i] = ^uint64(0)
		}
		mc.clearBelow(gen, false)
		want := uint64(censusGenBits)<<(gen%4) | uint64(censusGenBits)<<((gen-1)%4)
		for i, w := range mc.marks {
			if w != want {
				t.Fatalf("generation %d: word %d is %016x after clearing, want %016x", gen, i, w, want)
			}
		}
		// After a complete pass of gen-1, which cleared gen-3: gen+1's
		// bits (the next pass's, perhaps another process's) stay.
		for i := range mc.marks {
			mc.marks[i] = ^uint64(0)
		}
		mc.clearBelow(gen, true)
		want |= uint64(censusGenBits) << ((gen + 1) % 4)
		for i, w := range mc.marks {
			if w != want {
				t.Fatalf("generation %d after gen-1's pass: word %d is %016x after clearing, want %016x", gen, i, w, want)
			}
		}
	}

	const gen = 6
	stale := uint64(censusGenBits)<<((gen-2)%4) | uint64(censusGenBits)<<((gen-3)%4)
	done := make(chan []uint64)
	go func() {
		// The data path: marks of generation gen, slot by slot, in
		// words that hold stale bits being cleared.
		var set []uint64
		for round := range 64 {
			for i := round % 7; i < len(mc.marks); i += 7 {
				bit := uint64(1) << (uint(i+round)%16*4 + gen%4)
				atomic.OrUint64(&mc.marks[i], bit)
				set = append(set, uint64(i)<<32|uint64(uint(i+round)%16))
			}
		}
		done <- set
	}()
	for range 64 {
		for i := range mc.marks {
			atomic.OrUint64(&mc.marks[i], stale)
		}
		mc.clearBelow(gen, false)
	}
	set := <-done
	mc.clearBelow(gen, false)
	for _, s := range set {
		i, slot := s>>32, s&0xffffffff
		if w := atomic.LoadUint64(&mc.marks[i]); w>>(slot*4+gen%4)&1 == 0 {
			t.Fatalf("word %d: the mark of slot %d was lost to the clearing (%016x)", i, slot, w)
		}
		if w := atomic.LoadUint64(&mc.marks[i]); w&stale != 0 {
			t.Fatalf("word %d: stale bits left (%016x)", i, w)
		}
	}
}

// TestCensusSlotAgreesWithDataPath: the data path marks the slot that
// CensusSlot names for the tuple of a SYN it leaves to the kernel (auto
// mode, no flood), in both families, with the generation of the pass under
// way; so does a SYN that cookie mode leaves to the kernel (here: nothing
// listens). A SYN to an unprotected port marks nothing, and an allowlisted
// SYN (which skips the SYN defence) is marked too.
func TestCensusSlotAgreesWithDataPath(t *testing.T) {
	objs := setup(t)
	if err := Protect(objs.SynPorts, objs.SynCounters, objs.SynCensus, protectedPort, ModeAuto, 1<<30); err != nil {
		t.Fatal(err)
	}
	c := censusTable(t, objs.SynCensus)
	c.Generation = 7
	marked := func() map[uint32]uint64 {
		out := map[uint32]uint64{}
		for slot := range uint32(censusSlots) {
			if b := censusSlotBits(c, slot); b != 0 {
				out[slot] = b
			}
		}
		return out
	}
	for _, tc := range []struct {
		name           string
		client, server netip.Addr
		port           uint16
		want           bool
	}{
		{"ipv4", client4, server4, protectedPort, true},
		{"ipv6", client6, server6, protectedPort, true},
		{"ipv4 unprotected port", client4, server4, unprotectedPort, false},
		{"ipv6 allowlisted", client6, server6, unprotectedPort, true},
		{"ipv4 always mode, left to the kernel (no listener)", client4, server4, noListenerPort, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.name == "ipv6 allowlisted" {
				allow(t, objs, tc.client)
			}
			clear(c.Marks[:])
			var ret uint32
			withListener(t, func() {
				ret, _ = run(t, objs.MoatFilter, synOf(netip.AddrPortFrom(tc.client, 40123), netip.AddrPortFrom(tc.server, tc.port)))
			})
			if ret != 2 {
				t.Fatalf("verdict %d, want XDP_PASS", ret)
			}
			got := marked()
			if !tc.want {
				if len(got) != 0 {
					t.Fatalf("marks %v, want none", got)
				}
				return
			}
			slot := CensusSlot(netip.AddrPortFrom(tc.client, 40123), netip.AddrPortFrom(tc.server, tc.port))
			if len(got) != 1 || got[slot] != 1<<(7%4) {
				t.Fatalf("marks %v, want slot %d with the bit of generation 7", got, slot)
			}
		})
	}
}

// allow puts a host in the allowlist as the control plane does.
func allow(t *testing.T, objs *datapath.MoatObjects, a netip.Addr) {
	t.Helper()
	var s datapath.MoatRuntimeSettings
	if err := objs.Settings.Lookup(uint32(0), &s); err != nil {
		t.Fatal(err)
	}
	s.AllowInUse |= uint32(datapath.MoatAllowInUseALLOW_IN_USE_V6)
	if err := objs.Settings.Put(uint32(0), s); err != nil {
		t.Fatal(err)
	}
	if err := objs.AllowV6Hosts.Put(datapath.MoatHostV6{Addr: a.As16()}, datapath.MoatPrefixRule{}); err != nil {
		t.Fatal(err)
	}
}

// TestCensusTrust: a SYN whose tuple an established socket owns must reach
// the kernel, and so must that connection's pure ACKs in cookie mode; both
// do whenever the census can say so: the slot is marked, or the census is
// not to be trusted (no full pass yet, passes stopped, or the port was
// protected after the last one began). Only a census that is trusted and
// has no mark for the tuple makes moat skip the socket lookup, answer the
// SYN and take the ACK for one to the listener (dropped: no cookie): those
// rows are the evidence that the census decides, and the reason it must be
// right.
func TestCensusTrust(t *testing.T) {
	objs := setup(t)
	c := censusTable(t, objs.SynCensus)
	const cport = 41000
	client := netip.AddrPortFrom(client4, cport)
	server := netip.AddrPortFrom(server4, protectedPort)
	slot := CensusSlot(client, server)
	owned := synOf(client, server)
	ownedACK := testpkt.Frame{Net: testpkt.IPv4{Src: client4, Dst: server4},
		L4: testpkt.TCP{SrcPort: cport, DstPort: protectedPort, Seq: 12345, Ack: 67890, ACK: true}}.Bytes()
	// A SYN of another tuple first, in the same jiffy: it finds the
	// listener, which this CPU then remembers for the destination.
	warm := synOf(netip.AddrPortFrom(client4, cport+1), server)
	boot := func() uint64 { return bootNow() }
	fromOfPort := func(from uint32) {
		st := make([]datapath.MoatSynPortStats, ebpf.MustPossibleCPU())
		if err := objs.SynCounters.Lookup(uint32(1), &st); err != nil {
			t.Fatal(err)
		}
		for i := range st {
			st[i].CensusFrom = from
		}
		if err := objs.SynCounters.Update(uint32(1), st, ebpf.UpdateAny); err != nil {
			t.Fatal(err)
		}
	}
	rows := []struct {
		name string
		set  func()
		syn  uint32 // XDP_PASS 2, XDP_TX 3
		ack  uint32 // XDP_DROP 1, XDP_PASS 2
	}{
		{"no pass yet", func() { c.Generation, c.Floor, c.ValidUntilNs = 1, 0, boot()+1e12 }, 2, 2},
		{"slot marked", func() { c.Generation, c.Floor, c.ValidUntilNs = 5, 4, boot()+1e12; markCensusSlot(c, slot, 4) }, 2, 2},
		{"slot marked in the pass under way", func() { c.Generation, c.Floor, c.ValidUntilNs = 6, 4, boot()+1e12; markCensusSlot(c, slot, 6) }, 2, 2},
		{"slot marked in generation 7, bit 3", func() { c.Generation, c.Floor, c.ValidUntilNs = 7, 6, boot()+1e12; markCensusSlot(c, slot, 7) }, 2, 2},
		{"passes stopped", func() { c.Generation, c.Floor, c.ValidUntilNs = 5, 4, boot()-1e9 }, 2, 2},
		{"port protected since", func() { c.Generation, c.Floor, c.ValidUntilNs = 5, 4, boot()+1e12; fromOfPort(5) }, 2, 2},
		{"every other slot of its word marked", func() {
			c.Generation, c.Floor, c.ValidUntilNs = 5, 4, boot()+1e12
			c.Marks[slot/16] = ^uint64(0)
			clearCensusSlot(c, slot)
		}, 3, 1},
		{"trusted, no mark", func() { c.Generation, c.Floor, c.ValidUntilNs = 5, 4, boot()+1e12 }, 3, 1},
	}
	got := make([][2]uint32, len(rows))
	withConnection(t, client, server, func() {
		for i, r := range rows {
			c.Marks[slot/16] = 0
			fromOfPort(0)
			r.set()
			// The warm-up and the SYN must fall in one jiffy for the
			// skip to happen: a few tries. A row that wants XDP_PASS
			// must get it every time.
			for j, frame := range [][]byte{owned, ownedACK} {
				for try := 0; try < 20; try++ {
					run(t, objs.MoatFilter, warm)
					mark := c.Marks[slot/16]
					got[i][j], _ = run(t, objs.MoatFilter, frame)
					c.Marks[slot/16] = mark // a passed SYN marks its tuple
					if got[i][j] != 2 {
						break
					}
				}
			}
		}
	})
	for i, r := range rows {
		if got[i] != [2]uint32{r.syn, r.ack} {
			t.Errorf("%s: verdicts %d for the SYN and %d for the ACK, want %d and %d", r.name, got[i][0], got[i][1], r.syn, r.ack)
		}
	}
}

// TestCensusMarksSockets: a pass in the server's namespace marks the tuple
// of every socket of a protected port but the listener: established over
// IPv4, IPv6 and IPv4 to a dual-stack listener, time-wait, and a request
// socket whose handshake never completes. A socket of an unprotected port
// is not counted.
func TestCensusMarksSockets(t *testing.T) {
	s := newShieldedNoCensus(t, ModeNever)
	const other = labPort + 1
	if err := Protect(s.objs.SynPorts, s.objs.SynCounters, s.objs.SynCensus, labPort, ModeNever, 0); err != nil {
		t.Fatal(err)
	}
	var lns []net.Listener
	var lc net.ListenConfig
	lc.SetMultipathTCP(false)
	if err := s.lab.Server.Do(func() error {
		for _, a := range []string{fmt.Sprintf("[::]:%d", labPort), fmt.Sprintf(":%d", other)} {
			ln, err := lc.Listen(context.Background(), "tcp", a)
			if err != nil {
				return err
			}
			lns = append(lns, ln)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	accepted := make(chan net.Conn, 8)
	for _, ln := range lns {
		t.Cleanup(func() { ln.Close() })
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				accepted <- c
			}
		}()
	}
	ifc := s.lab.Client.Ifaces[0]
	var conns []net.Conn
	t.Cleanup(func() {
		for _, c := range conns {
			c.Close()
		}
	})
	dial := func(dst netip.AddrPort) netip.AddrPort {
		t.Helper()
		var c net.Conn
		if err := s.lab.Client.Do(func() (err error) {
			c, err = net.DialTimeout("tcp", dst.String(), 2*time.Second)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		return c.LocalAddr().(*net.TCPAddr).AddrPort()
	}
	srv4 := netip.AddrPortFrom(ifc.PeerIPv4, labPort)
	srv6 := netip.AddrPortFrom(ifc.PeerIPv6, labPort)
	want := map[string][2]netip.AddrPort{}
	want["established ipv4"] = [2]netip.AddrPort{dial(srv4), srv4}
	want["established ipv6"] = [2]netip.AddrPort{dial(srv6), srv6}
	dial(netip.AddrPortFrom(ifc.PeerIPv4, other)) // not counted
	for range 3 {
		conns = append(conns, <-accepted)
	}
	// Time-wait: the server closes first.
	want["time-wait"] = [2]netip.AddrPort{dial(srv4), srv4}
	(<-accepted).Close()
	conns[len(conns)-1].Close() // the client's FIN: the server's socket is in TIME_WAIT
	if !s.timeWaitOn(t, labPort) {
		t.Fatal("no time-wait socket on the server")
	}
	// A request socket: a SYN from a spoofed address whose SYN-ACK the
	// attacker's side drops, so that no RST ends it.
	drop, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.SchedCLS, License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 2), asm.Return()}}) // TC_ACT_SHOT
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { drop.Close() })
	atk := s.lab.Attacker.Ifaces[0]
	if err := s.lab.Attacker.Do(func() error {
		l, err := link.AttachTCX(link.TCXOptions{Interface: atk.Index, Program: drop, Attach: ebpf.AttachTCXIngress})
		if err == nil {
			t.Cleanup(func() { l.Close() })
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	send := s.lab.Attacker.RawSender(t)
	ghost := netip.AddrPortFrom(netip.MustParseAddr("198.19.3.3"), 33333)
	send(testpkt.Frame{SrcMAC: atk.MAC, DstMAC: atk.PeerMAC,
		Net: testpkt.IPv4{Src: ghost.Addr(), Dst: atk.PeerIPv4},
		L4:  testpkt.TCP{SrcPort: ghost.Port(), DstPort: labPort, Seq: 1, SYN: true}}.Bytes())
	want["request"] = [2]netip.AddrPort{ghost, netip.AddrPortFrom(atk.PeerIPv4, labPort)}
	time.Sleep(200 * time.Millisecond) // the FINs of the time-wait socket, the SYN

	c, err := NewCensus(s.objs.MoatSynCensus, s.objs.SynCensus)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	table := censusTable(t, s.objs.SynCensus)
	clear(table.Marks[:]) // the data path's own marks (none in never mode)
	var pass CensusPass
	if err := s.lab.Server.Do(func() (err error) { pass, err = c.Take(time.Second); return err }); err != nil {
		t.Fatal(err)
	}
	if pass.Sockets != uint64(len(want)) {
		t.Errorf("pass marked %d sockets, want %d (%v)", pass.Sockets, len(want), want)
	}
	for name, tuple := range want {
		if b := censusSlotBits(table, CensusSlot(tuple[0], tuple[1])); b != 1<<(pass.Generation%4) {
			t.Errorf("%s %v: slot holds bits %04b, want the bit of generation %d", name, tuple, b, pass.Generation)
		}
	}
	st, err := ReadCensus(s.objs.SynCensus)
	if err != nil {
		t.Fatal(err)
	}
	if st.Trusted || st.Passes != 1 {
		t.Errorf("after one pass: %+v, want one pass and no trust yet", st)
	}
	// Before the next pass: a stale mark (of the generation before this
	// pass's, which the pass of the generation after clears) and a mark
	// the data path made during this one (kept, as the floor will be its
	// generation).
	first := pass.Generation
	stale, fresh := CensusSlot(netip.MustParseAddrPort("198.19.9.9:1"), srv4), CensusSlot(netip.MustParseAddrPort("198.19.9.9:2"), srv4)
	markCensusSlot(table, stale, first-1)
	markCensusSlot(table, fresh, first)
	if err := s.lab.Server.Do(func() (err error) { pass, err = c.Take(time.Second); return err }); err != nil {
		t.Fatal(err)
	}
	if st, _ := ReadCensus(s.objs.SynCensus); !st.Trusted || st.Passes != 2 || st.Generation != pass.Generation {
		t.Errorf("after two passes: %+v, want trusted", st)
	}
	if b := censusSlotBits(table, stale); b != 0 {
		t.Errorf("a mark of generation %d is left after the pass of %d: %04b", first-1, pass.Generation, b)
	}
	if b := censusSlotBits(table, fresh); b != 1<<(first%4) {
		t.Errorf("the data path's mark of generation %d: slot holds %04b after the pass of %d", first, b, pass.Generation)
	}
	for name, tuple := range want {
		if b, w := censusSlotBits(table, CensusSlot(tuple[0], tuple[1])), uint64(1<<(first%4)|1<<(pass.Generation%4)); b&w != w {
			t.Errorf("%s %v: slot holds bits %04b after two passes, want those of generations %d and %d", name, tuple, b, first, pass.Generation)
		}
	}
}

// TestCensusMarksOutgoingConnection: a SYN-ACK to a protected port marks
// its tuple when the host opened that connection from the port (a socket
// in SYN-SENT owns it), so the peer's ACKs that follow are not taken for
// the listener's; a SYN-ACK no socket owns (reflected, spoofed) marks
// nothing.
func TestCensusMarksOutgoingConnection(t *testing.T) {
	objs := setup(t)
	c := censusTable(t, objs.SynCensus)
	c.Generation = 3
	local := netip.MustParseAddrPort("198.51.100.1:80")
	peer := netip.MustParseAddrPort("198.51.100.9:40123")
	stranger := netip.MustParseAddrPort("198.51.100.9:40124")
	synack := func(from netip.AddrPort) []byte {
		return testpkt.Frame{Net: testpkt.IPv4{Src: from.Addr(), Dst: local.Addr()},
			L4: testpkt.TCP{SrcPort: from.Port(), DstPort: local.Port(), Seq: 1, Ack: 2, SYN: true, ACK: true}}.Bytes()
	}
	var rets [2]uint32
	inScratchNetns(t, func() {
		// The peer's address is on no device: nothing answers the SYN
		// (not even ARP), so the socket stays in SYN-SENT. Both ends of
		// the veth pair are in this namespace.
		veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "census0"}, PeerName: "census1"}
		err := netlink.LinkAdd(veth)
		if err == nil {
			err = netlink.AddrAdd(veth, &netlink.Addr{IPNet: &net.IPNet{IP: local.Addr().AsSlice(), Mask: net.CIDRMask(24, 32)}})
		}
		if err == nil {
			err = netlink.LinkSetUp(veth)
		}
		if peerLink, lerr := netlink.LinkByName("census1"); err == nil && lerr == nil {
			err = netlink.LinkSetUp(peerLink)
		}
		if err != nil {
			t.Errorf("veth pair: %v", err)
			return
		}
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_NONBLOCK, 0)
		if err != nil {
			t.Errorf("socket: %v", err)
			return
		}
		defer unix.Close(fd)
		if err := unix.Bind(fd, &unix.SockaddrInet4{Port: int(local.Port()), Addr: local.Addr().As4()}); err != nil {
			t.Errorf("bind: %v", err)
			return
		}
		if err := unix.Connect(fd, &unix.SockaddrInet4{Port: int(peer.Port()), Addr: peer.Addr().As4()}); err != unix.EINPROGRESS {
			t.Errorf("connect: %v, want EINPROGRESS", err)
			return
		}
		rets[0], _ = run(t, objs.MoatFilter, synack(stranger))
		rets[1], _ = run(t, objs.MoatFilter, synack(peer))
	})
	if rets != [2]uint32{2, 2} {
		t.Fatalf("verdicts %v, want XDP_PASS for both SYN-ACKs", rets)
	}
	if b := censusSlotBits(c, CensusSlot(stranger, local)); b != 0 {
		t.Errorf("a SYN-ACK no socket owns marked its slot (%04b)", b)
	}
	if b := censusSlotBits(c, CensusSlot(peer, local)); b != 1<<3 {
		t.Errorf("the SYN-ACK of the host's connection: slot holds %04b, want the bit of generation 3", b)
	}
}

// timeWaitOn says whether a TIME_WAIT socket of local port port appears in
// the server's namespace within a second.
func (s *shielded) timeWaitOn(t *testing.T, port uint16) bool {
	t.Helper()
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if socketsIn(t, s.lab.Server, port, tcpTimeWait) > 0 {
			return true
		}
	}
	return false
}

// TestCensusReportsFailuresOnce: of the passes Start takes in the
// background, report hears of the first that fails, with its error, and of
// the first that works again, with the pass it took; of none in between,
// and of none while passes keep working.
func TestCensusReportsFailuresOnce(t *testing.T) {
	objs := loadObjects(t)
	c, err := NewCensus(objs.MoatSynCensus, objs.SynCensus)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fail := errors.New("the namespace is gone")
	var (
		mu      sync.Mutex
		calls   int
		reports []error
		passes  []CensusPass
	)
	// Start's own two passes are calls 1 and 2; calls 3 to 5 fail.
	in := func(f func() error) error {
		mu.Lock()
		calls++
		n := calls
		mu.Unlock()
		if n >= 3 && n <= 5 {
			return fail
		}
		return f()
	}
	report := func(p CensusPass, err error) {
		mu.Lock()
		defer mu.Unlock()
		reports, passes = append(reports, err), append(passes, p)
	}
	stop, err := c.Start(5*time.Millisecond, in, report)
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		mu.Lock()
		n := calls
		mu.Unlock()
		if n >= 10 {
			break
		}
		if time.Now().After(deadline) {
			stop()
			t.Fatalf("only %d passes in 5s", n)
		}
	}
	stop()
	mu.Lock()
	defer mu.Unlock()
	if len(reports) != 2 || !errors.Is(reports[0], fail) || reports[1] != nil {
		t.Fatalf("reports %v, want the failure once, then nil once", reports)
	}
	// Passes 1, 2 and 6 raised the generation: the one that works again
	// is the third.
	if passes[1].Generation != 3 {
		t.Errorf("the pass that worked again is generation %d, want 3", passes[1].Generation)
	}
}

// withConnection runs fn in a scratch namespace (inScratchNetns) with the
// addresses of client and server on lo, a listener on protectedPort, and
// one connection from client to server.
func withConnection(t *testing.T, client, server netip.AddrPort, fn func()) {
	t.Helper()
	inScratchNetns(t, func() {
		if err := loUpWith(client.Addr(), server.Addr()); err != nil {
			t.Errorf("addresses on lo: %v", err)
			return
		}
		ln := listen(t, protectedPort)
		defer ln.Close()
		conn, srv, err := dialFrom(ln, client, server)
		if err != nil {
			t.Error(err)
			return
		}
		defer conn.Close()
		defer srv.Close()
		fn()
	})
}

// loUpWith brings lo up in the calling thread's namespace with addrs on
// it, as /32s.
func loUpWith(addrs ...netip.Addr) error {
	lo, err := netlink.LinkByName("lo")
	if err == nil {
		err = netlink.LinkSetUp(lo)
	}
	for _, a := range addrs {
		if err == nil {
			err = netlink.AddrAdd(lo, &netlink.Addr{IPNet: &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(a.BitLen(), a.BitLen())}})
		}
	}
	return err
}

// dialFrom connects from client to server, where ln listens, and
// returns both ends.
func dialFrom(ln net.Listener, client, server netip.AddrPort) (conn, srv net.Conn, err error) {
	d := net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(client)}
	if conn, err = d.Dial("tcp", server.String()); err != nil {
		return nil, nil, fmt.Errorf("dial: %w", err)
	}
	if srv, err = ln.Accept(); err != nil {
		conn.Close()
		return nil, nil, fmt.Errorf("accept: %w", err)
	}
	return conn, srv, nil
}
