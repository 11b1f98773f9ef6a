package shield

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/cilium/ebpf"

	"github.com/moat-shield/moat/internal/datapath"
)

// The deny summary (enum deny_summary_geometry in bpf/include/moat_consts.h)
// lets the filter skip both deny lookups for a source that no entry can
// cover. Its rule: while a family is ready, every address an entry covers
// has its bit set. So bits are set before entries are added (here, and by
// the data path before an auto-block), and cleared only by a rebuild, which
// first takes the family out of use. A stale bit costs a lookup, never a
// verdict.

// summaryRebuildAfter is how many denylist entries may be removed before
// the next removal rebuilds the summary, clearing the bits they left. A
// single unblock does not rebuild: a rebuild reads the whole denylist.
const summaryRebuildAfter = 4096

var summaryFamilies = uint32(datapath.MoatDenySummaryFamilySUMMARY_V4 | datapath.MoatDenySummaryFamilySUMMARY_V6)

// SummaryState is the deny summary's state as the data path sees it.
type SummaryState = datapath.MoatSummaryState

// DenySummary reads the summary's state.
func (s *Shield) DenySummary() (SummaryState, error) {
	var st SummaryState
	err := s.maps[datapath.MoatMapDenySummaryState].Lookup(uint32(0), &st)
	return st, err
}

func (s *Shield) writeSummaryState(st SummaryState) error {
	if err := s.maps[datapath.MoatMapDenySummaryState].Put(uint32(0), &st); err != nil {
		return fmt.Errorf("write the deny summary's state: %w", err)
	}
	return nil
}

// markDeny sets the summary bits of entries about to enter the denylist.
// An entry too wide for the summary takes its family out of use first.
func (s *Shield) markDeny(entries []Entry) error {
	st, err := s.DenySummary()
	if err != nil {
		return err
	}
	if st.Built == 0 {
		return nil // never built: the data path looks every source up
	}
	marks := datapath.SummaryMarks{}
	var wide uint32
	for _, e := range entries {
		if !marks.Add(e.Prefix) {
			wide |= datapath.SummaryFamily(e.Prefix.Addr())
		}
	}
	if st.Ready&wide != 0 {
		st.Ready &^= wide
		if err := s.writeSummaryState(st); err != nil {
			return err
		}
	}
	return s.orSummary(marks)
}

// noteRemoved counts removed denylist entries and rebuilds the summary once
// enough have gone, or at once while a family is out of use: the removal
// may have been of the prefix too wide for it.
func (s *Shield) noteRemoved(n int) error {
	st, err := s.DenySummary()
	if err != nil || st.Built == 0 || n == 0 {
		return err
	}
	st.Removed += uint64(n)
	if st.Removed < summaryRebuildAfter && st.Ready == summaryFamilies {
		return s.writeSummaryState(st)
	}
	return s.RebuildDenySummary()
}

// orSummary ORs marks into the summary through deny_summary_or, which the
// kernel runs: an atomic OR cannot undo a bit the data path sets at the same
// moment, where writing a block from here could.
func (s *Shield) orSummary(marks datapath.SummaryMarks) error {
	if len(marks) == 0 {
		return nil
	}
	if s.summaryOr == nil {
		var objs struct {
			Or *ebpf.Program `ebpf:"deny_summary_or"`
		}
		repl := map[string]*ebpf.Map{datapath.MoatMapDenySummary: s.maps[datapath.MoatMapDenySummary]}
		if err := s.spec.LoadAndAssign(&objs, &ebpf.CollectionOptions{MapReplacements: repl}); err != nil {
			return fmt.Errorf("load the deny summary's writer: %w", err)
		}
		s.summaryOr = objs.Or
	}
	for blk, w := range marks {
		args := datapath.MoatSummaryOrArgs{Block: blk, W: *w}
		ret, err := s.summaryOr.Run(&ebpf.RunOptions{Context: args})
		if err == nil && ret != 0 {
			err = fmt.Errorf("no block %d", blk)
		}
		if err != nil {
			return fmt.Errorf("set deny summary bits: %w", err)
		}
	}
	return nil
}

// RebuildDenySummary recomputes the summary from the denylist, clearing
// the bits of removed entries. The families are out of use meanwhile; the
// filter looks every source up, as it did before the summary existed.
func (s *Shield) RebuildDenySummary() error {
	st, err := s.DenySummary()
	if err != nil {
		return err
	}
	st.Ready = 0
	if err := s.writeSummaryState(st); err != nil {
		return err
	}
	// Once no filter that saw the families ready is still running, the
	// bits can be cleared.
	if err := waitForPrograms(); err != nil {
		return err
	}
	if err := s.clearSummary(); err != nil {
		return err
	}
	// An auto-block whose bit was set before the clearing is in its map by
	// the end of the same run of the filter: once those runs are over, the
	// scan below sees it. Auto-blocks after the clearing set their own bits.
	if err := waitForPrograms(); err != nil {
		return err
	}
	marks := datapath.SummaryMarks{}
	var wide uint32
	mark := func(p netip.Prefix) {
		if !marks.Add(p) {
			wide |= datapath.SummaryFamily(p.Addr())
		}
	}
	hosts4, nets4 := s.listMaps(DenyList, false)
	hosts6, nets6 := s.listMaps(DenyList, true)
	err = errors.Join(
		readAll(hosts4, func(k *datapath.MoatHostV4, _ *datapath.MoatPrefixRule) {
			mark(netip.PrefixFrom(netip.AddrFrom4(k.Addr), 32))
		}),
		readAll(nets4, func(k *datapath.MoatNetV4, _ *datapath.MoatPrefixRule) {
			mark(netip.PrefixFrom(netip.AddrFrom4(k.Addr), int(k.Prefixlen)))
		}),
		readAll(hosts6, func(k *datapath.MoatHostV6, _ *datapath.MoatPrefixRule) {
			mark(netip.PrefixFrom(netip.AddrFrom16(k.Addr), 128))
		}),
		readAll(nets6, func(k *datapath.MoatNetV6, _ *datapath.MoatPrefixRule) {
			mark(netip.PrefixFrom(netip.AddrFrom16(k.Addr), int(k.Prefixlen)))
		}))
	if err != nil {
		return fmt.Errorf("read the denylist: %w", err)
	}
	if err := s.orSummary(marks); err != nil {
		return err
	}
	return s.writeSummaryState(SummaryState{Ready: summaryFamilies &^ wide, Built: 1})
}

// clearSummary zeroes every block, flags included.
func (s *Shield) clearSummary() error {
	n := int(datapath.MoatDenySummaryGeometrySUMMARY_BLOCKS)
	keys := make([]uint32, n)
	for i := range keys {
		keys[i] = uint32(i)
	}
	zero := make([]datapath.MoatSummaryBlock, n)
	if _, err := s.maps[datapath.MoatMapDenySummary].BatchUpdate(keys, zero, nil); err != nil {
		return fmt.Errorf("clear the deny summary: %w", err)
	}
	return nil
}

// waitForPrograms returns once every BPF program that was running when it
// was called has finished. The kernel waits so (synchronize_rcu) after an
// update of a map of maps, to tell user space that no program still uses
// the old inner map; a throwaway one serves.
func waitForPrograms() error {
	inner := &ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 4, MaxEntries: 1}
	outer, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.ArrayOfMaps, KeySize: 4, ValueSize: 4, MaxEntries: 1, InnerMap: inner})
	if err != nil {
		return fmt.Errorf("wait for running filters: %w", err)
	}
	defer outer.Close()
	m, err := ebpf.NewMap(inner)
	if err != nil {
		return fmt.Errorf("wait for running filters: %w", err)
	}
	defer m.Close()
	if err := outer.Put(uint32(0), m); err != nil {
		return fmt.Errorf("wait for running filters: %w", err)
	}
	return nil
}
