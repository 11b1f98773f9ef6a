package syncookie

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"

	"github.com/moat-shield/moat/internal/datapath"
	"github.com/moat-shield/moat/internal/testpkt"
)

// onesSum is the ones' complement sum of b as 16-bit big-endian words.
func onesSum(sum uint32, b []byte) uint32 {
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	if len(b)%2 == 1 {
		sum += uint32(b[len(b)-1]) << 8
	}
	return sum
}

func foldsToZero(sum uint32) bool {
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	return sum == 0xffff
}

// checkReset checks that out is the RST the kernel would send for the ACK
// in, run in a scratch namespace (inScratchNetns, a new namespace's
// settings): addresses and ports swapped, the ACK's acknowledgment number
// as the sequence number, only RST set, no options or payload, TTL or hop
// limit 64, the ACK's DS field with the ECN bits clear, over IPv6 a flow
// label of moat's own (auto labels, which a new namespace has on, and no
// reflection), tags kept; checksums summed here, apart from the program's.
func checkReset(t *testing.T, in, out []byte) {
	t.Helper()
	ip := gopacket.NewPacket(in, layers.LayerTypeEthernet, gopacket.Default)
	rp := gopacket.NewPacket(out, layers.LayerTypeEthernet, gopacket.Default)
	ie, re := ip.Layer(layers.LayerTypeEthernet).(*layers.Ethernet), rp.Layer(layers.LayerTypeEthernet).(*layers.Ethernet)
	it, rt := ip.Layer(layers.LayerTypeTCP).(*layers.TCP), rp.Layer(layers.LayerTypeTCP).(*layers.TCP)
	if ie == nil || re == nil || it == nil || rt == nil {
		t.Fatalf("not Ethernet and TCP: in %x, out %x", in, out)
	}
	if re.SrcMAC.String() != ie.DstMAC.String() || re.DstMAC.String() != ie.SrcMAC.String() {
		t.Errorf("MACs %s > %s, want %s > %s", re.SrcMAC, re.DstMAC, ie.DstMAC, ie.SrcMAC)
	}
	iv, rv := ip.Layer(layers.LayerTypeDot1Q), rp.Layer(layers.LayerTypeDot1Q)
	if (iv == nil) != (rv == nil) || (iv != nil && iv.(*layers.Dot1Q).VLANIdentifier != rv.(*layers.Dot1Q).VLANIdentifier) {
		t.Errorf("VLAN tag %v, want %v", rv, iv)
	}
	var pseudo uint32
	ipLen := 20
	if i4, ok := ip.Layer(layers.LayerTypeIPv4).(*layers.IPv4); ok {
		r4, ok := rp.Layer(layers.LayerTypeIPv4).(*layers.IPv4)
		if !ok {
			t.Fatalf("no IPv4 header in the RST %x", out)
		}
		if !r4.SrcIP.Equal(i4.DstIP) || !r4.DstIP.Equal(i4.SrcIP) || r4.TTL != 64 || r4.TOS != i4.TOS&^3 || r4.IHL != 5 ||
			r4.Length != 40 || r4.Flags != layers.IPv4DontFragment || r4.Protocol != layers.IPProtocolTCP {
			t.Errorf("IPv4 header %+v", r4)
		}
		if !foldsToZero(onesSum(0, r4.Contents)) {
			t.Errorf("IPv4 header checksum %#04x does not add up", r4.Checksum)
		}
		pseudo = onesSum(onesSum(0, r4.SrcIP.To4()), r4.DstIP.To4()) + uint32(layers.IPProtocolTCP) + 20
	} else {
		i6 := ip.Layer(layers.LayerTypeIPv6).(*layers.IPv6)
		r6, ok := rp.Layer(layers.LayerTypeIPv6).(*layers.IPv6)
		if !ok {
			t.Fatalf("no IPv6 header in the RST %x", out)
		}
		if !r6.SrcIP.Equal(i6.DstIP) || !r6.DstIP.Equal(i6.SrcIP) || r6.HopLimit != 64 || r6.Length != 20 ||
			r6.TrafficClass != i6.TrafficClass&^3 || r6.NextHeader != layers.IPProtocolTCP {
			t.Errorf("IPv6 header %+v", r6)
		}
		if r6.FlowLabel == 0 || r6.FlowLabel == i6.FlowLabel {
			t.Errorf("flow label %#x (the ACK's %#x), want one of moat's own", r6.FlowLabel, i6.FlowLabel)
		}
		ipLen = 40
		pseudo = onesSum(onesSum(0, r6.SrcIP), r6.DstIP) + uint32(layers.IPProtocolTCP) + 20
	}
	if rt.SrcPort != it.DstPort || rt.DstPort != it.SrcPort || rt.Seq != it.Ack || rt.Ack != 0 {
		t.Errorf("RST %d > %d seq %d ack %d, want %d > %d seq %d ack 0", rt.SrcPort, rt.DstPort, rt.Seq, rt.Ack,
			it.DstPort, it.SrcPort, it.Ack)
	}
	if !rt.RST || rt.ACK || rt.SYN || rt.FIN || rt.PSH || rt.URG || rt.ECE || rt.CWR || rt.DataOffset != 5 ||
		rt.Window != 0 || rt.Urgent != 0 || len(rt.Payload) != 0 {
		t.Errorf("TCP header %+v, want RST alone, 20 bytes, nothing after", rt)
	}
	if !foldsToZero(onesSum(pseudo, rt.Contents)) {
		t.Errorf("TCP checksum %#04x does not add up", rt.Checksum)
	}
	l2 := len(ie.Contents)
	if iv != nil {
		l2 += len(iv.LayerContents())
	}
	if want := l2 + ipLen + 20; len(out) != want {
		t.Errorf("frame of %d bytes, want %d: the Ethernet header and tags, and the two headers", len(out), want)
	}
}

// TestStrayAckReset: in cookie mode an ACK that fits no socket and no
// cookie is answered as the kernel would answer it, with a RST (XDP_TX),
// within a budget of RSTs a second, and dropped beyond it or with the
// budget at none. Test runs beside a listener: IPv4 with data and IP
// options, IPv6, a VLAN tag, a FIN; the RST checked byte by byte.
func TestStrayAckReset(t *testing.T) {
	objs := setup(t)
	stray := func(tcp testpkt.TCP, net testpkt.Network, tags []testpkt.Tag) []byte {
		tcp.SrcPort, tcp.DstPort, tcp.ACK = clientPort, protectedPort, true
		return testpkt.Frame{Tags: tags, Net: net, L4: tcp}.Bytes()
	}
	v4 := testpkt.IPv4{Src: client4, Dst: server4}
	v6 := testpkt.IPv6{Src: client6, Dst: server6}
	cases := []struct {
		name  string
		frame []byte
	}{
		{"ipv4", stray(testpkt.TCP{Seq: 1000, Ack: 0xdeadbeef, Options: tsOpts(5)}, v4, nil)},
		{"ipv4 with a DS field, ECT(1)", stray(testpkt.TCP{Seq: 1000, Ack: 0xdeadbeef}, testpkt.IPv4{Src: client4, Dst: server4, TOS: 0xb9}, nil)},
		{"ipv6 with a DS field, CE, a flow label", stray(testpkt.TCP{Seq: 7, Ack: 0x1234},
			testpkt.IPv6{Src: client6, Dst: server6, TrafficClass: 0x2b, FlowLabel: 0xabcde}, nil)},
		{"ipv4 with data", stray(testpkt.TCP{Seq: 1000, Ack: 77, PSH: true, Payload: []byte("GET / HTTP/1.1\r\n\r\n")}, v4, nil)},
		{"ipv4 with ip options", stray(testpkt.TCP{Seq: 1, Ack: 2}, testpkt.IPv4{Src: client4, Dst: server4, Options: []testpkt.IPv4Option{testpkt.RouterAlert()}}, nil)},
		{"ipv6", stray(testpkt.TCP{Seq: 9, Ack: 0x80000000}, v6, nil)},
		{"vlan", stray(testpkt.TCP{Seq: 9, Ack: 12345}, v4, testpkt.VLAN(100))},
		{"fin", stray(testpkt.TCP{Seq: 9, Ack: 12346, FIN: true}, v6, testpkt.VLAN(7))},
	}
	if err := Configure(objs.SynSettings, Config{}); err != nil {
		t.Fatal(err)
	}
	frames := make([][]byte, len(cases))
	for i, c := range cases {
		frames[i] = c.frame
	}
	rets, outs := verdicts(t, objs.MoatFilter, frames, nil)
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if rets[i] != 3 {
				t.Fatalf("verdict %d, want XDP_TX (3)", rets[i])
			}
			checkReset(t, c.frame, outs[i])
		})
	}
	st := portStatus(t, objs, protectedPort)
	if n := uint64(len(cases)); st.ResetsSent != n || st.ACKsDropped != n || st.CookiesRejected != n {
		t.Errorf("status %+v: want %d RSTs, ACKs dropped and cookies rejected", st, n)
	}
	if p, _ := counterOf(t, objs.Counters, 11, 0); p != uint64(len(cases)) { // REASON_SYN_DEFENCE, its XDP_TX slot
		t.Errorf("syn_defence answered %d, want %d", p, len(cases))
	}

	// What the kernel would drop before TCP sees it gets no RST, nor does
	// a segment signed with TCP-MD5, whose RST would have to be signed.
	t.Run("not answered", func(t *testing.T) {
		bcast := testpkt.Frame{DstMAC: net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, Net: v4,
			L4: testpkt.TCP{SrcPort: clientPort, DstPort: protectedPort, ACK: true, Seq: 9, Ack: 12345}}.Bytes()
		signed := stray(testpkt.TCP{Seq: 9, Ack: 12345, Options: []layers.TCPOption{md5Option(), testpkt.TCPNOP(), testpkt.TCPNOP()}}, v4, nil)
		if rets, _ := verdicts(t, objs.MoatFilter, [][]byte{bcast, signed}, nil); rets[0] != 1 || rets[1] != 1 {
			t.Errorf("verdicts %v for a broadcast frame and a signed segment, want XDP_DROP (1) for both", rets)
		}
	})

	// The first part of a fragmented segment gets no RST: the kernel
	// answers the segment once whole.
	t.Run("first fragment", func(t *testing.T) {
		frag := stray(testpkt.TCP{Seq: 9, Ack: 12345, Payload: make([]byte, 64)}, testpkt.IPv4{Src: client4, Dst: server4, MF: true}, nil)
		if rets, _ := verdicts(t, objs.MoatFilter, [][]byte{frag}, nil); rets[0] != 1 {
			t.Errorf("verdict %d, want XDP_DROP (1)", rets[0])
		}
	})

	// One RST a second per CPU: the test runs on one CPU, so the first
	// stray ACK of the burst is answered and the rest are dropped; with
	// RSTs off, all are.
	for _, tc := range []struct {
		name      string
		rate      int
		unwritten bool // rst_rate 0, as in settings an older moat wrote: the data path's default
		want      []uint32
	}{
		{"budget of one", OnlineCPUs(), false, []uint32{3, 1, 1}},
		{"none", -1, false, []uint32{1, 1, 1}},
		{"unwritten: the default", 0, true, []uint32{3, 3, 3}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs := setup(t)
			if err := Configure(objs.SynSettings, Config{ResetsPerSec: tc.rate}); err != nil {
				t.Fatal(err)
			}
			if tc.unwritten {
				var v datapath.MoatSynConfig
				if err := objs.SynSettings.Lookup(uint32(0), &v); err != nil {
					t.Fatal(err)
				}
				v.RstRate = 0
				if err := objs.SynSettings.Update(uint32(0), v, ebpf.UpdateAny); err != nil {
					t.Fatal(err)
				}
			}
			rets, _ := verdicts(t, objs.MoatFilter, [][]byte{cases[0].frame, cases[0].frame, cases[3].frame}, nil)
			if !slices.Equal(rets, tc.want) {
				t.Errorf("verdicts %v, want %v", rets, tc.want)
			}
		})
	}
}

// TestStrayAckFindsAnUnmarkedSocket: an ACK of an established connection
// that the socket census has not marked (its SYN came in another way)
// looks stray to the census; before a RST, the socket lookup finds the
// connection, and the ACK passes and its tuple is marked. With RSTs off it
// is dropped (TestCensusTrust), until the next pass marks it.
func TestStrayAckFindsAnUnmarkedSocket(t *testing.T) {
	objs := setup(t)
	if err := Configure(objs.SynSettings, Config{}); err != nil {
		t.Fatal(err)
	}
	c := censusTable(t, objs.SynCensus)
	const cport = 41000
	client := netip.AddrPortFrom(client4, cport)
	server := netip.AddrPortFrom(server4, protectedPort)
	slot := CensusSlot(client, server)
	ack := testpkt.Frame{Net: testpkt.IPv4{Src: client4, Dst: server4},
		L4: testpkt.TCP{SrcPort: cport, DstPort: protectedPort, Seq: 12345, Ack: 67890, ACK: true}}.Bytes()
	warm := synOf(netip.AddrPortFrom(client4, cport+1), server)
	var verdictsSeen []uint32
	marked := false
	withConnection(t, client, server, func() {
		// The census trusted, and the connection's slot unmarked. The
		// warm-up SYN and the ACK must fall in one jiffy for the census
		// to skip the lookup: a few tries.
		for try := 0; try < 20 && !marked; try++ {
			c.Generation, c.Floor, c.ValidUntilNs = 5, 4, bootNow()+uint64(time.Hour)
			clearCensusSlot(c, slot)
			run(t, objs.MoatFilter, warm)
			clearCensusSlot(c, slot) // the warm-up SYN's own tuple may share the slot
			ret, _ := run(t, objs.MoatFilter, ack)
			verdictsSeen = append(verdictsSeen, ret)
			marked = censusSlotBits(c, slot) != 0
		}
	})
	for _, v := range verdictsSeen {
		if v != 2 {
			t.Fatalf("verdicts %v: the ACK of a live connection must always pass", verdictsSeen)
		}
	}
	if !marked {
		t.Errorf("in %d tries the ACK never went the census's way and got its tuple marked", len(verdictsSeen))
	}
	if st := portStatus(t, objs, protectedPort); st.ResetsSent != 0 {
		t.Errorf("%d RSTs sent", st.ResetsSent)
	}
}

// TestGoneConnectionIsReset: a client whose connection the server no
// longer has (a reboot, a failover; here the server's socket closed in
// TCP_REPAIR mode, which sends nothing) gets a RST for its next segment,
// as from the kernel, and learns at once that the connection is gone;
// with RSTs off, cookie mode drops the segment and the client would send
// it again for many minutes. Always mode, IPv4 and IPv6.
func TestGoneConnectionIsReset(t *testing.T) {
	s := newShielded(t, ModeAlways)
	for _, tc := range []struct {
		network string
		resets  int
		reset   bool
	}{{"tcp4", 0, true}, {"tcp6", 0, true}, {"tcp4", -1, false}} {
		t.Run(fmt.Sprintf("%s resets %d", tc.network, tc.resets), func(t *testing.T) {
			s.configure(t, Config{ResetsPerSec: tc.resets})
			c, srv := s.connect(t, tc.network)
			if _, err := c.Write([]byte("one")); err != nil {
				t.Fatal(err)
			}
			buf := make([]byte, 3)
			srv.SetDeadline(time.Now().Add(3 * time.Second))
			if _, err := io.ReadFull(srv, buf); err != nil {
				t.Fatal(err)
			}
			// An answer, so that the client's next segment acknowledges
			// more than the handshake (segments right behind a cookie's
			// ACK pass as such, and the kernel resets them itself).
			if _, err := srv.Write([]byte("ok!")); err != nil {
				t.Fatal(err)
			}
			c.SetDeadline(time.Now().Add(3 * time.Second))
			if _, err := io.ReadFull(c, buf); err != nil {
				t.Fatal(err)
			}
			forget(t, srv) // the server forgets the connection without a word

			before := s.status(t)
			c.SetDeadline(time.Now().Add(1500 * time.Millisecond))
			_, werr := c.Write([]byte("two"))
			var rerr error
			if werr == nil {
				_, rerr = c.Read(buf)
			}
			after := s.status(t)
			reset := errors.Is(werr, syscall.ECONNRESET) || errors.Is(rerr, syscall.ECONNRESET)
			if reset != tc.reset {
				t.Fatalf("write %v, read %v: reset %t, want %t (syn status %+v)", werr, rerr, reset, tc.reset, after)
			}
			if tc.reset && after.ResetsSent == before.ResetsSent {
				t.Errorf("resets sent %d -> %d", before.ResetsSent, after.ResetsSent)
			}
			if !tc.reset && (after.ResetsSent != before.ResetsSent || after.ACKsDropped == before.ACKsDropped) {
				t.Errorf("with RSTs off: resets sent %d -> %d, ACKs dropped %d -> %d; want the segment dropped",
					before.ResetsSent, after.ResetsSent, before.ACKsDropped, after.ACKsDropped)
			}
		})
	}
}

// resetRate shares Config.ResetsPerSec out among the CPUs, rounding up, and
// keeps to what syn_config.rst_rate holds, one more meaning none.
func TestResetRate(t *testing.T) {
	for _, tc := range []struct {
		n, ncpu int
		want    uint16
	}{
		{0, 2, DefaultResets / 2}, {-1, 4, 0xffff}, {1000, 3, 334}, {1, 8, 1}, {10_000_000, 1, 0xfffe},
	} {
		if got := resetRate(tc.n, tc.ncpu); got != tc.want {
			t.Errorf("resetRate(%d, %d) = %d, want %d", tc.n, tc.ncpu, got, tc.want)
		}
	}
}

// TestStrayAckResetSparesHandshakes: a segment right behind a valid cookie
// ACK passes as such while its syn_recent entry holds (the stack has yet
// to make its socket). When another handshake has taken the entry over,
// the segment looks stray; it is dropped, and sent again, never reset: a
// RST would kill a live connection. A segment of the same tuple that
// acknowledges something else is stray and gets its RST.
func TestStrayAckResetSparesHandshakes(t *testing.T) {
	objs := setup(t)
	if err := Configure(objs.SynSettings, Config{}); err != nil {
		t.Fatal(err)
	}
	server := netip.AddrPortFrom(server4, protectedPort)
	x := Tuple{netip.AddrPortFrom(client4, clientPort), server}
	// Another client port whose handshake takes the same syn_recent slot.
	const recentMask = 1<<14 - 1
	var y Tuple
	for port := uint16(1024); port != 0; port++ {
		c := netip.AddrPortFrom(client4, port)
		if port != clientPort && CensusSlot(c, server)&recentMask == CensusSlot(x.Client, server)&recentMask {
			y = Tuple{c, server}
			break
		}
	}
	if !y.Client.IsValid() {
		t.Fatal("no client port shares the syn_recent slot")
	}
	meta := Meta(1460, true, 7, true, true, false, 1, false)
	cookieX, tsX := CookieTS(testKeys[0], x, clientISN, meta, 5_000_000)
	cookieY, tsY := CookieTS(testKeys[0], y, clientISN, meta, 5_000_000)
	ackOf := func(tu Tuple, seq, ack, ts uint32, data int) []byte {
		return testpkt.IP(tu.Client.Addr(), server4, testpkt.TCP{SrcPort: tu.Client.Port(), DstPort: protectedPort,
			Seq: seq, Ack: ack, ACK: true, PSH: data > 0, Options: tsOpts(ts), Payload: make([]byte, data)})
	}
	for _, c := range []struct {
		name   string
		frames [][]byte
		want   []uint32
	}{
		{"entry taken over", [][]byte{
			ackOf(x, clientISN+1, cookieX+1, tsX, 0),
			ackOf(y, clientISN+1, cookieY+1, tsY, 0),
			ackOf(x, clientISN+1+1448, cookieX+1, tsX, 1000),
		}, []uint32{2, 2, 1}},
		{"same tuple, another acknowledgment", [][]byte{
			ackOf(x, clientISN+1, cookieX+1, tsX, 0),
			ackOf(x, clientISN+1+1448, cookieX+9, tsX, 1000),
		}, []uint32{2, 3}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := make([]uint32, len(c.frames))
			withListener(t, func() {
				forgetHandshakes(t, objs.SynRecent)
				for i, f := range c.frames {
					got[i], _ = run(t, objs.MoatFilter, f)
				}
			})
			if !slices.Equal(got, c.want) {
				t.Errorf("verdicts %v, want %v", got, c.want)
			}
		})
	}
}

// TestStrayAckResetBudgetAcrossPorts: the budget is the CPU's (and the
// interface's), not each port's: at one RST a second, stray ACKs to two
// ports in turn draw one RST. (Each port keeps its own clock for the
// jiffy, so the next ACK, to another port, may bring an earlier time than
// the last; syn_rst_take counts time only forward. Its old arithmetic
// added the step back to a credit that spending had lowered, wrapped, and
// refilled the bucket: that needs a RST spent between the two clocks,
// which one RST a second does not give here.)
func TestStrayAckResetBudgetAcrossPorts(t *testing.T) {
	objs := setup(t)
	const otherPort = 84
	if err := Protect(objs.SynPorts, objs.SynCounters, objs.SynCensus, otherPort, ModeAlways, 0); err != nil {
		t.Fatal(err)
	}
	if err := Configure(objs.SynSettings, Config{ResetsPerSec: OnlineCPUs()}); err != nil {
		t.Fatal(err)
	}
	var frames [][]byte
	for i := 0; i < 8; i++ {
		port := uint16(protectedPort)
		if i%2 == 1 {
			port = otherPort
		}
		frames = append(frames, ackFrameOpts(client4, server4, port, clientISN+1, 0x5eed+uint32(i), false, nil))
	}
	got := make([]uint32, len(frames))
	inScratchNetns(t, func() {
		for _, port := range []uint16{protectedPort, otherPort} {
			ln := listen(t, port)
			defer ln.Close()
		}
		for i, f := range frames {
			got[i], _ = run(t, objs.MoatFilter, f)
		}
	})
	resets := 0
	for _, v := range got {
		if v == 3 {
			resets++
		} else if v != 1 {
			t.Fatalf("verdicts %v: want RSTs (3) and drops (1) only", got)
		}
	}
	if got[0] != 3 || resets != 1 {
		t.Errorf("verdicts %v: want one RST, the first", got)
	}
}
