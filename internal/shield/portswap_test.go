package shield_test

import (
	"sync"
	"sync/atomic"
	"testing"

	"github.com/moat-shield/moat/internal/datapath"
	"github.com/moat-shield/moat/internal/rules"
)

func portEntry(t *testing.T, spec string, a rules.Action) rules.PortEntry {
	t.Helper()
	ps, err := rules.ParsePortSpec(spec)
	if err != nil {
		t.Fatal(err)
	}
	return rules.PortEntry{Spec: ps, Action: a}
}

// TestSetPortRulesNoGap swaps a port range between two shapes of rules
// while a reader watches one port's slot in the table the data path reads:
// the slot must never be seen empty, and at the end exactly the wanted
// rules remain.
func TestSetPortRulesNoGap(t *testing.T) {
	s := openFresh(t)
	a := []rules.PortEntry{portEntry(t, "tcp/6000-6063", rules.Drop)}
	b := []rules.PortEntry{portEntry(t, "tcp/6000-6010", rules.Allow), portEntry(t, "tcp/6011-6100", rules.Drop)}
	if _, err := s.SetPortRules(a); err != nil {
		t.Fatal(err)
	}
	table := s.Map(datapath.MoatMapPortRules)
	watched := []uint32{6005, 6030} // TCP class is 0: the index is the port
	var stop atomic.Bool
	var empty, reads atomic.Int64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		var v datapath.MoatPortRule
		for !stop.Load() {
			for _, k := range watched {
				if err := table.Lookup(k, &v); err == nil && v.Id == 0 {
					empty.Add(1)
				}
				reads.Add(1)
			}
		}
	}()
	for i := 0; i < 100; i++ {
		want := a
		if i%2 == 0 {
			want = b
		}
		if _, err := s.SetPortRules(want); err != nil {
			stop.Store(true)
			wg.Wait()
			t.Fatal(err)
		}
	}
	stop.Store(true)
	wg.Wait()
	if empty.Load() != 0 {
		t.Fatalf("a watched port had no rule in %d of %d reads during the swaps", empty.Load(), reads.Load())
	}
	got, err := s.PortRules()
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Spec != a[0].Spec || got[0].Action != rules.Drop {
		t.Fatalf("rules after the swaps: %+v, want only %s drop", got, a[0].Spec)
	}
	// Slots beyond the final rule's range that rule b covered are clear.
	var v datapath.MoatPortRule
	if err := table.Lookup(uint32(6080), &v); err != nil || v.Id != 0 {
		t.Fatalf("port 6080 still has rule %+v after b was replaced", v)
	}
	if err := table.Lookup(uint32(6063), &v); err != nil || v.Id != got[0].ID {
		t.Fatalf("port 6063 has rule %+v, want id %d", v, got[0].ID)
	}
}
