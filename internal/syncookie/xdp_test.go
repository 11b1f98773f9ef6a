package syncookie

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/google/gopacket/layers"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/moat-shield/moat/internal/datapath"
	"github.com/moat-shield/moat/internal/testpkt"
)

var (
	client4 = netip.MustParseAddr("192.0.2.10")
	server4 = netip.MustParseAddr("192.0.2.1")
	client6 = netip.MustParseAddr("2001:db8::10")
	server6 = netip.MustParseAddr("2001:db8::1")

	testKeys = []Key{
		{0x0706050403020100, 0x0f0e0d0c0b0a0908},
		{0x1111111111111111, 0x2222222222222222},
		{0x3333333333333333, 0x4444444444444444},
	}
)

const (
	protectedPort   = 80
	unprotectedPort = 81
	neverPort       = 82
	noListenerPort  = 83 // protected (always), but nothing listens on it
	clientPort      = 40000
	clientISN       = 0x12345678
)

// loadObjects loads the filter with fresh maps for one test.
func loadObjects(t testing.TB) *datapath.MoatObjects {
	t.Helper()
	return loadObjectsKernel(t, true)
}

// loadObjectsKernel is loadObjects, with the kernel constants
// (datapath.SetKernelConstants) set, or left unknown as on a kernel
// without them.
func loadObjectsKernel(t testing.TB, constants bool) *datapath.MoatObjects {
	t.Helper()
	var objs datapath.MoatObjects
	spec, err := datapath.LoadMoat()
	if err == nil && constants {
		err = datapath.SetKernelConstants(spec)
	}
	if err == nil {
		err = spec.LoadAndAssign(&objs, nil)
	}
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	t.Cleanup(func() { objs.Close() })
	return &objs
}

// inScratchNetns runs fn on a locked thread, in a new network namespace
// (test runs look sockets up in the caller's namespace, so none of the
// host's listeners can change a verdict) and pinned to one CPU (flood
// detection counts per CPU).
func inScratchNetns(t testing.TB, fn func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread()
		// The thread is left locked: it exits with the goroutine rather
		// than return to the pool in the scratch namespace.
		var set unix.CPUSet
		set.Set(0)
		if err := unix.SchedSetaffinity(0, &set); err != nil {
			t.Errorf("pin to CPU 0: %v", err)
			return
		}
		ns, err := netns.New()
		if err != nil {
			t.Errorf("new netns: %v", err)
			return
		}
		defer ns.Close()
		// Test runs take their frames in on lo: at an Ethernet link's MTU,
		// moat's SYN-ACKs announce the MSS such a link takes (1460 and
		// 1440), as the kernel's would.
		lo, err := netlink.LinkByName("lo")
		if err == nil {
			err = netlink.LinkSetMTU(lo, testMTU)
		}
		if err != nil {
			t.Errorf("lo of the scratch namespace: %v", err)
			return
		}
		fn()
	}()
	<-done
}

// testMTU is lo's MTU in a scratch namespace; testWindowClamp is the
// TCP_WINDOW_CLAMP of listen's listeners, which bounds the window moat's
// SYN-ACKs announce, and their window scale: testWScale, none, since the
// clamp fits in 16 bits.
const (
	testMTU         = 1500
	testWindowClamp = 20000
	testWScale      = 0
)

// listen opens a dual-stack listener on port in the namespace of the
// calling (locked) thread: moat answers SYNs and filters ACKs only where a
// listener owns the port. MPTCP is off: moat leaves an MPTCP listener's
// SYNs to the kernel (TestSynToMPTCPListener).
func listen(t testing.TB, port uint16) net.Listener {
	t.Helper()
	var lc net.ListenConfig
	lc.SetMultipathTCP(false)
	lc.Control = func(_, _ string, c syscall.RawConn) error {
		var err error
		c.Control(func(fd uintptr) {
			err = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_WINDOW_CLAMP, testWindowClamp)
		})
		return err
	}
	ln, err := lc.Listen(context.Background(), "tcp", fmt.Sprintf("[::]:%d", port))
	if err != nil {
		t.Fatalf("listen on %d: %v", port, err)
	}
	return ln
}

// verdicts runs prog over each frame in a scratch namespace with a
// listener on protectedPort, returning verdicts and output frames.
// Subtests run on goroutines of their own, in the test binary's
// namespace, so frames are run here and the results checked in subtests.
func verdicts(t *testing.T, prog *ebpf.Program, frames [][]byte, before func()) ([]uint32, [][]byte) {
	t.Helper()
	rets := make([]uint32, len(frames))
	outs := make([][]byte, len(frames))
	withListener(t, func() {
		for i, f := range frames {
			if before != nil {
				before()
			}
			rets[i], outs[i] = run(t, prog, f)
		}
	})
	return rets, outs
}

// verdictCase is one frame and the verdict the filter must give it.
type verdictCase struct {
	name  string
	frame []byte
	want  uint32 // 1 XDP_DROP, 2 XDP_PASS
}

// checkVerdicts runs every case beside a listener, one subtest each, and
// returns how many must be dropped. A passed frame must be left as it was.
func checkVerdicts(t *testing.T, prog *ebpf.Program, cases []verdictCase) (drops uint64) {
	t.Helper()
	return checkVerdictsAfter(t, prog, cases, nil)
}

// checkVerdictsAfter is checkVerdicts with before run ahead of each case.
func checkVerdictsAfter(t *testing.T, prog *ebpf.Program, cases []verdictCase, before func()) (drops uint64) {
	t.Helper()
	frames := make([][]byte, len(cases))
	for i, c := range cases {
		frames[i] = c.frame
		if c.want == 1 {
			drops++
		}
	}
	rets, outs := verdicts(t, prog, frames, before)
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if rets[i] != c.want {
				t.Fatalf("verdict %d, want %d", rets[i], c.want)
			}
			if rets[i] == 2 && !bytes.Equal(outs[i], c.frame) {
				t.Fatal("a passed frame was modified")
			}
		})
	}
	return drops
}

// withListener is inScratchNetns with a listener on protectedPort.
func withListener(t testing.TB, fn func()) {
	t.Helper()
	inScratchNetns(t, func() {
		ln := listen(t, protectedPort)
		defer ln.Close()
		fn()
	})
}

// verdictsBeside runs prog over each frame in a scratch namespace beside
// a dual-stack listener on protectedPort of lc's making (rather than
// listen's), returning verdicts and output frames; nil if the listener
// failed, which it reports.
func verdictsBeside(t *testing.T, prog *ebpf.Program, lc net.ListenConfig, frames [][]byte) ([]uint32, [][]byte) {
	t.Helper()
	rets := make([]uint32, len(frames))
	outs := make([][]byte, len(frames))
	ok := false
	inScratchNetns(t, func() {
		ln, err := lc.Listen(context.Background(), "tcp", fmt.Sprintf("[::]:%d", protectedPort))
		if err != nil {
			t.Errorf("listen: %v", err)
			return
		}
		defer ln.Close()
		for i, f := range frames {
			rets[i], outs[i] = run(t, prog, f)
		}
		ok = true
	})
	if !ok {
		return nil, nil
	}
	return rets, outs
}

// checkPassedAsIs checks each frame's verdict, and that one passed
// (XDP_PASS) left the program unchanged.
func checkPassedAsIs(t *testing.T, frames [][]byte, rets []uint32, outs [][]byte, want []uint32) {
	t.Helper()
	for i := range frames {
		if rets[i] != want[i] {
			t.Errorf("frame %d: verdict %d, want %d", i, rets[i], want[i])
		}
		if rets[i] == 2 && !bytes.Equal(outs[i][:len(frames[i])], frames[i]) {
			t.Errorf("frame %d passed changed", i)
		}
	}
}

func run(t *testing.T, prog *ebpf.Program, frame []byte) (uint32, []byte) {
	t.Helper()
	opts := &ebpf.RunOptions{Data: bytes.Clone(frame), DataOut: make([]byte, len(frame)+256)}
	ret, err := prog.Run(opts)
	if err != nil {
		t.Fatalf("test run: %v", err)
	}
	return ret, opts.DataOut
}

// xdpMD is the kernel's struct xdp_md, the context of a test run.
type xdpMD struct {
	Data, DataEnd, DataMeta, IngressIfindex, RxQueueIndex, EgressIfindex uint32
}

// runOn is run with the frame arriving on device ifindex of the calling
// thread's namespace rather than on loopback.
func runOn(t *testing.T, prog *ebpf.Program, frame []byte, ifindex int) uint32 {
	t.Helper()
	ret, err := prog.Run(&ebpf.RunOptions{Data: bytes.Clone(frame), DataOut: make([]byte, len(frame)+256),
		Context: xdpMD{DataEnd: uint32(len(frame)), IngressIfindex: uint32(ifindex)}})
	if err != nil {
		t.Fatalf("test run: %v", err)
	}
	return ret
}

// synOpts is what a test SYN offers; the expected SYN-ACK and cookie are
// derived from it, not from parsing the frame.
type synOpts struct {
	mss       uint16
	hasMSS    bool
	wscale    uint8
	hasWScale bool
	sack      bool
	ts        bool
	tsval     uint32
	ecn       bool
}

// expectedSynAck builds the frame moat must send for a SYN from client to
// server offering o, under key k of generation gen. gotTSval is the TSval
// moat sent: its clock part cannot be predicted, so the expected TSval is
// built from it with the hash bits the reference computes.
func expectedSynAck(tags []testpkt.Tag, client, server netip.Addr, o synOpts, k Key, gen uint64, gotTSval uint32) ([]byte, uint32, uint32) {
	v6 := client.Is6()
	meta := Meta(o.mss, o.hasMSS, o.wscale, o.hasWScale, o.sack, o.ecn, gen, v6)
	tuple := Tuple{netip.AddrPortFrom(client, clientPort), netip.AddrPortFrom(server, protectedPort)}
	cookie := Cookie(k, tuple, clientISN, meta)
	var tsval uint32
	if o.ts {
		cookie, tsval = CookieTS(k, tuple, clientISN, meta, gotTSval-TSOffset(k, tuple, clientISN, meta))
	}

	ourMSS := uint16(1460)
	if v6 {
		ourMSS = 1440
	}
	opts := []layers.TCPOption{testpkt.MSS(ourMSS)}
	if o.ts {
		if o.sack {
			opts = append(opts, testpkt.SACKPermitted())
		} else {
			opts = append(opts, testpkt.TCPNOP(), testpkt.TCPNOP())
		}
		opts = append(opts, testpkt.Timestamps(tsval, o.tsval))
	} else if o.sack {
		opts = append(opts, testpkt.TCPNOP(), testpkt.TCPNOP(), testpkt.SACKPermitted())
	}
	if o.hasWScale {
		opts = append(opts, testpkt.TCPNOP(), testpkt.WindowScale(testWScale))
	}
	// The listener's window clamp, in whole segments of what the client
	// sends: the MSS less the timestamps it carries.
	seg := ourMSS
	if o.ts {
		seg -= 12
	}
	// Options take what they need, a multiple of 4 bytes: no padding.
	tcp := testpkt.TCP{
		SrcPort: protectedPort, DstPort: clientPort,
		Seq: cookie, Ack: clientISN + 1,
		SYN: true, ACK: true, ECE: o.ecn,
		Window:  testWindowClamp / seg * seg,
		Options: opts,
	}
	f := testpkt.Frame{SrcMAC: testpkt.DefaultDstMAC, DstMAC: testpkt.DefaultSrcMAC, Tags: tags, L4: tcp}
	if v6 {
		// The namespace's auto flow labels are on (its default): a
		// label of moat's own, spread from the cookie.
		f.Net = testpkt.IPv6{Src: server, Dst: client, HopLimit: 64, FlowLabel: synAckFlowLabel(cookie)}
	} else {
		f.Net = testpkt.IPv4{Src: server, Dst: client, TTL: 64, DF: true}
	}
	// moat sends the datagram alone: no Ethernet padding to 60 bytes
	// (a NIC adds it on the wire).
	b := f.Bytes()
	l3 := 14 + 4*len(tags)
	if v6 {
		b = b[:l3+40+int(binary.BigEndian.Uint16(b[l3+4:]))]
	} else {
		b = b[:l3+int(binary.BigEndian.Uint16(b[l3+2:]))]
	}
	return b, cookie, tsval
}

// synAckFlowLabel is the IPv6 flow label of moat's SYN-ACK carrying cookie
// where the namespace has auto flow labels and does not reflect the SYN's.
func synAckFlowLabel(cookie uint32) uint32 {
	return (cookie * 0x9e3779b1) >> 12
}

func synFrame(tags []testpkt.Tag, client, server netip.Addr, tcp testpkt.TCP) []byte {
	return synFrameECN(tags, client, server, tcp, 0)
}

// synFrameECN is synFrame with the IP header's ECN field set to ipECN.
func synFrameECN(tags []testpkt.Tag, client, server netip.Addr, tcp testpkt.TCP, ipECN uint8) []byte {
	tcp.SrcPort, tcp.Seq, tcp.SYN = clientPort, clientISN, true
	if tcp.DstPort == 0 {
		tcp.DstPort = protectedPort
	}
	f := testpkt.Frame{Tags: tags, L4: tcp}
	if client.Is6() {
		f.Net = testpkt.IPv6{Src: client, Dst: server, TrafficClass: ipECN}
	} else {
		f.Net = testpkt.IPv4{Src: client, Dst: server, TOS: ipECN}
	}
	return f.Bytes()
}

// verifyChecksums recomputes the IPv4 header and TCP checksums of a frame
// with its own one's-complement sum, independently of gopacket.
func verifyChecksums(t *testing.T, frame []byte, l3 int) {
	t.Helper()
	sum := func(b []byte, s uint32) uint32 {
		for i := 0; i+1 < len(b); i += 2 {
			s += uint32(binary.BigEndian.Uint16(b[i:]))
		}
		if len(b)%2 == 1 {
			s += uint32(b[len(b)-1]) << 8
		}
		return s
	}
	fold := func(s uint32) uint16 {
		for s > 0xffff {
			s = s&0xffff + s>>16
		}
		return uint16(s)
	}
	var pseudo []byte
	var tcp []byte
	if frame[l3]>>4 == 4 {
		ihl := int(frame[l3]&0xf) * 4
		if got := fold(sum(frame[l3:l3+ihl], 0)); got != 0xffff {
			t.Errorf("IPv4 header checksum does not verify (sum %#x)", got)
		}
		tcp = frame[l3+ihl:]
		pseudo = append(append([]byte{}, frame[l3+12:l3+20]...), 0, 6, byte(len(tcp)>>8), byte(len(tcp)))
	} else {
		tcp = frame[l3+40:]
		pseudo = append(append([]byte{}, frame[l3+8:l3+40]...), 0, 0, byte(len(tcp)>>8), byte(len(tcp)), 0, 0, 0, 6)
	}
	if got := fold(sum(tcp, sum(pseudo, 0))); got != 0xffff {
		t.Errorf("TCP checksum does not verify (sum %#x)", got)
	}
}

// tsvalOf returns the TSval of the timestamps option in a SYN-ACK whose
// TCP header starts at l4, or 0.
func tsvalOf(frame []byte, l4 int) uint32 {
	opts := frame[l4+20 : l4+40]
	for i := 0; i < len(opts); {
		switch opts[i] {
		case 0:
			return 0
		case 1:
			i++
			continue
		}
		if i+1 >= len(opts) || opts[i+1] < 2 {
			return 0
		}
		if opts[i] == 8 && i+10 <= len(opts) {
			return binary.BigEndian.Uint32(opts[i+2:])
		}
		i += int(opts[i+1])
	}
	return 0
}

// setup loads the filter with generation 1 installed (testKeys[0]),
// protectedPort and noListenerPort in always mode, neverPort in never.
func setup(t *testing.T) *datapath.MoatObjects {
	return setupObjects(t, loadObjects(t))
}

// setupObjects is setup over objs.
func setupObjects(t *testing.T, objs *datapath.MoatObjects) *datapath.MoatObjects {
	if err := InstallKey(objs.SynKeys, objs.SynRotation, 1, testKeys[0]); err != nil {
		t.Fatal(err)
	}
	// Stray ACKs are dropped rather than answered with RSTs
	// (TestStrayAckReset): the tables here judge which ACKs are stray.
	if err := Configure(objs.SynSettings, Config{ResetsPerSec: -1}); err != nil {
		t.Fatal(err)
	}
	for _, p := range []struct {
		port uint16
		mode Mode
	}{{protectedPort, ModeAlways}, {neverPort, ModeNever}, {noListenerPort, ModeAlways}} {
		if err := Protect(objs.SynPorts, objs.SynCounters, objs.SynCensus, p.port, p.mode, 0); err != nil {
			t.Fatal(err)
		}
	}
	return objs
}

func TestSynAckBytes(t *testing.T) {
	objs := setup(t)
	linux := []layers.TCPOption{testpkt.MSS(1460), testpkt.SACKPermitted(), testpkt.Timestamps(777, 0), testpkt.TCPNOP(), testpkt.WindowScale(7)}
	linuxOpts := synOpts{mss: 1460, hasMSS: true, wscale: 7, hasWScale: true, sack: true, ts: true, tsval: 777}
	cases := []struct {
		name   string
		tags   []testpkt.Tag
		client netip.Addr
		server netip.Addr
		tcp    testpkt.TCP
		want   synOpts
	}{
		{"ipv4 linux options", nil, client4, server4, testpkt.TCP{Options: linux}, linuxOpts},
		{"ipv6 linux options", nil, client6, server6, testpkt.TCP{Options: linux}, linuxOpts},
		{"ipv4 vlan", testpkt.VLAN(100), client4, server4, testpkt.TCP{Options: linux}, linuxOpts},
		{"no options", nil, client4, server4, testpkt.TCP{}, synOpts{}},
		{"ipv6 no options", nil, client6, server6, testpkt.TCP{}, synOpts{}},
		{"unusual order", nil, client4, server4, testpkt.TCP{Options: []layers.TCPOption{
			testpkt.WindowScale(9), testpkt.Timestamps(5, 0), testpkt.TCPNOP(), testpkt.TCPNOP(), testpkt.SACKPermitted(), testpkt.MSS(1400)}},
			synOpts{mss: 1400, hasMSS: true, wscale: 9, hasWScale: true, sack: true, ts: true, tsval: 5}},
		{"sack without timestamps", nil, client4, server4, testpkt.TCP{Options: []layers.TCPOption{testpkt.SACKPermitted(), testpkt.MSS(1300)}},
			synOpts{mss: 1300, hasMSS: true, sack: true}},
		{"timestamps without sack", nil, client6, server6, testpkt.TCP{Options: []layers.TCPOption{testpkt.Timestamps(0xdeadbeef, 0), testpkt.MSS(1220)}},
			synOpts{mss: 1220, hasMSS: true, ts: true, tsval: 0xdeadbeef}},
		{"mss zero", nil, client4, server4, testpkt.TCP{Options: []layers.TCPOption{testpkt.MSS(0)}}, synOpts{mss: 0, hasMSS: true}},
		{"mss between table entries", nil, client4, server4, testpkt.TCP{Options: []layers.TCPOption{testpkt.MSS(1459)}}, synOpts{mss: 1459, hasMSS: true}},
		{"mss 1380", testpkt.VLAN(7), client4, server4, testpkt.TCP{Options: []layers.TCPOption{testpkt.MSS(1380)}}, synOpts{mss: 1380, hasMSS: true}},
		{"ipv6 mss 536", nil, client6, server6, testpkt.TCP{Options: []layers.TCPOption{testpkt.MSS(536)}}, synOpts{mss: 536, hasMSS: true}},
		{"jumbo mss", nil, client6, server6, testpkt.TCP{Options: []layers.TCPOption{testpkt.MSS(9000)}}, synOpts{mss: 9000, hasMSS: true}},
		// What a 9000-byte MTU leaves IPv6 (IPv4: 8960).
		{"ipv6 jumbo mss 8940", nil, client6, server6, testpkt.TCP{Options: []layers.TCPOption{testpkt.MSS(8940)}}, synOpts{mss: 8940, hasMSS: true}},
		{"ipv4 jumbo mss 8960", nil, client4, server4, testpkt.TCP{Options: []layers.TCPOption{testpkt.MSS(8960)}}, synOpts{mss: 8960, hasMSS: true}},
		{"window scale above 14", nil, client4, server4, testpkt.TCP{Options: []layers.TCPOption{testpkt.MSS(1460), testpkt.TCPNOP(), testpkt.WindowScale(15)}},
			synOpts{mss: 1460, hasMSS: true, wscale: 15, hasWScale: true}},
		{"ecn setup", nil, client4, server4, testpkt.TCP{ECE: true, CWR: true, Options: linux},
			synOpts{mss: 1460, hasMSS: true, wscale: 7, hasWScale: true, sack: true, ts: true, tsval: 777, ecn: true}},
		{"ece alone is not ecn", nil, client4, server4, testpkt.TCP{ECE: true, Options: linux}, linuxOpts},
		{"ipv6 ecn setup", nil, client6, server6, testpkt.TCP{ECE: true, CWR: true, Options: linux},
			synOpts{mss: 1460, hasMSS: true, wscale: 7, hasWScale: true, sack: true, ts: true, tsval: 777, ecn: true}},
		{"unknown option skipped", nil, client4, server4, testpkt.TCP{Options: []layers.TCPOption{
			{OptionType: 30, OptionData: []byte{1, 2, 3, 4}}, testpkt.MSS(1440), testpkt.SACKPermitted()}},
			synOpts{mss: 1440, hasMSS: true, sack: true}},
		// Linux's 20-byte layout, read without the walk, except that the
		// last option is not a window scale: the walk must read the rest.
		{"linux layout with another last option", nil, client4, server4, testpkt.TCP{Options: []layers.TCPOption{
			testpkt.MSS(1460), testpkt.SACKPermitted(), testpkt.Timestamps(777, 0), testpkt.TCPNOP(),
			{OptionType: 30, OptionLength: 3, OptionData: []byte{7}}}},
			synOpts{mss: 1460, hasMSS: true, sack: true, ts: true, tsval: 777}},
		{"linux layout in another order", nil, client6, server6, testpkt.TCP{Options: []layers.TCPOption{
			testpkt.MSS(1440), testpkt.Timestamps(9, 0), testpkt.SACKPermitted(), testpkt.TCPNOP(), testpkt.WindowScale(3)}},
			synOpts{mss: 1440, hasMSS: true, wscale: 3, hasWScale: true, sack: true, ts: true, tsval: 9}},
		// The kernel refuses ECN to an ECT-marked SYN (tcp_ecn_create_request).
		{"ect(0) syn is not ecn", nil, client4, server4, testpkt.TCP{ECE: true, CWR: true, Options: linux}, linuxOpts},
		{"ipv6 ect(1) syn is not ecn", nil, client6, server6, testpkt.TCP{ECE: true, CWR: true, Options: linux}, linuxOpts},
	}
	// The ECN field of the SYN's IP header, where not 0 (not-ECT).
	ipECN := map[string]uint8{"ect(0) syn is not ecn": 2, "ipv6 ect(1) syn is not ecn": 1}
	var frames [][]byte
	for _, c := range cases {
		frames = append(frames, synFrameECN(c.tags, c.client, c.server, c.tcp, ipECN[c.name]))
	}
	rets, outs := verdicts(t, objs.MoatFilter, frames, nil)
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if rets[i] != uint32(2+1) { // XDP_TX
				t.Fatalf("verdict %d, want XDP_TX (3)", rets[i])
			}
			checkSynAck(t, outs[i], c.tags, c.client, c.server, c.want)
		})
	}
}

// checkSynAck checks out byte by byte against the SYN-ACK moat must send
// for a SYN from client to server offering want, under testKeys[0] at
// generation 1, then decodes its cookie with the Go reference.
func checkSynAck(t *testing.T, out []byte, tags []testpkt.Tag, client, server netip.Addr, want synOpts) {
	t.Helper()
	l3 := 14 + 4*len(tags)
	l4 := l3 + 20
	if client.Is6() {
		l4 = l3 + 40
	}
	tuple := Tuple{netip.AddrPortFrom(client, clientPort), netip.AddrPortFrom(server, protectedPort)}
	var gotTS uint32
	if want.ts {
		// TSval is the millisecond clock plus a keyed offset (its low
		// byte then replaced by hash bits): without the offset it is the
		// clock, which the raw value is not.
		gotTS = tsvalOf(out, l4)
		meta := Meta(want.mss, want.hasMSS, want.wscale, want.hasWScale, want.sack, want.ecn, 1, client.Is6())
		var ts unix.Timespec
		_ = unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts)
		nowMS := uint32(ts.Nano() / 1e6)
		if d := int32(nowMS - (gotTS - TSOffset(testKeys[0], tuple, clientISN, meta))); d < -256 || d > 2000 {
			t.Errorf("TSval %d less the offset is not moat's millisecond clock (now %d)", gotTS, nowMS)
		}
	}
	wantFrame, cookie, wantTS := expectedSynAck(tags, client, server, want, testKeys[0], 1, gotTS)
	if !bytes.Equal(out, wantFrame) {
		t.Fatalf("SYN-ACK differs\n got %x\nwant %x", out, wantFrame)
	}
	verifyChecksums(t, out, l3)
	// The Go reference decodes what the BPF encoded.
	check := func() (Options, bool) { return Check([2]Key{{}, testKeys[0]}, tuple, clientISN, cookie) }
	if want.ts {
		check = func() (Options, bool) { return CheckTS([2]Key{{}, testKeys[0]}, tuple, clientISN, cookie, wantTS) }
	}
	got, ok := check()
	if !ok {
		t.Fatal("reference rejects the cookie")
	}
	if got.SACK != want.sack || got.ECN != want.ecn || got.HasWScale != want.hasWScale {
		t.Errorf("decoded %+v from %+v", got, want)
	}
}

// TestSynAckFollowsSysctls: an option the listener's namespace turned off
// (net.ipv4.tcp_sack, tcp_timestamps, tcp_window_scaling, tcp_ecn) is not
// offered in the SYN-ACK nor encoded in the cookie, as in the kernel's own
// SYN-ACK, from the next jiffy on; with tcp_syncookies 0 the SYN is the
// kernel's.
func TestSynAckFollowsSysctls(t *testing.T) {
	objs := setup(t)
	linux := []layers.TCPOption{testpkt.MSS(1460), testpkt.SACKPermitted(), testpkt.Timestamps(777, 0), testpkt.TCPNOP(), testpkt.WindowScale(7)}
	all := synOpts{mss: 1460, hasMSS: true, wscale: 7, hasWScale: true, sack: true, ts: true, tsval: 777, ecn: true}
	cases := []struct {
		sysctl  string
		want    synOpts
		verdict uint32
	}{
		{"tcp_sack", synOpts{mss: 1460, hasMSS: true, wscale: 7, hasWScale: true, ts: true, tsval: 777, ecn: true}, 3},
		{"tcp_timestamps", synOpts{mss: 1460, hasMSS: true, wscale: 7, hasWScale: true, sack: true, ecn: true}, 3},
		{"tcp_window_scaling", synOpts{mss: 1460, hasMSS: true, sack: true, ts: true, tsval: 777, ecn: true}, 3},
		{"tcp_ecn", synOpts{mss: 1460, hasMSS: true, wscale: 7, hasWScale: true, sack: true, ts: true, tsval: 777}, 3},
		{"", all, 3}, // all on again: everything offered
		{"tcp_syncookies", synOpts{}, 2},
	}
	type result struct {
		ret uint32
		out []byte
	}
	var syns [][]byte
	for _, addr := range [][2]netip.Addr{{client4, server4}, {client6, server6}} {
		syns = append(syns, synFrame(nil, addr[0], addr[1], testpkt.TCP{ECE: true, CWR: true, Options: linux}))
	}
	// A SYN carrying data: refused in cookie mode, the kernel's where
	// the kernel takes no cookie handshake. Sent after the others, so
	// the settings it meets are read.
	withData := synFrame(nil, client4, server4, testpkt.TCP{Options: linux, Payload: []byte("GET / HTTP/1.0\r\n\r\n")})
	dataVerdicts := make([]uint32, len(cases))
	results := make([][]result, len(cases))
	withListener(t, func() {
		for i, c := range cases {
			if c.sysctl != "" {
				if err := os.WriteFile("/proc/sys/net/ipv4/"+c.sysctl, []byte("0"), 0); err != nil {
					t.Errorf("turn %s off: %v", c.sysctl, err)
					return
				}
			}
			// The data path reads the settings once per jiffy (at most
			// 10 ms) per CPU and port.
			time.Sleep(20 * time.Millisecond)
			for _, f := range syns {
				ret, out := run(t, objs.MoatFilter, f)
				results[i] = append(results[i], result{ret, out})
			}
			dataVerdicts[i], _ = run(t, objs.MoatFilter, withData)
			if c.sysctl != "" {
				on := "1"
				if c.sysctl == "tcp_ecn" {
					on = "2"
				}
				if err := os.WriteFile("/proc/sys/net/ipv4/"+c.sysctl, []byte(on), 0); err != nil {
					t.Errorf("turn %s on: %v", c.sysctl, err)
					return
				}
			}
		}
	})
	before := portStatus(t, objs, protectedPort)
	for i, c := range cases {
		for j, addr := range [][2]netip.Addr{{client4, server4}, {client6, server6}} {
			name := c.sysctl + " off"
			if c.sysctl == "" {
				name = "all on"
			}
			t.Run(fmt.Sprintf("%s ipv%d", name, 4+2*j), func(t *testing.T) {
				r := results[i][j]
				if r.ret != c.verdict {
					t.Fatalf("verdict %d, want %d", r.ret, c.verdict)
				}
				if c.verdict == 2 {
					if !bytes.Equal(r.out[:len(syns[j])], syns[j]) {
						t.Fatal("a passed SYN was modified")
					}
					return
				}
				checkSynAck(t, r.out, nil, addr[0], addr[1], c.want)
			})
		}
	}
	for i, c := range cases {
		want := uint32(1) // XDP_DROP
		if c.verdict == 2 {
			want = 2
		}
		if dataVerdicts[i] != want {
			t.Errorf("%s off: SYN with data got verdict %d, want %d", c.sysctl, dataVerdicts[i], want)
		}
	}
	if before.SYNsPassed != 3 || before.SYNsDropped != uint64(len(cases)-1) {
		t.Errorf("syns passed %d, dropped %d; want the 3 sent with tcp_syncookies 0 passed and the other SYNs with data dropped",
			before.SYNsPassed, before.SYNsDropped)
	}
}

func TestSynAckTrimsPadding(t *testing.T) {
	objs := setup(t)
	withListener(t, func() {
		// A 54-byte SYN padded to Ethernet's 60-byte minimum.
		in := append(synFrame(nil, client4, server4, testpkt.TCP{}), 0, 0, 0, 0, 0, 0)
		ret, out := run(t, objs.MoatFilter, in)
		want, _, _ := expectedSynAck(nil, client4, server4, synOpts{}, testKeys[0], 1, 0)
		if ret != 3 || !bytes.Equal(out, want) {
			t.Fatalf("verdict %d\n got %x\nwant %x", ret, out, want)
		}
	})
}

// TestSynsThatGetNoCookie: in cookie mode a SYN moat will not answer is
// dropped and counted (passing it would let a flood of that shape reach
// the kernel at its own rate), except where the kernel must decide: those
// pass untouched.
func TestSynsThatGetNoCookie(t *testing.T) {
	objs := setup(t)
	opts := []layers.TCPOption{testpkt.MSS(1460)}
	syn := testpkt.TCP{SrcPort: clientPort, DstPort: protectedPort, Seq: clientISN, SYN: true, Options: opts}
	bcastMAC := net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
	v4 := func(src, dst string) []byte {
		return testpkt.Frame{Net: testpkt.IPv4{Src: netip.MustParseAddr(src), Dst: netip.MustParseAddr(dst)}, L4: syn}.Bytes()
	}
	v6 := func(src, dst string) []byte {
		return testpkt.Frame{Net: testpkt.IPv6{Src: netip.MustParseAddr(src), Dst: netip.MustParseAddr(dst)}, L4: syn}.Bytes()
	}
	cases := []verdictCase{
		{"syn+fin", synFrame(nil, client4, server4, testpkt.TCP{FIN: true, Options: opts}), 1},
		{"syn+rst", synFrame(nil, client4, server4, testpkt.TCP{RST: true, Options: opts}), 1},
		{"syn with data", synFrame(nil, client4, server4, testpkt.TCP{Options: opts, Payload: []byte("GET /")}), 1},
		{"syn with one byte of data", synFrame(nil, client6, server6, testpkt.TCP{Options: opts, Payload: []byte{0}}), 1},
		{"ipv4 first fragment", testpkt.Frame{Net: testpkt.IPv4{Src: client4, Dst: server4, MF: true}, L4: syn}.Bytes(), 1},
		{"ipv6 first fragment", testpkt.Frame{Net: testpkt.IPv6{Src: client6, Dst: server6,
			Ext: []testpkt.IPv6Ext{testpkt.Fragment{More: true, ID: 7}}}, L4: syn}.Bytes(), 1},
		{"ipv4 options", testpkt.Frame{Net: testpkt.IPv4{Src: client4, Dst: server4,
			Options: []testpkt.IPv4Option{testpkt.RouterAlert()}}, L4: syn}.Bytes(), 1},
		{"ipv6 destination options", testpkt.Frame{Net: testpkt.IPv6{Src: client6, Dst: server6,
			Ext: []testpkt.IPv6Ext{testpkt.DestOpts{Options: []testpkt.IPv6TLV{{Type: 0x1e, Data: make([]byte, 4)}}}}}, L4: syn}.Bytes(), 1},
		{"broadcast mac", testpkt.Frame{DstMAC: bcastMAC, Net: testpkt.IPv4{Src: client4, Dst: server4}, L4: syn}.Bytes(), 1},
		{"to 255.255.255.255", v4("192.0.2.10", "255.255.255.255"), 1},
		{"to 224.0.0.1", v4("192.0.2.10", "224.0.0.1"), 1},
		{"to 0.0.0.0", v4("192.0.2.10", "0.0.0.0"), 1},
		{"from 0.0.0.0", v4("0.0.0.0", "192.0.2.1"), 1},
		{"from 127.0.0.1", v4("127.0.0.1", "192.0.2.1"), 1},
		{"from 224.0.0.5", v4("224.0.0.5", "192.0.2.1"), 1},
		{"to ff02::1", v6("2001:db8::10", "ff02::1"), 1},
		{"from ::1", v6("::1", "2001:db8::1"), 1},
		{"from ::", v6("::", "2001:db8::1"), 1},
		{"to ::1", v6("2001:db8::10", "::1"), 1},
		{"to ::ffff:192.0.2.1", v6("2001:db8::10", "::ffff:192.0.2.1"), 1},

		{"unprotected port", synFrame(nil, client4, server4, testpkt.TCP{DstPort: unprotectedPort, Options: opts}), 2},
		{"never mode", synFrame(nil, client4, server4, testpkt.TCP{DstPort: neverPort, Options: opts}), 2},
		{"ipv4 later fragment", testpkt.Frame{Net: testpkt.IPv4{Src: client4, Dst: server4, FragOff: 100}, L4: syn}.Bytes(), 2},
		// No listener in this namespace: the destination may be a container
		// behind this device, or NAT; the kernel knows.
		{"no listener", synFrame(nil, client4, server4, testpkt.TCP{DstPort: noListenerPort, Options: opts}), 2},
		{"ipv6 no listener", synFrame(nil, client6, server6, testpkt.TCP{DstPort: noListenerPort, Options: opts}), 2},
		// The tc acceptor would see the inner tag still in the frame.
		{"ipv6 qinq", synFrame(testpkt.QinQ(10, 20), client6, server6, testpkt.TCP{Options: opts}), 2},
	}
	drops := checkVerdicts(t, objs.MoatFilter, cases)
	st := portStatus(t, objs, protectedPort)
	// Passed on the protected port: the QinQ SYN (a later fragment has no
	// TCP header to count).
	if st.CookiesIssued != 0 || st.SYNsDropped != drops || st.SYNsPassed != 1 {
		t.Errorf("status %+v: want no cookie issued, %d SYNs dropped, 1 passed", st, drops)
	}
	if st.SYNs != st.CookiesIssued+st.SYNsDropped+st.SYNsPassed {
		t.Errorf("status %+v: an always-mode port's SYNs are issued + dropped + passed", st)
	}
	if st := portStatus(t, objs, noListenerPort); st.SYNs != 2 || st.SYNsPassed != 2 || st.SYNsDropped != 0 {
		t.Errorf("tcp/%d status %+v: want both SYNs passed to the kernel", noListenerPort, st)
	}
	if st := portStatus(t, objs, neverPort); st.SYNs != 1 || st.SYNsPassed != 0 {
		t.Errorf("tcp/%d status %+v: never mode counts the SYN, passes it outside cookie mode", neverPort, st)
	}
}

// TestStraySynAcks: while a port's ACKs are filtered, a SYN-ACK that only
// the listener would take (a spoofed or reflected flood, which the stack
// would answer with a RST each) is dropped and counted with the ACKs; in
// never mode, or to a port without a listener here, it goes on.
func TestStraySynAcks(t *testing.T) {
	objs := setup(t)
	synack := func(client, server netip.Addr, port uint16) []byte {
		return synFrame(nil, client, server, testpkt.TCP{ACK: true, DstPort: port, Ack: 12345})
	}
	drops := checkVerdicts(t, objs.MoatFilter, []verdictCase{
		{"ipv4 syn+ack", synack(client4, server4, protectedPort), 1},
		{"ipv6 syn+ack", synack(client6, server6, protectedPort), 1},
		{"syn+ack+fin", synFrame(nil, client4, server4, testpkt.TCP{ACK: true, FIN: true}), 1},
		{"never mode", synack(client4, server4, neverPort), 2},
		{"no listener", synack(client4, server4, noListenerPort), 2},
	})
	if st := portStatus(t, objs, protectedPort); st.ACKsDropped != drops || st.SYNs != 0 || st.CookiesIssued != 0 {
		t.Errorf("status %+v: want %d ACKs dropped, no SYN counted", st, drops)
	}
}

// TestMonitorModeStandsDown: in monitor mode the SYN defence neither
// answers nor drops: a SYN to an always-mode port, a spoofed ACK and a
// stray SYN-ACK reach the kernel unchanged, and the port counts nothing;
// with monitor mode off again the same SYN gets its cookie.
func TestMonitorModeStandsDown(t *testing.T) {
	objs := setup(t)
	setMonitor := func(on bool) { t.Helper(); setMonitorMode(t, objs, on) }
	syn := synFrame(nil, client4, server4, testpkt.TCP{Options: []layers.TCPOption{testpkt.MSS(1460)}})
	setMonitor(true)
	checkVerdicts(t, objs.MoatFilter, []verdictCase{
		{"syn", syn, 2},
		{"ipv6 syn", synFrame(nil, client6, server6, testpkt.TCP{Options: []layers.TCPOption{testpkt.MSS(1440)}}), 2},
		{"spoofed ack", ackFrame(client4, server4, protectedPort, clientISN+1, 0xdeadbeef, false), 2},
		{"stray syn+ack", synFrame(nil, client4, server4, testpkt.TCP{ACK: true, Ack: 12345}), 2},
	})
	if st := portStatus(t, objs, protectedPort); st.SYNs != 0 || st.CookiesIssued != 0 || st.ACKsDropped != 0 {
		t.Errorf("status %+v in monitor mode: want nothing counted", st)
	}
	setMonitor(false)
	withListener(t, func() {
		if ret, _ := run(t, objs.MoatFilter, syn); ret != 3 {
			t.Errorf("verdict %d with monitor mode off, want XDP_TX", ret)
		}
	})
}

// TestCounterSlots checks how protected ports share the counters array:
// each gets a slot of its own, cleared when handed out, reused once the
// port is unprotected, and a port past the last slot is refused without
// being protected.
func TestCounterSlots(t *testing.T) {
	objs := loadObjects(t)
	slotOf := func(port uint16) uint16 {
		t.Helper()
		var e datapath.MoatSynPort
		if err := objs.SynPorts.Lookup(uint32(port), &e); err != nil {
			t.Fatal(err)
		}
		return e.Slot
	}
	free := int(objs.SynCounters.MaxEntries()) - 1
	if free != MaxProtectedPorts {
		t.Fatalf("syn_counters has %d slots for ports, MaxProtectedPorts says %d", free, MaxProtectedPorts)
	}
	for i := 0; i < 3; i++ {
		if err := Protect(objs.SynPorts, objs.SynCounters, objs.SynCensus, uint16(1000+i), ModeNever, 0); err != nil {
			t.Fatal(err)
		}
	}
	// The other slots, through one table as the CLI and the daemon change
	// many ports: it must see the slots it hands out itself.
	table, err := ReadPortTable(objs.SynPorts, objs.SynCounters, objs.SynCensus)
	if err != nil {
		t.Fatal(err)
	}
	var rest []uint16
	for i := 3; i < free; i++ {
		rest = append(rest, uint16(1000+i))
	}
	if err := table.CheckRoom(append(rest, 1000, 1000+uint16(free-1))); err != nil {
		t.Fatalf("room for the ports that fill the slots (and ports already protected): %v", err)
	}
	if err := table.CheckRoom(append(rest, 9)); !errors.Is(err, ErrNoFreeSlot) {
		t.Fatalf("room for one port too many: %v, want ErrNoFreeSlot", err)
	}
	for _, p := range rest {
		if err := table.Protect(p, ModeNever, 0); err != nil {
			t.Fatalf("protect tcp/%d: %v", p, err)
		}
	}
	seen := map[uint16]bool{}
	for i := 0; i < free; i++ {
		slot := slotOf(uint16(1000 + i))
		if slot == 0 || seen[slot] {
			t.Fatalf("tcp/%d has slot %d: want a distinct, non-zero slot", 1000+i, slot)
		}
		seen[slot] = true
	}
	if err := table.Protect(9, ModeAlways, 0); !errors.Is(err, ErrNoFreeSlot) {
		t.Fatalf("protecting one port too many through the table: %v, want ErrNoFreeSlot", err)
	}
	err = Protect(objs.SynPorts, objs.SynCounters, objs.SynCensus, 9, ModeAlways, 0)
	if !errors.Is(err, ErrNoFreeSlot) {
		t.Fatalf("protecting one port too many: %v, want ErrNoFreeSlot", err)
	}
	if slotOf(9) != 0 {
		t.Fatal("the refused port was protected")
	}

	// Counters left in a slot do not reach the next port that takes it.
	reused := slotOf(1000)
	dirty := make([]datapath.MoatSynPortStats, ebpf.MustPossibleCPU())
	dirty[0].Syns = 41
	if err := objs.SynCounters.Update(uint32(reused), dirty, ebpf.UpdateAny); err != nil {
		t.Fatal(err)
	}
	// The table frees the slot of a port it unprotects.
	if err := table.Protect(1000, ModeOff, 0); err != nil {
		t.Fatal(err)
	}
	if err := table.Protect(9, ModeAlways, 0); err != nil {
		t.Fatalf("protect after a port was freed: %v", err)
	}
	if slotOf(9) != reused {
		t.Errorf("tcp/9 took slot %d, want the freed slot %d", slotOf(9), reused)
	}
	if st := portStatus(t, objs, 9); st.SYNs != 0 {
		t.Errorf("tcp/9 inherited %d SYNs from the slot's last port", st.SYNs)
	}
	// Protecting a protected port again keeps its slot.
	before := slotOf(1001)
	if err := Protect(objs.SynPorts, objs.SynCounters, objs.SynCensus, 1001, ModeAuto, 0); err != nil || slotOf(1001) != before {
		t.Errorf("re-protecting tcp/1001: slot %d -> %d (%v)", before, slotOf(1001), err)
	}
}

func TestNoCookiesWithoutKey(t *testing.T) {
	objs := loadObjects(t)
	if err := Protect(objs.SynPorts, objs.SynCounters, objs.SynCensus, protectedPort, ModeAlways, 0); err != nil {
		t.Fatal(err)
	}
	withListener(t, func() {
		if ret, _ := run(t, objs.MoatFilter, synFrame(nil, client4, server4, testpkt.TCP{})); ret != 2 {
			t.Fatalf("verdict %d before any key, want XDP_PASS", ret)
		}
	})
}

// portStatus is Status for one port.
func portStatus(t *testing.T, objs *datapath.MoatObjects, port uint16) PortStatus {
	t.Helper()
	st, err := Status(objs.SynPorts, objs.SynCounters)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range st {
		if s.Port == port {
			return s
		}
	}
	t.Fatalf("tcp/%d missing from status", port)
	return PortStatus{}
}

// tsOpts are the options of a Linux ACK: timestamps, moat's TSval echoed.
func tsOpts(tsecr uint32) []layers.TCPOption {
	return []layers.TCPOption{testpkt.TCPNOP(), testpkt.TCPNOP(), testpkt.Timestamps(778, tsecr)}
}

func ackFrame(client, server netip.Addr, port uint16, seq, ack uint32, rst bool) []byte {
	return ackFrameOpts(client, server, port, seq, ack, rst, tsOpts(1000))
}

func ackFrameOpts(client, server netip.Addr, port uint16, seq, ack uint32, rst bool, opts []layers.TCPOption) []byte {
	tcp := testpkt.TCP{SrcPort: clientPort, DstPort: port, Seq: seq, Ack: ack, ACK: true, RST: rst, Options: opts}
	return testpkt.IP(client, server, tcp)
}

func TestAckValidation(t *testing.T) {
	objs := setup(t)
	tuple4 := Tuple{netip.AddrPortFrom(client4, clientPort), netip.AddrPortFrom(server4, protectedPort)}
	tuple6 := Tuple{netip.AddrPortFrom(client6, clientPort), netip.AddrPortFrom(server6, protectedPort)}
	meta := func(gen uint64, v6 bool) uint32 { return Meta(1460, true, 7, true, true, false, gen, v6) }
	const now = 5_000_000 // moat's clock when it sent the SYN-ACK, in ms: any value

	// Generation 1 is installed by setup; make 2 current and 1 previous.
	if err := InstallKey(objs.SynKeys, objs.SynRotation, 2, testKeys[1]); err != nil {
		t.Fatal(err)
	}
	cur4, ts4 := CookieTS(testKeys[1], tuple4, clientISN, meta(2, false), now)
	prev4, prevTS4 := CookieTS(testKeys[0], tuple4, clientISN, meta(1, false), now)
	cur6, ts6 := CookieTS(testKeys[1], tuple6, clientISN, meta(2, true), now)
	plain4 := Cookie(testKeys[1], tuple4, clientISN, meta(2, false)) // SYN without timestamps
	ack := func(cookie, tsecr uint32) []byte {
		return ackFrameOpts(client4, server4, protectedPort, clientISN+1, cookie+1, false, tsOpts(tsecr))
	}
	noTS := func(cookie uint32) []byte {
		return ackFrameOpts(client4, server4, protectedPort, clientISN+1, cookie+1, false, nil)
	}
	randomACK := testpkt.TCP{SrcPort: clientPort, DstPort: protectedPort, Seq: 99, Ack: 12345, ACK: true, Options: tsOpts(2)}
	var routerAlerts []testpkt.IPv4Option
	for range 10 {
		routerAlerts = append(routerAlerts, testpkt.RouterAlert())
	}

	cases := []verdictCase{
		{"valid cookie ipv4", ack(cur4, ts4), 2},
		{"valid cookie ipv6", ackFrameOpts(client6, server6, protectedPort, clientISN+1, cur6+1, false, tsOpts(ts6)), 2},
		{"valid cookie without timestamps", noTS(plain4), 2},
		{"previous key", ack(prev4, prevTS4), 2},
		{"other clock bits in tsecr", ack(cur4, ts4^0xff00), 2},
		{"tsecr hash bits wrong", ack(cur4, ts4^1), 1},
		{"timestamps dropped from the ack", noTS(cur4), 1},
		{"timestamps added to the ack", ack(plain4, ts4), 1},
		{"hash bit flipped", ack(cur4^(1<<20), ts4), 1},
		{"sack bit flipped", ack(cur4^sackBit, ts4), 1},
		{"key bit flipped", ack(cur4^keyBit, ts4), 1},
		{"other client isn", ackFrameOpts(client4, server4, protectedPort, clientISN+2, cur4+1, false, tsOpts(ts4)), 1},
		{"random ack ipv6", ackFrame(client6, server6, protectedPort, 99, 12345, false), 1},
		// Headers in front of TCP do not take an ACK past the filter.
		{"random ack, ipv6 destination options", testpkt.Frame{Net: testpkt.IPv6{Src: client6, Dst: server6,
			Ext: []testpkt.IPv6Ext{testpkt.DestOpts{Options: []testpkt.IPv6TLV{{Type: 0x1e, Data: make([]byte, 20)}}}}}, L4: randomACK}.Bytes(), 1},
		// Too far in to check a cookie: dropped, and not counted as a
		// rejected cookie.
		{"random ack behind 1.2 KiB of ipv6 destination options", testpkt.Frame{Net: testpkt.IPv6{Src: client6, Dst: server6,
			Ext: []testpkt.IPv6Ext{testpkt.DestOpts{Options: []testpkt.IPv6TLV{
				{Type: 0x1e, Data: make([]byte, 250)}, {Type: 0x1e, Data: make([]byte, 250)}, {Type: 0x1e, Data: make([]byte, 250)},
				{Type: 0x1e, Data: make([]byte, 250)}, {Type: 0x1e, Data: make([]byte, 250)}}}}}, L4: randomACK}.Bytes(), 1},
		{"random ack, 40 bytes of ipv4 options", testpkt.Frame{Net: testpkt.IPv4{Src: client4, Dst: server4, Options: routerAlerts}, L4: randomACK}.Bytes(), 1},
		{"random ack, 4 bytes of ipv4 options", testpkt.Frame{Net: testpkt.IPv4{Src: client4, Dst: server4, Options: routerAlerts[:1]}, L4: randomACK}.Bytes(), 1},
		{"rst is not filtered", ackFrame(client4, server4, protectedPort, 99, 12345, true), 2},
		{"unprotected port", ackFrame(client4, server4, unprotectedPort, 99, 12345, false), 2},
		{"never mode port", ackFrame(client4, server4, neverPort, 99, 12345, false), 2},
		// No socket at all: not a local listener's (a container behind
		// this device, DNAT, a routed flow), so not moat's to drop.
		{"no listener", ackFrame(client4, server4, noListenerPort, 99, 12345, false), 2},
	}
	// Each case on its own: a valid cookie ACK lets the segments behind
	// it through (TestAckFollowsAValidHandshake), which would hide the
	// rows that change one thing of it.
	drops := checkVerdictsAfter(t, objs.MoatFilter, cases, func() { forgetHandshakes(t, objs.SynRecent) })
	withListener(t, func() {
		// After one more rotation the generation-1 cookie is two old.
		if err := InstallKey(objs.SynKeys, objs.SynRotation, 3, testKeys[2]); err != nil {
			t.Fatal(err)
		}
		drops++
		if ret, _ := run(t, objs.MoatFilter, ack(prev4, prevTS4)); ret != 1 {
			t.Errorf("generation-1 cookie after two rotations: verdict %d, want XDP_DROP", ret)
		}
		if ret, _ := run(t, objs.MoatFilter, ack(cur4, ts4)); ret != 2 {
			t.Errorf("generation-2 cookie after one rotation: verdict %d, want XDP_PASS", ret)
		}
	})
	st := portStatus(t, objs, protectedPort)
	if st.ACKsDropped != drops || st.CookiesRejected != drops-1 {
		t.Errorf("acks dropped %d, cookies rejected %d, want %d and %d (all but the one too far in to check)",
			st.ACKsDropped, st.CookiesRejected, drops, drops-1)
	}
}

// forgetHandshakes empties syn_recent.
func forgetHandshakes(t *testing.T, m *ebpf.Map) {
	t.Helper()
	n := int(m.MaxEntries())
	keys := make([]uint32, n)
	for i := range keys {
		keys[i] = uint32(i)
	}
	if _, err := m.BatchUpdate(keys, make([]datapath.MoatSynRecent, n), nil); err != nil {
		t.Fatal(err)
	}
}

// ageHandshakes makes every handshake in syn_recent older by units of its
// clock (2^20 ns). One batch read: the rows that test the window's end
// have a few milliseconds to spare.
func ageHandshakes(t *testing.T, m *ebpf.Map, units uint32) {
	t.Helper()
	n := int(m.MaxEntries())
	keys := make([]uint32, n)
	vals := make([]datapath.MoatSynRecent, n)
	var cursor ebpf.MapBatchCursor
	got, err := m.BatchLookup(&cursor, keys, vals, nil)
	if err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		t.Fatal(err)
	}
	for i := range got {
		if vals[i].Stamp != 0 {
			vals[i].Stamp -= units
			if err := m.Put(keys[i], vals[i]); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// TestAckFollowsAValidHandshake: the segments a client sends right behind
// its cookie ACK reach XDP before the stack has made the socket from it
// (one poll). A segment of the same tuple that acknowledges the cookie
// just validated, and starts within a window of the validated ACK, passes
// for about 100 ms; anything else is judged as before, and so is every
// segment when no valid ACK came first. TestHandshakeBurst sends such a
// burst through a real poll.
func TestAckFollowsAValidHandshake(t *testing.T) {
	objs := setup(t)
	tuple := Tuple{netip.AddrPortFrom(client4, clientPort), netip.AddrPortFrom(server4, protectedPort)}
	cookie, ts := CookieTS(testKeys[0], tuple, clientISN, Meta(1460, true, 7, true, true, false, 1, false), 5_000_000)
	segment := func(client netip.Addr, port uint16, seq, ack uint32) []byte {
		return testpkt.IP(client, server4, testpkt.TCP{SrcPort: port, DstPort: protectedPort, Seq: seq, Ack: ack,
			ACK: true, PSH: true, Options: tsOpts(ts), Payload: make([]byte, 1000)})
	}
	valid := ackFrameOpts(client4, server4, protectedPort, clientISN+1, cookie+1, false, tsOpts(ts))
	behind := segment(client4, clientPort, clientISN+1+1448, cookie+1)
	for _, c := range []struct {
		name   string
		first  []byte // a valid cookie ACK, or nil
		age    uint32 // of the handshake noted, in units of 2^20 ns
		second []byte
		want   uint32
	}{
		{"behind a valid ack", valid, 0, behind, 2},
		{"at the end of the largest window", valid, 0, segment(client4, clientPort, clientISN+1+65535<<14, cookie+1), 2},
		{"behind a valid ack 80 ms old", valid, 76, behind, 2},
		{"with no valid ack before it", nil, 0, behind, 1},
		{"behind a valid ack 110 ms old", valid, 105, behind, 1},
		{"another cookie", valid, 0, segment(client4, clientPort, clientISN+1+1448, cookie+2), 1},
		{"before the validated ack", valid, 0, segment(client4, clientPort, clientISN, cookie+1), 1},
		{"past the largest window", valid, 0, segment(client4, clientPort, clientISN+2+65535<<14, cookie+1), 1},
		{"another client port", valid, 0, segment(client4, clientPort+1, clientISN+1+1448, cookie+1), 1},
		{"another client address", valid, 0, segment(netip.MustParseAddr("192.0.2.99"), clientPort, clientISN+1+1448, cookie+1), 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			withListener(t, func() {
				forgetHandshakes(t, objs.SynRecent)
				if c.first != nil {
					if ret, _ := run(t, objs.MoatFilter, c.first); ret != 2 {
						t.Fatalf("the valid cookie ACK: verdict %d", ret)
					}
					ageHandshakes(t, objs.SynRecent, c.age)
				}
				if ret, _ := run(t, objs.MoatFilter, c.second); ret != c.want {
					t.Errorf("verdict %d, want %d", ret, c.want)
				}
			})
		})
	}
}

// TestUnwrittenKeySlotSignsNothing: at generation 1 the other key slot was
// never a generation's key. If it holds zeros (a control plane that wrote
// one slot), a cookie computed with the all-zero key must not pass; and
// InstallKey fills it with a random key all the same.
func TestUnwrittenKeySlotSignsNothing(t *testing.T) {
	tuple := Tuple{netip.AddrPortFrom(client4, clientPort), netip.AddrPortFrom(server4, protectedPort)}
	zeroMeta := Meta(1460, true, 7, true, true, false, 0, false) // key bit 0: slot 0
	forged := Cookie(Key{}, tuple, clientISN, zeroMeta)
	genuine := Cookie(testKeys[0], tuple, clientISN, Meta(1460, true, 7, true, true, false, 1, false))
	noTS := func(cookie uint32) []byte {
		return ackFrameOpts(client4, server4, protectedPort, clientISN+1, cookie+1, false, nil)
	}
	for _, how := range []string{"slot 1 written alone", "InstallKey"} {
		t.Run(how, func(t *testing.T) {
			objs := loadObjects(t)
			if how == "InstallKey" {
				if err := InstallKey(objs.SynKeys, objs.SynRotation, 1, testKeys[0]); err != nil {
					t.Fatal(err)
				}
			} else {
				if err := objs.SynKeys.Update(uint32(1), datapath.MoatSynKey{K0: testKeys[0].K0, K1: testKeys[0].K1}, ebpf.UpdateAny); err != nil {
					t.Fatal(err)
				}
				var ts unix.Timespec
				_ = unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts)
				if err := objs.SynRotation.Update(uint32(0), datapath.MoatSynKeyState{Generation: 1, RotatedNs: uint64(ts.Nano())}, ebpf.UpdateAny); err != nil {
					t.Fatal(err)
				}
			}
			if err := Configure(objs.SynSettings, Config{ResetsPerSec: -1}); err != nil {
				t.Fatal(err)
			}
			if err := Protect(objs.SynPorts, objs.SynCounters, objs.SynCensus, protectedPort, ModeAlways, 0); err != nil {
				t.Fatal(err)
			}
			withListener(t, func() {
				if ret, _ := run(t, objs.MoatFilter, noTS(forged)); ret != 1 {
					t.Errorf("cookie under the all-zero key of slot 0: verdict %d, want XDP_DROP", ret)
				}
				if ret, _ := run(t, objs.MoatFilter, noTS(genuine)); ret != 2 {
					t.Errorf("cookie under the generation-1 key: verdict %d, want XDP_PASS", ret)
				}
			})
		})
	}
}

// TestStaleKeysFailOpen: when the last rotation is older than 2.5 rotation
// periods the rotator is taken for dead: SYNs go to the kernel (counted)
// and moat cookies are refused, until the period allows the age again.
func TestStaleKeysFailOpen(t *testing.T) {
	objs := setup(t)
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts)
	age := 3 * DefaultRotation // > StaleAfter(DefaultRotation)
	if err := objs.SynRotation.Update(uint32(0), datapath.MoatSynKeyState{
		Generation: 1, RotatedNs: uint64(ts.Nano()) - uint64(age)}, ebpf.UpdateAny); err != nil {
		t.Fatal(err)
	}
	tuple := Tuple{netip.AddrPortFrom(client4, clientPort), netip.AddrPortFrom(server4, protectedPort)}
	cookie := Cookie(testKeys[0], tuple, clientISN, Meta(1460, true, 7, true, true, false, 1, false))
	syn := synFrame(nil, client4, server4, testpkt.TCP{Options: []layers.TCPOption{testpkt.MSS(1460)}})
	ack := ackFrameOpts(client4, server4, protectedPort, clientISN+1, cookie+1, false, nil)

	ks, err := Keys(objs.SynRotation, objs.SynSettings)
	if err != nil {
		t.Fatal(err)
	}
	if !ks.Stale || ks.Age < age || ks.Age > age+time.Minute || ks.Rotations != 1 {
		t.Errorf("key status %+v, want stale, about %s old", ks, age)
	}
	withListener(t, func() {
		if ret, _ := run(t, objs.MoatFilter, syn); ret != 2 {
			t.Errorf("SYN with stale keys: verdict %d, want XDP_PASS", ret)
		}
		if ret, _ := run(t, objs.MoatFilter, ack); ret != 1 {
			t.Errorf("moat cookie with stale keys: verdict %d, want XDP_DROP", ret)
		}
		// A longer period makes the same age fresh.
		if err := SetRotationPeriod(objs.SynSettings, 10*time.Minute); err != nil {
			t.Fatal(err)
		}
		if ret, _ := run(t, objs.MoatFilter, ack); ret != 2 {
			t.Errorf("moat cookie, 10m period: verdict %d, want XDP_PASS", ret)
		}
		if ret, _ := run(t, objs.MoatFilter, syn); ret != 3 {
			t.Errorf("SYN, 10m period: verdict %d, want XDP_TX", ret)
		}
	})
	if ks, err := Keys(objs.SynRotation, objs.SynSettings); err != nil || ks.Stale || ks.Period != 10*time.Minute {
		t.Errorf("key status %+v (%v), want fresh with a 10m period", ks, err)
	}
	if st := portStatus(t, objs, protectedPort); st.StaleKeySYNs != 1 || st.CookiesIssued != 1 {
		t.Errorf("status %+v: want 1 stale-key SYN and 1 cookie", st)
	}
}

func TestAutoModeSwitches(t *testing.T) {
	objs := setup(t)
	// A threshold of 1 SYN/s is 1 SYN per CPU window: the second SYN in a
	// window is a flood.
	if err := Protect(objs.SynPorts, objs.SynCounters, objs.SynCensus, protectedPort, ModeAuto, 1); err != nil {
		t.Fatal(err)
	}
	if err := Configure(objs.SynSettings, Config{Hold: 150 * time.Millisecond, ResetsPerSec: -1}); err != nil {
		t.Fatal(err)
	}
	syn := synFrame(nil, client4, server4, testpkt.TCP{})
	random := ackFrame(client4, server4, protectedPort, 99, 12345, false)
	state := func() PortStatus {
		st, err := Status(objs.SynPorts, objs.SynCounters)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range st {
			if s.Port == protectedPort {
				return s
			}
		}
		t.Fatal("port missing from status")
		return PortStatus{}
	}
	withListener(t, func() {
		if ret, _ := run(t, objs.MoatFilter, syn); ret != 2 {
			t.Fatalf("first SYN: verdict %d, want XDP_PASS (no flood)", ret)
		}
		if ret, _ := run(t, objs.MoatFilter, random); ret != 2 {
			t.Fatalf("ACK without flood: verdict %d, want XDP_PASS", ret)
		}
		if ret, _ := run(t, objs.MoatFilter, syn); ret != 3 {
			t.Fatalf("second SYN in the window: verdict %d, want XDP_TX", ret)
		}
		if s := state(); !s.Flooding || s.LastChange.IsZero() {
			t.Fatalf("status %+v, want flooding", s)
		}
		if ret, _ := run(t, objs.MoatFilter, random); ret != 1 {
			t.Fatalf("random ACK during flood: verdict %d, want XDP_DROP", ret)
		}
		time.Sleep(300 * time.Millisecond)
		// No SYN since: the data path still has the flag set, but the
		// hold time is over, status says so, and ACK filtering is over
		// too.
		if s := state(); s.Flooding {
			t.Fatalf("status %+v after the hold time, want not flooding", s)
		}
		if ret, _ := run(t, objs.MoatFilter, random); ret != 2 {
			t.Fatalf("random ACK after the hold time, no SYN since: verdict %d, want XDP_PASS", ret)
		}
		if ret, _ := run(t, objs.MoatFilter, syn); ret != 2 {
			t.Fatalf("SYN after the hold time: verdict %d, want XDP_PASS", ret)
		}
	})
	if s := state(); s.Flooding || s.SYNs != 3 || s.CookiesIssued != 1 || s.ACKsDropped != 1 {
		t.Fatalf("status %+v", s)
	}
}

// TestPortWithoutSlotIsLeftAlone checks the data path's side of slots: a
// port whose entry names no counters slot (state of an older moat before
// Open gives it one) gets no cookie and no count; with a slot it does.
func TestPortWithoutSlotIsLeftAlone(t *testing.T) {
	objs := setup(t)
	syn := synFrame(nil, client4, server4, testpkt.TCP{Options: []layers.TCPOption{testpkt.MSS(1460)}})
	var e datapath.MoatSynPort
	if err := objs.SynPorts.Lookup(uint32(protectedPort), &e); err != nil {
		t.Fatal(err)
	}
	slot := e.Slot
	e.Slot = 0
	if err := objs.SynPorts.Update(uint32(protectedPort), e, ebpf.UpdateAny); err != nil {
		t.Fatal(err)
	}
	withListener(t, func() {
		if ret, _ := run(t, objs.MoatFilter, syn); ret != 2 {
			t.Errorf("SYN to a port without a slot: verdict %d, want XDP_PASS", ret)
		}
		e.Slot = slot
		if err := objs.SynPorts.Update(uint32(protectedPort), e, ebpf.UpdateAny); err != nil {
			t.Fatal(err)
		}
		if ret, _ := run(t, objs.MoatFilter, syn); ret != 3 {
			t.Errorf("SYN once the port has its slot: verdict %d, want XDP_TX", ret)
		}
	})
	if st := portStatus(t, objs, protectedPort); st.SYNs != 1 || st.CookiesIssued != 1 {
		t.Errorf("status %+v: want only the SYN after the slot counted", st)
	}
}

// TestRoutedDestinations: on a host that forwards, a listener bound to the
// wildcard address matches SYNs and ACKs for destinations the host only
// routes on; moat leaves those to the kernel (counted in syns_passed) and
// still answers and filters for its own addresses. A listener bound to one
// address needs no route lookup: the socket lookup matched that address.
func TestRoutedDestinations(t *testing.T) {
	objs := loadObjects(t)
	if _, err := Rotate(objs.SynKeys, objs.SynRotation); err != nil {
		t.Fatal(err)
	}
	// Stray ACKs dropped, not answered with RSTs (TestStrayAckReset).
	if err := Configure(objs.SynSettings, Config{ResetsPerSec: -1}); err != nil {
		t.Fatal(err)
	}
	if err := Protect(objs.SynPorts, objs.SynCounters, objs.SynCensus, protectedPort, ModeAlways, 0); err != nil {
		t.Fatal(err)
	}
	far4, far6 := netip.MustParseAddr("192.0.2.77"), netip.MustParseAddr("2001:db8::77")
	dropped4 := netip.MustParseAddr("203.0.113.9") // a blackhole route
	type result struct {
		name       string
		ret, want  uint32
		passedSyns uint64
	}
	var results []result
	inScratchNetns(t, func() {
		// The host's own addresses on a link, the rest of their subnets
		// routed out of it, forwarding on.
		for _, f := range []string{"/proc/sys/net/ipv4/ip_forward", "/proc/sys/net/ipv6/conf/all/forwarding"} {
			if err := os.WriteFile(f, []byte("1"), 0); err != nil {
				t.Errorf("%s: %v", f, err)
				return
			}
		}
		// IPv6 delivers to local addresses through the loopback device:
		// down, their routes count for nothing.
		if lo, err := netlink.LinkByName("lo"); err != nil || netlink.LinkSetUp(lo) != nil {
			t.Errorf("set lo up: %v", err)
			return
		}
		// A veth pair: both ends in this namespace, so nothing leaves it.
		veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "fwd0"}, PeerName: "fwd1"}
		if err := netlink.LinkAdd(veth); err != nil {
			t.Errorf("add veth pair: %v", err)
			return
		}
		if peer, err := netlink.LinkByName("fwd1"); err != nil || netlink.LinkSetUp(peer) != nil {
			t.Errorf("set fwd1 up: %v", err)
			return
		}
		for _, a := range []string{server4.String() + "/24", server6.String() + "/64"} {
			addr, _ := netlink.ParseAddr(a)
			addr.Flags = unix.IFA_F_NODAD
			if err := netlink.AddrAdd(veth, addr); err != nil {
				t.Errorf("add %s: %v", a, err)
				return
			}
		}
		if err := netlink.LinkSetUp(veth); err != nil {
			t.Errorf("set fwd0 up: %v", err)
			return
		}
		if err := netlink.RouteAdd(&netlink.Route{Type: unix.RTN_BLACKHOLE,
			Dst: &net.IPNet{IP: net.IPv4(203, 0, 113, 0), Mask: net.CIDRMask(24, 32)}}); err != nil {
			t.Errorf("blackhole route: %v", err)
			return
		}
		passed := func() uint64 {
			st, err := Status(objs.SynPorts, objs.SynCounters)
			if err != nil || len(st) != 1 {
				t.Errorf("status: %v %v", st, err)
				return 0
			}
			return st[0].SYNsPassed
		}
		check := func(name string, frame []byte, want uint32) {
			before := passed()
			ret, _ := run(t, objs.MoatFilter, frame)
			results = append(results, result{name, ret, want, passed() - before})
		}
		wild := listen(t, protectedPort)
		for _, c := range []struct {
			name           string
			client, server netip.Addr
			want           uint32
		}{
			{"ipv4 syn for an own address", client4, server4, 3},
			{"ipv6 syn for an own address", client6, server6, 3},
			{"ipv4 syn routed on", client4, far4, 2},
			{"ipv6 syn routed on", client6, far6, 2},
			{"ipv4 syn to a blackhole route", client4, dropped4, 2},
		} {
			check(c.name, synFrame(nil, c.client, c.server, testpkt.TCP{}), c.want)
			// The same destination again: the answer cached for the
			// jiffy must be the same.
			check(c.name+" again", synFrame(nil, c.client, c.server, testpkt.TCP{}), c.want)
		}
		// SYNs cookie mode will not answer are dropped only when they
		// are a local listener's: a Fast Open SYN routed through keeps
		// its data, and a SYN+FIN routed on is the kernel's to judge.
		tfo := testpkt.TCP{Payload: []byte("GET / HTTP/1.0\r\n\r\n")}
		check("ipv4 fast open syn for an own address", synFrame(nil, client4, server4, tfo), 1)
		check("ipv4 fast open syn routed on", synFrame(nil, client4, far4, tfo), 2)
		check("ipv6 fast open syn routed on", synFrame(nil, client6, far6, tfo), 2)
		check("ipv4 syn+fin routed on", synFrame(nil, client4, far4, testpkt.TCP{FIN: true}), 2)
		check("ipv4 stray ack for an own address", ackFrameOpts(client4, server4, protectedPort, clientISN+1, 12345, false, nil), 1)
		// Forwarding is per device: the same destination, in the same
		// jiffy, is routed on from fwd0 and not from fwd1, which does not
		// forward (and whose frames moat takes for its own, README).
		if err := os.WriteFile("/proc/sys/net/ipv4/conf/fwd1/forwarding", []byte("0"), 0); err != nil {
			t.Errorf("turn forwarding off on fwd1: %v", err)
			return
		}
		peer, err := netlink.LinkByName("fwd1")
		if err != nil {
			t.Errorf("fwd1: %v", err)
			return
		}
		routedOn, notForwarding := 0, 0
		for range 20 {
			if runOn(t, objs.MoatFilter, synFrame(nil, client4, far4, testpkt.TCP{}), veth.Index) == 2 {
				routedOn++
			}
			if runOn(t, objs.MoatFilter, synFrame(nil, client4, far4, testpkt.TCP{}), peer.Attrs().Index) == 3 {
				notForwarding++
			}
		}
		results = append(results,
			result{"ipv4 syn routed on from a forwarding device", uint32(routedOn), 20, 1},
			result{"ipv4 syn from a device that does not forward", uint32(notForwarding), 20, 0})
		check("ipv6 stray ack for an own address", ackFrameOpts(client6, server6, protectedPort, clientISN+1, 12345, false, nil), 1)
		check("ipv4 ack routed on", ackFrameOpts(client4, far4, protectedPort, clientISN+1, 12345, false, nil), 2)
		check("ipv6 ack routed on", ackFrameOpts(client6, far6, protectedPort, clientISN+1, 12345, false, nil), 2)
		wild.Close()

		// A listener on one address: the socket lookup only matches
		// that address.
		var lc net.ListenConfig
		lc.SetMultipathTCP(false)
		one, err := lc.Listen(context.Background(), "tcp4", netip.AddrPortFrom(server4, protectedPort).String())
		if err != nil {
			t.Errorf("listen on %s: %v", server4, err)
			return
		}
		defer one.Close()
		check("ipv4 syn to a bound listener", synFrame(nil, client4, server4, testpkt.TCP{}), 3)
		check("ipv4 syn routed on past a bound listener", synFrame(nil, client4, far4, testpkt.TCP{}), 2)
	})
	for _, r := range results {
		t.Run(r.name, func(t *testing.T) {
			if strings.Contains(r.name, "device") { // counts of 20 runs
				if r.ret != r.want {
					t.Fatalf("%d of 20 runs as expected", r.ret)
				}
				return
			}
			if r.ret != r.want {
				t.Fatalf("verdict %d, want %d", r.ret, r.want)
			}
			if isSyn := strings.Contains(r.name, "syn"); isSyn && r.want == 2 && r.passedSyns != 1 {
				t.Errorf("syns_passed grew by %d, want 1", r.passedSyns)
			}
		})
	}
	if len(results) != 22 {
		t.Fatalf("%d cases ran, want 22", len(results))
	}
}

// setMonitorMode turns the filter's monitor mode on or off.
func setMonitorMode(t *testing.T, objs *datapath.MoatObjects, on bool) {
	t.Helper()
	var s datapath.MoatRuntimeSettings
	if on {
		s.Monitor = 1
	}
	if err := objs.Settings.Put(uint32(0), s); err != nil {
		t.Fatal(err)
	}
}
