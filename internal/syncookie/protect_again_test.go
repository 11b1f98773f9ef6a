package syncookie

import (
	"sync/atomic"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/moat-shield/moat/internal/datapath"
)

// TestProtectAgainKeepsCounters: a port that stays protected through a
// change of mode or threshold (a daemon's reload of syn.ports, `moat syn
// protect` again, with a flood running) keeps its counters, so that
// moat_syncookie_*_total never goes back to zero. Out of never mode,
// which marks no tuples, the census starts over for the port all the
// same. A port protected anew after ModeOff starts from zero.
func TestProtectAgainKeepsCounters(t *testing.T) {
	objs := loadObjects(t)
	const port = 4242
	table, err := ReadPortTable(objs.SynPorts, objs.SynCounters, objs.SynCensus)
	if err != nil {
		t.Fatal(err)
	}
	if err := table.Protect(port, ModeAuto, 1000); err != nil {
		t.Fatal(err)
	}
	slot := uint32(table.entries[port].Slot)
	// What the data path counted meanwhile.
	per := make([]datapath.MoatSynPortStats, ebpf.MustPossibleCPU())
	if err := objs.SynCounters.Lookup(slot, &per); err != nil {
		t.Fatal(err)
	}
	per[0].Syns, per[0].CookiesIssued = 77, 70
	if err := objs.SynCounters.Update(slot, per, ebpf.UpdateAny); err != nil {
		t.Fatal(err)
	}
	syns := func() uint64 {
		t.Helper()
		st, err := Status(objs.SynPorts, objs.SynCounters)
		if err != nil || len(st) != 1 {
			t.Fatalf("status %+v, %v", st, err)
		}
		return st[0].SYNs
	}
	mc, err := mapCensus(objs.SynCensus)
	if err != nil {
		t.Fatal(err)
	}
	defer mc.close()
	for _, step := range []struct {
		mode      Mode
		threshold uint32
	}{{ModeAuto, 5000}, {ModeAlways, 0}, {ModeNever, 0}, {ModeAuto, 0}} {
		atomic.StoreUint32(mc.gen, 10)
		if err := table.Protect(port, step.mode, step.threshold); err != nil {
			t.Fatal(err)
		}
		if got := syns(); got != 77 {
			t.Errorf("after protecting tcp/%d again (%s, threshold %d): %d SYNs, want the 77 it had", port, step.mode, step.threshold, got)
		}
	}
	// The last step left never mode: the census must start over.
	if err := objs.SynCounters.Lookup(slot, &per); err != nil {
		t.Fatal(err)
	}
	for cpu, c := range per {
		if c.CensusFrom != 11 {
			t.Errorf("CPU %d: census trusted from generation %d after never mode, want 11", cpu, c.CensusFrom)
		}
	}
	// Off, then protected anew: from zero.
	if err := table.Protect(port, ModeOff, 0); err != nil {
		t.Fatal(err)
	}
	if err := table.Protect(port, ModeAuto, 0); err != nil {
		t.Fatal(err)
	}
	if got := syns(); got != 0 {
		t.Errorf("protected anew after off: %d SYNs, want 0", got)
	}
}
