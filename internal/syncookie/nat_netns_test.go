package syncookie

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"
)

// TestHandshakeWhereNATRuns: on a host whose namespace runs NAT (any
// host of Docker, Kubernetes or libvirt containers: a masquerade rule for
// their subnet is enough), NAT's LOCAL_IN hook orphans a packet whose
// socket's remote port differs from the conntrack entry's, against early
// demux; the request socket bpf_sk_assign_tcp_reqsk hands over has no
// ports yet, so the kernel dropped it and reset every client whose SYN
// moat had answered, while `moat syn status` counted the handshake
// accepted. The kernel's own handshake is not affected. moat now leaves
// the SYNs of a family whose NAT runs to the kernel, and takes them again
// once it is gone.
func TestHandshakeWhereNATRuns(t *testing.T) {
	s := newShielded(t, ModeAlways)
	_, accepted := echoServer(t, s.lab.Server)
	ifc := s.lab.Client.Ifaces[0]
	nft := func(t *testing.T, script string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		cmd := s.lab.Server.Command(ctx, "nft", "-f", "-")
		cmd.Stdin = strings.NewReader(script)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("nft: %v: %s", err, out)
		}
	}
	connect := func(t *testing.T, addr netip.Addr) {
		t.Helper()
		c, _ := dialAccepted(t, s.lab.Client, addr, accepted)
		exchange(t, c, 64<<10)
	}

	for _, tc := range []struct {
		family string // nftables family of the NAT table
		nat    netip.Addr
		other  netip.Addr // the other family, whose SYNs moat still answers
		ahead  int        // filter chains at LOCAL_IN, the last at NAT's own priority
	}{
		{"ip", ifc.PeerIPv4, ifc.PeerIPv6, 0},
		{"ip6", ifc.PeerIPv6, ifc.PeerIPv4, 0},
		// A firewall's input chains (iptables' mangle and filter,
		// firewalld's, kube-proxy's) sort before NAT's LOCAL_IN hook
		// (priority 100): the data path must find it behind them. A
		// chain at NAT's own priority is not NAT: with the NAT table
		// gone, moat answers again.
		{"ip", ifc.PeerIPv4, ifc.PeerIPv6, 2},
		{"ip6", ifc.PeerIPv6, ifc.PeerIPv4, 5},
		{"ip", ifc.PeerIPv4, ifc.PeerIPv6, 7},
	} {
		t.Run(fmt.Sprintf("%s/%d-ahead", tc.family, tc.ahead), func(t *testing.T) {
			src := "192.0.2.0/24"
			if tc.family == "ip6" {
				src = "2001:db8:ff::/64"
			}
			if tc.ahead > 0 {
				chains := ""
				for i := range tc.ahead {
					prio := -50 + i
					if i == tc.ahead-1 {
						prio = 100
					}
					chains += fmt.Sprintf(" chain in%d {\n  type filter hook input priority %d;\n }\n", i, prio)
				}
				nft(t, fmt.Sprintf("table %s moat_test_filter {\n%s}\n", tc.family, chains))
				t.Cleanup(func() { nft(t, fmt.Sprintf("delete table %s moat_test_filter\n", tc.family)) })
			}
			nft(t, fmt.Sprintf("table %[1]s moat_test_nat {\n chain post {\n  type nat hook postrouting priority 100;\n"+
				"  %[1]s saddr %[2]s masquerade\n }\n}\n", tc.family, src))
			time.Sleep(20 * time.Millisecond) // the data path reads the namespace once per jiffy

			before := s.status(t)
			connect(t, tc.nat)
			after := s.status(t)
			if after.CookiesIssued != before.CookiesIssued || after.SYNsPassed != before.SYNsPassed+1 || after.NATSYNs != before.NATSYNs+1 {
				t.Errorf("with NAT: cookies issued %d->%d, syns passed %d->%d, NAT SYNs %d->%d: want the SYN left to the kernel, counted",
					before.CookiesIssued, after.CookiesIssued, before.SYNsPassed, after.SYNsPassed, before.NATSYNs, after.NATSYNs)
			}
			before = after
			connect(t, tc.other)
			if after = s.status(t); after.CookiesAccepted != before.CookiesAccepted+1 {
				t.Errorf("the family without NAT: cookies accepted %d->%d, want a moat handshake",
					before.CookiesAccepted, after.CookiesAccepted)
			}

			nft(t, fmt.Sprintf("delete table %s moat_test_nat\n", tc.family))
			time.Sleep(20 * time.Millisecond)
			before = s.status(t)
			connect(t, tc.nat)
			if after = s.status(t); after.CookiesAccepted != before.CookiesAccepted+1 {
				t.Errorf("NAT gone: cookies accepted %d->%d, want a moat handshake again",
					before.CookiesAccepted, after.CookiesAccepted)
			}
		})
	}

	// More input hooks ahead of NAT's priority than the data path looks
	// at (16): it cannot tell, and leaves the SYNs to the kernel as if
	// NAT ran; with the chains gone, moat answers again.
	t.Run("ip/17-ahead, no NAT", func(t *testing.T) {
		chains := ""
		for i := range 17 {
			chains += fmt.Sprintf(" chain in%d {\n  type filter hook input priority %d;\n }\n", i, -100+i)
		}
		nft(t, fmt.Sprintf("table ip moat_test_many {\n%s}\n", chains))
		time.Sleep(20 * time.Millisecond)
		before := s.status(t)
		connect(t, ifc.PeerIPv4)
		if after := s.status(t); after.CookiesIssued != before.CookiesIssued || after.NATSYNs != before.NATSYNs+1 {
			t.Errorf("17 hooks ahead: cookies issued %d->%d, NAT SYNs %d->%d: want the SYN left to the kernel",
				before.CookiesIssued, after.CookiesIssued, before.NATSYNs, after.NATSYNs)
		}
		nft(t, "delete table ip moat_test_many\n")
		time.Sleep(20 * time.Millisecond)
		before = s.status(t)
		connect(t, ifc.PeerIPv4)
		if after := s.status(t); after.CookiesAccepted != before.CookiesAccepted+1 {
			t.Errorf("chains gone: cookies accepted %d->%d, want a moat handshake again", before.CookiesAccepted, after.CookiesAccepted)
		}
	})
}
