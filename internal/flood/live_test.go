package flood

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/moat-shield/moat/internal/lab"
)

// newNetns creates an anonymous network namespace that lives until the
// test ends; without a bind mount it disappears with its last handle.
func newNetns(t testing.TB, ipv6 bool) netns.NsHandle {
	t.Helper()
	var ns netns.NsHandle
	err := onThread(func() error {
		var err error
		ns, err = netns.New() // also moves this thread, which then exits
		if err != nil {
			return err
		}
		if ipv6 {
			return nil
		}
		// Without IPv6 on the lab's devices, neighbour discovery and MLD
		// add no frames to the receiver's exact counts.
		for _, conf := range []string{"all", "default"} {
			os.WriteFile("/proc/sys/net/ipv6/conf/"+conf+"/disable_ipv6", []byte("1"), 0)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("new network namespace: %v", err)
	}
	t.Cleanup(func() { ns.Close() })
	return ns
}

// onThread runs fn on an OS thread of its own, which exits afterwards, so
// whatever namespace fn leaves it in never leaks to other goroutines.
func onThread(fn func() error) error {
	errc := make(chan error)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with us
		errc <- fn()
	}()
	return <-errc
}

// inNetns runs fn on a thread of its own inside ns.
func inNetns(ns netns.NsHandle, fn func() error) error {
	return onThread(func() error {
		if err := netns.Set(ns); err != nil {
			return err
		}
		return fn()
	})
}

// vethLab is a veth pair between two fresh namespaces: frames flooded out of
// send arrive at recv.
type vethLab struct {
	sendNS, recvNS     netns.NsHandle
	sendIndex          int
	recvIndex          int
	recvMAC            net.HardwareAddr
	sendName, recvName string
}

func newVethLab(t testing.TB, ipv6 bool) *vethLab {
	t.Helper()
	// The sender never has IPv6, so nothing but the flood reaches the
	// receiver; ipv6 turns it on at the receiver, for addresses of its own.
	l := &vethLab{sendNS: newNetns(t, false), recvNS: newNetns(t, ipv6), sendName: "flood-tx", recvName: "flood-rx"}
	hs, err := netlink.NewHandleAt(l.sendNS)
	if err != nil {
		t.Fatal(err)
	}
	defer hs.Close()
	hr, err := netlink.NewHandleAt(l.recvNS)
	if err != nil {
		t.Fatal(err)
	}
	defer hr.Close()
	veth := &netlink.Veth{
		LinkAttrs: netlink.LinkAttrs{Name: l.sendName},
		PeerName:  l.recvName, PeerNamespace: netlink.NsFd(l.recvNS),
		// One receive queue per CPU: each sending CPU fills its own ring,
		// so parallel threads cannot overflow a shared one.
		PeerNumRxQueues: uint32(runtime.NumCPU()),
		PeerNumTxQueues: uint32(runtime.NumCPU()),
	}
	if err := hs.LinkAdd(veth); err != nil {
		if errors.Is(err, unix.EOPNOTSUPP) {
			t.Skipf("veth not supported: %v", err)
		}
		t.Fatalf("create veth: %v", err)
	}
	send, err := hs.LinkByName(l.sendName)
	if err != nil {
		t.Fatal(err)
	}
	recv, err := hr.LinkByName(l.recvName)
	if err != nil {
		t.Fatal(err)
	}
	if err := hs.LinkSetUp(send); err != nil {
		t.Fatal(err)
	}
	if err := hr.LinkSetUp(recv); err != nil {
		t.Fatal(err)
	}
	l.sendIndex, l.recvIndex = send.Attrs().Index, recv.Attrs().Index
	l.recvMAC = recv.Attrs().HardwareAddr
	return l
}

// attachCounter puts a Counter on the receiving end.
func (l *vethLab) attachCounter(t testing.TB, pass bool) *Counter {
	t.Helper()
	var c *Counter
	if err := inNetns(l.recvNS, func() (err error) {
		c, err = AttachCounter(l.recvIndex, pass)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// refused is how many frames the receiving end's rings have refused (full)
// since the pair was made: the sending veth's tx_queue_*_xdp_xmit_errors.
func (l *vethLab) refused(t testing.TB) uint64 {
	t.Helper()
	var out []byte
	if err := inNetns(l.sendNS, func() (err error) {
		out, err = exec.Command("ethtool", "-S", l.sendName).CombinedOutput()
		return err
	}); err != nil {
		t.Fatalf("ethtool -S %s: %v: %s", l.sendName, err, out)
	}
	n, err := lab.SumEthtoolStats(out, "tx_queue_", "_xdp_xmit_errors")
	if err != nil {
		t.Fatalf("%s: %v", l.sendName, err)
	}
	return n
}

// flood runs Run from the sending namespace.
func (l *vethLab) flood(ctx context.Context, cfg Config) (Result, error) {
	cfg.IfIndex = l.sendIndex
	if cfg.DstMAC == nil {
		cfg.DstMAC = l.recvMAC
	}
	var res Result
	err := inNetns(l.sendNS, func() (err error) {
		res, err = Run(ctx, cfg)
		return err
	})
	return res, err
}

func TestLiveExactCount(t *testing.T) {
	l := newVethLab(t, false)
	counter := l.attachCounter(t, false)

	cases := []struct {
		name  string
		cfg   Config
		field func(Counts) uint64
	}{
		{"syn v4, 1 thread", Config{Kind: KindSYN, Sources: netip.MustParsePrefix("198.19.0.0/16"),
			Dst: netip.MustParseAddr("198.18.2.1"), DstPort: 80, Count: 100_000},
			func(c Counts) uint64 { return c.TCPSyn }},
		{"syn v6 vlan, 2 threads", Config{Kind: KindSYN, Sources: netip.MustParsePrefix("2001:db8:f00::/48"),
			Dst: netip.MustParseAddr("2001:db8:2::1"), DstPort: 443, VLAN: 7, Count: 100_001, Threads: 2},
			func(c Counts) uint64 { return c.TCPSyn }},
		{"udp v4 sequential, 2 pinned threads", Config{Kind: KindUDP, Sources: netip.MustParsePrefix("198.19.0.0/24"),
			Sequential: true, Dst: netip.MustParseAddr("198.18.2.1"), DstPort: 53, Count: 50_003, Threads: 2, PinCPUs: true},
			func(c Counts) uint64 { return c.UDP }},
		{"syn v4, 1 pinned thread at SCHED_IDLE", Config{Kind: KindSYN, Sources: netip.MustParsePrefix("198.19.0.0/16"),
			Dst: netip.MustParseAddr("198.18.2.1"), DstPort: 80, Count: 20_000, PinCPUs: true, Background: true},
			func(c Counts) uint64 { return c.TCPSyn }},
		{"tls-hello v4", Config{Kind: KindTLSHello, Sources: netip.MustParsePrefix("198.19.0.0/16"),
			Dst: netip.MustParseAddr("198.18.2.1"), DstPort: 443, Count: 20_000},
			func(c Counts) uint64 { return c.TCPOther }},
		{"icmp v6", Config{Kind: KindICMP, Sources: netip.MustParsePrefix("2001:db8:f00::/48"),
			Dst: netip.MustParseAddr("2001:db8:2::1"), Count: 20_000},
			func(c Counts) uint64 { return c.ICMP }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before, err := counter.Counts()
			if err != nil {
				t.Fatal(err)
			}
			refusedBefore := l.refused(t)
			res, err := l.flood(context.Background(), tc.cfg)
			if err != nil {
				t.Fatal(err)
			}
			after, err := counter.Counts()
			if err != nil {
				t.Fatal(err)
			}
			if res.Sent != tc.cfg.Count {
				t.Errorf("Run reports %d sent, want %d", res.Sent, tc.cfg.Count)
			}
			got := tc.field(after) - tc.field(before)
			all := after.Total() - before.Total()
			if tc.cfg.Threads <= 1 {
				if got != tc.cfg.Count || all != tc.cfg.Count {
					t.Errorf("receiver counted %d of the expected kind and %d in all (%+v), want %d",
						got, all, after, tc.cfg.Count)
				}
			} else {
				// Two senders can overflow the receiving veth's ring when
				// other work holds its CPU (the other packages' tests, in
				// make test): the receiver counts what the ring took, the
				// sending veth what it refused, and the two add up to
				// what the generator sent.
				refused := l.refused(t) - refusedBefore
				// Frames still in the rings when Run returns are counted
				// as the receiver takes them.
				for deadline := time.Now().Add(2 * time.Second); got+refused < tc.cfg.Count && time.Now().Before(deadline); {
					time.Sleep(10 * time.Millisecond)
					if after, err = counter.Counts(); err != nil {
						t.Fatal(err)
					}
					got, all = tc.field(after)-tc.field(before), after.Total()-before.Total()
					refused = l.refused(t) - refusedBefore
				}
				t.Logf("received %d, the ring refused %d", got, refused)
				if got != all || got+refused != tc.cfg.Count || got < tc.cfg.Count/2 {
					t.Errorf("receiver counted %d of the expected kind and %d in all (%+v), the ring refused %d; want %d in all, at least half of them received",
						got, all, after, refused, tc.cfg.Count)
				}
			}
			if res.Elapsed <= 0 || res.PPS <= 0 {
				t.Errorf("result %+v has no time or rate", res)
			}
			t.Logf("%d frames in %s: %.2f Mpps", res.Sent, res.Elapsed, res.PPS/1e6)
		})
	}
}

func TestLiveRateAndDuration(t *testing.T) {
	l := newVethLab(t, false)
	counter := l.attachCounter(t, false)
	base := Config{Kind: KindUDP, Sources: netip.MustParsePrefix("198.19.0.0/16"),
		Dst: netip.MustParseAddr("198.18.2.1"), DstPort: 9}

	// A rate cap with a count: the count is exact, and the last slice of
	// frames goes out count/rate after the first.
	cfg := base
	cfg.Count, cfg.Rate = 6000, 20_000
	res, err := l.flood(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if res.Sent != 6000 {
		t.Errorf("sent %d, want 6000", res.Sent)
	}
	if low := time.Duration(float64(cfg.Count)/float64(cfg.Rate)*float64(time.Second)) - rateSlice; res.Elapsed < low || res.Elapsed > low+500*time.Millisecond {
		t.Errorf("6000 frames at 20000 pps took %s, want about %s", res.Elapsed, low)
	}

	// A duration with a rate cap: stops in time, sends about rate*duration.
	cfg = base
	cfg.Duration, cfg.Rate, cfg.Threads = 200*time.Millisecond, 50_000, 2
	before, _ := counter.Counts()
	res, err = l.flood(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	after, _ := counter.Counts()
	if res.Elapsed < 190*time.Millisecond || res.Elapsed > 500*time.Millisecond {
		t.Errorf("a 200ms flood took %s", res.Elapsed)
	}
	if res.Sent < 5000 || res.Sent > 15_000 {
		t.Errorf("200ms at 50000 pps sent %d, want about 10000", res.Sent)
	}
	if got := after.UDP - before.UDP; got != res.Sent {
		t.Errorf("receiver counted %d, Run reports %d", got, res.Sent)
	}

	// A duration alone: every thread sends in one kernel call, which the
	// deadline ends, so the flood never pauses between calls.
	cfg = base
	cfg.Duration, cfg.Threads = 300*time.Millisecond, 2
	before, _ = counter.Counts()
	res, err = l.flood(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	after, _ = counter.Counts()
	// One call per thread; a stray signal to a sending thread (none is
	// expected) would add one. Calls of 200ms, as the generator made
	// before, would be at least 3 per thread.
	if res.Calls < 2 || res.Calls > 3 {
		t.Errorf("a 300ms flood on 2 threads made %d kernel calls, want 2", res.Calls)
	}
	// The call's own teardown (20-30ms) comes after the deadline.
	if res.Elapsed < 290*time.Millisecond || res.Elapsed > 700*time.Millisecond {
		t.Errorf("a 300ms flood took %s", res.Elapsed)
	}
	// Two senders at full speed can overflow the receiving rings when
	// other work holds a CPU: the receiver sees most, never more.
	if got := after.UDP - before.UDP; res.Sent < 10_000 || got > res.Sent || got < res.Sent/2 {
		t.Errorf("300ms unlimited: sent %d, receiver counted %d", res.Sent, got)
	}

	// Cancelling the context ends an unlimited flood early, without error,
	// within the call in progress. (The timeout runs from before the
	// program is loaded, so the flood itself lasts less.)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	cfg = base
	res, err = l.flood(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if res.Sent == 0 || res.Calls > 2 || res.Elapsed > 400*time.Millisecond {
		t.Errorf("flood cancelled after 200ms: %+v, want one call that ends soon after", res)
	}
}

// TestLiveRejectedTemplate: a thread whose program refuses its template
// says so, also when its deadline, not the frame count, ends its call.
func TestLiveRejectedTemplate(t *testing.T) {
	l := newVethLab(t, false)
	l.attachCounter(t, false)
	err := inNetns(l.sendNS, func() error {
		cfg := Config{Kind: KindUDP, IfIndex: l.sendIndex, DstMAC: l.recvMAC, Sources: netip.MustParsePrefix("198.19.0.0/16"),
			Dst: netip.MustParseAddr("198.18.2.1"), DstPort: 9}
		mac, err := deviceMAC(l.sendIndex)
		if err != nil {
			return err
		}
		cfg.SrcMAC = mac
		tmpl, spec, err := prepare(&cfg)
		if err != nil {
			return err
		}
		// Shorter than the headers the program writes back into each
		// frame: it refuses every one (XDP_ABORTED).
		tmpl.frame = tmpl.frame[:20]
		ns, err := netns.Get()
		if err != nil {
			return err
		}
		defer ns.Close()
		w := &worker{spec: spec, tmpl: tmpl, ifindex: l.sendIndex, ns: ns, cpu: -1}
		g := &gate{start: make(chan struct{}), deadline: time.Now().Add(300 * time.Millisecond)}
		g.ready.Add(1)
		close(g.start)
		var sent uint64
		done := make(chan struct{})
		go func() {
			defer close(done)
			sent, err = w.run(context.Background(), g)
		}()
		<-done
		if err == nil || !strings.Contains(err.Error(), "template rejected") {
			t.Errorf("a refused template: sent %d, error %v; want template rejected", sent, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestCheckTarget(t *testing.T) {
	l := newVethLab(t, false)

	// A veth inside a lab namespace is the intended target.
	if err := inNetns(l.sendNS, func() error { return CheckTarget(l.sendIndex, false) }); err != nil {
		t.Errorf("veth in a lab namespace refused: %v", err)
	}
	// Loopback is not a veth, wherever it is.
	err := inNetns(l.sendNS, func() error { return CheckTarget(1, false) })
	if err == nil || !strings.HasPrefix(err.Error(), "moat flood is a lab tool: lo is a loopback device, not a veth") {
		t.Errorf("loopback: got %v", err)
	}
	if err := inNetns(l.sendNS, func() error { return CheckTarget(1, true) }); err != nil {
		t.Errorf("loopback with force: %v", err)
	}
	// A missing device is an error even with force.
	if err := inNetns(l.sendNS, func() error { return CheckTarget(9999, true) }); err == nil {
		t.Errorf("missing device accepted")
	}
	// And Run refuses before sending anything.
	err = inNetns(l.sendNS, func() error {
		_, err := Run(context.Background(), Config{Kind: KindSYN, IfIndex: 1, DstMAC: l.recvMAC,
			Sources: netip.MustParsePrefix("198.19.0.0/16"), Dst: netip.MustParseAddr("198.18.2.1"), DstPort: 80, Count: 1})
		return err
	})
	if err == nil || !strings.HasPrefix(err.Error(), "moat flood is a lab tool:") {
		t.Errorf("Run on loopback: got %v", err)
	}

	// A veth in the initial namespace is refused. The pair gets a unique
	// name there and goes away with the test.
	if initial, err := inInitialNetns(); err != nil || !initial {
		t.Logf("the test process is not in the initial network namespace (%v); skipping that case", err)
		return
	}
	suffix := make([]byte, 4)
	rand.Read(suffix)
	name := "mfl" + hex.EncodeToString(suffix)
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: name + "p"}
	if err := netlink.LinkAdd(veth); err != nil {
		t.Fatalf("create veth in the initial namespace: %v", err)
	}
	t.Cleanup(func() { netlink.LinkDel(veth) })
	link, err := netlink.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	err = onThread(func() error { return CheckTarget(link.Attrs().Index, false) })
	want := fmt.Sprintf("moat flood is a lab tool: %s is in the initial network namespace", name)
	if err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Errorf("veth in the initial namespace: got %v, want %q", err, want)
	}
	if err := onThread(func() error { return CheckTarget(link.Attrs().Index, true) }); err != nil {
		t.Errorf("veth in the initial namespace with force: %v", err)
	}
}

// BenchmarkFlood measures the generator into a veth whose peer drops
// everything with XDP; the figure includes the receiver's work, which veth
// runs on the sending CPU.
//
//	go test ./internal/flood -run '^$' -bench Flood -benchtime 5x
func BenchmarkFlood(b *testing.B) {
	for _, kind := range []Kind{KindSYN, KindUDP} {
		for _, run := range []struct {
			threads int
			pin     bool
		}{{1, false}, {2, false}, {2, true}} {
			b.Run(fmt.Sprintf("%s/threads=%d/pinned=%v", kind, run.threads, run.pin), func(b *testing.B) {
				l := newVethLab(b, false)
				if err := inNetns(l.recvNS, func() error {
					d, err := AttachDropper(l.recvIndex)
					if err == nil {
						b.Cleanup(func() { d.Close() })
					}
					return err
				}); err != nil {
					b.Fatal(err)
				}
				cfg := Config{Kind: kind, Sources: netip.MustParsePrefix("198.19.0.0/16"),
					Dst: netip.MustParseAddr("198.18.2.1"), DstPort: 80,
					Count: 4_000_000, Threads: run.threads, PinCPUs: run.pin}
				var sent uint64
				var elapsed time.Duration
				b.ResetTimer()
				for range b.N {
					res, err := l.flood(context.Background(), cfg)
					if err != nil {
						b.Fatal(err)
					}
					sent += res.Sent
					elapsed += res.Elapsed
				}
				b.ReportMetric(float64(sent)/elapsed.Seconds()/1e6, "Mpps")
			})
		}
	}
}
