package syncookie

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"

	"github.com/moat-shield/moat/internal/lab"
	"github.com/moat-shield/moat/internal/testpkt"
)

// TestSubnetRouterAnycastLeftToTheKernel: a host that forwards has a
// subnet-router anycast address for each prefix of its devices
// (2001:db8:1:: for 2001:db8:1::1/64), and the kernel takes no TCP
// connection to it: it drops the SYN. moat answered such a SYN with a
// SYN-ACK from the anycast address, and took the third ACK: a connection
// the kernel alone never makes, and only while the port was in cookie
// mode. Where the device forwards, its SYNs are the kernel's (counted as
// passed); a stray ACK to it gets the listener's RST, as from the kernel
// (TestSubnetRouterAnycastAsTheKernel). Where it does not, the kernel makes
// no anycast address, and an address with a zero interface identifier is
// a server's like any other: its SYNs get moat's cookies.
func TestSubnetRouterAnycastLeftToTheKernel(t *testing.T) {
	opts := []layers.TCPOption{testpkt.MSS(1460), testpkt.SACKPermitted(), testpkt.Timestamps(1, 0), testpkt.TCPNOP(), testpkt.WindowScale(7)}
	syn := func(server netip.Addr) []byte {
		return synFrame(nil, client6, server, testpkt.TCP{Options: opts})
	}
	for _, forwarding := range []bool{true, false} {
		t.Run(fmt.Sprintf("forwarding %t", forwarding), func(t *testing.T) {
			objs := setup(t)
			// RSTs for stray ACKs on, as by default.
			if err := Configure(objs.SynSettings, Config{}); err != nil {
				t.Fatal(err)
			}
			anycast := uint32(3) // 1 XDP_DROP, 2 XDP_PASS, 3 XDP_TX
			if forwarding {
				anycast = 2
			}
			for _, tc := range []struct {
				name  string
				frame []byte
				want  uint32
			}{
				{"syn to a unicast address", syn(server6), 3},
				{"syn to 2001:db8:1::", syn(netip.MustParseAddr("2001:db8:1::")), anycast},
				{"syn to fe80::", syn(netip.MustParseAddr("fe80::")), anycast},
				{"stray ack to a unicast address", ackFrame(client6, server6, protectedPort, 9, 12345, false), 3},
				{"stray ack to 2001:db8:1::", ackFrame(client6, netip.MustParseAddr("2001:db8:1::"), protectedPort, 9, 12345, false), 3},
			} {
				var ret uint32
				var out []byte
				withListener(t, func() {
					// The scratch namespace's devices, lo among them,
					// by which test runs come in.
					v := "0"
					if forwarding {
						v = "1"
					}
					if err := os.WriteFile("/proc/sys/net/ipv6/conf/all/forwarding", []byte(v), 0); err != nil {
						t.Fatal(err)
					}
					ret, out = run(t, objs.MoatFilter, tc.frame)
				})
				if ret != tc.want {
					t.Errorf("%s: verdict %d, want %d", tc.name, ret, tc.want)
				}
				if ret == 2 && string(out[:len(tc.frame)]) != string(tc.frame) {
					t.Errorf("%s: passed changed", tc.name)
				}
			}
			st := portStatus(t, objs, protectedPort)
			want := PortStatus{CookiesIssued: 3, ResetsSent: 2}
			if forwarding {
				want = PortStatus{CookiesIssued: 1, SYNsPassed: 2, ResetsSent: 2}
			}
			if st.CookiesIssued != want.CookiesIssued || st.SYNsPassed != want.SYNsPassed || st.ResetsSent != want.ResetsSent {
				t.Errorf("status %+v: want %d cookies issued, %d SYNs passed, %d RSTs sent", st,
					want.CookiesIssued, want.SYNsPassed, want.ResetsSent)
			}
		})
	}
}

// TestSubnetRouterAnycastAsTheKernel: on a server that forwards IPv6, with
// a listener on the wildcard address, the kernel makes no connection to
// the link's subnet-router anycast address (no SYN-ACK for a SYN) but
// answers a stray ACK to it with the listener's RST, as it does for its
// unicast address; moat in always mode does the same, with its own
// SYN-ACK and RST for the unicast address and its own RST for the anycast
// one. Hand-made frames from the client, replies read on its interface.
func TestSubnetRouterAnycastAsTheKernel(t *testing.T) {
	s := newShielded(t, ModeNever)
	cl := s.lab.Client.Ifaces[0]
	if err := s.lab.Server.Do(func() error {
		return os.WriteFile("/proc/sys/net/ipv6/conf/all/forwarding", []byte("1"), 0)
	}); err != nil {
		t.Fatal(err)
	}
	anycast := cl.IPv6.Masked().Addr()
	const port = labPort + 200
	ln := s.listenTCP(t, "tcp6", port, nil)
	defer ln.Close()
	send := s.lab.Client.RawSender(t)
	replies := tcpReplies(t, s.lab.Client, port)
	srcPort := uint16(40000)
	for _, m := range []Mode{ModeNever, ModeAlways} {
		s.protect(t, port, m)
		for _, tc := range []struct {
			dst       netip.Addr
			syn       bool
			wantFlags string // "" for no reply
		}{
			{anycast, true, ""},
			{anycast, false, "R"},
			{cl.PeerIPv6, true, "SA"},
			{cl.PeerIPv6, false, "R"},
		} {
			srcPort++
			tcp := testpkt.TCP{SrcPort: srcPort, DstPort: port, Seq: 1000, SYN: tc.syn, ACK: !tc.syn,
				Options: []layers.TCPOption{testpkt.MSS(1400)}}
			if !tc.syn {
				tcp.Ack, tcp.Options = 5555, nil
			}
			send(testpkt.Frame{SrcMAC: cl.MAC, DstMAC: cl.PeerMAC,
				Net: testpkt.IPv6{Src: cl.IPv6.Addr(), Dst: tc.dst}, L4: tcp}.Bytes())
			what := "ACK"
			if tc.syn {
				what = "SYN"
			}
			if got := replies(srcPort); got != tc.wantFlags {
				t.Errorf("%s: %s to %v: reply %q, want %q", m, what, tc.dst, got, tc.wantFlags)
			}
		}
	}
	if p := portStatus(t, s.objs, port); p.CookiesIssued != 1 || p.SYNsPassed != 1 || p.ResetsSent != 2 {
		t.Errorf("always mode: %+v; want 1 cookie issued, 1 SYN passed (anycast), 2 RSTs sent", p)
	}
}

// tcpReplies reads the frames that come in on h's first interface and
// returns a function that waits up to 700 ms for a TCP segment from port
// to the client port dport, and says which flags it had ("SA", "R", ...;
// "" for none).
func tcpReplies(t *testing.T, h *lab.Host, port uint16) func(dport uint16) string {
	t.Helper()
	frames := newFrameReader(t, h)
	return func(dport uint16) string {
		flags := ""
		frames.until(700*time.Millisecond, func(_ gopacket.Packet, tcp *layers.TCP, sent bool) bool {
			if sent || uint16(tcp.SrcPort) != port || uint16(tcp.DstPort) != dport {
				return false
			}
			for _, f := range []struct {
				on bool
				s  string
			}{{tcp.SYN, "S"}, {tcp.ACK, "A"}, {tcp.RST, "R"}} {
				if f.on {
					flags += f.s
				}
			}
			return true
		})
		return flags
	}
}

// TestAnycastResetNeedsASocket: the kernel refuses a RST of no socket to
// a subnet-router anycast address, and sends one to a unicast address.
// A stray ACK that comes within the jiffy in which this CPU found the
// listener, after the listener closed, meets no socket at the lookup
// before the RST: moat drops it for an anycast destination and resets it
// for a unicast one. The listener check must skip its lookup for that (a
// trusted census, one jiffy): a few tries.
func TestAnycastResetNeedsASocket(t *testing.T) {
	objs := setup(t)
	if err := Configure(objs.SynSettings, Config{}); err != nil { // RSTs on
		t.Fatal(err)
	}
	c := censusTable(t, objs.SynCensus)
	for _, tc := range []struct {
		name string
		dst  netip.Addr
		want uint32 // for the ACK after the listener closed: 1 XDP_DROP, 3 XDP_TX
	}{
		{"anycast", netip.MustParseAddr("2001:db8:1::"), 1},
		{"unicast", server6, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []uint32
			inScratchNetns(t, func() {
				if err := os.WriteFile("/proc/sys/net/ipv6/conf/all/forwarding", []byte("1"), 0); err != nil {
					t.Fatal(err)
				}
				for try := 0; try < 20; try++ {
					c.Generation, c.Floor, c.ValidUntilNs = 5, 4, bootNow()+uint64(time.Hour)
					clear(c.Marks[:])
					ln := listen(t, protectedPort)
					first, _ := run(t, objs.MoatFilter, ackFrame(client6, tc.dst, protectedPort, 9, 12345, false))
					ln.Close()
					second, _ := run(t, objs.MoatFilter,
						testpkt.Frame{Net: testpkt.IPv6{Src: client6, Dst: tc.dst},
							L4: testpkt.TCP{SrcPort: clientPort + 1, DstPort: protectedPort, Seq: 9, Ack: 777, ACK: true}}.Bytes())
					got = []uint32{first, second}
					if first == 3 && second != 2 { // 2: the jiffy passed, no listener found
						return
					}
				}
			})
			if want := []uint32{3, tc.want}; !slices.Equal(got, want) {
				t.Errorf("verdicts %v (the listener's RST, then the ACK after it closed), want %v", got, want)
			}
		})
	}
}

// TestNoSocketResetFlowLabel: the kernel's RST for a segment that meets
// the listener carries the segment's flow label where the listener
// reflects labels (its own REPFLOW, from flowlabel_reflect bit 0 when it
// was made); its RST of no socket, where flowlabel_reflect has bit 1
// (resets). A stray ACK that comes within the jiffy in which this CPU
// found the listener, after the listener closed, meets no socket at the
// lookup before moat's RST, and that RST follows the second rule, not the
// listener that was. Auto flow labels off: a label not reflected is 0.
func TestNoSocketResetFlowLabel(t *testing.T) {
	objs := setup(t)
	if err := Configure(objs.SynSettings, Config{}); err != nil { // RSTs on
		t.Fatal(err)
	}
	c := censusTable(t, objs.SynCensus)
	const first, second = 0x12345, 0x6789a // the ACKs' flow labels
	ack := func(label uint32, sport uint16) []byte {
		return testpkt.Frame{Net: testpkt.IPv6{Src: client6, Dst: server6, FlowLabel: label},
			L4: testpkt.TCP{SrcPort: sport, DstPort: protectedPort, Seq: 9, Ack: 777, ACK: true}}.Bytes()
	}
	label := func(frame []byte) uint32 { return binary.BigEndian.Uint32(frame[14:18]) & 0xfffff }
	for _, tc := range []struct {
		reflect string // net.ipv6.flowlabel_reflect
		// The RSTs' labels: the listener's, then the one of no socket.
		want [2]uint32
	}{
		{"1", [2]uint32{first, 0}},
		{"2", [2]uint32{0, second}},
		{"3", [2]uint32{first, second}},
		{"0", [2]uint32{0, 0}},
	} {
		t.Run("flowlabel_reflect "+tc.reflect, func(t *testing.T) {
			var verdicts [2]uint32
			var got [2]uint32
			// This CPU's listener cache lasts a jiffy and knows a
			// device by its ifindex, which each row's scratch
			// loopback shares with the last row's: a row of its own
			// jiffy finds its own listener.
			time.Sleep(20 * time.Millisecond)
			inScratchNetns(t, func() {
				for _, w := range [][2]string{{"flowlabel_reflect", tc.reflect}, {"auto_flowlabels", "0"}} {
					if err := os.WriteFile("/proc/sys/net/ipv6/"+w[0], []byte(w[1]), 0); err != nil {
						t.Fatal(err)
					}
				}
				for try := 0; try < 20; try++ {
					c.Generation, c.Floor, c.ValidUntilNs = 5, 4, bootNow()+uint64(time.Hour)
					clear(c.Marks[:])
					ln := listen(t, protectedPort)
					v0, out0 := run(t, objs.MoatFilter, ack(first, clientPort))
					ln.Close()
					v1, out1 := run(t, objs.MoatFilter, ack(second, clientPort+1))
					verdicts = [2]uint32{v0, v1}
					got = [2]uint32{label(out0), label(out1)}
					if v0 == 3 && v1 != 2 { // 2: the jiffy passed, no listener found
						return
					}
				}
			})
			if verdicts != [2]uint32{3, 3} {
				t.Fatalf("verdicts %v (the listener's RST, then the RST of no socket), want [3 3]", verdicts)
			}
			if got != tc.want {
				t.Errorf("RST flow labels %#x (the listener's, then of no socket), want %#x", got, tc.want)
			}
		})
	}
}

// TestListenerFlowBitsUnknown: where the loader could not read the
// kernel's numbers of a socket's flow label bits (a kernel before 6.7),
// the namespace's flowlabel_reflect as it is now stands for the
// listener's choice; where it could, the listener's own choice holds,
// made when flowlabel_reflect was 0. Auto flow labels off: a label not
// reflected is 0.
func TestListenerFlowBitsUnknown(t *testing.T) {
	const label = 0x2468a
	ack := testpkt.Frame{Net: testpkt.IPv6{Src: client6, Dst: server6, FlowLabel: label},
		L4: testpkt.TCP{SrcPort: clientPort, DstPort: protectedPort, Seq: 9, Ack: 777, ACK: true}}.Bytes()
	for _, tc := range []struct {
		name      string
		constants bool
		want      uint32 // the RST's flow label
	}{
		{"bits read from the kernel's BTF", true, 0},
		{"bits unknown", false, label},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs := setupObjects(t, loadObjectsKernel(t, tc.constants))
			if err := Configure(objs.SynSettings, Config{}); err != nil { // RSTs on
				t.Fatal(err)
			}
			var verdict uint32
			var out []byte
			inScratchNetns(t, func() {
				write := func(name, val string) {
					if err := os.WriteFile("/proc/sys/net/ipv6/"+name, []byte(val), 0); err != nil {
						t.Fatal(err)
					}
				}
				write("auto_flowlabels", "0")
				write("flowlabel_reflect", "0")
				ln := listen(t, protectedPort)
				defer ln.Close()
				write("flowlabel_reflect", "1")
				verdict, out = run(t, objs.MoatFilter, ack)
			})
			if verdict != 3 {
				t.Fatalf("stray ACK: verdict %d, want XDP_TX (3): the listener's RST", verdict)
			}
			if got := binary.BigEndian.Uint32(out[14:18]) & 0xfffff; got != tc.want {
				t.Errorf("RST flow label %#x, want %#x", got, tc.want)
			}
		})
	}
}
