package syncookie

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/google/gopacket/layers"
	"github.com/vishvananda/netlink"

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
	lo := netip.MustParseAddr("127.0.0.1")
	const repeat = 2_000_000

	type benchCase struct {
		name    string
		mode    Mode
		frame   func(est netip.AddrPort, srv netip.AddrPort) []byte
		mutates bool // the program rewrites the frame, so Repeat would rerun it on its output
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
		{"established ack, port unprotected", ModeOff, ack, false},
		{"established ack, auto no flood", ModeAuto, ack, false},
		{"established ack, always", ModeAlways, ack, false},
		{"spoofed ack dropped, always", ModeAlways, stray, false},
		{"syn answered, always", ModeAlways, syn, true},
		{"syn to kernel, auto no flood", ModeAuto, syn, false},
	}

	inScratchNetns(b, func() {
		loLink, err := netlink.LinkByName("lo")
		if err == nil {
			err = netlink.LinkSetUp(loLink)
		}
		if err != nil {
			b.Fatalf("loopback up: %v", err)
		}
		ln, err := net.Listen("tcp4", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		defer ln.Close()
		c, err := net.Dial("tcp4", ln.Addr().String())
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		srvAddr := netip.MustParseAddrPort(ln.Addr().String())
		est := netip.MustParseAddrPort(c.LocalAddr().String())

		for _, bc := range cases {
			// A high threshold keeps auto mode out of flood mode.
			if err := Protect(objs.SynPorts, objs.SynStats, srvAddr.Port(), bc.mode, 1<<30); err != nil {
				b.Fatal(err)
			}
			b.Run(bc.name, func(b *testing.B) {
				frame := bc.frame(est, srvAddr)
				b.ReportMetric(perPacket(b, objs.MoatFilter, frame, bc.mutates), "ns/pkt")
			})
		}
	})
}

// perPacket is the mean run time of prog over frame as the kernel times it.
// A program that rewrites its input is run once per call.
func perPacket(b *testing.B, prog *ebpf.Program, frame []byte, mutates bool) float64 {
	calls, repeat := 10, 200_000
	if mutates {
		calls, repeat = 20_000, 1
	}
	var total time.Duration
	for i := 0; i < calls*b.N; i++ {
		_, d, err := prog.Benchmark(frame, repeat, nil)
		if err != nil {
			b.Fatal(err)
		}
		total += d
	}
	return float64(total.Nanoseconds()) / float64(calls*b.N)
}
