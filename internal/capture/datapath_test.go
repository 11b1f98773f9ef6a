package capture

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/ringbuf"
	"github.com/cilium/ebpf/rlimit"
	"golang.org/x/sys/unix"

	"github.com/moat-shield/moat/internal/datapath"
	"github.com/moat-shield/moat/internal/shield"
	"github.com/moat-shield/moat/internal/testpkt"
)

func init() { _ = rlimit.RemoveMemlock() }

// filterObjects is the XDP filter with every map of the collection; the
// tc programs beside it are not under test.
type filterObjects struct {
	MoatFilter *ebpf.Program `ebpf:"moat_filter"`
	datapath.MoatMaps
}

// fixture is a freshly loaded filter with its own unpinned maps.
type fixture struct {
	tb   testing.TB
	objs filterObjects
	lock string
}

// newFixture loads the filter; ringSize, if not 0, replaces the size of
// the capture ring.
func newFixture(tb testing.TB, ringSize uint32) *fixture {
	tb.Helper()
	spec, err := datapath.LoadMoat()
	if err != nil {
		tb.Fatal(err)
	}
	if ringSize != 0 {
		spec.Maps[datapath.MoatMapCaptureRing].MaxEntries = ringSize
	}
	f := &fixture{tb: tb, lock: filepath.Join(tb.TempDir(), "capture.lock")}
	if err := spec.LoadAndAssign(&f.objs, nil); err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			tb.Fatalf("load: %+v", ve)
		}
		tb.Fatalf("load: %v", err)
	}
	tb.Cleanup(func() {
		f.objs.MoatFilter.Close()
		f.objs.MoatMaps.Close()
	})
	return f
}

// Rules every test has: a deny prefix and a port rule.
var (
	denyNet   = netip.MustParsePrefix("10.0.0.0/8")
	denied4   = netip.MustParseAddr("10.1.2.3")
	clean4    = netip.MustParseAddr("203.0.113.7")
	server4   = netip.MustParseAddr("192.0.2.10")
	clean6    = netip.MustParseAddr("2001:db8:1::3")
	server6   = netip.MustParseAddr("2001:db8:ff::10")
	dropPort  = uint16(9)
	dropRule  = uint16(3)
	otherPort = uint16(80)
)

func (f *fixture) rules() {
	f.tb.Helper()
	m := &f.objs.MoatMaps
	key := datapath.MoatNetV4{Prefixlen: uint32(denyNet.Bits()), Addr: denyNet.Addr().As4()}
	if err := m.DenyV4Nets.Put(key, datapath.MoatPrefixRule{Prefixlen: uint32(denyNet.Bits())}); err != nil {
		f.tb.Fatal(err)
	}
	idx := uint32(datapath.MoatPortClassPORT_CLASS_UDP)<<16 | uint32(dropPort)
	if err := m.PortRules.Put(idx, datapath.MoatPortRule{Id: dropRule, Action: uint8(datapath.MoatRuleActionACTION_DROP)}); err != nil {
		f.tb.Fatal(err)
	}
	def := datapath.MoatPortRuleDef{Class: uint8(datapath.MoatPortClassPORT_CLASS_UDP), Action: uint8(datapath.MoatRuleActionACTION_DROP), From: dropPort, To: dropPort}
	if err := m.PortRuleDefs.Put(uint32(dropRule), def); err != nil {
		f.tb.Fatal(err)
	}
}

// maps hands a session its own handles, as PinnedMaps does.
func (f *fixture) maps() Maps {
	f.tb.Helper()
	m := &f.objs.MoatMaps
	var out Maps
	for _, x := range []struct{ dst, src **ebpf.Map }{
		{&out.Settings, &m.CaptureSettings}, {&out.Ring, &m.CaptureRing},
		{&out.Lost, &m.CaptureLost}, {&out.PortRuleDefs, &m.PortRuleDefs},
	} {
		c, err := (*x.src).Clone()
		if err != nil {
			f.tb.Fatal(err)
		}
		*x.dst = c
	}
	return out
}

func (f *fixture) start(flt Filter) *Session {
	f.tb.Helper()
	s, err := Start(f.maps(), flt, f.lock)
	if err != nil {
		f.tb.Fatalf("start: %v", err)
	}
	f.tb.Cleanup(func() { s.Close() })
	return s
}

// xdpMD is the kernel's struct xdp_md, the context of a test run.
type xdpMD struct {
	Data, DataEnd, DataMeta, IngressIfindex, RxQueueIndex, EgressIfindex uint32
}

// run runs pkt through the filter n times, arriving on ifindex (0: the
// test run's default, loopback), and returns the last verdict. Each run is
// a call of its own: the kernel restarts a repeated run that a signal
// interrupts, which would make counts inexact. The thread stays on one CPU
// throughout, for the per-CPU sample counter.
func (f *fixture) run(pkt []byte, n int, ifindex int) uint32 {
	f.tb.Helper()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var old unix.CPUSet
	if err := unix.SchedGetaffinity(0, &old); err != nil {
		f.tb.Fatal(err)
	}
	var one unix.CPUSet
	for cpu := 0; cpu < 1024; cpu++ {
		if old.IsSet(cpu) {
			one.Set(cpu)
			break
		}
	}
	if err := unix.SchedSetaffinity(0, &one); err != nil {
		f.tb.Fatal(err)
	}
	defer unix.SchedSetaffinity(0, &old)

	opts := &ebpf.RunOptions{Data: pkt}
	if ifindex != 0 {
		opts.Context = xdpMD{DataEnd: uint32(len(pkt)), IngressIfindex: uint32(ifindex)}
	}
	var ret uint32
	for i := 0; i < n; i++ {
		var err error
		if ret, err = f.objs.MoatFilter.Run(opts); err != nil {
			f.tb.Fatalf("run: %v", err)
		}
	}
	return ret
}

// drain reads every record that is in the ring.
func drain(tb testing.TB, s *Session) []Packet {
	tb.Helper()
	var out []Packet
	for {
		p, err := s.Next(time.Now().Add(50 * time.Millisecond))
		if errors.Is(err, ErrTimeout) {
			return out
		}
		if err != nil {
			tb.Fatalf("next: %v", err)
		}
		p.Data = bytes.Clone(p.Data)
		out = append(out, p)
	}
}

type testPacket struct {
	name   string
	pkt    []byte
	action uint8
	reason shield.Reason
	rule   string // comment the record must produce
}

func testPackets() []testPacket {
	return []testPacket{
		{"denied-tcp4", testpkt.TCPv4(denied4, server4, testpkt.TCP{SYN: true, SrcPort: 40000, DstPort: otherPort}),
			ActionDrop, datapath.MoatVerdictReasonREASON_DENYLIST, "moat: drop denylist rule=10.0.0.0/8"},
		{"clean-tcp4", testpkt.TCPv4(clean4, server4, testpkt.TCP{SYN: true, SrcPort: 40001, DstPort: otherPort}),
			ActionPass, datapath.MoatVerdictReasonREASON_PASS, "moat: pass pass"},
		{"port-drop-udp4", testpkt.UDPv4(clean4, server4, testpkt.UDP{SrcPort: 5353, DstPort: dropPort, Payload: []byte("x")}),
			ActionDrop, datapath.MoatVerdictReasonREASON_PORT_DROP, "moat: drop port_drop rule=#3 udp/9"},
		{"clean-tcp6", testpkt.TCPv6(clean6, server6, testpkt.TCP{SYN: true, SrcPort: 40002, DstPort: otherPort}),
			ActionPass, datapath.MoatVerdictReasonREASON_PASS, "moat: pass pass"},
		{"echo4", testpkt.IP(clean4, server4, testpkt.ICMPv4{Type: testpkt.ICMPv4EchoRequest, ID: 1, Seq: 1}),
			ActionPass, datapath.MoatVerdictReasonREASON_PASS, "moat: pass pass"},
		// A TCP header cut short: malformed, and TCP all the same to a
		// capture by protocol.
		{"short-tcp4", testpkt.IP(clean4, server4, testpkt.Payload{Proto: testpkt.ProtoTCP, Data: make([]byte, 6)}),
			ActionDrop, datapath.MoatVerdictReasonREASON_MALFORMED, "moat: drop malformed"},
		{"arp", testpkt.Frame{Net: testpkt.ARP{SenderIP: clean4, TargetIP: server4}}.Bytes(),
			ActionPass, datapath.MoatVerdictReasonREASON_NON_IP, "moat: pass non_ip"},
		// Capture does not walk IPv6 extension headers (capture_parse):
		// address filters match this packet, protocol and port filters
		// do not.
		{"hbh-tcp6", testpkt.Frame{
			Net: testpkt.IPv6{Src: clean6, Dst: server6, Ext: []testpkt.IPv6Ext{testpkt.HopByHop{}}},
			L4:  testpkt.TCP{SYN: true, SrcPort: 40003, DstPort: otherPort},
		}.Bytes(), ActionPass, datapath.MoatVerdictReasonREASON_PASS, "moat: pass pass"},
	}
}

// TestCaptureOff: with capture off, or on with a lease that has run out,
// the data path writes nothing; the lapsed lease turns capture off.
func TestCaptureOff(t *testing.T) {
	f := newFixture(t, 0)
	f.rules()
	for _, p := range testPackets() {
		f.run(p.pkt, 10, 0)
	}
	if n := ringBytes(t, f); n != 0 {
		t.Fatalf("capture off: %d bytes in the ring", n)
	}

	cfg := Filter{}.config()
	cfg.Enabled, cfg.Session = 1, 7
	cfg.LeaseNs = uint64(clockNow(unix.CLOCK_BOOTTIME) - int64(time.Millisecond))
	if err := f.objs.CaptureSettings.Put(uint32(0), cfg); err != nil {
		t.Fatal(err)
	}
	f.run(testPackets()[0].pkt, 1, 0)
	if n := ringBytes(t, f); n != 0 {
		t.Fatalf("lapsed lease: %d bytes in the ring", n)
	}
	if enabled(t, f) {
		t.Fatal("the data path left capture on past its lease")
	}

	// Packets the filter does not want check the lease too, though only
	// one in 256 at random: after 5,000 the chance of none is 3e-9.
	cfg = Filter{Verdicts: VerdictDrop}.config()
	cfg.Enabled, cfg.Session = 1, 8
	cfg.LeaseNs = uint64(clockNow(unix.CLOCK_BOOTTIME) - int64(time.Millisecond))
	if err := f.objs.CaptureSettings.Put(uint32(0), cfg); err != nil {
		t.Fatal(err)
	}
	f.run(testPackets()[1].pkt, 5000, 0)
	if n := ringBytes(t, f); n != 0 || enabled(t, f) {
		t.Fatalf("lapsed lease, unwanted packets: %d bytes in the ring, capture on %v", n, enabled(t, f))
	}
}

func enabled(tb testing.TB, f *fixture) bool {
	tb.Helper()
	var got datapath.MoatCaptureConfig
	if err := f.objs.CaptureSettings.Lookup(uint32(0), &got); err != nil {
		tb.Fatal(err)
	}
	return got.Enabled != 0
}

// ringBytes is what the ring holds unread.
func ringBytes(tb testing.TB, f *fixture) int {
	tb.Helper()
	rd, err := ringbuf.NewReader(f.objs.CaptureRing)
	if err != nil {
		tb.Fatal(err)
	}
	defer rd.Close()
	return rd.AvailableBytes()
}

// TestCaptureFilters runs every test packet under each filter and checks
// that exactly the matching ones are recorded, with their verdict, reason,
// rule, interface and bytes.
func TestCaptureFilters(t *testing.T) {
	f := newFixture(t, 0)
	f.rules()
	pkts := testPackets()
	names := func(ns ...string) map[string]bool {
		m := map[string]bool{}
		for _, n := range ns {
			m[n] = true
		}
		return m
	}
	all := names("denied-tcp4", "clean-tcp4", "port-drop-udp4", "clean-tcp6", "echo4", "short-tcp4", "arp", "hbh-tcp6")
	const lo = 1 // the loopback device, always ifindex 1 in a namespace
	cases := []struct {
		name    string
		filter  Filter
		ifindex int
		want    map[string]bool
	}{
		{"all", Filter{}, 0, all},
		{"verdict-drop", Filter{Verdicts: VerdictDrop}, 0, names("denied-tcp4", "port-drop-udp4", "short-tcp4")},
		{"verdict-pass", Filter{Verdicts: VerdictPass}, 0, names("clean-tcp4", "clean-tcp6", "echo4", "arp", "hbh-tcp6")},
		{"host-src", Filter{Prefix: netip.PrefixFrom(clean4, 32)}, 0, names("clean-tcp4", "port-drop-udp4", "echo4", "short-tcp4")},
		{"host-dst", Filter{Prefix: netip.PrefixFrom(server4, 32)}, 0, names("denied-tcp4", "clean-tcp4", "port-drop-udp4", "echo4", "short-tcp4")},
		{"net4", Filter{Prefix: denyNet}, 0, names("denied-tcp4")},
		{"net6", Filter{Prefix: netip.MustParsePrefix("2001:db8::/32")}, 0, names("clean-tcp6", "hbh-tcp6")},
		{"host6-dst", Filter{Prefix: netip.PrefixFrom(server6, 128)}, 0, names("clean-tcp6", "hbh-tcp6")},
		{"proto-tcp", Filter{Proto: ProtoTCP}, 0, names("denied-tcp4", "clean-tcp4", "clean-tcp6", "short-tcp4")},
		{"net6-other", Filter{Prefix: netip.MustParsePrefix("2001:db8:1:1::/64")}, 0, names()},
		{"proto-udp", Filter{Proto: ProtoUDP}, 0, names("port-drop-udp4")},
		{"proto-icmp", Filter{Proto: ProtoICMP}, 0, names("echo4")},
		{"proto-tcp-drop", Filter{Proto: ProtoTCP, Verdicts: VerdictDrop}, 0, names("denied-tcp4", "short-tcp4")},
		{"port-dst", Filter{Port: dropPort, HasPort: true}, 0, names("port-drop-udp4")},
		{"port-src", Filter{Port: 40002, HasPort: true}, 0, names("clean-tcp6")},
		{"port-src-ext", Filter{Port: 40003, HasPort: true}, 0, names()},
		{"port-80-v4", Filter{Port: otherPort, HasPort: true, Prefix: netip.MustParsePrefix("0.0.0.0/0")}, 0, names("denied-tcp4", "clean-tcp4")},
		{"ifindex-match", Filter{Ifindex: lo}, lo, all},
		{"ifindex-other", Filter{Ifindex: lo + 1000}, lo, names()},
	}
	byName := map[string]testPacket{}
	for _, p := range pkts {
		byName[p.name] = p
	}
	names2 := PortRuleNames(f.objs.PortRuleDefs)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := f.start(c.filter)
			start := time.Now()
			for _, p := range pkts {
				if got := f.run(p.pkt, 1, c.ifindex); got != uint32(p.action) {
					t.Fatalf("%s: verdict %d, want %d", p.name, got, p.action)
				}
			}
			got := drain(t, s)
			if lost, err := s.Lost(); err != nil || lost != 0 {
				t.Errorf("lost %d (%v)", lost, err)
			}
			s.Close()
			// Without a context, a test run arrives on the loopback device.
			wantIf := c.ifindex
			if wantIf == 0 {
				wantIf = lo
			}
			seen := map[string]bool{}
			for _, r := range got {
				var match *testPacket
				for i := range pkts {
					if bytes.Equal(pkts[i].pkt, r.Data) {
						match = &pkts[i]
					}
				}
				if match == nil {
					t.Fatalf("record of %d bytes matches no packet sent", len(r.Data))
				}
				if seen[match.name] {
					t.Errorf("%s recorded twice", match.name)
				}
				seen[match.name] = true
				if r.Action != match.action || r.Reason != match.reason || r.Length != len(match.pkt) || r.Ifindex != wantIf {
					t.Errorf("%s: record action %d reason %d length %d ifindex %d, want %d %d %d %d",
						match.name, r.Action, r.Reason, r.Length, r.Ifindex, match.action, match.reason, len(match.pkt), wantIf)
				}
				if cm := Comment(r, names2); cm != match.rule {
					t.Errorf("%s: comment %q, want %q", match.name, cm, match.rule)
				}
				if d := r.Time.Sub(start); d < -time.Second || d > 5*time.Second {
					t.Errorf("%s: timestamp %v is %v from the run", match.name, r.Time, d)
				}
			}
			for n := range all {
				if seen[n] != c.want[n] {
					t.Errorf("%s: captured %v, want %v", n, seen[n], c.want[n])
				}
			}
		})
	}
}

// TestCaptureMonitored: in monitor mode a frame a rule would drop passes,
// and its record says pass, marked monitored; a drop selection still
// takes it, a pass selection takes only what passed by judgement.
func TestCaptureMonitored(t *testing.T) {
	f := newFixture(t, 0)
	f.rules()
	if err := f.objs.Settings.Put(uint32(0), datapath.MoatRuntimeSettings{Monitor: 1}); err != nil {
		t.Fatal(err)
	}
	denied := testpkt.TCPv4(denied4, server4, testpkt.TCP{SYN: true, SrcPort: 40000, DstPort: otherPort})
	clean := testpkt.TCPv4(clean4, server4, testpkt.TCP{SYN: true, SrcPort: 40001, DstPort: otherPort})
	for _, c := range []struct {
		verdicts Verdicts
		want     []string // comments, in order
	}{
		{VerdictDrop, []string{"moat: monitored denylist rule=10.0.0.0/8"}},
		{VerdictPass, []string{"moat: pass pass"}},
		{VerdictAll, []string{"moat: monitored denylist rule=10.0.0.0/8", "moat: pass pass"}},
	} {
		s := f.start(Filter{Verdicts: c.verdicts})
		for _, pkt := range [][]byte{denied, clean} {
			if got := f.run(pkt, 1, 0); got != ActionPass {
				t.Fatalf("verdict %d in monitor mode, want XDP_PASS", got)
			}
		}
		got := drain(t, s)
		s.Close()
		var comments []string
		for _, r := range got {
			if r.Action != ActionPass {
				t.Errorf("record action %d, want pass", r.Action)
			}
			if r.Monitored != bytes.Equal(r.Data, denied) {
				t.Errorf("record of the %s frame: monitored %v", map[bool]string{true: "denied", false: "clean"}[bytes.Equal(r.Data, denied)], r.Monitored)
			}
			comments = append(comments, Comment(r, nil))
		}
		if fmt.Sprint(comments) != fmt.Sprint(c.want) {
			t.Errorf("verdicts %d: records %q, want %q", c.verdicts, comments, c.want)
		}
	}
}

// TestCaptureSnaplen: frames are cut at the snap length and keep their
// length; a frame in every size class comes back whole.
func TestCaptureSnaplen(t *testing.T) {
	f := newFixture(t, 0)
	for _, size := range []int{0, 1, 60, 200, 1000, 1400, 3000} {
		pkt := testpkt.UDPv4(clean4, server4, testpkt.UDP{SrcPort: 1, DstPort: 2, Payload: bytes.Repeat([]byte{0xa5}, size)})
		for _, snap := range []uint32{0, 14, 64, 65, 1500, MaxSnaplen} {
			t.Run(fmt.Sprintf("frame%d-snap%d", len(pkt), snap), func(t *testing.T) {
				s := f.start(Filter{Snaplen: snap})
				f.run(pkt, 1, 0)
				got := drain(t, s)
				s.Close()
				if len(got) != 1 {
					t.Fatalf("%d records, want 1", len(got))
				}
				want := len(pkt)
				if snap != 0 && int(snap) < want {
					want = int(snap)
				}
				if got[0].Length != len(pkt) || !bytes.Equal(got[0].Data, pkt[:want]) {
					t.Fatalf("record length %d with %d bytes, want %d with the frame's first %d", got[0].Length, len(got[0].Data), len(pkt), want)
				}
			})
		}
	}
}

// TestCaptureSample: 1 in N of the matching packets, counted per CPU, so
// the run stays on one CPU.
func TestCaptureSample(t *testing.T) {
	f := newFixture(t, 0)
	f.rules()
	pkts := testPackets()
	for _, c := range []struct{ n, sample, want uint32 }{{10, 1, 10}, {10, 3, 4}, {9, 3, 3}, {100, 10, 10}, {5, 100, 1}} {
		t.Run(fmt.Sprintf("%d-in-1/%d", c.n, c.sample), func(t *testing.T) {
			clearSeen(t, f)
			// Denied packets only: the clean ones do not match, and must
			// not advance the sample counter either.
			s := f.start(Filter{Sample: c.sample, Verdicts: VerdictDrop, Prefix: denyNet})
			f.run(pkts[1].pkt, int(c.n), 0)
			f.run(pkts[0].pkt, int(c.n), 0)
			got := drain(t, s)
			s.Close()
			if uint32(len(got)) != c.want {
				t.Fatalf("%d records, want %d", len(got), c.want)
			}
		})
	}
}

func clearSeen(tb testing.TB, f *fixture) {
	tb.Helper()
	zero := make([]uint64, runtime.NumCPU())
	if n, err := ebpf.PossibleCPU(); err == nil {
		zero = make([]uint64, n)
	}
	if err := f.objs.CaptureSeen.Put(uint32(0), zero); err != nil {
		tb.Fatal(err)
	}
}

// TestCaptureLost: records that do not fit in the ring are counted, and
// the count plus the records is every matching packet.
func TestCaptureLost(t *testing.T) {
	f := newFixture(t, uint32(unix.Getpagesize()))
	s := f.start(Filter{})
	const n = 200
	pkt := testPackets()[1].pkt
	f.run(pkt, n, 0)
	lost, err := s.Lost()
	if err != nil {
		t.Fatal(err)
	}
	got := drain(t, s)
	if lost == 0 || len(got) == 0 || uint64(len(got))+lost != n {
		t.Fatalf("%d records and %d lost, want %d in all with some of each", len(got), lost, n)
	}
	// Drained, the ring takes records again, and the count only grows.
	f.run(pkt, 1, 0)
	if got := drain(t, s); len(got) != 1 {
		t.Fatalf("after draining: %d records, want 1", len(got))
	}
	if l, _ := s.Lost(); l != lost {
		t.Fatalf("lost went from %d to %d with room in the ring", lost, l)
	}
}

// TestSession: one session at a time; records of an earlier session that
// was killed are skipped; Close turns capture off.
func TestSession(t *testing.T) {
	f := newFixture(t, 0)
	pkt := testPackets()[1].pkt

	first, err := Start(f.maps(), Filter{}, f.lock)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Start(f.maps(), Filter{}, f.lock); !errors.Is(err, ErrBusy) {
		t.Fatalf("second session: %v, want ErrBusy", err)
	}
	f.run(pkt, 5, 0)
	// Killed: renewals stop and the lock goes with the process; its
	// records stay in the ring, and capture stays on until the lease
	// runs out.
	close(first.stop)
	<-first.renewDone
	first.release()

	second := f.start(Filter{})
	f.run(pkt, 2, 0)
	if got := drain(t, second); len(got) != 2 {
		t.Fatalf("second session read %d records, want its own 2", len(got))
	}
	if second.stale != 5 {
		t.Fatalf("skipped %d records of the first session, want 5", second.stale)
	}
	if err := second.Close(); err != nil {
		t.Fatal(err)
	}
	var cfg datapath.MoatCaptureConfig
	if err := f.objs.CaptureSettings.Lookup(uint32(0), &cfg); err != nil {
		t.Fatal(err)
	}
	if cfg.Enabled != 0 {
		t.Fatal("capture still on after Close")
	}
	f.run(pkt, 3, 0)
	if n := ringBytes(t, f); n != 0 {
		t.Fatalf("closed: %d bytes in the ring", n)
	}
}

// TestPortRuleNames: a dump names a port rule as `moat list` does, ICMP
// types by name.
func TestPortRuleNames(t *testing.T) {
	f := newFixture(t, 0)
	for id, d := range map[uint32]datapath.MoatPortRuleDef{
		7: {Class: uint8(datapath.MoatPortClassPORT_CLASS_ICMP), Action: uint8(datapath.MoatRuleActionACTION_DROP), From: 8, To: 8},
		8: {Class: uint8(datapath.MoatPortClassPORT_CLASS_TCP), Action: uint8(datapath.MoatRuleActionACTION_ALLOW), From: 6000, To: 6063},
	} {
		if err := f.objs.PortRuleDefs.Put(id, d); err != nil {
			t.Fatal(err)
		}
	}
	name := PortRuleNames(f.objs.PortRuleDefs)
	for id, want := range map[uint16]string{7: "icmp/echo-request", 8: "tcp/6000-6063", 9: ""} {
		if got := name(id); got != want {
			t.Errorf("rule %d named %q, want %q", id, got, want)
		}
	}
}
