package shield_test

import (
	"testing"

	"github.com/cilium/ebpf"

	"github.com/moat-shield/moat/internal/datapath"
	"github.com/moat-shield/moat/internal/shield"
)

// TestReadCountersSplitsVerdicts writes known values into a counters map
// and checks how ReadCounters sums them: drops, passes, and the SYN-ACKs
// that syn_cookie's pass slot holds, which are answers, not passes.
func TestReadCountersSplitsVerdicts(t *testing.T) {
	spec, err := datapath.LoadMoat()
	if err != nil {
		t.Fatal(err)
	}
	m, err := ebpf.NewMap(spec.Maps[datapath.MoatMapCounters])
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	cpus := ebpf.MustPossibleCPU()
	put := func(reason datapath.MoatVerdictReason, slot uint32, packets, bytes uint64) {
		vals := make([]datapath.MoatVerdictCounter, cpus)
		vals[0] = datapath.MoatVerdictCounter{Packets: packets, Bytes: bytes}
		if err := m.Update(uint32(reason)*2+slot, vals, ebpf.UpdateAny); err != nil {
			t.Fatal(err)
		}
	}
	put(datapath.MoatVerdictReasonREASON_PASS, 0, 5, 500)
	put(datapath.MoatVerdictReasonREASON_DENYLIST, 1, 7, 700)
	put(datapath.MoatVerdictReasonREASON_SYN_COOKIE, 0, 3, 222)
	put(datapath.MoatVerdictReasonREASON_SYN_DEFENCE, 1, 2, 120)

	c, err := shield.ReadCounters(m)
	if err != nil {
		t.Fatal(err)
	}
	if c.Passed != (shield.Count{Packets: 5, Bytes: 500}) {
		t.Errorf("passed %+v", c.Passed)
	}
	if c.Dropped != (shield.Count{Packets: 9, Bytes: 820}) {
		t.Errorf("dropped %+v", c.Dropped)
	}
	if c.Answered != (shield.Count{Packets: 3, Bytes: 222}) {
		t.Errorf("answered %+v", c.Answered)
	}
	if rc := c.ByReason["syn_cookie"]; rc.Answered.Packets != 3 || rc.Passed.Packets != 0 {
		t.Errorf("syn_cookie %+v", rc)
	}
	if rc := c.ByReason["syn_defence"]; rc.Dropped.Packets != 2 {
		t.Errorf("syn_defence %+v", rc)
	}
}
