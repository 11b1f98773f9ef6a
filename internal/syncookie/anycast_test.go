package syncookie

import (
	"fmt"
	"net/netip"
	"os"
	"testing"

	"github.com/google/gopacket/layers"

	"github.com/moat-shield/moat/internal/testpkt"
)

// TestSubnetRouterAnycastLeftToTheKernel: a host that forwards has a
// subnet-router anycast address for each prefix of its devices
// (2001:db8:1:: for 2001:db8:1::1/64), and the kernel takes no TCP
// connection to it: it drops the SYN and answers a stray segment with no
// RST. moat answered such a SYN with a SYN-ACK from the anycast address,
// and took the third ACK: a connection the kernel alone never makes, and
// only while the port was in cookie mode. Where the device forwards, its
// SYNs are the kernel's (counted as passed), and a stray ACK to it is
// dropped without a RST. Where it does not, the kernel makes no anycast
// address, and an address with a zero interface identifier is a server's
// like any other: its SYNs get moat's cookies.
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
			anycastAck := uint32(3)
			if forwarding {
				anycast, anycastAck = 2, 1
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
				{"stray ack to 2001:db8:1::", ackFrame(client6, netip.MustParseAddr("2001:db8:1::"), protectedPort, 9, 12345, false), anycastAck},
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
				want = PortStatus{CookiesIssued: 1, SYNsPassed: 2, ResetsSent: 1}
			}
			if st.CookiesIssued != want.CookiesIssued || st.SYNsPassed != want.SYNsPassed || st.ResetsSent != want.ResetsSent {
				t.Errorf("status %+v: want %d cookies issued, %d SYNs passed, %d RSTs sent", st,
					want.CookiesIssued, want.SYNsPassed, want.ResetsSent)
			}
		})
	}
}
