package shield

import (
	"encoding/binary"
	"fmt"
	"sort"
	"unsafe"

	"github.com/cilium/ebpf"

	"github.com/moat-shield/moat/internal/datapath"
	"github.com/moat-shield/moat/internal/rules"
)

// PortRule is a protocol/port or ICMP type rule as stored: one id written in
// every slot of the port table that its range covers.
type PortRule struct {
	ID     uint16
	Spec   rules.PortSpec
	Action rules.Action
	Hits   uint64
}

func portIndex(c rules.Class, port uint16) uint32 { return uint32(c)<<16 | uint32(port) }

// PortRules lists the port rules from the definitions table, in the order
// of the port table.
func (s *Shield) PortRules() ([]PortRule, error) {
	defs, err := s.portDefs()
	if err != nil {
		return nil, err
	}
	var out []PortRule
	for id, d := range defs {
		if d.Action == 0 {
			continue
		}
		hits, err := s.portHits(uint16(id))
		if err != nil {
			return nil, err
		}
		out = append(out, PortRule{
			ID:     uint16(id),
			Spec:   rules.PortSpec{Class: rules.Class(d.Class), From: d.From, To: d.To},
			Action: rules.Action(d.Action),
			Hits:   hits,
		})
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i].Spec, out[j].Spec
		return portIndex(a.Class, a.From) < portIndex(b.Class, b.From)
	})
	return out, nil
}

// portDefs reads the definitions table, indexed by rule id.
func (s *Shield) portDefs() ([]datapath.MoatPortRuleDef, error) {
	m := s.maps[datapath.MoatMapPortRuleDefs]
	n := int(m.MaxEntries())
	keys := make([]uint32, n)
	vals := make([]datapath.MoatPortRuleDef, n)
	var cursor ebpf.MapBatchCursor
	got := 0
	for got < n {
		c, err := m.BatchLookup(&cursor, keys[got:], vals[got:], nil)
		got += c
		if err != nil {
			if isBatchEnd(err) {
				break
			}
			return nil, fmt.Errorf("read port rules: %w", err)
		}
	}
	defs := make([]datapath.MoatPortRuleDef, n)
	for i := 0; i < got; i++ {
		defs[keys[i]] = vals[i]
	}
	return defs, nil
}

func (s *Shield) portHits(id uint16) (uint64, error) {
	var perCPU []uint64
	if err := s.maps[datapath.MoatMapPortRuleHits].Lookup(uint32(id), &perCPU); err != nil {
		return 0, err
	}
	var sum uint64
	for _, v := range perCPU {
		sum += v
	}
	return sum, nil
}

// AddPortRule installs a rule. It refuses a rule that overlaps an existing
// one, naming it; nothing changes then. Each slot of the table flips from
// "no rule" to the new rule in one atomic element write.
func (s *Shield) AddPortRule(spec rules.PortSpec, action rules.Action) error {
	existing, err := s.PortRules()
	if err != nil {
		return err
	}
	used := map[uint16]bool{}
	for _, r := range existing {
		used[r.ID] = true
		if r.Spec.Overlaps(spec) {
			if r.Spec == spec {
				return userErrorf("port rule %s exists already (%s)", spec, r.Action)
			}
			return userErrorf("port rule %s overlaps the existing rule %s (%s)", spec, r.Spec, r.Action)
		}
	}
	limit := int(s.maps[datapath.MoatMapPortRuleHits].MaxEntries())
	id := uint16(0)
	for i := 1; i < limit; i++ {
		if !used[uint16(i)] {
			id = uint16(i)
			break
		}
	}
	if id == 0 {
		return userErrorf("no room for another port rule: %d rules is the limit", limit-1)
	}
	// A reused id must not inherit its old rule's hits.
	zero := make([]uint64, ebpf.MustPossibleCPU())
	if err := s.maps[datapath.MoatMapPortRuleHits].Update(uint32(id), zero, ebpf.UpdateAny); err != nil {
		return err
	}
	return s.setPortRule(id, spec, action)
}

// setPortRule writes a rule's definition, then its slots, so a listing
// never misses a rule that the data path applies.
func (s *Shield) setPortRule(id uint16, spec rules.PortSpec, action rules.Action) error {
	def := datapath.MoatPortRuleDef{Class: uint8(spec.Class), Action: uint8(action), From: spec.From, To: spec.To}
	if err := s.maps[datapath.MoatMapPortRuleDefs].Update(uint32(id), def, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("update port rules: %w", err)
	}
	return s.writePorts(spec, portValue(id, action))
}

func portValue(id uint16, a rules.Action) datapath.MoatPortRule {
	return datapath.MoatPortRule{Id: id, Action: uint8(a)}
}

// RemovePortRule deletes the rule that covers exactly spec.
func (s *Shield) RemovePortRule(spec rules.PortSpec) error {
	existing, err := s.PortRules()
	if err != nil {
		return err
	}
	for _, r := range existing {
		if r.Spec == spec {
			if err := s.writePorts(spec, datapath.MoatPortRule{}); err != nil {
				return err
			}
			return s.maps[datapath.MoatMapPortRuleDefs].Update(uint32(r.ID), datapath.MoatPortRuleDef{}, ebpf.UpdateAny)
		}
		if r.Spec.Overlaps(spec) {
			return userErrorf("no port rule %s; the rule there is %s", spec, r.Spec)
		}
	}
	return userErrorf("no port rule %s", spec)
}

func (s *Shield) writePorts(spec rules.PortSpec, v datapath.MoatPortRule) error {
	n := int(spec.To) - int(spec.From) + 1
	keys := make([]uint32, n)
	vals := make([]datapath.MoatPortRule, n)
	for i := range keys {
		keys[i] = portIndex(spec.Class, spec.From+uint16(i))
		vals[i] = v
	}
	if _, err := s.maps[datapath.MoatMapPortRules].BatchUpdate(keys, vals, nil); err != nil {
		return fmt.Errorf("update port rules: %w", err)
	}
	return nil
}

// Settings reads the fragment and malformed-packet policies and whether
// verdicts are only monitored.
func (s *Shield) Settings() (rules.Settings, error) {
	var v datapath.MoatRuntimeSettings
	m := s.maps[datapath.MoatMapSettings]
	if m.ValueSize() == uint32(unsafe.Sizeof(v)) {
		if err := m.Lookup(uint32(0), &v); err != nil {
			return rules.Settings{}, err
		}
	} else {
		// Pinned by an older moat, with fewer policies (OpenAsIs): the
		// fields it had lead the struct, one it lacked is at its default,
		// as carrySettings would make it.
		var b []byte
		if err := m.Lookup(uint32(0), &b); err != nil {
			return rules.Settings{}, err
		}
		copy(unsafe.Slice((*byte)(unsafe.Pointer(&v)), unsafe.Sizeof(v)), b)
	}
	out := rules.Settings{Fragments: "pass", Malformed: "drop"}
	if v.Fragments == uint32(datapath.MoatFragmentPolicyFRAGMENTS_DROP) {
		out.Fragments = "drop"
	}
	if v.Malformed == uint32(datapath.MoatMalformedPolicyMALFORMED_PASS) {
		out.Malformed = "pass"
	}
	out.Monitor = v.Monitor != 0
	return out, nil
}

func defaultSettings() rules.Settings { return rules.Settings{Fragments: "pass", Malformed: "drop"} }

// SettingsOlderFilter names an interface whose filter reads the settings
// map this one replaced (an older moat's, whose settings were shorter: see
// carrySettings), or "" if none does: the policies, monitor mode and the
// allowlist's families in use reach it only once `moat attach` replaces
// it.
func (s *Shield) SettingsOlderFilter() (string, error) {
	return s.filterWithout(datapath.MoatMapSettings)
}

// SetSettings changes the policies and the monitor mode in one element
// write.
func (s *Shield) SetSettings(set rules.Settings) error {
	if err := set.Validate(); err != nil {
		return &UserError{err}
	}
	cur, err := s.Settings()
	if err != nil {
		return err
	}
	if err := s.writeSettings(set); err != nil {
		return err
	}
	if cur.Monitor && !set.Monitor {
		// The trial's auto-blocks: out of force from the write above.
		return s.dropMonitorBlocks()
	}
	return nil
}

func (s *Shield) writeSettings(set rules.Settings) error {
	var cur datapath.MoatRuntimeSettings
	if err := s.maps[datapath.MoatMapSettings].Lookup(uint32(0), &cur); err != nil {
		return err
	}
	v := datapath.MoatRuntimeSettings{
		Fragments:  uint32(datapath.MoatFragmentPolicyFRAGMENTS_PASS),
		Malformed:  uint32(datapath.MoatMalformedPolicyMALFORMED_DROP),
		AllowInUse: cur.AllowInUse, // kept up by the allowlist's writers
	}
	if set.Fragments == "drop" {
		v.Fragments = uint32(datapath.MoatFragmentPolicyFRAGMENTS_DROP)
	}
	if set.Malformed == "pass" {
		v.Malformed = uint32(datapath.MoatMalformedPolicyMALFORMED_PASS)
	}
	if set.Monitor {
		v.Monitor = 1
	}
	return s.maps[datapath.MoatMapSettings].Update(uint32(0), v, ebpf.UpdateAny)
}

// updateAllowInUse rewrites the allowlist's in-use bits (see enum
// allow_in_use) in one element write.
func (s *Shield) updateAllowInUse(change func(uint32) uint32) error {
	m := s.maps[datapath.MoatMapSettings]
	var v datapath.MoatRuntimeSettings
	if m.ValueSize() != uint32(unsafe.Sizeof(v)) {
		return updateOlderAllowInUse(m, change)
	}
	if err := m.Lookup(uint32(0), &v); err != nil {
		return err
	}
	next := change(v.AllowInUse)
	if next == v.AllowInUse {
		return nil
	}
	v.AllowInUse = next
	return m.Update(uint32(0), v, ebpf.UpdateAny)
}

// updateOlderAllowInUse is updateAllowInUse for settings an older moat
// pinned with fewer fields (OpenAsIs leaves them in place): its filter
// reads the in-use bits there, at the same offset, so they are written
// there, in a value of the map's own size. A moat older than the bits
// has no field for them, and its filter looks every allowlist up.
func updateOlderAllowInUse(m *ebpf.Map, change func(uint32) uint32) error {
	at := int(unsafe.Offsetof(datapath.MoatRuntimeSettings{}.AllowInUse))
	if int(m.ValueSize()) < at+4 {
		return nil
	}
	var b []byte
	if err := m.Lookup(uint32(0), &b); err != nil {
		return err
	}
	cur := binary.NativeEndian.Uint32(b[at:])
	next := change(cur)
	if next == cur {
		return nil
	}
	binary.NativeEndian.PutUint32(b[at:], next)
	return m.Update(uint32(0), b, ebpf.UpdateAny)
}

// SetPortRules makes the port rules equal to want and returns how many
// rules it added or removed. Unchanged rules are left alone (their hits
// keep counting). A changed rule never leaves its ports without a rule: the
// new rule is written over the slots of the old one, each slot flipping in
// one element write, and only then are the old rule's remaining slots and
// definition cleared.
func (s *Shield) SetPortRules(want []rules.PortEntry) (int, error) {
	cur, err := s.PortRules()
	if err != nil {
		return 0, err
	}
	if err := s.checkPortRules(cur, want); err != nil {
		return 0, err
	}
	keep := map[rules.PortEntry]bool{}
	for _, w := range want {
		keep[rules.PortEntry{Spec: w.Spec, Action: w.Action}] = true
	}
	used := map[uint16]bool{}
	have := map[rules.PortEntry]bool{}
	var stale []PortRule
	for _, c := range cur {
		used[c.ID] = true
		e := rules.PortEntry{Spec: c.Spec, Action: c.Action}
		if keep[e] {
			have[e] = true
		} else {
			stale = append(stale, c)
		}
	}
	limit := int(s.maps[datapath.MoatMapPortRuleDefs].MaxEntries())
	next := uint16(1)
	changes := 0
	for _, w := range want {
		if have[rules.PortEntry{Spec: w.Spec, Action: w.Action}] {
			continue
		}
		for int(next) < limit && used[next] {
			next++
		}
		if int(next) >= limit {
			return changes, userErrorf("no room for port rule %s: %d rules is the limit", w.Spec, limit-1)
		}
		used[next] = true
		zero := make([]uint64, ebpf.MustPossibleCPU())
		if err := s.maps[datapath.MoatMapPortRuleHits].Update(uint32(next), zero, ebpf.UpdateAny); err != nil {
			return changes, err
		}
		if err := s.setPortRule(next, w.Spec, w.Action); err != nil {
			return changes, err
		}
		changes++
	}
	for _, st := range stale {
		// Clear the slots that no wanted rule has taken over.
		for _, r := range uncovered(st.Spec, want) {
			if err := s.writePorts(r, datapath.MoatPortRule{}); err != nil {
				return changes, err
			}
		}
		if err := s.maps[datapath.MoatMapPortRuleDefs].Update(uint32(st.ID), datapath.MoatPortRuleDef{}, ebpf.UpdateAny); err != nil {
			return changes, err
		}
		changes++
	}
	return changes, nil
}

// CheckRoomFor refuses port rules to add, all with one action, that would
// not fit beside those held: nothing changes if one would not.
func (s *Shield) CheckRoomFor(specs []rules.PortSpec, action rules.Action) error {
	cur, err := s.PortRules()
	if err != nil {
		return err
	}
	want := make([]rules.PortEntry, 0, len(cur)+len(specs))
	for _, r := range cur {
		want = append(want, rules.PortEntry{Spec: r.Spec, Action: r.Action})
	}
	for _, spec := range specs {
		want = append(want, rules.PortEntry{Spec: spec, Action: action})
	}
	return s.checkPortRules(cur, want)
}

// CheckPortRules refuses, with the error SetPortRules would return part
// way, a set of port rules that SetPortRules could not put in place: for
// callers that must know before they write anything else.
func (s *Shield) CheckPortRules(want []rules.PortEntry) error {
	cur, err := s.PortRules()
	if err != nil {
		return err
	}
	return s.checkPortRules(cur, want)
}

// checkPortRules refuses a set of port rules that SetPortRules could not
// put in place of cur: a rule without an action, rules that overlap, or
// more new rules than there are free ids (those of stale rules are freed
// only after the new ones are written).
func (s *Shield) checkPortRules(cur []PortRule, want []rules.PortEntry) error {
	for i, w := range want {
		if w.Action != rules.Drop && w.Action != rules.Allow {
			return userErrorf("port rule %s: missing action", w.Spec)
		}
		for _, o := range want[:i] {
			if o.Spec.Overlaps(w.Spec) {
				return userErrorf("port rules %s and %s overlap", o.Spec, w.Spec)
			}
		}
	}
	held := map[rules.PortEntry]bool{}
	for _, c := range cur {
		held[rules.PortEntry{Spec: c.Spec, Action: c.Action}] = true
	}
	added := 0
	for _, w := range want {
		if !held[rules.PortEntry{Spec: w.Spec, Action: w.Action}] {
			added++
		}
	}
	if limit := int(s.maps[datapath.MoatMapPortRuleDefs].MaxEntries()) - 1; len(cur)+added > limit {
		return userErrorf("no room for %d more port rules: %d rules is the limit and %d are held", added, limit, len(cur))
	}
	return nil
}

// uncovered returns the parts of spec that no rule in want covers.
func uncovered(spec rules.PortSpec, want []rules.PortEntry) []rules.PortSpec {
	covered := make([]bool, int(spec.To)-int(spec.From)+1)
	for _, w := range want {
		if !w.Spec.Overlaps(spec) {
			continue
		}
		lo, hi := max(w.Spec.From, spec.From), min(w.Spec.To, spec.To)
		for p := int(lo); p <= int(hi); p++ {
			covered[p-int(spec.From)] = true
		}
	}
	var out []rules.PortSpec
	for i := 0; i < len(covered); {
		if covered[i] {
			i++
			continue
		}
		j := i
		for j+1 < len(covered) && !covered[j+1] {
			j++
		}
		out = append(out, rules.PortSpec{Class: spec.Class, From: spec.From + uint16(i), To: spec.From + uint16(j)})
		i = j + 1
	}
	return out
}
