package shield

import (
	"net/netip"
	"time"

	"github.com/moat-shield/moat/internal/rules"
)

// ApplyResult counts what Apply changed.
type ApplyResult struct {
	Added, Removed, PortRules int
}

// Apply writes a whole ruleset. Everything is checked before anything is
// written. In replace mode the new entries are written first and the ones
// the ruleset no longer holds are removed after, so there is never a moment
// when an entry present in both the old and the new set is missing.
func (s *Shield) Apply(rs *rules.Ruleset, replace bool) (ApplyResult, error) {
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
			if c.Spec.Overlaps(p.Spec) && c.Spec != p.Spec && !(replace && !covers(rs.Ports, c.Spec)) {
				return res, userErrorf("port rule %s overlaps the existing rule %s", p.Spec, c.Spec)
			}
		}
	}

	lists := []struct {
		l       List
		entries []rules.PrefixEntry
	}{{AllowList, rs.Allow}, {DenyList, rs.Deny}}
	for _, x := range lists {
		entries := make([]Entry, len(x.entries))
		for i, e := range x.entries {
			entries[i] = Entry{Prefix: e.Prefix, Comment: e.Comment}
			if e.Expires != nil {
				entries[i].Expires = *e.Expires
			}
		}
		if err := s.Add(x.l, entries, Upsert); err != nil {
			return res, err
		}
		res.Added += len(entries)
	}

	// Port rules: in replace mode the file's rules are the whole set; in
	// merge mode they join the current ones, a rule for the same ports
	// taking the file's action.
	want := rs.Ports
	if !replace {
		want = nil
		for _, c := range current {
			if _, ok := wanted[c.Spec]; !ok {
				want = append(want, rules.PortEntry{Spec: c.Spec, Action: c.Action})
			}
		}
		want = append(want, rs.Ports...)
	}
	n, err := s.SetPortRules(want)
	res.PortRules += n
	if err != nil {
		return res, err
	}
	if rs.Settings != nil {
		if err := s.SetSettings(*rs.Settings); err != nil {
			return res, err
		}
	}

	if replace {
		for _, x := range lists {
			keep := make(map[netip.Prefix]bool, len(x.entries))
			for _, e := range x.entries {
				keep[e.Prefix] = true
			}
			have, err := s.Entries(x.l)
			if err != nil {
				return res, err
			}
			var gone []netip.Prefix
			for _, e := range have {
				if !keep[e.Prefix] {
					gone = append(gone, e.Prefix)
				}
			}
			if err := s.deletePrefixes(x.l, gone); err != nil {
				return res, err
			}
			res.Removed += len(gone)
		}
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
func (s *Shield) Snapshot() (*rules.Ruleset, error) {
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
			pe := rules.PrefixEntry{Prefix: e.Prefix, Comment: e.Comment, Hits: e.Hits}
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
