package shield

import (
	"net/netip"
	"slices"
	"time"

	"github.com/moat-shield/moat/internal/rules"
)

// ApplyResult counts what Apply changed.
type ApplyResult struct {
	Added     int  // allow/deny entries that the lists did not hold
	Updated   int  // allow/deny entries rewritten with another expiry or comment
	Removed   int  // allow/deny entries deleted (replace mode)
	Unchanged int  // allow/deny entries held as wanted, left alone
	PortRules int  // port rules added or removed
	Settings  bool // the policies changed
}

// Changed tells whether Apply wrote or deleted anything.
func (r ApplyResult) Changed() bool {
	return r.Added+r.Updated+r.Removed+r.PortRules > 0 || r.Settings
}

// ListDiff is what it takes to make a list hold a wanted set of entries.
type ListDiff struct {
	Write                     []Entry        // the new entries and the changed ones
	Stale                     []netip.Prefix // held but not wanted, auto-blocks left out
	Added, Updated, Unchanged int
	AutoKept                  int // auto-blocks held but not wanted: kept until they expire
	// AutoKeptIn counts them by the map that holds them (IPv4 hosts, IPv4
	// networks, IPv6 hosts, IPv6 networks): they take room there beside
	// the wanted and the stale entries.
	AutoKeptIn [4]int
}

// DiffList compares the entries a list holds (as Entries returns them) with
// the wanted ones. An entry held with the same expiry and comment is
// unchanged and is not written: writing it again would restart its hit
// counter. An auto-block that a rate limit wrote is never stale: it is
// the data path's, not the rules', and lasts until it expires (or an
// unblock). Both sides are walked in prefix order (address, then length);
// have is in that order already, and want is sorted, in a copy, if it is
// not. want must not name a prefix twice (Ruleset.Validate refuses that).
func DiffList(have []Entry, want []rules.PrefixEntry) ListDiff {
	var d ListDiff
	if len(have) == 0 { // a fresh list: everything is new, in any order
		d.Write = make([]Entry, len(want))
		for i, e := range want {
			d.Write[i] = EntryOf(e)
		}
		d.Added = len(want)
		return d
	}
	cmpEntry := func(a, b rules.PrefixEntry) int { return rules.ComparePrefixes(a.Prefix, b.Prefix) }
	if !slices.IsSortedFunc(want, cmpEntry) {
		want = slices.Clone(want)
		slices.SortFunc(want, cmpEntry)
	}
	if !slices.IsSortedFunc(have, func(a, b Entry) int { return rules.ComparePrefixes(a.Prefix, b.Prefix) }) {
		have = slices.Clone(have)
		slices.SortFunc(have, func(a, b Entry) int { return rules.ComparePrefixes(a.Prefix, b.Prefix) })
	}
	i, j := 0, 0
	for i < len(want) || j < len(have) {
		c := 0
		switch {
		case i == len(want):
			c = 1
		case j == len(have):
			c = -1
		default:
			c = rules.ComparePrefixes(want[i].Prefix, have[j].Prefix)
		}
		switch {
		case c < 0: // wanted, not held
			d.Write = append(d.Write, EntryOf(want[i]))
			d.Added++
			i++
		case c > 0: // held, not wanted
			if have[j].Auto {
				d.AutoKept++
				d.AutoKeptIn[prefixClass(have[j].Prefix)]++
			} else {
				d.Stale = append(d.Stale, have[j].Prefix)
			}
			j++
		default:
			if want[i].Comment != have[j].Comment || !SameExpiry(want[i].Expires, have[j].Expires) {
				d.Write = append(d.Write, EntryOf(want[i]))
				d.Updated++
			} else {
				d.Unchanged++
			}
			i++
			j++
		}
	}
	return d
}

// SameExpiry compares a wanted expiry with a stored one as Entries reads
// it back: through CLOCK_BOOTTIME and rounded to the second, so a second
// or so either way is the same deadline.
func SameExpiry(want *time.Time, have time.Time) bool {
	if want == nil || have.IsZero() {
		return want == nil && have.IsZero()
	}
	d := want.Sub(have)
	return d < 2*time.Second && d > -2*time.Second
}

// EntryOf is the entry a rule list holds for a rule.
func EntryOf(e rules.PrefixEntry) Entry {
	out := Entry{Prefix: e.Prefix, Comment: e.Comment}
	if e.Expires != nil {
		out.Expires = *e.Expires
	}
	return out
}

// Apply writes a whole ruleset. Everything is checked before anything is
// written. Entries that the lists hold as the ruleset has them are left
// alone (their hits keep counting), as are unchanged port rules and
// policies. In replace mode the new and changed entries are written first
// and the ones the ruleset no longer holds are removed after, so there is
// never a moment when an entry present in both the old and the new set is
// missing.
func (s *Shield) Apply(rs *rules.Ruleset, replace bool) (ApplyResult, error) {
	return s.apply(rs, [2]bool{replace, replace}, replace)
}

// ReplaceList makes list l hold exactly entries, in the same way as Apply
// in replace mode, and leaves the other list, the port rules and the
// policies alone.
func (s *Shield) ReplaceList(l List, entries []rules.PrefixEntry) (ApplyResult, error) {
	rs := &rules.Ruleset{Allow: entries}
	if l == DenyList {
		rs = &rules.Ruleset{Deny: entries}
	}
	var replace [2]bool
	replace[l] = true
	return s.apply(rs, replace, false)
}

// apply writes rs; replaceLists says, by List, which lists become the
// ruleset's (the others take its entries in), replacePorts whether the port
// rules do.
func (s *Shield) apply(rs *rules.Ruleset, replaceLists [2]bool, replacePorts bool) (ApplyResult, error) {
	var res ApplyResult
	if err := rs.Validate(); err != nil {
		return res, &UserError{err}
	}
	current, err := s.PortRules()
	if err != nil {
		return res, err
	}
	wanted := map[rules.PortSpec]rules.Action{}
	for _, p := range rs.Ports {
		wanted[p.Spec] = p.Action
		for _, c := range current {
			if c.Spec.Overlaps(p.Spec) && c.Spec != p.Spec && !(replacePorts && !covers(rs.Ports, c.Spec)) {
				return res, userErrorf("port rule %s overlaps the existing rule %s", p.Spec, c.Spec)
			}
		}
	}

	// Port rules: in replace mode the file's rules are the whole set; in
	// merge mode they join the current ones, a rule for the same ports
	// taking the file's action. Checked here, before the lists are
	// written, so that rules the port maps cannot hold change nothing.
	want := rs.Ports
	if !replacePorts {
		want = nil
		for _, c := range current {
			if _, ok := wanted[c.Spec]; !ok {
				want = append(want, rules.PortEntry{Spec: c.Spec, Action: c.Action})
			}
		}
		want = append(want, rs.Ports...)
	}
	if err := s.checkPortRules(current, want); err != nil {
		return res, err
	}

	// Both lists are checked for room before either is written, so that
	// a ruleset one of them cannot hold changes nothing.
	var stale [2][]netip.Prefix
	var changes []*listChange
	for _, x := range []struct {
		l       List
		entries []rules.PrefixEntry
	}{{AllowList, rs.Allow}, {DenyList, rs.Deny}} {
		have, err := s.Entries(x.l)
		if err != nil {
			return res, err
		}
		d := DiffList(have, x.entries)
		have = nil
		if len(d.Write) > 0 {
			c, err := s.prepareAdd(x.l, d.Write, Upsert)
			if err != nil {
				return res, err
			}
			changes = append(changes, c)
		}
		res.Added += d.Added
		res.Updated += d.Updated
		res.Unchanged += d.Unchanged
		if replaceLists[x.l] {
			stale[x.l] = d.Stale
		}
	}
	if err := s.checkCommentRoom(changes...); err != nil {
		return res, err
	}
	if err := s.commit(changes...); err != nil {
		return res, err
	}

	n, err := s.SetPortRules(want)
	res.PortRules += n
	if err != nil {
		return res, err
	}
	if rs.Settings != nil {
		cur, err := s.Settings()
		if err != nil {
			return res, err
		}
		// Monitor mode is this host's: a file from a host that enforces
		// must not end a trial here, nor one from a host on trial start
		// one.
		want := *rs.Settings
		want.Monitor = cur.Monitor
		if cur != want {
			if err := s.SetSettings(want); err != nil {
				return res, err
			}
			res.Settings = true
		}
	}

	// Stale entries last: everything wanted is in place by now.
	for _, l := range []List{AllowList, DenyList} {
		if len(stale[l]) == 0 {
			continue
		}
		if err := s.deletePrefixes(l, stale[l]); err != nil {
			return res, err
		}
		res.Removed += len(stale[l])
	}
	return res, nil
}

func covers(ports []rules.PortEntry, spec rules.PortSpec) bool {
	for _, p := range ports {
		if p.Spec == spec {
			return true
		}
	}
	return false
}

// Snapshot returns every rule and setting as a ruleset, with hit counts.
// An auto-block of monitor mode has its comment marked so.
func (s *Shield) Snapshot() (*rules.Ruleset, error) { return s.snapshot(false) }

// Export is Snapshot without the auto-blocks of monitor mode: elsewhere
// they would be in force.
func (s *Shield) Export() (*rules.Ruleset, error) { return s.snapshot(true) }

func (s *Shield) snapshot(export bool) (*rules.Ruleset, error) {
	rs := &rules.Ruleset{Allow: []rules.PrefixEntry{}, Deny: []rules.PrefixEntry{}, Ports: []rules.PortEntry{}}
	for _, x := range []struct {
		l   List
		out *[]rules.PrefixEntry
	}{{AllowList, &rs.Allow}, {DenyList, &rs.Deny}} {
		entries, err := s.Entries(x.l)
		if err != nil {
			return nil, err
		}
		for _, e := range entries {
			if e.Monitor && export {
				continue
			}
			pe := rules.PrefixEntry{Prefix: e.Prefix, Comment: e.Comment, Hits: e.Hits}
			if e.Monitor {
				pe.Comment = "monitor mode: " + pe.Comment
			}
			if !e.Expires.IsZero() {
				t := e.Expires.UTC().Truncate(time.Second)
				pe.Expires = &t
			}
			*x.out = append(*x.out, pe)
		}
	}
	ports, err := s.PortRules()
	if err != nil {
		return nil, err
	}
	for _, p := range ports {
		rs.Ports = append(rs.Ports, rules.PortEntry{Spec: p.Spec, Action: p.Action, Hits: p.Hits})
	}
	set, err := s.Settings()
	if err != nil {
		return nil, err
	}
	rs.Settings = &set
	return rs, nil
}
