package ratelimit

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/cilium/ebpf"

	"github.com/moat-shield/moat/internal/datapath"
)

// Status is a stored limit with its id and counters.
type Status struct {
	ID uint16 `json:"id"`
	Limit
	Stats RuleStats `json:"stats"`
}

// RuleStats are a limit's counters, summed over CPUs.
type RuleStats struct {
	Passed       uint64 `json:"passed"`
	PassedBytes  uint64 `json:"passed_bytes"`
	Dropped      uint64 `json:"dropped"`
	DroppedBytes uint64 `json:"dropped_bytes"`
	// Over the limit but passed, in monitor mode: what enforcing would
	// have dropped. Named as moat stats names them.
	Monitored      uint64 `json:"monitored"`
	MonitoredBytes uint64 `json:"monitored_bytes"`
	// Source limits: packets passed before their source had a bucket,
	// buckets created, and denylist entries written (and failed).
	Untracked   uint64 `json:"untracked,omitempty"`
	Tracked     uint64 `json:"tracked,omitempty"`
	Blocks      uint64 `json:"blocks,omitempty"`
	BlockErrors uint64 `json:"block_errors,omitempty"`
}

type stored struct {
	id   uint16
	lim  Limit
	rule datapath.MoatRlRule // as stored, which lim describes
}

// stored reads the rules table.
func (m Maps) stored() ([]stored, error) {
	var out []stored
	var r datapath.MoatRlRule
	for id := uint32(1); id <= MaxRules; id++ {
		if err := m.Rules.Lookup(id, &r); err != nil {
			return nil, fmt.Errorf("read rate limit %d: %w", id, err)
		}
		if r.Kind == 0 {
			continue
		}
		out = append(out, stored{uint16(id), limitOf(r), r})
	}
	return out, nil
}

// Limits lists the stored limits with their counters, general scopes first.
func (m Maps) Limits() ([]Status, error) {
	st, err := m.stored()
	if err != nil {
		return nil, err
	}
	out := make([]Status, 0, len(st))
	for _, s := range st {
		rs, err := m.ruleStats(s.id)
		if err != nil {
			return nil, err
		}
		out = append(out, Status{ID: s.id, Limit: s.lim, Stats: rs})
	}
	sortLimits(out, func(s Status) Limit { return s.Limit })
	return out, nil
}

// ruleStats reads a limit's counters. The values are read as bytes: a map
// pinned by an older moat has shorter ones, without the fields added at
// their end since, which read as 0. shield.Open replaces such a map, but
// the metrics read the pins as they find them.
func (m Maps) ruleStats(id uint16) (RuleStats, error) {
	var per [][]byte
	if err := m.Stats.Lookup(uint32(id), &per); err != nil {
		return RuleStats{}, fmt.Errorf("read rate limit counters: %w", err)
	}
	var s RuleStats
	full := make([]byte, binary.Size(datapath.MoatRlRuleStats{}))
	for _, b := range per {
		clear(full)
		copy(full, b)
		var v datapath.MoatRlRuleStats
		if _, err := binary.Decode(full, binary.NativeEndian, &v); err != nil {
			return RuleStats{}, fmt.Errorf("read rate limit counters: %w", err)
		}
		s.Passed += v.Passed
		s.PassedBytes += v.PassedBytes
		s.Dropped += v.Dropped
		s.DroppedBytes += v.DroppedBytes
		s.Monitored += v.Monitored
		s.MonitoredBytes += v.MonitoredBytes
		s.Untracked += v.Untracked
		s.Tracked += v.Tracked
		s.Blocks += v.Blocks
		s.BlockErrors += v.BlockErrors
	}
	return s, nil
}

// Add stores a limit. A limit of the same kind and exactly the same scope
// is replaced in place when replace is set (no moment without a limit);
// any other overlap of the same kind is refused, as the data path applies
// one limit of each kind per packet.
func (m Maps) Add(l Limit, replace bool) error {
	if err := l.Validate(); err != nil {
		return &UserError{err}
	}
	st, err := m.stored()
	if err != nil {
		return err
	}
	for _, s := range st {
		if s.lim.Kind != l.Kind || !s.lim.Scope.Overlaps(l.Scope) {
			continue
		}
		if s.lim.Scope == l.Scope && replace {
			return m.update(s, l)
		}
		if s.lim.Scope == l.Scope {
			return &UserError{fmt.Errorf("a %s limit on %s %w (%s); use --replace", l.Kind, l.Scope, ErrExists, s.lim)}
		}
		return userErrorf("%s limit on %s overlaps the one on %s", l.Kind, l.Scope, s.lim.Scope)
	}
	used := map[uint16]bool{}
	for _, s := range st {
		used[s.id] = true
	}
	var id uint16
	for i := uint16(1); i <= MaxRules; i++ {
		if !used[i] {
			id = i
			break
		}
	}
	if id == 0 {
		return userErrorf("no room for another limit (at most %d)", MaxRules)
	}
	return m.install(id, l)
}

// update replaces the stored rule s with l in place. A bucket holds its
// next arrival time, up to the old limit's tolerance (its burst, in time)
// ahead: when the new limit tolerates less, a source the old limit let
// run ahead would be refused for as long as that lead lasts, even by a
// looser limit (1 pps with a burst of 30 replaced by 1000 pps with a
// burst of 100: 30 s against 0.1 s). Then the buckets start afresh, the
// budget's and every source's, each with the new burst. Otherwise they
// are kept: the new limit honours what the old one counted. The counters
// stay either way.
func (m Maps) update(s stored, l Limit) error {
	id := s.id
	a, b := s.rule, l.ruleValue()
	if err := m.Rules.Put(uint32(id), b); err != nil {
		return fmt.Errorf("write limit %d: %w", id, err)
	}
	shrinks := func(oldTol, newInterval, newTol uint64) bool { return newInterval != 0 && newTol < oldTol }
	if !shrinks(a.PktTolerance, b.PktInterval, b.PktTolerance) && !shrinks(a.ByteTolerance, b.ByteInterval, b.ByteTolerance) {
		return nil
	}
	if err := m.Budgets.Put(uint32(id), datapath.MoatRlBucket{}); err != nil {
		return fmt.Errorf("reset budget %d: %w", id, err)
	}
	return m.forgetSources(id)
}

// install writes a new rule: its state and counters are reset and the
// rule is in place before any scope slot points at it.
func (m Maps) install(id uint16, l Limit) error {
	if err := m.prepare(id, l); err != nil {
		return err
	}
	return m.setSlots(l, id)
}

// prepare writes a new rule with fresh state and counters, and no slot
// pointing at it yet.
func (m Maps) prepare(id uint16, l Limit) error {
	ncpu, err := ebpf.PossibleCPU()
	if err != nil {
		return err
	}
	if err := m.Budgets.Put(uint32(id), datapath.MoatRlBucket{}); err != nil {
		return fmt.Errorf("reset budget %d: %w", id, err)
	}
	if err := m.Stats.Put(uint32(id), make([]datapath.MoatRlRuleStats, ncpu)); err != nil {
		return fmt.Errorf("reset counters of limit %d: %w", id, err)
	}
	if err := m.forgetSources(id); err != nil {
		return err
	}
	if err := m.Rules.Put(uint32(id), l.ruleValue()); err != nil {
		return fmt.Errorf("write limit %d: %w", id, err)
	}
	return nil
}

// forgetSources drops the buckets a former rule with this id left behind.
func (m Maps) forgetSources(id uint16) error {
	return deleteKeys(m.Sources, "source buckets", func(k datapath.MoatRlSrcKey) bool { return k.Rule == id })
}

// deleteKeys deletes the keys of m that match, read in one pass first: a
// map changed while it is walked may repeat or skip keys. what names the
// map in errors.
func deleteKeys[K any](m *ebpf.Map, what string, match func(K) bool) error {
	var k K
	var v []byte
	var found []K
	it := m.Iterate()
	for it.Next(&k, &v) {
		if match(k) {
			found = append(found, k)
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("read %s: %w", what, err)
	}
	for _, k := range found {
		if err := m.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("clear %s: %w", what, err)
		}
	}
	return nil
}

// setSlots points the scope's slots for the limit's kind at id.
func (m Maps) setSlots(l Limit, id uint16) error { return m.writeSlots(l, 0, id, false) }

// clearSlots clears the scope's slots for the limit's kind where they
// still point at id: a slot a new limit took over already is left to it.
func (m Maps) clearSlots(l Limit, id uint16) error { return m.writeSlots(l, id, 0, true) }

// writeSlots writes id into the scope's slots for the limit's kind; with
// onlyFrom, only into those that hold from.
func (m Maps) writeSlots(l Limit, from, id uint16, onlyFrom bool) error {
	set := func(s *datapath.MoatRlSlot) {
		p := &s.Budget
		if l.Kind == Source {
			p = &s.Source
		}
		if !onlyFrom || *p == from {
			*p = id
		}
	}
	sc := l.Scope
	if sc.All || sc.WholeClass {
		k := sc.classSlot()
		var s datapath.MoatRlSlot
		if err := m.ClassScopes.Lookup(k, &s); err != nil {
			return fmt.Errorf("read scope %s: %w", sc, err)
		}
		set(&s)
		return m.ClassScopes.Put(k, s)
	}
	n := int(sc.To) - int(sc.From) + 1
	keys := make([]uint32, n)
	for i := range keys {
		keys[i] = uint32(sc.Class)<<16 | uint32(int(sc.From)+i)
	}
	vals := make([]datapath.MoatRlSlot, n)
	for i, k := range keys {
		if err := m.PortScopes.Lookup(k, &vals[i]); err != nil {
			return fmt.Errorf("read scope %s: %w", sc, err)
		}
		set(&vals[i])
	}
	if _, err := m.PortScopes.BatchUpdate(keys, vals, nil); err != nil {
		return fmt.Errorf("write scope %s: %w", sc, err)
	}
	return nil
}

// Remove deletes the limit of a kind on exactly this scope.
func (m Maps) Remove(kind Kind, scope Scope) error {
	st, err := m.stored()
	if err != nil {
		return err
	}
	for _, s := range st {
		if s.lim.Kind == kind && s.lim.Scope == scope {
			return m.remove(s)
		}
	}
	return &UserError{fmt.Errorf("%s limit on %s: %w", kind, scope, ErrNotFound)}
}

// remove clears the slots before the rule, so the data path never follows
// a slot to an empty rule.
func (m Maps) remove(s stored) error {
	if err := m.clearSlots(s.lim, s.id); err != nil {
		return err
	}
	return m.retire(s)
}

// retire deletes a rule no slot points at, and its buckets.
func (m Maps) retire(s stored) error {
	if err := m.Rules.Put(uint32(s.id), datapath.MoatRlRule{}); err != nil {
		return fmt.Errorf("delete limit %d: %w", s.id, err)
	}
	return m.forgetSources(s.id)
}

// Apply makes the stored limits equal to limits, as a config reload does.
// Every limit is validated before anything changes. Limits whose kind and
// scope are stored already are updated in place, new ones are added
// before old ones go, and a new limit that overlaps an old one takes over
// its slots in one write, so a scope that keeps a limit never goes without
// one.
func Apply(m Maps, limits []Limit) error {
	want := make([]Limit, len(limits))
	copy(want, limits)
	for i := range want {
		if err := want[i].Validate(); err != nil {
			return &UserError{err}
		}
		for j := 0; j < i; j++ {
			if want[j].Kind == want[i].Kind && want[j].Scope.Overlaps(want[i].Scope) {
				return userErrorf("%s limits on %s and %s overlap", want[i].Kind, want[j].Scope, want[i].Scope)
			}
		}
	}
	if len(want) > MaxRules {
		return userErrorf("%d limits: at most %d", len(want), MaxRules)
	}
	st, err := m.stored()
	if err != nil {
		return err
	}
	kept := map[uint16]bool{}
	var fresh []Limit
	for _, l := range want {
		found := false
		for _, s := range st {
			if s.lim.Kind == l.Kind && s.lim.Scope == l.Scope {
				if err := m.update(s, l); err != nil {
					return err
				}
				kept[s.id], found = true, true
				break
			}
		}
		if !found {
			fresh = append(fresh, l)
		}
	}
	// New limits that do not collide with an old one go in first, so that
	// no traffic goes unlimited between the old limits and the new; when
	// the old and the new would not fit in the rule ids together, the old
	// go first.
	var first, later []Limit
	for _, l := range fresh {
		collides := false
		for _, s := range st {
			if !kept[s.id] && s.lim.Kind == l.Kind && s.lim.Scope.Overlaps(l.Scope) {
				collides = true
			}
		}
		if collides {
			later = append(later, l)
		} else {
			first = append(first, l)
		}
	}
	if len(st)+len(first) > MaxRules {
		later, first = append(first, later...), nil
	}
	for _, l := range first {
		if err := m.Add(l, false); err != nil {
			return err
		}
	}
	// A new limit that takes an old one's slots is written whole under a
	// free id, then its slots point at it, which moves every slot the two
	// share from the old rule to the new in one write; only then are the
	// old limits' other slots cleared. Limits that find no free id go in
	// after the old ones are gone.
	now, err := m.stored()
	if err != nil {
		return err
	}
	used := map[uint16]bool{}
	for _, s := range now {
		used[s.id] = true
	}
	var moved []stored
	var rest []Limit
	for _, l := range later {
		id := uint16(0)
		for i := uint16(1); i <= MaxRules && id == 0; i++ {
			if !used[i] {
				id = i
			}
		}
		if id == 0 {
			rest = append(rest, l)
			continue
		}
		used[id] = true
		if err := m.prepare(id, l); err != nil {
			return err
		}
		moved = append(moved, stored{id: id, lim: l})
	}
	for _, n := range moved {
		if err := m.setSlots(n.lim, n.id); err != nil {
			return err
		}
	}
	for _, s := range st {
		if !kept[s.id] {
			if err := m.clearSlots(s.lim, s.id); err != nil {
				return err
			}
		}
	}
	for _, s := range st {
		if !kept[s.id] {
			if err := m.retire(s); err != nil {
				return err
			}
		}
	}
	for _, l := range rest {
		if err := m.Add(l, false); err != nil {
			return err
		}
	}
	return nil
}

// Gate is what lets a source without a bucket get one (enum rl_gate).
type Gate uint32

const (
	GateSketch = Gate(datapath.MoatRlGateRL_GATE_SKETCH)
	GateSample = Gate(datapath.MoatRlGateRL_GATE_SAMPLE)
	GateNone   = Gate(datapath.MoatRlGateRL_GATE_NONE)
)

func (g Gate) String() string {
	switch g {
	case GateSketch:
		return "sketch"
	case GateSample:
		return "sample"
	case GateNone:
		return "none"
	}
	return fmt.Sprintf("gate%d", uint32(g))
}

// ParseGate reads sketch, sample or none.
func ParseGate(s string) (Gate, error) {
	for _, g := range []Gate{GateSample, GateSketch, GateNone} {
		if g.String() == s {
			return g, nil
		}
	}
	return 0, fmt.Errorf("invalid gate %q: want sketch, sample or none", s)
}

func (g Gate) MarshalText() ([]byte, error) { return []byte(g.String()), nil }
func (g *Gate) UnmarshalText(b []byte) (err error) {
	*g, err = ParseGate(string(b))
	return err
}

// Config are the run-time switches of the mitigation.
type Config struct {
	Shape bool `json:"shape"` // count the attack shape
	// HeavyHitters samples 1 packet in Sample (a power of two, 1..65536)
	// into the heavy-hitter map when set.
	HeavyHitters bool   `json:"heavy_hitters"`
	Sample       uint32 `json:"sample"`
	Gate         Gate   `json:"gate"`
}

const defaultSampleLog2 = 6 // HH_DEFAULT_SAMPLE_LOG2

// CheckSample checks a heavy-hitter sample rate: 1 packet in n, n a power
// of two from 1 to 65536.
func CheckSample(n uint32) error {
	if n == 0 || n&(n-1) != 0 || n > 1<<16 {
		return fmt.Errorf("%d: want a power of two from 1 to 65536", n)
	}
	return nil
}

// Config reads the switches.
func (m Maps) Config() (Config, error) {
	var c datapath.MoatRlConfig
	if err := m.Settings.Lookup(uint32(0), &c); err != nil {
		return Config{}, fmt.Errorf("read rate limit settings: %w", err)
	}
	log2 := uint32(defaultSampleLog2)
	if c.HhSample > 0 {
		log2 = min(c.HhSample-1, 16)
	}
	return Config{Shape: c.ShapeOff == 0, HeavyHitters: c.HhOff == 0, Sample: 1 << log2, Gate: Gate(c.Gate)}, nil
}

// Configure writes the switches. Sample 0 keeps the default.
func (m Maps) Configure(c Config) error {
	if c.Sample == 0 {
		c.Sample = 1 << defaultSampleLog2
	}
	if err := CheckSample(c.Sample); err != nil {
		return userErrorf("sample %w", err)
	}
	if c.Gate != GateSample && c.Gate != GateSketch && c.Gate != GateNone {
		return userErrorf("invalid gate %d", c.Gate)
	}
	v := datapath.MoatRlConfig{Gate: uint32(c.Gate)}
	if !c.Shape {
		v.ShapeOff = 1
	}
	if !c.HeavyHitters {
		v.HhOff = 1
	}
	v.HhSample = 1 // 2^0
	for s := c.Sample; s > 1; s >>= 1 {
		v.HhSample++
	}
	old, err := m.Config()
	if err != nil {
		return err
	}
	if err := m.Settings.Put(uint32(0), v); err != nil {
		return err
	}
	// Heavy-hitter counts are samples, scaled by the rate they were taken
	// at when read: counts of another rate would read wrong, and moat top
	// would take the change for a reset. They start over.
	if old.Sample != c.Sample {
		return m.forgetHeavyHitters()
	}
	return nil
}

// forgetHeavyHitters empties the heavy-hitter table.
func (m Maps) forgetHeavyHitters() error {
	return deleteKeys(m.HHSources, "heavy hitters", func(datapath.MoatRlSrcKey) bool { return true })
}
