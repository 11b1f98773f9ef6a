package shield

import (
	"fmt"

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

// portTable reads the whole port table in a few batched lookups.
func (s *Shield) portTable() ([]datapath.MoatPortRule, error) {
	m := s.maps[datapath.MoatMapPortRules]
	n := int(m.MaxEntries())
	keys := make([]uint32, n)
	vals := make([]datapath.MoatPortRule, n)
	var cursor ebpf.MapBatchCursor
	got := 0
	for got < n {
		c, err := m.BatchLookup(&cursor, keys[got:], vals[got:], nil)
		got += c
		if err != nil {
			if got == n || isBatchEnd(err) {
				break
			}
			return nil, fmt.Errorf("read port rules: %w", err)
		}
	}
	table := make([]datapath.MoatPortRule, n)
	for i := 0; i < got; i++ {
		table[keys[i]] = vals[i]
	}
	return table, nil
}

// PortRules lists the port rules, in table order.
func (s *Shield) PortRules() ([]PortRule, error) {
	table, err := s.portTable()
	if err != nil {
		return nil, err
	}
	var out []PortRule
	for i := 0; i < len(table); {
		r := table[i]
		if r.Id == 0 {
			i++
			continue
		}
		j := i
		for j+1 < len(table) && table[j+1].Id == r.Id && (j+1)>>16 == i>>16 {
			j++
		}
		hits, err := s.portHits(r.Id)
		if err != nil {
			return nil, err
		}
		out = append(out, PortRule{
			ID:     r.Id,
			Spec:   rules.PortSpec{Class: rules.Class(i >> 16), From: uint16(i), To: uint16(j)},
			Action: rules.Action(r.Action),
			Hits:   hits,
		})
		i = j + 1
	}
	return out, nil
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
			return s.writePorts(spec, datapath.MoatPortRule{})
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

// Settings reads the fragment and malformed-packet policies.
func (s *Shield) Settings() (rules.Settings, error) {
	var v datapath.MoatRuntimeSettings
	if err := s.maps[datapath.MoatMapSettings].Lookup(uint32(0), &v); err != nil {
		return rules.Settings{}, err
	}
	out := rules.Settings{Fragments: "pass", Malformed: "drop"}
	if v.Fragments == uint32(datapath.MoatFragmentPolicyFRAGMENTS_DROP) {
		out.Fragments = "drop"
	}
	if v.Malformed == uint32(datapath.MoatMalformedPolicyMALFORMED_PASS) {
		out.Malformed = "pass"
	}
	return out, nil
}

func defaultSettings() rules.Settings { return rules.Settings{Fragments: "pass", Malformed: "drop"} }

// SetSettings changes the policies in one element write.
func (s *Shield) SetSettings(set rules.Settings) error {
	if err := set.Validate(); err != nil {
		return &UserError{err}
	}
	return s.writeSettings(set)
}

func (s *Shield) writeSettings(set rules.Settings) error {
	v := datapath.MoatRuntimeSettings{
		Fragments: uint32(datapath.MoatFragmentPolicyFRAGMENTS_PASS),
		Malformed: uint32(datapath.MoatMalformedPolicyMALFORMED_DROP),
	}
	if set.Fragments == "drop" {
		v.Fragments = uint32(datapath.MoatFragmentPolicyFRAGMENTS_DROP)
	}
	if set.Malformed == "pass" {
		v.Malformed = uint32(datapath.MoatMalformedPolicyMALFORMED_PASS)
	}
	return s.maps[datapath.MoatMapSettings].Update(uint32(0), v, ebpf.UpdateAny)
}
