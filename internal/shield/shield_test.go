package shield_test

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/moat-shield/moat/internal/datapath"
	"github.com/moat-shield/moat/internal/rules"
	"github.com/moat-shield/moat/internal/shield"
)

func pfx(s string) netip.Prefix { return netip.MustParsePrefix(s) }

func entries(ps ...string) []shield.Entry {
	out := make([]shield.Entry, len(ps))
	for i, p := range ps {
		out[i] = shield.Entry{Prefix: pfx(p)}
	}
	return out
}

func listOf(t *testing.T, s *shield.Shield, l shield.List) string {
	t.Helper()
	es, err := s.Entries(l)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range es {
		out = append(out, e.Prefix.String())
	}
	return strings.Join(out, " ")
}

func wantUserError(t *testing.T, err error, part string) {
	t.Helper()
	var ue *shield.UserError
	if !errors.As(err, &ue) {
		t.Fatalf("err = %v, want a UserError", err)
	}
	if !strings.Contains(err.Error(), part) {
		t.Fatalf("err %q does not mention %q", err, part)
	}
}

// TestHasIsExact checks that a prefix inside a listed network is not taken
// for the network itself: a trie lookup matches the longest covering
// prefix, which must not count as "listed".
func TestHasIsExact(t *testing.T) {
	s := openFresh(t)
	if err := s.Add(shield.DenyList, entries("10.0.0.0/8", "2001:db8::/32", "192.0.2.0/24"), shield.Strict); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]bool{
		"10.0.0.0/8": true, "10.1.0.0/16": false, "10.0.0.0/9": false, "10.1.2.3/32": false,
		"2001:db8::/32": true, "2001:db8:1::/48": false, "192.0.2.0/24": true, "192.0.2.128/25": false,
	} {
		if got, err := s.Has(shield.DenyList, pfx(p)); err != nil || got != want {
			t.Errorf("Has(%s) = %v, %v; want %v", p, got, err, want)
		}
	}
	// So a more specific prefix can be added, and removing one that is
	// only covered is refused rather than reported done.
	if err := s.Add(shield.DenyList, entries("10.1.0.0/16", "2001:db8:1::/48"), shield.Strict); err != nil {
		t.Fatalf("adding prefixes inside listed networks: %v", err)
	}
	wantUserError(t, s.RemovePrefixes(shield.DenyList, []netip.Prefix{pfx("192.0.2.128/25")}), "not in the denylist")
	if err := s.RemovePrefixes(shield.DenyList, []netip.Prefix{pfx("10.0.0.0/8")}); err != nil {
		t.Fatal(err)
	}
	if got := listOf(t, s, shield.DenyList); got != "10.1.0.0/16 192.0.2.0/24 2001:db8::/32 2001:db8:1::/48" {
		t.Fatalf("deny list %s", got)
	}
}

func TestAddAndRemoveAllOrNothing(t *testing.T) {
	s := openFresh(t)
	if err := s.Add(shield.AllowList, entries("198.18.1.0/24", "2001:db8:1::2/128"), shield.Strict); err != nil {
		t.Fatal(err)
	}
	wantUserError(t, s.Add(shield.AllowList, entries("198.18.2.0/24", "2001:db8:1::2/128"), shield.Strict), "already in the allowlist")
	wantUserError(t, s.RemovePrefixes(shield.AllowList, []netip.Prefix{pfx("198.18.1.0/24"), pfx("198.18.3.0/24")}), "not in the allowlist")
	if got := listOf(t, s, shield.AllowList); got != "198.18.1.0/24 2001:db8:1::2/128" {
		t.Fatalf("allow list after refused changes: %s", got)
	}
	if got := listOf(t, s, shield.DenyList); got != "" {
		t.Fatalf("deny list filled by allowlist changes: %s", got)
	}
	// Upsert overwrites instead of refusing.
	if err := s.Add(shield.AllowList, entries("198.18.2.0/24", "2001:db8:1::2/128"), shield.Upsert); err != nil {
		t.Fatal(err)
	}
	if n, err := s.Count(shield.AllowList); err != nil || n != 3 {
		t.Fatalf("allow count %d, %v", n, err)
	}
}

func commentCount(t *testing.T, s *shield.Shield) int {
	t.Helper()
	return mapCount(t, s, datapath.MoatMapComments)
}

// mapCount counts the elements of a map of comments (or of auto-blocks'
// reasons).
func mapCount(t *testing.T, s *shield.Shield, name string) int {
	t.Helper()
	m := s.Map(name)
	var k datapath.MoatCommentKey
	var v datapath.MoatComment
	n := 0
	it := m.Iterate()
	for it.Next(&k, &v) {
		n++
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestComments(t *testing.T) {
	s := openFresh(t)
	withComment := []shield.Entry{
		{Prefix: pfx("192.0.2.7/32"), Comment: "scanner"},
		{Prefix: pfx("2001:db8:f00::/48"), Comment: "spoofed range"},
	}
	if err := s.Add(shield.DenyList, withComment, shield.Strict); err != nil {
		t.Fatal(err)
	}
	// The same prefix in the other list has its own comment.
	if err := s.Add(shield.AllowList, []shield.Entry{{Prefix: pfx("192.0.2.7/32"), Comment: "false positive"}}, shield.Strict); err != nil {
		t.Fatal(err)
	}
	es, err := s.Entries(shield.DenyList)
	if err != nil {
		t.Fatal(err)
	}
	if len(es) != 2 || es[0].Comment != "scanner" || es[1].Comment != "spoofed range" {
		t.Fatalf("deny entries %+v", es)
	}
	if n := commentCount(t, s); n != 3 {
		t.Fatalf("%d comments stored, want 3", n)
	}

	// Rewritten without a comment (as an import does): the comment goes.
	if err := s.Add(shield.DenyList, entries("192.0.2.7/32"), shield.Upsert); err != nil {
		t.Fatal(err)
	}
	es, _ = s.Entries(shield.DenyList)
	if es[0].Comment != "" {
		t.Fatalf("comment %q survived an upsert without one", es[0].Comment)
	}
	if n := commentCount(t, s); n != 2 {
		t.Fatalf("%d comments stored after the upsert, want 2 (no orphan)", n)
	}
	if err := s.RemovePrefixes(shield.DenyList, []netip.Prefix{pfx("2001:db8:f00::/48")}); err != nil {
		t.Fatal(err)
	}
	if n := commentCount(t, s); n != 1 {
		t.Fatalf("%d comments stored after removal, want only the allowlist's", n)
	}
	al, _ := s.Entries(shield.AllowList)
	if len(al) != 1 || al[0].Comment != "false positive" {
		t.Fatalf("allow entries %+v", al)
	}
	wantUserError(t, s.Add(shield.DenyList, []shield.Entry{{Prefix: pfx("192.0.2.8/32"), Comment: strings.Repeat("x", 64)}}, shield.Strict), "at most 63")
}

func TestExpireStale(t *testing.T) {
	s := openFresh(t)
	now := time.Now()
	es := []shield.Entry{
		{Prefix: pfx("192.0.2.1/32"), Expires: now.Add(-time.Second)},
		{Prefix: pfx("192.0.2.2/32"), Expires: now.Add(time.Hour)},
		{Prefix: pfx("192.0.2.3/32")},
		{Prefix: pfx("2001:db8::/48"), Expires: now.Add(-time.Minute)},
	}
	if err := s.Add(shield.DenyList, es, shield.Strict); err != nil {
		t.Fatal(err)
	}
	got, err := s.Entries(shield.DenyList)
	if err != nil {
		t.Fatal(err)
	}
	if d := got[1].Expires.Sub(now.Add(time.Hour)); d < -2*time.Second || d > 2*time.Second {
		t.Errorf("expiry read back as %s, want about %s", got[1].Expires, now.Add(time.Hour))
	}
	if !got[2].Expires.IsZero() {
		t.Errorf("entry without TTL expires at %s", got[2].Expires)
	}
	n, err := s.ExpireStale()
	if err != nil || n != 2 {
		t.Fatalf("ExpireStale = %d, %v; want 2", n, err)
	}
	if got := listOf(t, s, shield.DenyList); got != "192.0.2.2/32 192.0.2.3/32" {
		t.Fatalf("deny list after expiry: %s", got)
	}
}

func TestPortRules(t *testing.T) {
	s := openFresh(t)
	spec := func(v string) rules.PortSpec {
		p, err := rules.ParsePortSpec(v)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, r := range []struct {
		spec   string
		action rules.Action
	}{{"tcp/6000-6063", rules.Drop}, {"udp/19", rules.Drop}, {"icmpv6/128", rules.Allow}, {"tcp/6064", rules.Allow}} {
		if err := s.AddPortRule(spec(r.spec), r.action); err != nil {
			t.Fatalf("add %s: %v", r.spec, err)
		}
	}
	wantUserError(t, s.AddPortRule(spec("tcp/6063-6070"), rules.Drop), "overlaps the existing rule")
	wantUserError(t, s.AddPortRule(spec("udp/19"), rules.Allow), "exists already")
	wantUserError(t, s.RemovePortRule(spec("tcp/6010")), "the rule there is tcp/6000-6063")
	wantUserError(t, s.RemovePortRule(spec("udp/53")), "no port rule udp/53")

	got, err := s.PortRules()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, r := range got {
		names = append(names, r.Spec.String()+" "+r.Action.String())
	}
	// Adjacent ranges with different ids stay apart.
	if want := "tcp/6000-6063 drop,tcp/6064 allow,udp/19 drop,icmpv6/echo-request allow"; strings.Join(names, ",") != want {
		t.Fatalf("port rules %q, want %q", strings.Join(names, ","), want)
	}

	// A removed rule's id is reused without its old hits.
	udpID := got[2].ID
	hits := make([]uint64, ebpf.MustPossibleCPU())
	hits[0] = 41
	if err := s.Map(datapath.MoatMapPortRuleHits).Update(uint32(udpID), hits, ebpf.UpdateAny); err != nil {
		t.Fatal(err)
	}
	if err := s.RemovePortRule(spec("udp/19")); err != nil {
		t.Fatal(err)
	}
	if err := s.AddPortRule(spec("udp/53"), rules.Drop); err != nil {
		t.Fatal(err)
	}
	got, _ = s.PortRules()
	for _, r := range got {
		if r.Spec == spec("udp/53") && (r.ID != udpID || r.Hits != 0) {
			t.Fatalf("udp/53 got id %d with %d hits; want the freed id %d with none", r.ID, r.Hits, udpID)
		}
	}

	// Replace: overlapping old rules make way for the new set.
	rs := &rules.Ruleset{Ports: []rules.PortEntry{
		{Spec: spec("tcp/6010-6020"), Action: rules.Allow},
		{Spec: spec("icmpv6/128"), Action: rules.Drop},
	}}
	if _, err := s.Apply(rs, false); err == nil {
		t.Fatal("a merging Apply accepted a rule that overlaps an existing one")
	}
	if _, err := s.Apply(rs, true); err != nil {
		t.Fatal(err)
	}
	got, _ = s.PortRules()
	names = nil
	for _, r := range got {
		names = append(names, r.Spec.String()+" "+r.Action.String())
	}
	if want := "tcp/6010-6020 allow,icmpv6/echo-request drop"; strings.Join(names, ",") != want {
		t.Fatalf("port rules after replace %q, want %q", strings.Join(names, ","), want)
	}
}

func TestSettings(t *testing.T) {
	s := openFresh(t)
	set, err := s.Settings()
	if err != nil || set != (rules.Settings{Fragments: "pass", Malformed: "drop"}) {
		t.Fatalf("default settings %+v, %v", set, err)
	}
	wantUserError(t, s.SetSettings(rules.Settings{Fragments: "drop", Malformed: "maybe"}), "malformed")
	want := rules.Settings{Fragments: "drop", Malformed: "pass"}
	if err := s.SetSettings(want); err != nil {
		t.Fatal(err)
	}
	if set, err := s.Settings(); err != nil || set != want {
		t.Fatalf("settings %+v, %v; want %+v", set, err, want)
	}
}

func TestMissingInterface(t *testing.T) {
	s := openFresh(t)
	_, err := s.Attach("moat-nx0", shield.ModeAuto)
	wantUserError(t, err, "no interface")
	wantUserError(t, s.Detach("moat-nx0"), "not attached")
	_, err = s.Counters("moat-nx0")
	wantUserError(t, err, "not attached")
	if _, err := shield.ParseMode("turbo"); err == nil {
		t.Fatal("ParseMode accepted turbo")
	}
	atts, err := s.Attachments()
	if err != nil || len(atts) != 0 {
		t.Fatalf("attachments %+v, %v", atts, err)
	}
}

// TestAllowInUseBits checks the bits that let the data path skip an empty
// allowlist: set for a family before its first allow entry goes in,
// cleared after its last one goes out, kept across policy changes.
func TestAllowInUseBits(t *testing.T) {
	s := openFresh(t)
	bits := func() uint32 {
		t.Helper()
		var v datapath.MoatRuntimeSettings
		if err := s.Map(datapath.MoatMapSettings).Lookup(uint32(0), &v); err != nil {
			t.Fatal(err)
		}
		return v.AllowInUse
	}
	v4, v6 := uint32(datapath.MoatAllowInUseALLOW_IN_USE_V4), uint32(datapath.MoatAllowInUseALLOW_IN_USE_V6)
	if b := bits(); b != 0 {
		t.Fatalf("fresh state: bits %b", b)
	}
	if err := s.Add(shield.DenyList, entries("198.51.100.0/24"), shield.Strict); err != nil {
		t.Fatal(err)
	}
	if b := bits(); b != 0 {
		t.Fatalf("a deny entry set allow bits %b", b)
	}
	if err := s.Add(shield.AllowList, entries("192.0.2.1/32", "2001:db8::/48"), shield.Strict); err != nil {
		t.Fatal(err)
	}
	if b := bits(); b != v4|v6 {
		t.Fatalf("after allowing both families: bits %b", b)
	}
	if err := s.SetSettings(rules.Settings{Fragments: "drop", Malformed: "drop"}); err != nil {
		t.Fatal(err)
	}
	if b := bits(); b != v4|v6 {
		t.Fatalf("a policy change lost the bits: %b", b)
	}
	if err := s.RemovePrefixes(shield.AllowList, []netip.Prefix{pfx("2001:db8::/48")}); err != nil {
		t.Fatal(err)
	}
	if b := bits(); b != v4 {
		t.Fatalf("after removing the last IPv6 entry: bits %b", b)
	}
	if err := s.RemovePrefixes(shield.AllowList, []netip.Prefix{pfx("192.0.2.1/32")}); err != nil {
		t.Fatal(err)
	}
	if b := bits(); b != 0 {
		t.Fatalf("after removing every entry: bits %b", b)
	}
}
