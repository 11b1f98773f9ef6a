package shield_test

import (
	"bufio"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
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
	var st unix.Statfs_t
	if err := unix.Statfs("/sys/fs/bpf", &st); err != nil || st.Type != unix.BPF_FS_MAGIC {
		tb.Skip("no bpffs at /sys/fs/bpf")
	}
	var rnd [6]byte
	rand.Read(rnd[:])
	base := "moat-test-" + hex.EncodeToString(rnd[:])
	root := filepath.Join("/sys/fs/bpf", base)
	s, err := shield.Open(root)
	if err != nil {
		tb.Fatalf("open %s: %v", root, err)
	}
	tb.Cleanup(func() {
		s.Close()
		if err := os.RemoveAll(root); err != nil {
			tb.Errorf("remove %s: %v", root, err)
		}
		locks, _ := filepath.Glob("/run/moat-*" + base + ".lock")
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

// BenchmarkLoadMillion loads a million mixed prefixes into a fresh root
// per iteration:
//
//	go test -run '^$' -bench LoadMillion -benchtime 1x ./internal/shield/
func BenchmarkLoadMillion(b *testing.B) {
	const n = 1_000_000
	entries := mixedPrefixes(n)
	var total time.Duration
	var mem uint64
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		s := openFresh(b)
		b.StartTimer()
		start := time.Now()
		if _, err := s.Apply(&rules.Ruleset{Deny: entries}, false); err != nil {
			b.Fatal(err)
		}
		total += time.Since(start)
		b.StopTimer()
		if got, err := s.Count(shield.DenyList); err != nil || got != n {
			b.Fatalf("deny count %d (%v), want %d", got, err, n)
		}
		mem = ruleMapsMemlock(b, s)
		b.StartTimer()
	}
	b.ReportMetric(total.Seconds()/float64(b.N), "s/load")
	b.ReportMetric(float64(n)*float64(b.N)/total.Seconds(), "prefixes/s")
	b.ReportMetric(float64(mem)/(1<<20), "MiB-memlock")
	b.ReportMetric(float64(mem)/n, "B/prefix")
}
