package bench

import (
	"math"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/moat-shield/moat/internal/rules"
)

func TestGenerateDenylist(t *testing.T) {
	flood := netip.MustParsePrefix("198.19.32.0/20")
	const n = 20000
	got, err := GenerateDenylist(n, []netip.Prefix{flood}, DefaultMix, 7)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != n {
		t.Fatalf("got %d prefixes, want %d", len(got), n)
	}
	if !slices.Contains(got, flood) {
		t.Errorf("extra prefix %s missing", flood)
	}
	lab := []netip.Prefix{netip.MustParsePrefix("198.18.0.0/15"), netip.MustParsePrefix("2001:db8::/32")}
	kinds := map[string]int{}
	for _, p := range got {
		if p != p.Masked() {
			t.Fatalf("%s has host bits set", p)
		}
		for _, l := range lab {
			if p != flood && l.Overlaps(p) {
				t.Fatalf("%s overlaps the lab's %s", p, l)
			}
		}
		fam := "v6"
		if p.Addr().Is4() {
			fam = "v4"
		}
		if p.IsSingleIP() {
			kinds[fam+" hosts"]++
		} else {
			kinds[fam+" nets"]++
		}
	}
	for kind, share := range map[string]float64{
		"v4 hosts": DefaultMix.V4Hosts, "v4 nets": DefaultMix.V4Nets,
		"v6 hosts": DefaultMix.V6Hosts, "v6 nets": DefaultMix.V6Nets,
	} {
		if want := share * n; math.Abs(float64(kinds[kind])-want) > 2 {
			t.Errorf("%d %s, want about %.0f", kinds[kind], kind, want)
		}
	}

	// No two entries overlap, as an nftables interval set requires.
	sorted := slices.Clone(got)
	slices.SortFunc(sorted, rules.ComparePrefixes)
	for i := 1; i < len(sorted); i++ {
		if sorted[i-1].Overlaps(sorted[i]) {
			t.Fatalf("%s overlaps %s", sorted[i-1], sorted[i])
		}
	}

	again, _ := GenerateDenylist(n, []netip.Prefix{flood}, DefaultMix, 7)
	if !slices.Equal(got, again) {
		t.Error("the same seed gave a different list")
	}
}

func TestGenerateDenylistRefusesOverlappingExtra(t *testing.T) {
	if _, err := GenerateDenylist(10, []netip.Prefix{netip.MustParsePrefix("20.0.0.0/8")}, DefaultMix, 1); err == nil {
		t.Error("an extra prefix inside the generated regions was accepted")
	}
	if _, err := GenerateDenylist(10, []netip.Prefix{netip.MustParsePrefix("2a00:1::/32")}, DefaultMix, 1); err == nil {
		t.Error("an extra IPv6 prefix inside the generated regions was accepted")
	}
}

func TestWriteNftSets(t *testing.T) {
	ps := []netip.Prefix{
		netip.MustParsePrefix("2400::1/128"),
		netip.MustParsePrefix("198.19.32.0/20"),
		netip.MustParsePrefix("100.1.2.3/32"),
		netip.MustParsePrefix("2a00:1::/32"),
	}
	var b strings.Builder
	if err := WriteNftSets(&b, ps); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"set deny4 { type ipv4_addr; flags interval; }",
		"add element netdev moatbench deny4 { 100.1.2.3, 198.19.32.0/20 }",
		"add element netdev moatbench deny6 { 2400::1, 2a00:1::/32 }",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("script lacks %q:\n%s", want, out)
		}
	}
}

func TestSummarize(t *testing.T) {
	s := Summarize([]float64{5, 1, math.NaN(), 3, 2})
	if s.Median != 2.5 || s.Min != 1 || s.Max != 5 || len(s.Values) != 5 {
		t.Errorf("got %+v", s)
	}
	if s := Summarize([]float64{4, 9, 1}); s.Median != 4 {
		t.Errorf("median of 3 values: %v", s.Median)
	}
	if s := Summarize(nil); !math.IsNaN(s.Median) {
		t.Errorf("median of nothing: %v", s.Median)
	}
	vs := make([]float64, 100)
	for i := range vs {
		vs[i] = float64(100 - i)
	}
	if p := Percentile(vs, 99); p != 99 {
		t.Errorf("p99 of 1..100 = %v", p)
	}
	if p := Percentile(vs, 50); p != 50 {
		t.Errorf("p50 of 1..100 = %v", p)
	}
}
