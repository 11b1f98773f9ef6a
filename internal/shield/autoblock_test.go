package shield_test

import (
	"errors"
	"maps"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/moat-shield/moat/internal/datapath"
	"github.com/moat-shield/moat/internal/rules"
	"github.com/moat-shield/moat/internal/shield"
)

// TestReplaceKeepsAutoBlocks: an entry a rate limit wrote (RULE_F_AUTO) is
// the data path's, so making the denylist equal to a ruleset, as a daemon
// reload and `moat import --replace` do, leaves it in place, while a rule
// the ruleset no longer names goes.
func TestReplaceKeepsAutoBlocks(t *testing.T) {
	s := openFresh(t)
	if err := s.Add(shield.DenyList, entries("198.51.100.7/32", "203.0.113.0/24"), shield.Strict); err != nil {
		t.Fatal(err)
	}
	auto := netip.MustParseAddr("198.51.100.9")
	// As the data path's auto-block writes it: a host entry that expires,
	// flagged auto.
	v := datapath.MoatPrefixRule{Prefixlen: 32, Flags: 2, ExpiresNs: bootNs(t) + 600e9}
	if err := s.Map(datapath.MoatMapDenyV4Hosts).Put(datapath.MoatHostV4{Addr: auto.As4()}, v); err != nil {
		t.Fatal(err)
	}
	es, err := s.Entries(shield.DenyList)
	if err != nil {
		t.Fatal(err)
	}
	d := shield.DiffList(es, []rules.PrefixEntry{{Prefix: netip.MustParsePrefix("203.0.113.0/24")}})
	if len(d.Stale) != 1 || d.Stale[0] != netip.MustParsePrefix("198.51.100.7/32") || d.AutoKept != 1 || d.AutoKeptIn != [4]int{1, 0, 0, 0} {
		t.Errorf("diff: stale %v, %d auto-blocks kept (by map %v); want only 198.51.100.7/32 stale and 1 IPv4 host kept", d.Stale, d.AutoKept, d.AutoKeptIn)
	}

	for _, replace := range []func() error{
		func() error {
			_, err := s.Apply(&rules.Ruleset{Deny: []rules.PrefixEntry{{Prefix: netip.MustParsePrefix("203.0.113.0/24")}}}, true)
			return err
		},
		func() error { _, err := s.ReplaceList(shield.DenyList, nil); return err },
	} {
		if err := replace(); err != nil {
			t.Fatal(err)
		}
		es, err := s.Entries(shield.DenyList)
		if err != nil {
			t.Fatal(err)
		}
		kept := false
		for _, e := range es {
			if e.Prefix == netip.PrefixFrom(auto, 32) {
				kept = e.Auto
			}
			if e.Prefix == netip.MustParsePrefix("198.51.100.7/32") {
				t.Errorf("the rule no longer wanted is still held")
			}
		}
		if !kept {
			t.Errorf("the auto-block of %v was removed: %+v", auto, es)
		}
	}
}

func bootNs(t *testing.T) uint64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		t.Fatal(err)
	}
	return uint64(ts.Nano())
}

// TestMonitorModeAutoBlocks: an auto-block written in monitor mode
// (RULE_F_MONITOR) is listed as monitor mode's, left out of exports, and
// deleted when monitor mode is turned off, while an auto-block written
// when enforcing stays. An import leaves monitor mode as it is.
func TestMonitorModeAutoBlocks(t *testing.T) {
	s := openFresh(t)
	if err := s.SetSettings(rules.Settings{Fragments: "pass", Malformed: "drop", Monitor: true}); err != nil {
		t.Fatal(err)
	}
	trial, real := netip.MustParseAddr("198.51.100.9"), netip.MustParseAddr("198.51.100.10")
	for _, b := range []struct {
		addr  netip.Addr
		flags uint32
	}{{trial, 2 | 4}, {real, 2}} {
		v := datapath.MoatPrefixRule{Prefixlen: 32, Flags: b.flags, ExpiresNs: bootNs(t) + 600e9}
		if err := s.Map(datapath.MoatMapDenyV4Hosts).Put(datapath.MoatHostV4{Addr: b.addr.As4()}, v); err != nil {
			t.Fatal(err)
		}
	}
	denied := func(rs *rules.Ruleset, a netip.Addr) (string, bool) {
		for _, e := range rs.Deny {
			if e.Prefix == netip.PrefixFrom(a, 32) {
				return e.Comment, true
			}
		}
		return "", false
	}
	rs, err := s.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if c, ok := denied(rs, trial); !ok || c != "monitor mode: " {
		t.Errorf("listing: trial block %v, comment %q; want it listed as monitor mode's", ok, c)
	}
	ex, err := s.Export()
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := denied(ex, trial); ok {
		t.Error("the export holds monitor mode's auto-block")
	}
	if _, ok := denied(ex, real); !ok {
		t.Error("the export lacks the auto-block written when enforcing")
	}

	// An import from a host that enforces keeps this host on trial.
	if _, err := s.Apply(&rules.Ruleset{Settings: &rules.Settings{Fragments: "drop", Malformed: "drop"}}, false); err != nil {
		t.Fatal(err)
	}
	if set, err := s.Settings(); err != nil || !set.Monitor || set.Fragments != "drop" {
		t.Fatalf("settings after an import %+v (%v): want fragments drop and monitor mode still on", set, err)
	}

	if err := s.SetSettings(rules.Settings{Fragments: "drop", Malformed: "drop"}); err != nil {
		t.Fatal(err)
	}
	if rs, err = s.Snapshot(); err != nil {
		t.Fatal(err)
	}
	if _, ok := denied(rs, trial); ok {
		t.Error("monitor mode's auto-block outlived monitor mode")
	}
	if _, ok := denied(rs, real); !ok {
		t.Error("turning monitor mode off took the auto-block written when enforcing")
	}
}

// TestBlockReplacesAutoBlock: an auto-block is the limit's, not a rule of
// the operator's: it lapses at its expiry, and monitor mode's at the end
// of the trial. So `moat block` of its source writes the operator's entry
// in its place (and says so) rather than refuse with "already in the
// denylist" and leave the source to be let through once the auto-block
// goes; the entry outlives the trial.
func TestBlockReplacesAutoBlock(t *testing.T) {
	for _, monitor := range []bool{false, true} {
		t.Run(map[bool]string{false: "enforcing", true: "monitor mode"}[monitor], func(t *testing.T) {
			s := openFresh(t)
			if err := s.SetSettings(rules.Settings{Fragments: "pass", Malformed: "drop", Monitor: monitor}); err != nil {
				t.Fatal(err)
			}
			src := netip.MustParseAddr("198.51.100.9")
			// As the data path writes it: auto, with a reason (and
			// monitor's in monitor mode).
			v := datapath.MoatPrefixRule{Prefixlen: 32, Flags: 1 | 2, ExpiresNs: bootNs(t) + 600e9}
			if monitor {
				v.Flags |= 4
			}
			if err := s.Map(datapath.MoatMapAutoReasons).Put(datapath.MoatCommentKey{List: 1, Family: 4, Prefixlen: 32, Addr: [16]byte(append(src.AsSlice(), make([]byte, 12)...))},
				datapath.MoatComment{}); err != nil {
				t.Fatal(err)
			}
			if err := s.Map(datapath.MoatMapDenyV4Hosts).Put(datapath.MoatHostV4{Addr: src.As4()}, v); err != nil {
				t.Fatal(err)
			}
			r, err := s.Insert(shield.DenyList, entries("198.51.100.9/32"))
			if err != nil {
				t.Fatalf("block of an auto-blocked source: %v", err)
			}
			if len(r.AutoBlocks) != 1 || r.AutoBlocks[0] != netip.PrefixFrom(src, 32) || len(r.Expired) != 0 {
				t.Errorf("replaced %+v, want the one auto-block", r)
			}
			if err := s.SetSettings(rules.Settings{Fragments: "pass", Malformed: "drop"}); err != nil {
				t.Fatal(err)
			}
			e, ok, err := s.Stored(shield.DenyList, netip.PrefixFrom(src, 32))
			if err != nil || !ok || e.Auto || e.Monitor || !e.Expires.IsZero() {
				t.Fatalf("after the block (and monitor mode): entry %+v held %v (%v); want the operator's, without expiry", e, ok, err)
			}
			if n := mapCount(t, s, datapath.MoatMapAutoReasons); n != 0 {
				t.Errorf("%d auto-block reasons left; the replaced one's went with it", n)
			}
			// The operator's entry is a rule: a second block is refused.
			if _, err := s.Insert(shield.DenyList, entries("198.51.100.9/32")); err == nil {
				t.Error("a second block of the same source was not refused")
			}
		})
	}
}

// TestAutoBlockReasons: the data path writes an auto-block's reason into a
// map of its own, so that a flood's blocks never fill the operators'
// comment map. Listings take an auto-block's reason from there, and one
// written by an older moat from the comment map; an operator's entry never
// shows a reason left behind for its prefix; removing an auto-block takes
// its reason with it.
func TestAutoBlockReasons(t *testing.T) {
	s := openFresh(t)
	key := func(a netip.Addr) datapath.MoatCommentKey {
		return datapath.MoatCommentKey{List: 1, Family: 4, Prefixlen: 32, Addr: [16]byte(append(a.AsSlice(), make([]byte, 12)...))}
	}
	text := func(s string) (c datapath.MoatComment) {
		for i := range len(s) {
			c.Text[i] = int8(s[i])
		}
		return c
	}
	auto := netip.MustParseAddr("198.51.100.1")  // written by this data path
	older := netip.MustParseAddr("198.51.100.2") // by an older one, into the comments
	if err := s.Add(shield.DenyList, []shield.Entry{{Prefix: netip.MustParsePrefix("198.51.100.3/32"), Comment: "the operator's"}}, shield.Strict); err != nil {
		t.Fatal(err)
	}
	for _, w := range []struct {
		m    string
		a    netip.Addr
		text string
	}{
		{datapath.MoatMapAutoReasons, auto, "auto-block on udp: over 10pps per source"},
		{datapath.MoatMapComments, older, "auto-block on tcp: over 5pps per source"},
		{datapath.MoatMapAutoReasons, netip.MustParseAddr("198.51.100.3"), "left behind"},
	} {
		if err := s.Map(w.m).Put(key(w.a), text(w.text)); err != nil {
			t.Fatal(err)
		}
	}
	for _, a := range []netip.Addr{auto, older} {
		v := datapath.MoatPrefixRule{Prefixlen: 32, Flags: 1 | 2, ExpiresNs: bootNs(t) + 600e9}
		if err := s.Map(datapath.MoatMapDenyV4Hosts).Put(datapath.MoatHostV4{Addr: a.As4()}, v); err != nil {
			t.Fatal(err)
		}
	}
	es, err := s.Entries(shield.DenyList)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, e := range es {
		got[e.Prefix.String()] = e.Comment
	}
	want := map[string]string{
		"198.51.100.1/32": "auto-block on udp: over 10pps per source",
		"198.51.100.2/32": "auto-block on tcp: over 5pps per source",
		"198.51.100.3/32": "the operator's",
	}
	if !maps.Equal(got, want) {
		t.Errorf("listing %v, want %v", got, want)
	}
	if err := s.RemovePrefixes(shield.DenyList, []netip.Prefix{netip.PrefixFrom(auto, 32), netip.PrefixFrom(older, 32)}); err != nil {
		t.Fatal(err)
	}
	var c datapath.MoatComment
	if err := s.Map(datapath.MoatMapAutoReasons).Lookup(key(auto), &c); !errors.Is(err, ebpf.ErrKeyNotExist) {
		t.Errorf("the removed auto-block's reason is still there (%v)", err)
	}
	if n := commentCount(t, s); n != 1 {
		t.Errorf("%d comments after the auto-blocks went, want the operator's 1", n)
	}
}
