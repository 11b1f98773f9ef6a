package flood

import (
	"bufio"
	"context"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/moat-shield/moat/internal/lab"
)

// snmpCounters reads the calling thread's namespace's protocol counters:
// lab.NetCounters and /proc/net/snmp6's name/value lines, keyed
// "snmp6.Name".
func snmpCounters() (map[string]uint64, error) {
	out, err := lab.NetCounters()
	if err != nil {
		return nil, err
	}
	f, err := os.Open("/proc/thread-self/net/snmp6")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if fs := strings.Fields(sc.Text()); len(fs) == 2 {
			v, _ := strconv.ParseUint(fs[1], 10, 64)
			out["snmp6."+fs[0]] = v
		}
	}
	return out, sc.Err()
}

// TestLiveStackAccepts sends live floods to addresses the receiver owns and
// lets its kernel judge them: every frame must reach the L4 protocol with
// no checksum error, which checks the checksums of frames the generator
// rewrote in recycled pages, not only of fresh templates.
func TestLiveStackAccepts(t *testing.T) {
	l := newVethLab(t, true)
	counter := l.attachCounter(t, true)
	if err := inNetns(l.recvNS, func() error {
		link, err := netlink.LinkByIndex(l.recvIndex)
		if err != nil {
			return err
		}
		for _, a := range []string{"198.18.2.1/24", "2001:db8:2::1/64"} {
			addr, _ := netlink.ParseAddr(a)
			addr.Flags = 0x02 // IFA_F_NODAD: usable at once
			if err := netlink.AddrAdd(link, addr); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	const n = 20_000
	v4, v6 := netip.MustParseAddr("198.18.2.1"), netip.MustParseAddr("2001:db8:2::1")
	src4, src6 := netip.MustParsePrefix("198.19.0.0/16"), netip.MustParsePrefix("2001:db8:f00::/48")
	tcp := func(c Counts) uint64 { return c.TCPSyn + c.TCPOther }
	udp := func(c Counts) uint64 { return c.UDP }
	icmp := func(c Counts) uint64 { return c.ICMP }
	cases := []struct {
		name     string
		cfg      Config
		arrived  func(Counts) uint64 // frames of the kind the receiver's XDP saw
		accepted string              // must grow by as many
		clean    []string            // counters that must not grow
	}{
		{"udp v4", Config{Kind: KindUDP, Sources: src4, Dst: v4, DstPort: 9, PayloadSize: 101},
			udp, "Udp.NoPorts", []string{"Udp.InCsumErrors", "Udp.InErrors", "Ip.InHdrErrors"}},
		{"udp v6", Config{Kind: KindUDP, Sources: src6, Dst: v6, DstPort: 9},
			udp, "snmp6.Udp6NoPorts", []string{"snmp6.Udp6InCsumErrors", "snmp6.Udp6InErrors"}},
		{"syn v4", Config{Kind: KindSYN, Sources: src4, Dst: v4, DstPort: 81},
			tcp, "Tcp.InSegs", []string{"Tcp.InCsumErrors", "Tcp.InErrs", "Ip.InHdrErrors"}},
		{"syn-random-port v6", Config{Kind: KindSYNRandomPort, Sources: src6, Dst: v6},
			tcp, "Tcp.InSegs", []string{"Tcp.InCsumErrors", "Tcp.InErrs"}},
		{"ack v6", Config{Kind: KindACK, Sources: src6, Dst: v6, DstPort: 81},
			tcp, "Tcp.InSegs", []string{"Tcp.InCsumErrors", "Tcp.InErrs"}},
		{"tls-hello v4, 2 threads", Config{Kind: KindTLSHello, Sources: src4, Dst: v4, DstPort: 443, Threads: 2},
			tcp, "Tcp.InSegs", []string{"Tcp.InCsumErrors", "Tcp.InErrs", "Ip.InHdrErrors"}},
		{"icmp v4", Config{Kind: KindICMP, Sources: src4, Dst: v4},
			icmp, "Icmp.InEchos", []string{"Icmp.InCsumErrors", "Icmp.InErrors", "Ip.InHdrErrors"}},
		{"icmp v6", Config{Kind: KindICMP, Sources: src6, Dst: v6},
			icmp, "snmp6.Icmp6InEchos", []string{"snmp6.Icmp6InCsumErrors", "snmp6.Icmp6InErrors"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var before, after map[string]uint64
			read := func(into *map[string]uint64) {
				if err := inNetns(l.recvNS, func() (err error) {
					*into, err = snmpCounters()
					return err
				}); err != nil {
					t.Fatal(err)
				}
			}
			read(&before)
			countsBefore, _ := counter.Counts()
			tc.cfg.Count = n
			if _, err := l.flood(context.Background(), tc.cfg); err != nil {
				t.Fatal(err)
			}
			read(&after)
			countsAfter, _ := counter.Counts()
			// Passing frames on to the stack is slow enough that softirq
			// work can be deferred and the veth ring overflow, so what
			// arrived is the measure; nothing else reaches these counters
			// (echo replies and RSTs have no route back to the sources).
			arrived := tc.arrived(countsAfter) - tc.arrived(countsBefore)
			if arrived < n/10 || arrived > n {
				t.Fatalf("receiver's XDP saw %d frames of %d", arrived, n)
			}
			if got := after[tc.accepted] - before[tc.accepted]; got != arrived {
				t.Errorf("%s grew by %d, want %d, the frames that arrived", tc.accepted, got, arrived)
			}
			for _, c := range tc.clean {
				if _, ok := after[c]; !ok {
					t.Fatalf("no counter %s", c)
				}
				if d := after[c] - before[c]; d != 0 {
					t.Errorf("%s grew by %d", c, d)
				}
			}
		})
	}
}
