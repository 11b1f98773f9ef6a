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
	}{
		{"ip", ifc.PeerIPv4, ifc.PeerIPv6},
		{"ip6", ifc.PeerIPv6, ifc.PeerIPv4},
	} {
		t.Run(tc.family, func(t *testing.T) {
			src := "192.0.2.0/24"
			if tc.family == "ip6" {
				src = "2001:db8:ff::/64"
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
}

// TestNATHooksFromKallsyms: the addresses of the NAT hooks come from
// kallsyms; a kallsyms whose addresses all read 0 (kernel.kptr_restrict)
// says nothing, and one without the hooks (a kernel without NAT) gives 0
// for them but shows addresses.
func TestNATHooksFromKallsyms(t *testing.T) {
	for _, c := range []struct {
		name     string
		kallsyms string
		addrs    [2]uint64
		visible  bool
	}{
		{"both", "ffffffff81000000 T _text\nffffffff81e3c0a0 t nf_nat_ipv4_local_in\nffffffff81e3d1b0 t nf_nat_ipv6_local_in\n",
			[2]uint64{0xffffffff81e3c0a0, 0xffffffff81e3d1b0}, true},
		{"hidden", "0000000000000000 T _text\n0000000000000000 t nf_nat_ipv4_local_in\n0000000000000000 t nf_nat_ipv6_local_in\n",
			[2]uint64{}, false},
		{"no NAT in the kernel", "ffffffff81000000 T _text\nffffffff81e3c0a0 t nf_nat_ipv4_local_fn\n",
			[2]uint64{}, true},
		{"a module's symbol", "ffffffffc0a01000 t nf_nat_ipv4_local_in\t[nf_nat]\n", [2]uint64{0xffffffffc0a01000, 0}, true},
	} {
		addrs, visible, err := NATHooks(strings.NewReader(c.kallsyms))
		if err != nil || addrs != c.addrs || visible != c.visible {
			t.Errorf("%s: %x, visible %v, %v; want %x, visible %v", c.name, addrs, visible, err, c.addrs, c.visible)
		}
	}
}
