package shield_test

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/moat-shield/moat/internal/datapath"
	"github.com/moat-shield/moat/internal/rules"
	"github.com/moat-shield/moat/internal/shield"
)

// smallMaps are list and comment maps small enough to fill in a test.
var smallMaps = map[string]uint32{
	datapath.MoatMapAllowV4Hosts: 8, datapath.MoatMapAllowV4Nets: 4,
	datapath.MoatMapAllowV6Hosts: 8, datapath.MoatMapAllowV6Nets: 4,
	datapath.MoatMapDenyV4Hosts: 8, datapath.MoatMapDenyV4Nets: 4,
	datapath.MoatMapDenyV6Hosts: 8, datapath.MoatMapDenyV6Nets: 4,
	datapath.MoatMapComments: 6,
}

// hosts returns n IPv4 hosts from base.
func hosts(base string, n int) []shield.Entry {
	a := netip.MustParseAddr(base)
	out := make([]shield.Entry, n)
	for i := range out {
		out[i] = shield.Entry{Prefix: netip.PrefixFrom(a, 32)}
		a = a.Next()
	}
	return out
}

func commented(es []shield.Entry, c string) []shield.Entry {
	for i := range es {
		es[i].Comment = fmt.Sprintf("%s %d", c, i)
	}
	return es
}

// state renders both lists with comments and the whole comment map, which
// holds comments no listing shows when they lost their entry.
func state(t *testing.T, s *shield.Shield) string {
	t.Helper()
	var b strings.Builder
	for _, l := range []shield.List{shield.AllowList, shield.DenyList} {
		es, err := s.Entries(l)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "%s:", l)
		for _, e := range es {
			fmt.Fprintf(&b, " %s=%q", e.Prefix, e.Comment)
		}
		b.WriteString("\n")
	}
	var k datapath.MoatCommentKey
	var v datapath.MoatComment
	n := 0
	for it := s.Map(datapath.MoatMapComments).Iterate(); it.Next(&k, &v); {
		n++
	}
	fmt.Fprintf(&b, "comments: %d\n", n)
	return b.String()
}

// TestAddRefusesOverCapacity: a change that a list's map (or the comment
// map) cannot hold is refused with one line that names the list and what
// it holds, and leaves everything as it was; a change that fits exactly,
// or that only rewrites held keys, goes through. A large change is
// refused before the first write, with both numbers; a change of a few
// entries, which does not count what the maps hold, when a map is full.
func TestAddRefusesOverCapacity(t *testing.T) {
	t.Run("few entries", func(t *testing.T) { testAddRefusesOverCapacity(t, true) })
	t.Run("in batches", func(t *testing.T) {
		defer shield.AddInBatches()()
		testAddRefusesOverCapacity(t, false)
	})
}

func testAddRefusesOverCapacity(t *testing.T, few bool) {
	room := func(need int) string {
		if few {
			return "; it has no room for this change"
		}
		return fmt.Sprintf("; this change needs %d", need)
	}
	s := openFreshSized(t, smallMaps)
	if err := s.Add(shield.AllowList, hosts("10.0.0.1", 7), shield.Strict); err != nil {
		t.Fatal(err)
	}
	if err := s.Add(shield.AllowList, entries("10.8.0.0/16", "10.9.0.0/16", "10.10.0.0/16"), shield.Strict); err != nil {
		t.Fatal(err)
	}
	if err := s.Add(shield.DenyList, commented(entries("192.0.2.1/32", "192.0.2.0/25"), "seed"), shield.Strict); err != nil {
		t.Fatal(err)
	}
	before := state(t, s)
	unchanged := func(t *testing.T) {
		t.Helper()
		if after := state(t, s); after != before {
			t.Fatalf("a refused change changed the maps:\nbefore\n%s\nafter\n%s", before, after)
		}
	}
	refused := func(t *testing.T, err error, want string) {
		t.Helper()
		wantUserError(t, err, want)
		if strings.Contains(err.Error(), "\n") {
			t.Errorf("error %q spans lines", err)
		}
		unchanged(t)
	}

	t.Run("hosts of one family full, others not", func(t *testing.T) {
		// As `moat allow 2001:db8::1 10.200.0.1 10.201.0.0/16`: the IPv6
		// host and the network would fit.
		_, err := s.Insert(shield.AllowList, append(entries("2001:db8::1/128"), append(hosts("10.200.0.1", 2), entries("10.201.0.0/16")...)...))
		refused(t, err, "the allowlist holds at most 8 IPv4 hosts"+room(9))
	})
	t.Run("trie full", func(t *testing.T) {
		err := s.Add(shield.AllowList, entries("10.11.0.0/16", "10.12.0.0/16"), shield.Upsert)
		refused(t, err, "the allowlist holds at most 4 IPv4 networks"+room(5))
	})
	t.Run("comments full", func(t *testing.T) {
		err := s.Add(shield.DenyList, commented(hosts("198.51.100.1", 5), "new"), shield.Upsert)
		refused(t, err, "holds at most 6 comments (allowlist and denylist together)"+room(7))
	})
	t.Run("replace needs old and new at once", func(t *testing.T) {
		// Stale entries go only after the new ones are in place.
		var want []rules.PrefixEntry
		for _, e := range hosts("10.100.0.1", 2) {
			want = append(want, rules.PrefixEntry{Prefix: e.Prefix})
		}
		_, err := s.ReplaceList(shield.AllowList, want)
		refused(t, err, "this change needs 9")
	})
	t.Run("import whose second list does not fit", func(t *testing.T) {
		// The allowlist part fits, and must not be written either.
		rs := &rules.Ruleset{Allow: []rules.PrefixEntry{{Prefix: pfx("2001:db8::7/128"), Comment: "fits"}}}
		for _, e := range hosts("198.51.100.1", 8) {
			rs.Deny = append(rs.Deny, rules.PrefixEntry{Prefix: e.Prefix})
		}
		_, err := s.Apply(rs, false)
		refused(t, err, "the denylist holds at most 8 IPv4 hosts; this change needs 9")
	})
	t.Run("comments of both lists together", func(t *testing.T) {
		rs := &rules.Ruleset{
			Allow: []rules.PrefixEntry{{Prefix: pfx("2001:db8::7/128"), Comment: "a"}, {Prefix: pfx("2001:db8::8/128"), Comment: "b"}},
			Deny:  []rules.PrefixEntry{{Prefix: pfx("2001:db8::9/128"), Comment: "c"}, {Prefix: pfx("2001:db8::a/128"), Comment: "d"}, {Prefix: pfx("2001:db8::b/128"), Comment: "e"}},
		}
		_, err := s.Apply(rs, false)
		refused(t, err, "this change needs 7")
	})

	// Rewriting held entries adds no key, however full the map.
	if err := s.Add(shield.AllowList, commented(hosts("10.0.0.1", 4), "rewritten"), shield.Upsert); err != nil {
		t.Fatalf("rewriting held entries of a full map: %v", err)
	}
	// And the last free slot can be filled.
	if _, err := s.Insert(shield.AllowList, hosts("10.0.0.8", 1)); err != nil {
		t.Fatalf("filling the last slot: %v", err)
	}
	if _, err := s.Insert(shield.AllowList, entries("10.13.0.0/16")); err != nil {
		t.Fatalf("filling the last slot of a trie: %v", err)
	}
	if n, err := s.Count(shield.AllowList); err != nil || n != 12 {
		t.Fatalf("allowlist holds %d entries (%v), want 12", n, err)
	}
}

// TestAddTakesBackAFailedWrite: when a write fails for another reason than
// room (here a key the kernel refuses, written after the comments and
// beside the hosts), the entries and comments the change added are
// deleted again; an entry it rewrote stays.
func TestAddTakesBackAFailedWrite(t *testing.T) {
	t.Run("few entries", testAddTakesBackAFailedWrite)
	t.Run("in batches", func(t *testing.T) {
		defer shield.AddInBatches()()
		testAddTakesBackAFailedWrite(t)
	})
}

func testAddTakesBackAFailedWrite(t *testing.T) {
	s := openFreshSized(t, smallMaps)
	if err := s.Add(shield.AllowList, commented(entries("192.0.2.1/32"), "held"), shield.Strict); err != nil {
		t.Fatal(err)
	}
	before := state(t, s)
	bad := shield.Entry{Prefix: netip.PrefixFrom(netip.MustParseAddr("10.0.0.0"), 33), Comment: "refused by the trie"}
	change := append(commented(hosts("198.51.100.1", 4), "new"), bad)
	change = append(change, shield.Entry{Prefix: pfx("192.0.2.1/32"), Comment: "held 0"})
	err := s.Add(shield.AllowList, change, shield.Upsert)
	var ue *shield.UserError
	if err == nil || errors.As(err, &ue) {
		t.Fatalf("err = %v, want a failed write", err)
	}
	if after := state(t, s); after != before {
		t.Fatalf("a failed change left part of itself:\nbefore\n%s\nafter\n%s", before, after)
	}
	if _, err := s.Insert(shield.AllowList, commented(hosts("198.51.100.1", 4), "again")); err != nil {
		t.Fatalf("adding after the failed change: %v", err)
	}
}

// TestApplyRefusesPortRulesOverCapacityFirst: a ruleset with more port
// rules than the port maps hold is refused before its list entries are
// written.
func TestApplyRefusesPortRulesOverCapacityFirst(t *testing.T) {
	s := openFreshSized(t, map[string]uint32{datapath.MoatMapPortRuleDefs: 4}) // ids 1 to 3
	rs := &rules.Ruleset{Deny: []rules.PrefixEntry{{Prefix: netip.MustParsePrefix("198.51.100.0/24")}}}
	for p := uint16(1000); p < 1004; p++ {
		rs.Ports = append(rs.Ports, rules.PortEntry{Spec: rules.PortSpec{Class: rules.TCP, From: p, To: p}, Action: rules.Drop})
	}
	before := state(t, s)
	_, err := s.Apply(rs, false)
	var ue *shield.UserError
	if !errors.As(err, &ue) || !strings.Contains(err.Error(), "3 rules is the limit") {
		t.Fatalf("Apply with 4 port rules where 3 fit: %v, want a refusal naming the limit", err)
	}
	if after := state(t, s); after != before {
		t.Errorf("a refused ruleset changed the lists:\n%s\nwas\n%s", after, before)
	}
	if ps, err := s.PortRules(); err != nil || len(ps) != 0 {
		t.Errorf("port rules after the refusal: %v %v", ps, err)
	}
	rs.Ports = rs.Ports[:3]
	if _, err := s.Apply(rs, false); err != nil {
		t.Fatalf("Apply with 3 port rules: %v", err)
	}
}
