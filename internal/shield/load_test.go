package shield_test

import (
	"bufio"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	mrand "math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/moat-shield/moat/internal/datapath"
	"github.com/moat-shield/moat/internal/rules"
	"github.com/moat-shield/moat/internal/shield"
)

// openFresh opens the shield on a root unique to the test and removes the
// root and its lock file when the test ends.
func openFresh(tb testing.TB) *shield.Shield {
	tb.Helper()
	return openFreshSized(tb, nil)
}

// openFreshSized is openFresh with shared maps of other sizes, by name.
func openFreshSized(tb testing.TB, sizes map[string]uint32) *shield.Shield {
	tb.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs("/sys/fs/bpf", &st); err != nil || st.Type != unix.BPF_FS_MAGIC {
		tb.Skip("no bpffs at /sys/fs/bpf")
	}
	var rnd [6]byte
	rand.Read(rnd[:])
	base := "moat-test-" + hex.EncodeToString(rnd[:])
	root := filepath.Join("/sys/fs/bpf", base)
	s, err := shield.OpenSized(root, sizes)
	if err != nil {
		tb.Fatalf("open %s: %v", root, err)
	}
	tb.Cleanup(func() {
		s.Close()
		if err := os.RemoveAll(root); err != nil {
			tb.Errorf("remove %s: %v", root, err)
		}
		locks, _ := filepath.Glob("/run/moat-*" + base + "*.lock")
		for _, l := range locks {
			os.Remove(l)
		}
	})
	return s
}

// mixedPrefixes returns n distinct, masked deny entries, in the proportions
// of a big real blocklist: 60% IPv4 hosts, 20% IPv4 networks of /16 to /30,
// 15% IPv6 hosts and 5% IPv6 networks of /40 to /64.
func mixedPrefixes(n int) []rules.PrefixEntry {
	out := make([]rules.PrefixEntry, 0, n)
	v4hosts, v4nets, v6hosts := n*60/100, n*20/100, n*15/100
	v6nets := n - v4hosts - v4nets - v6hosts
	for i := 0; i < v4hosts; i++ {
		// 3 apart from 11.0.0.0 so that neighbours land in different
		// hash buckets and /24s: no accidental structure.
		a := uint32(11<<24) + uint32(i)*3
		out = append(out, entry(netip.PrefixFrom(v4(a), 32)))
	}
	for i := 0; i < v4nets; i++ {
		bits := 16 + i%15
		a := uint32(64<<24) + uint32(i/15)<<(32-bits)
		out = append(out, entry(netip.PrefixFrom(v4(a), bits)))
	}
	for i := 0; i < v6hosts; i++ {
		var b [16]byte
		binary.BigEndian.PutUint64(b[:8], 0x20010db8_01000000)
		binary.BigEndian.PutUint64(b[8:], uint64(i)*0x9e3779b9+1)
		out = append(out, entry(netip.PrefixFrom(netip.AddrFrom16(b), 128)))
	}
	for i := 0; i < v6nets; i++ {
		bits := 40 + i%25
		var b [16]byte
		binary.BigEndian.PutUint64(b[:8], 0x20010db8_00000000+uint64(i/25+1)<<(64-bits))
		out = append(out, entry(netip.PrefixFrom(netip.AddrFrom16(b), bits)))
	}
	return out
}

func v4(a uint32) netip.Addr {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], a)
	return netip.AddrFrom4(b)
}

func entry(p netip.Prefix) rules.PrefixEntry { return rules.PrefixEntry{Prefix: p} }

// ruleMapsMemlock sums what the kernel charges for the shared rule maps,
// as /proc/self/fdinfo reports it.
func ruleMapsMemlock(tb testing.TB, s *shield.Shield) uint64 {
	tb.Helper()
	var total uint64
	for _, name := range []string{
		datapath.MoatMapDenyV4Hosts, datapath.MoatMapDenyV4Nets,
		datapath.MoatMapDenyV6Hosts, datapath.MoatMapDenyV6Nets,
	} {
		m := s.Map(name)
		if m == nil {
			tb.Fatalf("no map %s", name)
		}
		f, err := os.Open(fmt.Sprintf("/proc/self/fdinfo/%d", m.FD()))
		if err != nil {
			tb.Fatal(err)
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if v, ok := strings.CutPrefix(sc.Text(), "memlock:"); ok {
				n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
				if err != nil {
					tb.Fatalf("fdinfo of %s: %v", name, err)
				}
				total += n
			}
		}
		f.Close()
	}
	return total
}

func TestLoadHundredThousand(t *testing.T) {
	const n = 100_000
	s := openFresh(t)
	entries := mixedPrefixes(n)
	start := time.Now()
	res, err := s.Apply(&rules.Ruleset{Deny: entries}, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("loaded %d prefixes in %s, rule maps hold %d KiB", n, time.Since(start).Round(time.Millisecond), ruleMapsMemlock(t, s)>>10)
	if res.Added != n {
		t.Fatalf("Apply added %d, want %d", res.Added, n)
	}
	if got, err := s.Count(shield.DenyList); err != nil || got != n {
		t.Fatalf("deny count %d (%v), want %d", got, err, n)
	}
	if got, err := s.Count(shield.AllowList); err != nil || got != 0 {
		t.Fatalf("allow count %d (%v), want 0", got, err)
	}
	// Every kind landed where lookups find it.
	for _, i := range []int{0, n*60/100 - 1, n * 60 / 100, n*80/100 + 7, n*95/100 + 3, n - 1} {
		if ok, err := s.Has(shield.DenyList, entries[i].Prefix); err != nil || !ok {
			t.Errorf("entry %d (%s) not found: %v", i, entries[i].Prefix, err)
		}
	}
	if ok, _ := s.Has(shield.DenyList, netip.MustParsePrefix("11.0.0.1/32")); ok {
		t.Error("an address between two loaded hosts is listed")
	}

	// Replacing with half of the set removes the other half.
	half := entries[:n/2]
	res, err = s.Apply(&rules.Ruleset{Deny: half}, true)
	if err != nil {
		t.Fatal(err)
	}
	if res.Removed != n-n/2 {
		t.Errorf("replace removed %d, want %d", res.Removed, n-n/2)
	}
	if got, err := s.Count(shield.DenyList); err != nil || got != n/2 {
		t.Fatalf("deny count after replace %d (%v), want %d", got, err, n/2)
	}
}

// TestBigBatchesRoundTrip writes more entries than one batch holds, in
// random order, with comments and expiry times, and reads them back: every
// entry comes back once, sorted, with what was written. Then a removal
// across batches takes exactly the entries asked for.
func TestBigBatchesRoundTrip(t *testing.T) {
	const n = 40_000 // more than two batches of every map kind
	s := openFresh(t)
	var es []shield.Entry
	for _, e := range mixedPrefixes(n) {
		es = append(es, shield.Entry{Prefix: e.Prefix})
	}
	expires := time.Now().Add(time.Hour)
	for i := range es {
		if i%97 == 0 {
			es[i].Comment = "c" + strconv.Itoa(i)
		}
		if i%89 == 0 {
			es[i].Expires = expires
		}
	}
	shuffled := append([]shield.Entry(nil), es...)
	mrand.New(mrand.NewPCG(1, 2)).Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
	if err := s.Add(shield.DenyList, shuffled, shield.Strict); err != nil {
		t.Fatal(err)
	}

	got, err := s.Entries(shield.DenyList)
	if err != nil {
		t.Fatal(err)
	}
	want := append([]shield.Entry(nil), es...)
	slices.SortFunc(want, func(a, b shield.Entry) int { return a.Prefix.Compare(b.Prefix) })
	if len(got) != len(want) {
		t.Fatalf("read back %d entries, wrote %d", len(got), len(want))
	}
	for i := range want {
		g, w := got[i], want[i]
		if g.Prefix != w.Prefix || g.Comment != w.Comment || g.Expires.IsZero() != w.Expires.IsZero() {
			t.Fatalf("entry %d: got %s %q expires %v, want %s %q expires %v", i, g.Prefix, g.Comment, g.Expires, w.Prefix, w.Comment, w.Expires)
		}
		if d := g.Expires.Sub(w.Expires); !w.Expires.IsZero() && (d < -2*time.Second || d > 2*time.Second) {
			t.Fatalf("entry %s expires %v, want about %v", g.Prefix, g.Expires, w.Expires)
		}
	}

	// Remove every third entry; the rest stay, comments included.
	var gone []netip.Prefix
	var kept []string
	for i, e := range want {
		if i%3 == 0 {
			gone = append(gone, e.Prefix)
		} else {
			kept = append(kept, e.Prefix.String()+" "+e.Comment)
		}
	}
	if err := s.RemovePrefixes(shield.DenyList, gone); err != nil {
		t.Fatal(err)
	}
	got, err = s.Entries(shield.DenyList)
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for _, e := range got {
		left = append(left, e.Prefix.String()+" "+e.Comment)
	}
	if !slices.Equal(left, kept) {
		t.Fatalf("after removing %d entries, %d are left, want %d", len(gone), len(left), len(kept))
	}
	if c, err := s.Count(shield.DenyList); err != nil || c != len(kept) {
		t.Fatalf("count %d (%v), want %d", c, err, len(kept))
	}
}

// TestStrictAddOfManyChangesNothing adds a long list in Strict mode where
// one entry, far down the list and checked by another worker than the
// first entries, exists already: the add is refused and no map changes.
func TestStrictAddOfManyChangesNothing(t *testing.T) {
	const n = 30_000
	s := openFresh(t)
	var es []shield.Entry
	for _, e := range mixedPrefixes(n) {
		es = append(es, shield.Entry{Prefix: e.Prefix})
	}
	for _, i := range []int{n - 1, n * 70 / 100} { // a v6 network, a v4 network
		old := shield.Entry{Prefix: es[i].Prefix, Comment: "already here"}
		if err := s.Add(shield.DenyList, []shield.Entry{old}, shield.Strict); err != nil {
			t.Fatal(err)
		}
		es[i].Comment = "new comment"
		wantUserError(t, s.Add(shield.DenyList, es, shield.Strict), es[i].Prefix.String()+" is already in the denylist")
		got, err := s.Entries(shield.DenyList)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 1 || got[0].Prefix != old.Prefix || got[0].Comment != old.Comment {
			t.Fatalf("after a refused add the denylist holds %d entries, first %+v; want only %s", len(got), got[0], old.Prefix)
		}
		if err := s.RemovePrefixes(shield.DenyList, []netip.Prefix{old.Prefix}); err != nil {
			t.Fatal(err)
		}
		es[i].Comment = ""
	}
	if c := commentCount(t, s); c != 0 {
		t.Fatalf("%d comments left behind by refused adds", c)
	}
}

// cpuTime is the CPU time, user and system, that the process has used so
// far: on a shared machine it says more than wall time about the work.
func cpuTime() time.Duration {
	var ru unix.Rusage
	unix.Getrusage(unix.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// loadTimer measures one operation per benchmark iteration, in wall and
// in CPU time.
type loadTimer struct{ wall, cpu time.Duration }

func (lt *loadTimer) time(b *testing.B, f func()) {
	b.StartTimer()
	w, c := time.Now(), cpuTime()
	f()
	lt.wall += time.Since(w)
	lt.cpu += cpuTime() - c
	b.StopTimer()
}

func (lt *loadTimer) report(b *testing.B, unit string) {
	b.ReportMetric(lt.wall.Seconds()/float64(b.N), "s/"+unit)
	b.ReportMetric(lt.cpu.Seconds()/float64(b.N), "cpu-s/"+unit)
}

// BenchmarkLoadMillion loads a million mixed prefixes into a fresh root
// per iteration, through Apply (the path of `moat import`) and through
// Add (the shield's own part, without the ruleset's validation):
//
//	go test -run '^$' -bench Million -benchtime 1x ./internal/shield/
func BenchmarkLoadMillion(b *testing.B) {
	const n = 1_000_000
	entries := mixedPrefixes(n)
	b.Run("Apply", func(b *testing.B) {
		var lt loadTimer
		var mem uint64
		b.StopTimer()
		for i := 0; i < b.N; i++ {
			s := openFresh(b)
			lt.time(b, func() {
				if _, err := s.Apply(&rules.Ruleset{Deny: entries}, false); err != nil {
					b.Fatal(err)
				}
			})
			if got, err := s.Count(shield.DenyList); err != nil || got != n {
				b.Fatalf("deny count %d (%v), want %d", got, err, n)
			}
			mem = ruleMapsMemlock(b, s)
			closeNow(b, s)
		}
		lt.report(b, "load")
		b.ReportMetric(float64(mem)/(1<<20), "MiB-memlock")
		b.ReportMetric(float64(mem)/n, "B/prefix")
	})
	es := make([]shield.Entry, n)
	for i, e := range entries {
		es[i] = shield.Entry{Prefix: e.Prefix}
	}
	// Strict adds first look every entry up, one syscall each.
	for _, mode := range []struct {
		name string
		mode shield.AddMode
	}{{"Add", shield.Upsert}, {"AddStrict", shield.Strict}} {
		b.Run(mode.name, func(b *testing.B) {
			var lt loadTimer
			b.StopTimer()
			for i := 0; i < b.N; i++ {
				s := openFresh(b)
				lt.time(b, func() {
					if err := s.Add(shield.DenyList, es, mode.mode); err != nil {
						b.Fatal(err)
					}
				})
				if got, err := s.Count(shield.DenyList); err != nil || got != n {
					b.Fatalf("deny count %d (%v), want %d", got, err, n)
				}
				closeNow(b, s)
			}
			lt.report(b, "load")
		})
	}
}

// BenchmarkReadMillion reads a list of a million prefixes the ways the CLI
// does: Entries for `moat list`, Count for `moat status`.
func BenchmarkReadMillion(b *testing.B) {
	const n = 1_000_000
	s := openFresh(b)
	if _, err := s.Apply(&rules.Ruleset{Deny: mixedPrefixes(n)}, false); err != nil {
		b.Fatal(err)
	}
	b.Run("Entries", func(b *testing.B) {
		var lt loadTimer
		b.StopTimer()
		for i := 0; i < b.N; i++ {
			var es []shield.Entry
			lt.time(b, func() {
				var err error
				if es, err = s.Entries(shield.DenyList); err != nil {
					b.Fatal(err)
				}
			})
			if len(es) != n {
				b.Fatalf("%d entries, want %d", len(es), n)
			}
		}
		lt.report(b, "op")
	})
	b.Run("Count", func(b *testing.B) {
		var lt loadTimer
		b.StopTimer()
		for i := 0; i < b.N; i++ {
			var got int
			lt.time(b, func() {
				var err error
				if got, err = s.Count(shield.DenyList); err != nil {
					b.Fatal(err)
				}
			})
			if got != n {
				b.Fatalf("count %d, want %d", got, n)
			}
		}
		lt.report(b, "op")
	})
}

// closeNow frees the maps of a finished iteration at once, so that the
// kernel's freeing of a million elements does not overlap the next one.
func closeNow(tb testing.TB, s *shield.Shield) {
	tb.Helper()
	if err := s.Remove(); err != nil {
		tb.Fatal(err)
	}
	s.Close()
}
