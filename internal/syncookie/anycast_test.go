package syncookie

import (
	"net/netip"
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
// only while the port was in cookie mode. Its SYNs are the kernel's
// (counted as passed), and a stray ACK to it is dropped without a RST.
func TestSubnetRouterAnycastLeftToTheKernel(t *testing.T) {
	objs := setup(t)
	// RSTs for stray ACKs on, as by default.
	if err := Configure(objs.SynSettings, Config{}); err != nil {
		t.Fatal(err)
	}
	opts := []layers.TCPOption{testpkt.MSS(1460), testpkt.SACKPermitted(), testpkt.Timestamps(1, 0), testpkt.TCPNOP(), testpkt.WindowScale(7)}
	syn := func(server netip.Addr) []byte {
		return synFrame(nil, client6, server, testpkt.TCP{Options: opts})
	}
	for _, tc := range []struct {
		name  string
		frame []byte
		want  uint32 // 1 XDP_DROP, 2 XDP_PASS, 3 XDP_TX
	}{
		{"syn to a unicast address", syn(server6), 3},
		{"syn to 2001:db8:1::", syn(netip.MustParseAddr("2001:db8:1::")), 2},
		{"syn to fe80::", syn(netip.MustParseAddr("fe80::")), 2},
		{"stray ack to a unicast address", ackFrame(client6, server6, protectedPort, 9, 12345, false), 3},
		{"stray ack to 2001:db8:1::", ackFrame(client6, netip.MustParseAddr("2001:db8:1::"), protectedPort, 9, 12345, false), 1},
	} {
		var ret uint32
		var out []byte
		withListener(t, func() { ret, out = run(t, objs.MoatFilter, tc.frame) })
		if ret != tc.want {
			t.Errorf("%s: verdict %d, want %d", tc.name, ret, tc.want)
		}
		if ret == 2 && string(out[:len(tc.frame)]) != string(tc.frame) {
			t.Errorf("%s: passed changed", tc.name)
		}
	}
	st := portStatus(t, objs, protectedPort)
	if st.CookiesIssued != 1 || st.SYNsPassed != 2 || st.ResetsSent != 1 {
		t.Errorf("status %+v: want 1 cookie issued, 2 SYNs passed, 1 RST sent", st)
	}
}
