package syncookie

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"runtime"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/google/gopacket/layers"
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
	clientPort      = 40000
	clientISN       = 0x12345678
)

// loadObjects loads the filter with fresh maps for one test.
func loadObjects(t testing.TB) *datapath.MoatObjects {
	t.Helper()
	var objs datapath.MoatObjects
	if err := datapath.LoadMoatObjects(&objs, nil); err != nil {
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
		fn()
	}()
	<-done
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
// server offering o, under key k of generation gen, with moat's TSval tsval.
func expectedSynAck(tags []testpkt.Tag, client, server netip.Addr, o synOpts, k Key, gen uint64, tsval uint32) ([]byte, uint32) {
	v6 := client.Is6()
	meta := Meta(o.mss, o.hasMSS, o.wscale, o.hasWScale, o.sack, o.ecn, gen, v6)
	tuple := Tuple{netip.AddrPortFrom(client, clientPort), netip.AddrPortFrom(server, protectedPort)}
	cookie := Cookie(k, tuple, clientISN, meta)

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
		opts = append(opts, testpkt.TCPNOP(), testpkt.WindowScale(7))
	}
	// Options always fill 20 bytes, the rest end-of-list.
	n := 0
	for _, op := range opts {
		if op.OptionType == layers.TCPOptionKindNop {
			n++
		} else {
			n += 2 + len(op.OptionData)
		}
	}
	for ; n < 20; n++ {
		opts = append(opts, layers.TCPOption{OptionType: layers.TCPOptionKindEndList})
	}
	tcp := testpkt.TCP{
		SrcPort: protectedPort, DstPort: clientPort,
		Seq: cookie, Ack: clientISN + 1,
		SYN: true, ACK: true, ECE: o.ecn,
		Window:  65535,
		Options: opts,
	}
	f := testpkt.Frame{SrcMAC: testpkt.DefaultDstMAC, DstMAC: testpkt.DefaultSrcMAC, Tags: tags, L4: tcp}
	if v6 {
		f.Net = testpkt.IPv6{Src: server, Dst: client, HopLimit: 64}
	} else {
		f.Net = testpkt.IPv4{Src: server, Dst: client, TTL: 64, DF: true}
	}
	return f.Bytes(), cookie
}

func synFrame(tags []testpkt.Tag, client, server netip.Addr, tcp testpkt.TCP) []byte {
	tcp.SrcPort, tcp.Seq, tcp.SYN = clientPort, clientISN, true
	if tcp.DstPort == 0 {
		tcp.DstPort = protectedPort
	}
	f := testpkt.Frame{Tags: tags, L4: tcp}
	if client.Is6() {
		f.Net = testpkt.IPv6{Src: client, Dst: server}
	} else {
		f.Net = testpkt.IPv4{Src: client, Dst: server}
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

func setup(t *testing.T) *datapath.MoatObjects {
	objs := loadObjects(t)
	if err := InstallKey(objs.SynKeys, objs.SynRotation, 1, testKeys[0]); err != nil {
		t.Fatal(err)
	}
	if err := Configure(objs.SynSettings, Config{ECN: true}); err != nil {
		t.Fatal(err)
	}
	for _, p := range []struct {
		port uint16
		mode Mode
	}{{protectedPort, ModeAlways}, {neverPort, ModeNever}} {
		if err := Protect(objs.SynPorts, objs.SynStats, p.port, p.mode, 0); err != nil {
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
		{"ipv6 qinq", testpkt.QinQ(10, 20), client6, server6, testpkt.TCP{Options: linux}, linuxOpts},
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
		{"window scale above 14", nil, client4, server4, testpkt.TCP{Options: []layers.TCPOption{testpkt.MSS(1460), testpkt.TCPNOP(), testpkt.WindowScale(15)}},
			synOpts{mss: 1460, hasMSS: true, wscale: 15, hasWScale: true}},
		{"ecn setup", nil, client4, server4, testpkt.TCP{ECE: true, CWR: true, Options: linux},
			synOpts{mss: 1460, hasMSS: true, wscale: 7, hasWScale: true, sack: true, ts: true, tsval: 777, ecn: true}},
		{"ece alone is not ecn", nil, client4, server4, testpkt.TCP{ECE: true, Options: linux}, linuxOpts},
		{"unknown option skipped", nil, client4, server4, testpkt.TCP{Options: []layers.TCPOption{
			{OptionType: 30, OptionData: []byte{1, 2, 3, 4}}, testpkt.MSS(1440), testpkt.SACKPermitted()}},
			synOpts{mss: 1440, hasMSS: true, sack: true}},
	}
	inScratchNetns(t, func() {
		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				in := synFrame(c.tags, c.client, c.server, c.tcp)
				ret, out := run(t, objs.MoatFilter, in)
				if ret != uint32(2+1) { // XDP_TX
					t.Fatalf("verdict %d, want XDP_TX (3)", ret)
				}
				l3 := 14 + 4*len(c.tags)
				l4 := l3 + 20
				if c.client.Is6() {
					l4 = l3 + 40
				}
				var tsval uint32
				if c.want.ts {
					tsval = tsvalOf(out, l4)
					var ts unix.Timespec
					_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
					nowMS := uint32(ts.Nano() / 1e6)
					if d := int32(nowMS - tsval); d < 0 || d > 2000 {
						t.Errorf("TSval %d is not moat's millisecond clock (now %d)", tsval, nowMS)
					}
				}
				want, cookie := expectedSynAck(c.tags, c.client, c.server, c.want, testKeys[0], 1, tsval)
				if !bytes.Equal(out, want) {
					t.Fatalf("SYN-ACK differs\n got %x\nwant %x", out, want)
				}
				verifyChecksums(t, out, l3)
				// The Go reference decodes what the BPF encoded.
				tuple := Tuple{netip.AddrPortFrom(c.client, clientPort), netip.AddrPortFrom(c.server, protectedPort)}
				got, ok := Check([2]Key{{}, testKeys[0]}, tuple, clientISN, cookie)
				if !ok {
					t.Fatal("reference rejects the cookie")
				}
				if got.SACK != c.want.sack || got.ECN != c.want.ecn || got.HasWScale != c.want.hasWScale {
					t.Errorf("decoded %+v from %+v", got, c.want)
				}
			})
		}
	})
}

func TestSynAckTrimsPadding(t *testing.T) {
	objs := setup(t)
	inScratchNetns(t, func() {
		// A 54-byte SYN padded to Ethernet's 60-byte minimum.
		in := append(synFrame(nil, client4, server4, testpkt.TCP{}), 0, 0, 0, 0, 0, 0)
		ret, out := run(t, objs.MoatFilter, in)
		want, _ := expectedSynAck(nil, client4, server4, synOpts{}, testKeys[0], 1, 0)
		if ret != 3 || !bytes.Equal(out, want) {
			t.Fatalf("verdict %d\n got %x\nwant %x", ret, out, want)
		}
	})
}

func TestSynsThatGetNoCookie(t *testing.T) {
	objs := setup(t)
	opts := []layers.TCPOption{testpkt.MSS(1460)}
	cases := []struct {
		name  string
		frame []byte
	}{
		{"syn+fin", synFrame(nil, client4, server4, testpkt.TCP{FIN: true, Options: opts})},
		{"syn+rst", synFrame(nil, client4, server4, testpkt.TCP{RST: true, Options: opts})},
		{"syn with data", synFrame(nil, client4, server4, testpkt.TCP{Options: opts, Payload: []byte("GET /")})},
		{"syn+ack", synFrame(nil, client4, server4, testpkt.TCP{ACK: true, Options: opts})},
		{"unprotected port", synFrame(nil, client4, server4, testpkt.TCP{DstPort: unprotectedPort, Options: opts})},
		{"never mode", synFrame(nil, client4, server4, testpkt.TCP{DstPort: neverPort, Options: opts})},
		{"ipv4 first fragment", testpkt.Frame{Net: testpkt.IPv4{Src: client4, Dst: server4, MF: true},
			L4: testpkt.TCP{SrcPort: clientPort, DstPort: protectedPort, SYN: true, Options: opts}}.Bytes()},
		{"ipv4 later fragment", testpkt.Frame{Net: testpkt.IPv4{Src: client4, Dst: server4, FragOff: 100},
			L4: testpkt.TCP{SrcPort: clientPort, DstPort: protectedPort, SYN: true, Options: opts}}.Bytes()},
		{"ipv6 fragment header", testpkt.Frame{Net: testpkt.IPv6{Src: client6, Dst: server6, Ext: []testpkt.IPv6Ext{testpkt.Fragment{More: true, ID: 7}}},
			L4: testpkt.TCP{SrcPort: clientPort, DstPort: protectedPort, SYN: true, Options: opts}}.Bytes()},
		{"ipv4 options", testpkt.Frame{Net: testpkt.IPv4{Src: client4, Dst: server4, Options: []testpkt.IPv4Option{testpkt.RouterAlert()}},
			L4: testpkt.TCP{SrcPort: clientPort, DstPort: protectedPort, SYN: true, Options: opts}}.Bytes()},
	}
	inScratchNetns(t, func() {
		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				ret, out := run(t, objs.MoatFilter, c.frame)
				if ret != 2 { // XDP_PASS
					t.Fatalf("verdict %d, want XDP_PASS", ret)
				}
				if !bytes.Equal(out, c.frame) {
					t.Fatal("a passed frame was modified")
				}
			})
		}
	})
	st, err := Status(objs.SynPorts, objs.SynStats)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range st {
		if s.CookiesIssued != 0 {
			t.Errorf("tcp/%d issued %d cookies", s.Port, s.CookiesIssued)
		}
	}
}

func TestNoCookiesWithoutKey(t *testing.T) {
	objs := loadObjects(t)
	if err := Protect(objs.SynPorts, objs.SynStats, protectedPort, ModeAlways, 0); err != nil {
		t.Fatal(err)
	}
	inScratchNetns(t, func() {
		if ret, _ := run(t, objs.MoatFilter, synFrame(nil, client4, server4, testpkt.TCP{})); ret != 2 {
			t.Fatalf("verdict %d before any key, want XDP_PASS", ret)
		}
	})
}

func ackFrame(client, server netip.Addr, port uint16, seq, ack uint32, rst bool) []byte {
	tcp := testpkt.TCP{SrcPort: clientPort, DstPort: port, Seq: seq, Ack: ack, ACK: true, RST: rst,
		Options: []layers.TCPOption{testpkt.TCPNOP(), testpkt.TCPNOP(), testpkt.Timestamps(778, 1000)}}
	return testpkt.IP(client, server, tcp)
}

func TestAckValidation(t *testing.T) {
	objs := setup(t)
	tuple4 := Tuple{netip.AddrPortFrom(client4, clientPort), netip.AddrPortFrom(server4, protectedPort)}
	tuple6 := Tuple{netip.AddrPortFrom(client6, clientPort), netip.AddrPortFrom(server6, protectedPort)}
	meta := func(gen uint64, v6 bool) uint32 { return Meta(1460, true, 7, true, true, false, gen, v6) }

	// Generation 1 is installed by setup; make 2 current and 1 previous.
	if err := InstallKey(objs.SynKeys, objs.SynRotation, 2, testKeys[1]); err != nil {
		t.Fatal(err)
	}
	cur4 := Cookie(testKeys[1], tuple4, clientISN, meta(2, false))
	prev4 := Cookie(testKeys[0], tuple4, clientISN, meta(1, false))
	cur6 := Cookie(testKeys[1], tuple6, clientISN, meta(2, true))
	// A cookie of generation 0 would sit in generation 2's slot: it stands
	// for a key two rotations old.
	old4 := Cookie(testKeys[2], tuple4, clientISN, meta(0, false))

	cases := []struct {
		name  string
		frame []byte
		want  uint32
	}{
		{"valid cookie ipv4", ackFrame(client4, server4, protectedPort, clientISN+1, cur4+1, false), 2},
		{"valid cookie ipv6", ackFrame(client6, server6, protectedPort, clientISN+1, cur6+1, false), 2},
		{"previous key", ackFrame(client4, server4, protectedPort, clientISN+1, prev4+1, false), 2},
		{"hash bit flipped", ackFrame(client4, server4, protectedPort, clientISN+1, cur4^(1<<20)+1, false), 1},
		{"sack bit flipped", ackFrame(client4, server4, protectedPort, clientISN+1, cur4^sackBit+1, false), 1},
		{"key bit flipped", ackFrame(client4, server4, protectedPort, clientISN+1, cur4^keyBit+1, false), 1},
		{"other client isn", ackFrame(client4, server4, protectedPort, clientISN+2, cur4+1, false), 1},
		{"key two rotations old", ackFrame(client4, server4, protectedPort, clientISN+1, old4+1, false), 1},
		{"random ack ipv6", ackFrame(client6, server6, protectedPort, 99, 12345, false), 1},
		{"rst is not filtered", ackFrame(client4, server4, protectedPort, 99, 12345, true), 2},
		{"unprotected port", ackFrame(client4, server4, unprotectedPort, 99, 12345, false), 2},
		{"never mode port", ackFrame(client4, server4, neverPort, 99, 12345, false), 2},
	}
	inScratchNetns(t, func() {
		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				if ret, _ := run(t, objs.MoatFilter, c.frame); ret != c.want {
					t.Fatalf("verdict %d, want %d", ret, c.want)
				}
			})
		}
		// After one more rotation the generation-1 cookie is two old.
		if err := InstallKey(objs.SynKeys, objs.SynRotation, 3, testKeys[2]); err != nil {
			t.Fatal(err)
		}
		if ret, _ := run(t, objs.MoatFilter, ackFrame(client4, server4, protectedPort, clientISN+1, prev4+1, false)); ret != 1 {
			t.Errorf("generation-1 cookie after two rotations: verdict %d, want XDP_DROP", ret)
		}
		if ret, _ := run(t, objs.MoatFilter, ackFrame(client4, server4, protectedPort, clientISN+1, cur4+1, false)); ret != 2 {
			t.Errorf("generation-2 cookie after one rotation: verdict %d, want XDP_PASS", ret)
		}
	})
	st, err := Status(objs.SynPorts, objs.SynStats)
	if err != nil {
		t.Fatal(err)
	}
	var drops uint64
	for _, s := range st {
		if s.Port == protectedPort {
			drops = s.ACKsDropped
		}
	}
	if drops != 7 {
		t.Errorf("acks dropped counter %d, want 7", drops)
	}
}

func TestAutoModeSwitches(t *testing.T) {
	objs := setup(t)
	// A threshold of 1 SYN/s is 1 SYN per CPU window: the second SYN in a
	// window is a flood.
	if err := Protect(objs.SynPorts, objs.SynStats, protectedPort, ModeAuto, 1); err != nil {
		t.Fatal(err)
	}
	if err := Configure(objs.SynSettings, Config{Hold: 150 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	syn := synFrame(nil, client4, server4, testpkt.TCP{})
	random := ackFrame(client4, server4, protectedPort, 99, 12345, false)
	state := func() PortStatus {
		st, err := Status(objs.SynPorts, objs.SynStats)
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
	inScratchNetns(t, func() {
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
		if ret, _ := run(t, objs.MoatFilter, syn); ret != 2 {
			t.Fatalf("SYN after the hold time: verdict %d, want XDP_PASS", ret)
		}
	})
	if s := state(); s.Flooding || s.SYNs != 3 || s.CookiesIssued != 1 || s.ACKsDropped != 1 {
		t.Fatalf("status %+v", s)
	}
}
