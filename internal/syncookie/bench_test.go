package syncookie

import (
	"context"
	"net"
	"net/netip"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/google/gopacket/layers"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/moat-shield/moat/internal/testpkt"
)

// BenchmarkPerPacket measures the filter's time per packet with
// BPF_PROG_TEST_RUN (Repeat), in a scratch namespace holding one
// established loopback connection, so that the cost of the SYN defence on
// established traffic is measured against a real socket lookup.
//
//	go test -run '^$' -bench PerPacket -benchtime 1x ./internal/syncookie/
func BenchmarkPerPacket(b *testing.B) {
	objs := loadObjects(b)
	if err := InstallKey(objs.SynKeys, objs.SynRotation, 1, testKeys[0]); err != nil {
		b.Fatal(err)
	}
	// Stray ACKs dropped, not answered with RSTs (a budget a second, which
	// a run of 200,000 would spend at once): the ACK filter's own cost.
	if err := Configure(objs.SynSettings, Config{ResetsPerSec: -1}); err != nil {
		b.Fatal(err)
	}
	// Not 127.0.0.1: moat answers no SYN from or to a loopback address.
	lo := netip.MustParseAddr("10.99.0.1")

	type benchCase struct {
		name    string
		mode    Mode
		frame   func(est netip.AddrPort, srv netip.AddrPort) []byte
		mutates bool   // the program rewrites the frame, so Repeat would rerun it on its output
		want    uint32 // the verdict: a benchmark of the wrong path measures nothing
		// census: with a current socket census that marks the
		// established connection, as under the daemon; without, every
		// SYN and ACK pays the socket lookup.
		census bool
	}
	ack := func(est, srv netip.AddrPort) []byte {
		return testpkt.IP(lo, lo, testpkt.TCP{SrcPort: est.Port(), DstPort: srv.Port(), Seq: 1, Ack: 2, ACK: true,
			Options: []layers.TCPOption{testpkt.TCPNOP(), testpkt.TCPNOP(), testpkt.Timestamps(1, 2)}})
	}
	stray := func(est, srv netip.AddrPort) []byte {
		return testpkt.IP(lo, lo, testpkt.TCP{SrcPort: 1, DstPort: srv.Port(), Seq: 1, Ack: 2, ACK: true})
	}
	syn := func(est, srv netip.AddrPort) []byte {
		return testpkt.IP(lo, lo, testpkt.TCP{SrcPort: 2, DstPort: srv.Port(), Seq: 1, SYN: true,
			Options: []layers.TCPOption{testpkt.MSS(1460), testpkt.SACKPermitted(), testpkt.Timestamps(1, 0), testpkt.TCPNOP(), testpkt.WindowScale(7)}})
	}
	cases := []benchCase{
		{"established ack, port unprotected", ModeOff, ack, false, 2, false},
		{"established ack, auto no flood", ModeAuto, ack, false, 2, false},
		{"established ack, always", ModeAlways, ack, false, 2, false},
		{"spoofed ack dropped, always", ModeAlways, stray, false, 1, false},
		{"syn answered, always", ModeAlways, syn, true, 3, false},
		{"syn to kernel, auto no flood", ModeAuto, syn, false, 2, false},
		{"established ack, always, census", ModeAlways, ack, false, 2, true},
		{"spoofed ack dropped, always, census", ModeAlways, stray, false, 1, true},
		{"syn answered, always, census", ModeAlways, syn, true, 3, true},
	}
	census := censusTable(b, objs.SynCensus)

	var scratch netns.NsHandle
	var ln net.Listener
	var c net.Conn
	inScratchNetns(b, func() {
		var err error
		if scratch, err = netns.Get(); err != nil {
			b.Fatalf("scratch netns: %v", err)
		}
		loLink, err := netlink.LinkByName("lo")
		if err == nil {
			err = netlink.LinkSetUp(loLink)
		}
		if err == nil {
			err = netlink.AddrAdd(loLink, &netlink.Addr{IPNet: &net.IPNet{IP: lo.AsSlice(), Mask: net.CIDRMask(32, 32)}})
		}
		if err != nil {
			b.Fatalf("loopback up with %s: %v", lo, err)
		}
		// Plain TCP: moat leaves an MPTCP listener's SYNs (Go's
		// default) to the kernel.
		var lc net.ListenConfig
		lc.SetMultipathTCP(false)
		if ln, err = lc.Listen(context.Background(), "tcp4", netip.AddrPortFrom(lo, 0).String()); err != nil {
			b.Fatal(err)
		}
		if c, err = net.Dial("tcp4", ln.Addr().String()); err != nil {
			b.Fatal(err)
		}
	})
	if c == nil {
		return
	}
	// The sockets and the namespace stay open (and so alive) until the end.
	defer scratch.Close()
	defer ln.Close()
	defer c.Close()
	srvAddr := netip.MustParseAddrPort(ln.Addr().String())
	est := netip.MustParseAddrPort(c.LocalAddr().String())

	for _, bc := range cases {
		// A high threshold keeps auto mode out of flood mode.
		if err := Protect(objs.SynPorts, objs.SynCounters, objs.SynCensus, srvAddr.Port(), bc.mode, 1<<30); err != nil {
			b.Fatal(err)
		}
		census.Floor = 0
		if bc.census {
			census.Generation, census.Floor, census.ValidUntilNs = 5, 4, bootNow()+uint64(time.Hour)
			markCensusSlot(census, CensusSlot(est, srvAddr), 4)
		}
		b.Run(bc.name, func(b *testing.B) {
			frame := bc.frame(est, srvAddr)
			// Test runs look sockets up in the namespace of the thread
			// that runs them, and b.Run's goroutine is not in scratch.
			var ret uint32
			var ns float64
			var err error
			inNetns(scratch, func() {
				if ret, _, err = objs.MoatFilter.Benchmark(frame, 1, nil); err != nil || ret != bc.want {
					return
				}
				ns, err = perPacket(b.N, objs.MoatFilter, frame, bc.mutates)
			})
			if err != nil || ret != bc.want {
				b.Fatalf("verdict %d (%v), want %d", ret, err, bc.want)
			}
			b.ReportMetric(ns, "ns/pkt")
		})
	}

	// The established path's cost of auto mode with no flood, against the
	// port unprotected, measured side by side: the two alternate within
	// each of 9 rounds, and the median of the rounds' differences is the
	// figure, so that drift of a shared machine falls on both.
	b.Run("established ack, auto no flood minus unprotected", func(b *testing.B) {
		frame := ack(est, srvAddr)
		census.Floor = 0
		var diffs, ratios []float64
		for round := 0; round < 9*b.N; round++ {
			var ns [2]float64
			for i, m := range []Mode{ModeOff, ModeAuto} {
				if round%2 == 1 {
					m = []Mode{ModeAuto, ModeOff}[i]
				}
				if err := Protect(objs.SynPorts, objs.SynCounters, objs.SynCensus, srvAddr.Port(), m, 1<<30); err != nil {
					b.Fatal(err)
				}
				var v float64
				var ret uint32
				var err error
				inNetns(scratch, func() {
					if ret, _, err = objs.MoatFilter.Benchmark(frame, 1, nil); err == nil && ret == 2 {
						v, err = perPacket(1, objs.MoatFilter, frame, false)
					}
				})
				if err != nil || ret != 2 {
					b.Fatalf("%s: verdict %d (%v), want XDP_PASS (2)", m, ret, err)
				}
				if m == ModeAuto {
					ns[1] = v
				} else {
					ns[0] = v
				}
			}
			diffs = append(diffs, ns[1]-ns[0])
			ratios = append(ratios, ns[1]/ns[0])
		}
		b.ReportMetric(median(diffs), "extra-ns/pkt")
		b.ReportMetric(median(ratios), "ratio")
	})
}

// median of xs (sorted in place).
func median(xs []float64) float64 {
	slices.Sort(xs)
	n := len(xs)
	if n%2 == 1 {
		return xs[n/2]
	}
	return (xs[n/2-1] + xs[n/2]) / 2
}

// inNetns runs fn on a locked thread switched into ns; the thread exits
// with the goroutine rather than return to the pool in ns.
func inNetns(ns netns.NsHandle, fn func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread()
		if netns.Set(ns) == nil {
			fn()
		}
	}()
	<-done
}

// perPacket is the mean run time of prog over frame as the kernel times it.
// A program that rewrites its input is run once per call.
func perPacket(n int, prog *ebpf.Program, frame []byte, mutates bool) (float64, error) {
	calls, repeat := 10, 200_000
	if mutates {
		calls, repeat = 20_000, 1
	}
	var total time.Duration
	for i := 0; i < calls*n; i++ {
		_, d, err := prog.Benchmark(frame, repeat, nil)
		if err != nil {
			return 0, err
		}
		total += d
	}
	return float64(total.Nanoseconds()) / float64(calls*n), nil
}
