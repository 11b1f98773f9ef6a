package datapath

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/moat-shield/moat/internal/testpkt"
)

// benchRepeat is how many times the kernel runs the program over one frame
// per BPF_PROG_TEST_RUN call; the kernel reports the mean time per run.
const benchRepeat = 1_000_000

// Sources of the benchmark packets; the generated prefixes avoid them.
var (
	benchAllowed  = netip.MustParseAddr("10.9.9.9")    // allow host
	benchDenyHost = netip.MustParseAddr("10.1.2.3")    // deny host
	benchDenyNet  = netip.MustParseAddr("11.2.3.4")    // only 11.0.0.0/8 covers it
	benchClean    = netip.MustParseAddr("203.0.113.7") // no rule covers it
)

// tenPrefixes is the small rule set: 10 prefixes over both lists, both
// families, host maps and tries.
func tenPrefixes(f *fixture) {
	f.allow("10.9.9.9/32")
	f.allow("192.168.0.0/16")
	f.allow("2001:db8:ffff::/48")
	f.deny("10.1.2.3/32")
	f.deny("11.0.0.0/8")
	f.deny("172.16.0.0/12")
	f.deny("100.64.0.0/10")
	f.deny("198.18.0.0/15")
	f.deny("2001:db8::/32")
	f.deny("2001:db8:1:2::3/128")
	f.portRule(cTCP, 22, 22, 1, aDrop)
}

// prefixSet is a generated deny list, split the way the control plane
// stores it.
type prefixSet struct {
	hosts4 []MoatHostV4
	hosts6 []MoatHostV6
	nets4  []MoatNetV4
	nets6  []MoatNetV6
}

func (s *prefixSet) len() int { return len(s.hosts4) + len(s.hosts6) + len(s.nets4) + len(s.nets6) }

// genPrefixes returns n distinct deny prefixes: 40% IPv4 /32s, 10% IPv6
// /128s, 35% IPv4 CIDRs of /9../31 and 15% IPv6 CIDRs of /16../127. None
// covers the benchmark sources, so the /8 stays the longest match for
// benchDenyNet and the clean source stays clean.
func genPrefixes(n int) *prefixSet {
	r := rand.New(rand.NewPCG(1, 2))
	s := &prefixSet{}
	seen4 := map[MoatNetV4]bool{}
	seen6 := map[MoatNetV6]bool{}
	// First bytes in use by the benchmark sources and the ten prefixes.
	reserved4 := func(b byte) bool { return b == 10 || b == 11 || b == 203 || b == 0 }
	want := [4]int{n * 40 / 100, n * 10 / 100, n * 35 / 100, 0}
	want[3] = n - want[0] - want[1] - want[2]

	for len(s.hosts4) < want[0] {
		a := r.Uint32()
		b := [4]byte{byte(a >> 24), byte(a >> 16), byte(a >> 8), byte(a)}
		k := MoatNetV4{Prefixlen: 32, Addr: b}
		if reserved4(b[0]) || seen4[k] {
			continue
		}
		seen4[k] = true
		s.hosts4 = append(s.hosts4, MoatHostV4{Addr: b})
	}
	for len(s.nets4) < want[2] {
		bits := 9 + r.IntN(23)
		a := r.Uint32()
		p := netip.PrefixFrom(netip.AddrFrom4([4]byte{byte(a >> 24), byte(a >> 16), byte(a >> 8), byte(a)}), bits).Masked()
		k := MoatNetV4{Prefixlen: uint32(bits), Addr: p.Addr().As4()}
		if reserved4(k.Addr[0]) || seen4[k] {
			continue
		}
		seen4[k] = true
		s.nets4 = append(s.nets4, k)
	}
	rand6 := func() [16]byte {
		var b [16]byte
		for i := 0; i < 16; i += 8 {
			v := r.Uint64()
			for j := 0; j < 8; j++ {
				b[i+j] = byte(v >> (8 * j))
			}
		}
		b[0] = 0x24 + byte(r.IntN(8)) // 2400::/5-ish, away from 2001:db8::/32
		return b
	}
	for len(s.hosts6) < want[1] {
		k := MoatNetV6{Prefixlen: 128, Addr: rand6()}
		if seen6[k] {
			continue
		}
		seen6[k] = true
		s.hosts6 = append(s.hosts6, MoatHostV6{Addr: k.Addr})
	}
	for len(s.nets6) < want[3] {
		bits := 16 + r.IntN(112)
		p := netip.PrefixFrom(netip.AddrFrom16(rand6()), bits).Masked()
		k := MoatNetV6{Prefixlen: uint32(bits), Addr: p.Addr().As16()}
		if seen6[k] {
			continue
		}
		seen6[k] = true
		s.nets6 = append(s.nets6, k)
	}
	return s
}

// loadReport is how long loading took and how much kernel memory the maps
// hold afterwards.
type loadReport struct {
	lines []string
}

func (r *loadReport) addf(format string, args ...any) {
	r.lines = append(r.lines, fmt.Sprintf(format, args...))
}

// batchPut writes keys and values in chunks with BPF_MAP_UPDATE_BATCH; if
// the map type has no batch support it falls back to one update per
// element and says so.
func batchPut[K, V any](m *ebpf.Map, keys []K, vals []V) (batched bool, err error) {
	const chunk = 65536
	for i := 0; i < len(keys); i += chunk {
		j := min(i+chunk, len(keys))
		if _, err := m.BatchUpdate(keys[i:j], vals[i:j], nil); err != nil {
			if errors.Is(err, ebpf.ErrNotSupported) && i == 0 {
				return false, putEach(m, keys, vals)
			}
			return true, err
		}
	}
	return true, nil
}

func putEach[K, V any](m *ebpf.Map, keys []K, vals []V) error {
	for i := range keys {
		if err := m.Put(keys[i], vals[i]); err != nil {
			return err
		}
	}
	return nil
}

func memlock(tb testing.TB, m *ebpf.Map) uint64 {
	info, err := m.Info()
	if err != nil {
		tb.Fatalf("map info: %v", err)
	}
	n, _ := info.Memlock()
	return n
}

func mib(n uint64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }

// loadPrefixSet loads s into the deny maps of f, timing each map, and
// reports load rate and kernel memory (memlock from the map's fdinfo).
// perElement forces one update per element, for comparison.
func loadPrefixSet(tb testing.TB, f *fixture, s *prefixSet, perElement bool) *loadReport {
	tb.Helper()
	rep := &loadReport{}
	m := &f.objs.MoatMaps
	load := func(name string, mp *ebpf.Map, n int, put func() (bool, error)) {
		before := memlock(tb, mp)
		start := time.Now()
		batched, err := put()
		d := time.Since(start)
		if err != nil {
			tb.Fatalf("load %s: %v", name, err)
		}
		how := "batched"
		switch {
		case perElement:
			how = "per element"
		case !batched:
			how = "per element (this kernel has no batch update for the map type)"
		}
		rep.addf("%-14s %8d entries %8.0f ms %6.2f M/s %-8s memlock %s (+%s)",
			name, n, float64(d.Microseconds())/1000, float64(n)/d.Seconds()/1e6, how, mib(memlock(tb, mp)), mib(memlock(tb, mp)-before))
	}
	vals := func(n int, bits uint32) []MoatPrefixRule {
		v := make([]MoatPrefixRule, n)
		for i := range v {
			v[i].Prefixlen = bits
		}
		return v
	}
	put := func(mp *ebpf.Map, keys any, v []MoatPrefixRule) func() (bool, error) {
		return func() (bool, error) {
			switch k := keys.(type) {
			case []MoatHostV4:
				if perElement {
					return false, putEach(mp, k, v)
				}
				return batchPut(mp, k, v)
			case []MoatHostV6:
				if perElement {
					return false, putEach(mp, k, v)
				}
				return batchPut(mp, k, v)
			case []MoatNetV4:
				if perElement {
					return false, putEach(mp, k, v)
				}
				return batchPut(mp, k, v)
			case []MoatNetV6:
				if perElement {
					return false, putEach(mp, k, v)
				}
				return batchPut(mp, k, v)
			}
			return false, fmt.Errorf("unknown key type %T", keys)
		}
	}
	nv4 := vals(len(s.nets4), 0)
	for i := range nv4 {
		nv4[i].Prefixlen = s.nets4[i].Prefixlen
	}
	nv6 := vals(len(s.nets6), 0)
	for i := range nv6 {
		nv6[i].Prefixlen = s.nets6[i].Prefixlen
	}
	start := time.Now()
	load("deny_v4_hosts", m.DenyV4Hosts, len(s.hosts4), put(m.DenyV4Hosts, s.hosts4, vals(len(s.hosts4), 32)))
	load("deny_v6_hosts", m.DenyV6Hosts, len(s.hosts6), put(m.DenyV6Hosts, s.hosts6, vals(len(s.hosts6), 128)))
	load("deny_v4_nets", m.DenyV4Nets, len(s.nets4), put(m.DenyV4Nets, s.nets4, nv4))
	load("deny_v6_nets", m.DenyV6Nets, len(s.nets6), put(m.DenyV6Nets, s.nets6, nv6))
	d := time.Since(start)
	var total uint64
	for _, mp := range []*ebpf.Map{m.DenyV4Hosts, m.DenyV6Hosts, m.DenyV4Nets, m.DenyV6Nets} {
		total += memlock(tb, mp)
	}
	rep.addf("total %d prefixes in %.2f s (%.2f M/s), deny maps hold %s of kernel memory",
		s.len(), d.Seconds(), float64(s.len())/d.Seconds()/1e6, mib(total))
	return rep
}

// nsPerPacket runs pkt benchRepeat times in the kernel and returns the mean
// time per run, after checking the verdict of the path being measured.
func nsPerPacket(tb testing.TB, f *fixture, pkt []byte, want uint32) float64 {
	tb.Helper()
	ret, d, err := f.objs.MoatFilter.Benchmark(pkt, benchRepeat, nil)
	if err != nil {
		tb.Fatalf("benchmark run: %v", err)
	}
	if ret != want {
		tb.Fatalf("verdict %s, want %s: the benchmark is not measuring the path it names", verdictName(ret), verdictName(want))
	}
	return float64(d.Nanoseconds())
}

type benchPath struct {
	name    string
	f       *fixture
	pkt     []byte
	verdict uint32
}

// BenchmarkVerdictPaths measures ns per packet through moat_filter for each
// verdict path, with 10 prefixes and (unless -short) with 1,000,000 more, and
// prints the figures side by side with the ratio of the /8 deny path with
// 1M prefixes to the same path with 10. Run with e.g.
//
//	go test -run xxx -bench VerdictPaths -benchtime 1x ./internal/datapath/
func BenchmarkVerdictPaths(b *testing.B) {
	tcp := func(src netip.Addr, dport uint16) []byte {
		return testpkt.TCPv4(src, dst4, testpkt.TCP{SYN: true, SrcPort: 40000, DstPort: dport})
	}
	empty := newFixture(b)
	ten := newFixture(b)
	tenPrefixes(ten)

	paths := []benchPath{
		{"pass-no-rules", empty, tcp(benchClean, 80), xdpPass},
		{"pass-10", ten, tcp(benchClean, 80), xdpPass},
		{"allowlisted-host-10", ten, tcp(benchAllowed, 80), xdpPass},
		{"deny-host-10", ten, tcp(benchDenyHost, 80), xdpDrop},
		{"deny-net8-10", ten, tcp(benchDenyNet, 80), xdpDrop},
		{"port-drop-10", ten, tcp(benchClean, 22), xdpDrop},
	}
	var load *loadReport
	if !testing.Short() {
		million := newFixture(b)
		tenPrefixes(million)
		load = loadPrefixSet(b, million, genPrefixes(1_000_000), false)
		paths = append(paths,
			benchPath{"pass-1M", million, tcp(benchClean, 80), xdpPass},
			benchPath{"deny-host-1M", million, tcp(benchDenyHost, 80), xdpDrop},
			benchPath{"deny-net8-1M", million, tcp(benchDenyNet, 80), xdpDrop},
			benchPath{"port-drop-1M", million, tcp(benchClean, 22), xdpDrop},
		)
	}

	results := map[string]float64{}
	for _, p := range paths {
		b.Run(p.name, func(b *testing.B) {
			p.f.tb = b
			var total float64
			for i := 0; i < b.N; i++ {
				total += nsPerPacket(b, p.f, p.pkt, p.verdict)
			}
			results[p.name] = total / float64(b.N)
			// One op is one packet: the Go-side time of an iteration is
			// the whole repeat loop plus the syscall, so it is replaced.
			b.ReportMetric(results[p.name], "ns/op")
		})
	}

	var out strings.Builder
	fmt.Fprintf(&out, "ns per packet (BPF_PROG_TEST_RUN, repeat %d, mean per run):\n", benchRepeat)
	for _, p := range paths {
		if ns, ok := results[p.name]; ok {
			fmt.Fprintf(&out, "  %-20s %7.1f ns\n", p.name, ns)
		}
	}
	if load == nil {
		fmt.Print(out.String())
		return
	}
	// A parent benchmark's own log is not printed, so the side-by-side
	// figures come from a last sub-benchmark. Its ratio is measured in
	// interleaved runs, so drift from other load on the machine hits both
	// sides alike.
	b.Run("ratio-deny-net8-1M-over-10", func(b *testing.B) {
		tenPath, millionPath := paths[4], paths[len(paths)-2]
		var ratio float64
		var summary string
		for i := 0; i < b.N; i++ {
			var small, large []float64
			for j := 0; j < 5; j++ {
				small = append(small, nsPerPacket(b, tenPath.f, tenPath.pkt, xdpDrop))
				large = append(large, nsPerPacket(b, millionPath.f, millionPath.pkt, xdpDrop))
			}
			slices.Sort(small)
			slices.Sort(large)
			ratio = large[2] / small[2]
			summary = fmt.Sprintf("deny by /8: 10 prefixes %.1f ns, 1,000,010 prefixes %.1f ns, ratio 1M/10 = %.2f (medians of 5 interleaved runs)\n",
				small[2], large[2], ratio)
		}
		b.ReportMetric(ratio, "ratio")
		b.ReportMetric(0, "ns/op")
		// Printed, not logged: the testing package cuts benchmark logs to
		// ten lines without -v.
		fmt.Print(out.String() + summary +
			fmt.Sprintf("loading 1,000,000 deny prefixes:\n  %s\n", strings.Join(load.lines, "\n  ")))
	})
}

// BenchmarkLoadPrefixes measures loading 1,000,000 mixed prefixes into
// fresh maps, batched and one update per element, and the kernel memory of
// the maps. Skipped with -short.
func BenchmarkLoadPrefixes(b *testing.B) {
	if testing.Short() {
		b.Skip("loads 1,000,000 prefixes")
	}
	set := genPrefixes(1_000_000)
	for _, mode := range []struct {
		name       string
		perElement bool
	}{{"batched", false}, {"per-element", true}} {
		b.Run(mode.name, func(b *testing.B) {
			var lines []string
			for i := 0; i < b.N; i++ {
				f := newFixture(b)
				start := time.Now()
				rep := loadPrefixSet(b, f, set, mode.perElement)
				b.ReportMetric(time.Since(start).Seconds(), "s/1M-prefixes")
				lines = rep.lines
				// Free the 1M entries now rather than at the end of the run.
				f.objs.MoatFilter.Close()
				f.objs.MoatMaps.Close()
			}
			b.Log("\n  " + strings.Join(lines, "\n  "))
		})
	}
}

// TestPrefixSetLoads loads a small generated set through the same helper as
// the benchmarks and checks that the filter then denies from it, so the
// benchmark's loader is known to write entries the filter finds.
func TestPrefixSetLoads(t *testing.T) {
	f := newFixture(t)
	s := genPrefixes(2000)
	loadPrefixSet(t, f, s, false)
	pick := []netip.Addr{
		netip.AddrFrom4(s.hosts4[7].Addr),
		netip.AddrFrom16(s.hosts6[3].Addr),
		netip.AddrFrom4(s.nets4[5].Addr),
		netip.AddrFrom16(s.nets6[9].Addr),
	}
	for _, a := range pick {
		var pkt []byte
		if a.Is4() {
			pkt = testpkt.TCPv4(a, dst4, testpkt.TCP{DstPort: 80})
		} else {
			pkt = testpkt.TCPv6(a, dst6, testpkt.TCP{DstPort: 80})
		}
		if v := f.run(pkt); v != xdpDrop {
			t.Errorf("source %v from the generated set: %s", a, verdictName(v))
		}
	}
	for _, pkt := range [][]byte{tcp4From(benchClean, 80), tcp4From(benchDenyNet, 80), tcp6(80)} {
		if v := f.run(pkt); v != xdpPass {
			t.Errorf("a benchmark source is covered by the generated set: %s", verdictName(v))
		}
	}
}
