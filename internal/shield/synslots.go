package shield

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"

	"github.com/moat-shield/moat/internal/datapath"
	"github.com/moat-shield/moat/internal/syncookie"
)

// legacySynStats is the pin of the map in which moat kept SYN counters
// before syn_counters: a per-CPU hash keyed by port.
const legacySynStats = "syn_stats"

// legacySynPortStats is that map's value, per CPU.
type legacySynPortStats struct {
	Syns, CookiesIssued, CookiesAccepted, CookiesRejected uint64
	AcksDropped, AcceptErrors, SynsDropped, StaleKeySyns  uint64
	WinStartNs, WinSyns                                   uint64
}

// ensureSynSlots gives a counters slot to every protected port that has
// none, which is how state pinned before syn_counters existed looks: the
// data path leaves such a port alone. The counters the old map kept come
// along. The old map's pin goes once no attached filter is an older moat's;
// until then every protected port gets an entry there too, so that such a
// filter protects it, and SynOlderFilter names the interface. Open, Attach
// and Detach call it.
func (s *Shield) ensureSynSlots() error {
	s.SynOlderFilter = ""
	legacyPath := filepath.Join(s.mapsDir(), legacySynStats)
	legacy, err := ebpf.LoadPinnedMap(legacyPath, nil)
	if errors.Is(err, os.ErrNotExist) {
		// State of this version: every protected port has a slot. A
		// filter loaded before syn_counters was last replaced (its values
		// grew) still counts in the map it was loaded with.
		s.SynOlderFilter, err = s.filterWithout(datapath.MoatMapSynCounters)
		return err
	}
	if err != nil {
		return fmt.Errorf("open %s: %w", legacySynStats, err)
	}
	defer legacy.Close()
	carry := legacy.ValueSize() == uint32(binary.Size(legacySynPortStats{}))

	ports, counters := s.maps[datapath.MoatMapSynPorts], s.maps[datapath.MoatMapSynCounters]
	protected, err := syncookie.ProtectedPorts(ports)
	if err != nil {
		return err
	}
	used := map[uint16]bool{}
	var orphans []syncookie.PortEntry
	for _, p := range protected {
		if p.Entry.Slot == 0 {
			orphans = append(orphans, p)
		} else {
			used[p.Entry.Slot] = true
		}
	}
	slot := uint16(1)
	for _, p := range orphans {
		for used[slot] {
			slot++
		}
		if uint32(slot) >= counters.MaxEntries() {
			return fmt.Errorf("give tcp/%d a counters slot: %w", p.Port, syncookie.ErrNoFreeSlot)
		}
		vals := make([]datapath.MoatSynPortStats, ebpf.MustPossibleCPU())
		var old []legacySynPortStats
		if carry && legacy.Lookup(uint32(p.Port), &old) == nil {
			for i := range min(len(old), len(vals)) {
				o := old[i]
				vals[i] = datapath.MoatSynPortStats{
					Syns: o.Syns, CookiesIssued: o.CookiesIssued, CookiesAccepted: o.CookiesAccepted,
					CookiesRejected: o.CookiesRejected, AcksDropped: o.AcksDropped,
					AcceptErrors: o.AcceptErrors, SynsDropped: o.SynsDropped, StaleKeySyns: o.StaleKeySyns,
				}
			}
		}
		if err := counters.Update(uint32(slot), vals, ebpf.UpdateAny); err != nil {
			return fmt.Errorf("give tcp/%d a counters slot: %w", p.Port, err)
		}
		e := p.Entry
		e.Slot = slot
		if err := ports.Update(uint32(p.Port), e, ebpf.UpdateAny); err != nil {
			return fmt.Errorf("give tcp/%d a counters slot: %w", p.Port, err)
		}
		used[slot] = true
	}
	older, err := s.filterWithout(datapath.MoatMapSynCounters)
	if err != nil {
		return err
	}
	if older != "" {
		s.SynOlderFilter = older
		return keepLegacyEntries(legacy, protected)
	}
	if err := os.Remove(legacyPath); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove %s: %w", legacySynStats, err)
	}
	return nil
}

// keepLegacyEntries gives every protected port an entry in the old
// counters map: an older filter protects only ports it finds there.
func keepLegacyEntries(legacy *ebpf.Map, protected []syncookie.PortEntry) error {
	zero := make([][]byte, ebpf.MustPossibleCPU())
	for i := range zero {
		zero[i] = make([]byte, legacy.ValueSize())
	}
	for _, p := range protected {
		err := legacy.Update(uint32(p.Port), zero, ebpf.UpdateNoExist)
		if err != nil && !errors.Is(err, ebpf.ErrKeyExist) {
			return fmt.Errorf("keep tcp/%d in %s: %w", p.Port, legacySynStats, err)
		}
	}
	return nil
}
