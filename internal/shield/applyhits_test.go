package shield_test

import (
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/moat-shield/moat/internal/rules"
	"github.com/moat-shield/moat/internal/shield"
	"github.com/moat-shield/moat/internal/testpkt"
)

// hitCounts reads every rule's hit count: allow/deny entries by list and
// prefix, port rules by spec.
func hitCounts(t *testing.T, s *shield.Shield) map[string]uint64 {
	t.Helper()
	out := map[string]uint64{}
	for _, l := range []shield.List{shield.AllowList, shield.DenyList} {
		es, err := s.Entries(l)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range es {
			out[l.String()+" "+e.Prefix.String()] = e.Hits
		}
	}
	ps, err := s.PortRules()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range ps {
		out["port "+p.Spec.String()] = p.Hits
	}
	return out
}

// udpVerdict runs a UDP datagram from src to port through the filter.
func udpVerdict(t *testing.T, prog *ebpf.Program, src netip.Addr, port uint16) uint32 {
	t.Helper()
	u := testpkt.UDP{SrcPort: 40000, DstPort: port, Payload: []byte("hx7")}
	var pkt []byte
	if src.Is4() {
		pkt = testpkt.UDPv4(src, netip.MustParseAddr("192.0.2.1"), u)
	} else {
		pkt = testpkt.UDPv6(src, netip.MustParseAddr("2001:db8:ff::1"), u)
	}
	ret, err := prog.Run(&ebpf.RunOptions{Data: pkt})
	if err != nil {
		t.Fatal(err)
	}
	return ret
}

// TestApplyKeepsHitsOfUnchangedRules runs packets through the filter so
// that every rule has hits, then applies rulesets made from a snapshot (as
// `moat export` and `moat import` do): the rules the ruleset holds as they
// are keep their hit counts, changed ones start again from zero, and the
// result counts what changed.
func TestApplyKeepsHitsOfUnchangedRules(t *testing.T) {
	later := time.Now().Add(2 * time.Hour).UTC().Truncate(time.Second)
	cases := []struct {
		name    string
		replace bool
		list    bool // through ReplaceList(DenyList, …) instead of Apply
		edit    func(rs *rules.Ruleset)
		want    shield.ApplyResult
		reset   []string // rules whose hits restart; the others keep theirs
		gone    []string
		watch   string // an address the filter must drop throughout the apply
	}{
		{name: "replace with the same rules", replace: true,
			want: shield.ApplyResult{Unchanged: 4}},
		{name: "merge the same rules",
			want: shield.ApplyResult{Unchanged: 4}},
		{name: "replace the denylist with itself", list: true,
			want: shield.ApplyResult{Unchanged: 3}},
		{name: "replace with a comment changed, an entry gone and one new", replace: true,
			edit: func(rs *rules.Ruleset) {
				rs.Deny[1].Comment = "hx7 changed"
				rs.Deny = slices.Delete(rs.Deny, 2, 3) // 2001:db8:f00::/48
				rs.Deny = append(rs.Deny, rules.PrefixEntry{Prefix: pfx("203.0.113.0/24")})
			},
			want:  shield.ApplyResult{Added: 1, Updated: 1, Removed: 1, Unchanged: 2},
			reset: []string{"denylist 198.51.100.7/32"},
			gone:  []string{"denylist 2001:db8:f00::/48"},
			watch: "198.51.100.7"},
		{name: "merge with an expiry changed",
			edit: func(rs *rules.Ruleset) { rs.Deny[2].Expires = &later },
			want: shield.ApplyResult{Updated: 1, Unchanged: 3}, reset: []string{"denylist 2001:db8:f00::/48"},
			watch: "2001:db8:f00::1"},
		{name: "merge with an expiry dropped",
			edit: func(rs *rules.Ruleset) { rs.Deny[2].Expires = nil },
			want: shield.ApplyResult{Updated: 1, Unchanged: 3}, reset: []string{"denylist 2001:db8:f00::/48"}},
		{name: "replace with a port rule's action changed", replace: true,
			edit: func(rs *rules.Ruleset) { rs.Ports[0].Action = rules.Allow },
			want: shield.ApplyResult{Unchanged: 4, PortRules: 2}, reset: []string{"port udp/9"}},
		{name: "merge with the policy changed",
			edit: func(rs *rules.Ruleset) { rs.Settings.Fragments = "drop" },
			want: shield.ApplyResult{Unchanged: 4, Settings: true}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := openFresh(t)
			prog := s.LoadFilter(t)
			hour := time.Now().Add(time.Hour)
			if err := s.Add(shield.DenyList, []shield.Entry{
				{Prefix: pfx("10.10.0.0/16")},
				{Prefix: pfx("198.51.100.7/32"), Comment: "hx7 flood"},
				{Prefix: pfx("2001:db8:f00::/48"), Expires: hour},
			}, shield.Strict); err != nil {
				t.Fatal(err)
			}
			if err := s.Add(shield.AllowList, entries("192.0.2.9/32"), shield.Strict); err != nil {
				t.Fatal(err)
			}
			if err := s.AddPortRule(rules.PortSpec{Class: rules.UDP, From: 9, To: 9}, rules.Drop); err != nil {
				t.Fatal(err)
			}
			for i := 0; i < 3; i++ {
				for _, src := range []string{"10.10.1.1", "198.51.100.7", "2001:db8:f00::1"} {
					if v := verdictFrom(t, prog, netip.MustParseAddr(src)); v != xdpDrop {
						t.Fatalf("SYN from denied %s: verdict %d", src, v)
					}
				}
				if v := verdictFrom(t, prog, netip.MustParseAddr("192.0.2.9")); v != xdpPass {
					t.Fatalf("SYN from the allowed address: verdict %d", v)
				}
				if v := udpVerdict(t, prog, netip.MustParseAddr("203.0.113.50"), 9); v != xdpDrop {
					t.Fatalf("UDP to the dropped port: verdict %d", v)
				}
			}
			before := hitCounts(t, s)
			if len(before) != 5 {
				t.Fatalf("rules before: %v", before)
			}
			for k, n := range before {
				if n != 3 {
					t.Fatalf("%s has %d hits before the apply, want 3", k, n)
				}
			}

			rs, err := s.Snapshot()
			if err != nil {
				t.Fatal(err)
			}
			if tc.edit != nil {
				tc.edit(rs)
			}
			var stop atomic.Bool
			var wg sync.WaitGroup
			var passed, runs atomic.Int64
			if tc.watch != "" {
				wg.Add(1)
				go func() {
					defer wg.Done()
					u := testpkt.UDP{SrcPort: 40000, DstPort: 53}
					a := netip.MustParseAddr(tc.watch)
					var pkt []byte
					if a.Is4() {
						pkt = testpkt.UDPv4(a, netip.MustParseAddr("192.0.2.1"), u)
					} else {
						pkt = testpkt.UDPv6(a, netip.MustParseAddr("2001:db8:ff::1"), u)
					}
					for !stop.Load() {
						v, err := prog.Run(&ebpf.RunOptions{Data: pkt})
						if err != nil || v != xdpDrop {
							passed.Add(1)
						}
						runs.Add(1)
					}
				}()
			}
			var res shield.ApplyResult
			if tc.list {
				res, err = s.ReplaceList(shield.DenyList, rs.Deny)
			} else {
				res, err = s.Apply(rs, tc.replace)
			}
			stop.Store(true)
			wg.Wait()
			if err != nil {
				t.Fatal(err)
			}
			if res != tc.want {
				t.Errorf("result %+v, want %+v", res, tc.want)
			}
			if n := passed.Load(); n > 0 {
				t.Errorf("the filter let %s through %d times during the apply", tc.watch, n)
			}
			after := hitCounts(t, s)
			for k, n := range before {
				switch {
				case slices.Contains(tc.gone, k):
					if _, ok := after[k]; ok {
						t.Errorf("%s still listed", k)
					}
				case slices.Contains(tc.reset, k) && tc.watch != "":
					// The watcher's packets count here too: those before
					// the rewrite are lost with the old hits.
					if kept := n + uint64(runs.Load()); after[k] >= kept {
						t.Errorf("%s changed but kept its hits: %d, %d before and %d packets since", k, after[k], n, runs.Load())
					}
				case slices.Contains(tc.reset, k):
					if after[k] != 0 {
						t.Errorf("%s changed but kept %d hits", k, after[k])
					}
				default:
					if after[k] != n {
						t.Errorf("%s has %d hits after the apply, want the %d it had", k, after[k], n)
					}
				}
			}
			if v := verdictFrom(t, prog, netip.MustParseAddr("10.10.1.1")); v != xdpDrop {
				t.Errorf("10.10.0.0/16 no longer drops after the apply: verdict %d", v)
			}

			// Applying the result again changes nothing.
			rs, err = s.Snapshot()
			if err != nil {
				t.Fatal(err)
			}
			res, err = s.Apply(rs, true)
			if err != nil {
				t.Fatal(err)
			}
			if res.Changed() {
				t.Errorf("applying the snapshot again changed %+v", res)
			}
		})
	}
}

// TestInsertReplacesExpiredEntries checks that an entry past its expiry,
// which the filter ignores, does not stop a new entry for the same prefix
// (it takes the old one's place), while a live entry still refuses the
// whole change.
func TestInsertReplacesExpiredEntries(t *testing.T) {
	past := time.Now().Add(-time.Minute) // stored as already expired
	cases := []struct {
		name     string
		list     shield.List
		existing []shield.Entry
		add      []shield.Entry
		refused  string         // the error, if the add is refused
		replaced []netip.Prefix // what Insert reports it replaced
	}{
		{name: "expired deny host", list: shield.DenyList,
			existing: []shield.Entry{{Prefix: pfx("10.77.0.2/32"), Expires: past, Comment: "hx7 old"}},
			add:      []shield.Entry{{Prefix: pfx("10.77.0.2/32"), Expires: time.Now().Add(time.Hour)}},
			replaced: []netip.Prefix{pfx("10.77.0.2/32")}},
		{name: "expired deny network, IPv6", list: shield.DenyList,
			existing: []shield.Entry{{Prefix: pfx("2001:db8:77::/48"), Expires: past}},
			add:      []shield.Entry{{Prefix: pfx("2001:db8:77::/48"), Comment: "hx7 new"}},
			replaced: []netip.Prefix{pfx("2001:db8:77::/48")}},
		{name: "expired allow entry", list: shield.AllowList,
			existing: []shield.Entry{{Prefix: pfx("192.0.2.77/32"), Expires: past}},
			add:      entries("192.0.2.77/32"),
			replaced: []netip.Prefix{pfx("192.0.2.77/32")}},
		{name: "live entry", list: shield.DenyList,
			existing: []shield.Entry{{Prefix: pfx("10.77.0.2/32"), Expires: time.Now().Add(time.Hour)}},
			add:      []shield.Entry{{Prefix: pfx("10.77.0.2/32"), Expires: time.Now().Add(2 * time.Hour)}},
			refused:  "10.77.0.2/32 is already in the denylist"},
		{name: "live entry beside an expired one", list: shield.DenyList,
			existing: []shield.Entry{{Prefix: pfx("10.77.0.2/32"), Expires: past}, {Prefix: pfx("10.77.1.0/24")}},
			add:      entries("10.77.0.2/32", "10.77.1.0/24"),
			refused:  "10.77.1.0/24 is already in the denylist"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := openFresh(t)
			prog := s.LoadFilter(t)
			if err := s.Add(tc.list, tc.existing, shield.Upsert); err != nil {
				t.Fatal(err)
			}
			before, err := s.Entries(tc.list)
			if err != nil {
				t.Fatal(err)
			}
			replaced, err := s.Insert(tc.list, tc.add)
			if tc.refused != "" {
				wantUserError(t, err, tc.refused)
				after, err := s.Entries(tc.list)
				if err != nil {
					t.Fatal(err)
				}
				if !slices.EqualFunc(before, after, func(a, b shield.Entry) bool {
					return a.Prefix == b.Prefix && a.Comment == b.Comment && shield.SameExpiry(expiryOf(a), b.Expires)
				}) {
					t.Fatalf("a refused add changed the list:\n%+v\nwant\n%+v", after, before)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(replaced.Expired, tc.replaced) || len(replaced.AutoBlocks) != 0 {
				t.Errorf("replaced %v, want %v", replaced, tc.replaced)
			}
			got, err := s.Entries(tc.list)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tc.add) {
				t.Fatalf("list after the add: %+v", got)
			}
			for i, e := range got {
				w := tc.add[i]
				if e.Prefix != w.Prefix || e.Comment != w.Comment || !shield.SameExpiry(expiryOf(w), e.Expires) {
					t.Errorf("entry %+v, want %+v", e, w)
				}
			}
			if n := commentCount(t, s); n != len(slices.DeleteFunc(slices.Clone(tc.add), func(e shield.Entry) bool { return e.Comment == "" })) {
				t.Errorf("%d comments stored, want one per new entry with a comment", n)
			}
			// The filter applies the new entry.
			src := tc.add[0].Prefix.Addr()
			want := uint32(xdpDrop)
			if tc.list == shield.AllowList {
				// An allowed source passes a port rule that drops others.
				if err := s.AddPortRule(rules.PortSpec{Class: rules.UDP, From: 9, To: 9}, rules.Drop); err != nil {
					t.Fatal(err)
				}
				want = xdpPass
			}
			if v := udpVerdict(t, prog, src, 9); v != want {
				t.Errorf("UDP from %s after the add: verdict %d, want %d", src, v, want)
			}
		})
	}
}

func expiryOf(e shield.Entry) *time.Time {
	if e.Expires.IsZero() {
		return nil
	}
	return &e.Expires
}
