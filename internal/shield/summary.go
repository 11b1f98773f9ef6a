package shield

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"

	"github.com/cilium/ebpf"

	"github.com/moat-shield/moat/internal/datapath"
	"github.com/moat-shield/moat/internal/rules"
)

// The deny summary (enum deny_summary_geometry in bpf/include/moat_consts.h)
// lets the filter skip both deny lookups for a source that no entry can
// cover. Its rule: while a family is ready (and not flagged by the data
// path), every address an entry covers has its bit set. So bits are set before entries are added (here, and by
// the data path before an auto-block), and cleared only by a rebuild, which
// first takes the family out of use. A stale bit costs a lookup, never a
// verdict.
//
// The host summary (deny_host_summary, same geometry) follows the same
// rule for exact host entries alone: while its family is ready, every
// address with a host entry has its bit set there, so the filter skips the
// host lookup of a covered source whose host bit is clear.

// summaryRebuildAfter is how many denylist entries may be removed before
// the next removal rebuilds the summary, clearing the bits they left. A
// single unblock does not rebuild: a rebuild reads the whole denylist.
const summaryRebuildAfter = 4096

// summaryFormat is what a finished build writes to the state's built field:
// the summary's layout and hash, and since format 2 the host summary. State
// built with another layout is rebuilt by Open.
const summaryFormat = 2

var (
	summaryFamilies     = uint32(datapath.MoatDenySummaryFamilySUMMARY_V4 | datapath.MoatDenySummaryFamilySUMMARY_V6)
	hostSummaryFamilies = uint32(datapath.MoatDenySummaryFamilySUMMARY_V4HOSTS | datapath.MoatDenySummaryFamilySUMMARY_V6HOSTS)
)

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
func (s *Shield) markDeny(entries []Entry) error {
	st, err := s.DenySummary()
	if err != nil {
		return err
	}
	if st.Built == 0 {
		return nil // not built: the data path looks every source up
	}
	m := newDenyMarks()
	for _, e := range entries {
		m.add(e.Prefix)
	}
	return s.orDenyMarks(m)
}

// denyMarks are the bits denylist entries need: in the summary for every
// entry, in the host summary for exact hosts.
type denyMarks struct{ all, hosts datapath.SummaryMarks }

func newDenyMarks() denyMarks {
	return denyMarks{all: datapath.SummaryMarks{}, hosts: datapath.SummaryMarks{}}
}

func (m denyMarks) add(p netip.Prefix) {
	m.all.Add(p)
	if rules.IsHost(p) {
		m.hosts.Add(p)
	}
}

// orDenyMarks sets m's bits in both summaries.
func (s *Shield) orDenyMarks(m denyMarks) error {
	if err := s.orSummary(datapath.MoatMapDenySummary, m.all); err != nil {
		return err
	}
	return s.orSummary(datapath.MoatMapDenyHostSummary, m.hosts)
}

// noteRemoved counts removed denylist entries and rebuilds the summary once
// enough have gone, or at once when a removed prefix was broad (its stale
// bits would cost lookups over a large range) or was an IPv6 auto-block
// shorter than /32, whose flag keeps IPv6 sources out of the summary.
func (s *Shield) noteRemoved(prefixes []netip.Prefix) error {
	st, err := s.DenySummary()
	if err != nil || st.Built == 0 || len(prefixes) == 0 {
		return err
	}
	wideV6, err := s.summaryFlags()
	if err != nil {
		return err
	}
	st.Removed += uint64(len(prefixes))
	rebuild := st.Removed >= summaryRebuildAfter
	for _, p := range prefixes {
		if datapath.SummaryBroad(p) || wideV6&datapath.SummaryFamily(p.Addr()) != 0 && p.Bits() < 32 {
			rebuild = true
		}
	}
	if !rebuild {
		return s.writeSummaryState(st)
	}
	return s.RebuildDenySummary()
}

// summaryFlags returns the families the data path flagged (an IPv6
// auto-block shorter than /32): their sources are looked up until a rebuild.
func (s *Shield) summaryFlags() (uint32, error) {
	var b datapath.MoatSummaryBlock
	if err := s.maps[datapath.MoatMapDenySummary].Lookup(uint32(0), &b); err != nil {
		return 0, fmt.Errorf("read the deny summary's flags: %w", err)
	}
	return uint32(b.W[0]), nil
}

// SummaryInUse returns the families for which the filter uses the summary
// (SUMMARY_V4, SUMMARY_V6).
func (s *Shield) SummaryInUse() (uint32, error) {
	st, err := s.DenySummary()
	if err != nil {
		return 0, err
	}
	flags, err := s.summaryFlags()
	return st.Ready & summaryFamilies &^ flags, err
}

// olderFilterAttached names an interface whose pinned filter does not use
// this state's deny summary or host summary: one of a moat version before
// them, or one loaded against a summary map that has since been replaced.
// Such a filter adds auto-blocks without their bits, so no family may be
// ready.
func (s *Shield) olderFilterAttached() (string, error) {
	for _, m := range []string{datapath.MoatMapDenySummary, datapath.MoatMapDenyHostSummary} {
		if name, err := s.filterWithout(m); err != nil || name != "" {
			return name, err
		}
	}
	return "", nil
}

// filterWithout names an interface whose pinned filter does not use this
// state's shared map name (an older moat's filter), or returns "".
func (s *Shield) filterWithout(name string) (string, error) {
	info, err := s.maps[name].Info()
	if err != nil {
		return "", err
	}
	id, ok := info.ID()
	if !ok {
		return "", errors.New("the kernel does not report map ids")
	}
	ifaces, err := PinnedInterfaces(s.root)
	if err != nil {
		return "", err
	}
	for _, pi := range ifaces {
		prog, err := ebpf.LoadPinnedProgram(filepath.Join(pi.Dir, "prog"), nil)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return "", err
		}
		pinfo, err := prog.Info()
		prog.Close()
		if err != nil {
			return "", err
		}
		ids, _ := pinfo.MapIDs()
		if !slices.Contains(ids, id) {
			return pi.Name, nil
		}
	}
	return "", nil
}

// ensureSummary builds the summary if it is not built and every attached
// filter uses it, and takes it out of use while one does not. Open and
// every attach and detach call it.
func (s *Shield) ensureSummary() error {
	st, err := s.DenySummary()
	if err != nil {
		return s.summaryOutOfUse(err)
	}
	older, err := s.olderFilterAttached()
	if err != nil {
		return s.summaryOutOfUse(err)
	}
	if older != "" {
		if st.Built != 0 || st.Ready != 0 {
			return s.writeSummaryState(SummaryState{})
		}
		return nil
	}
	if st.Built != summaryFormat {
		return s.RebuildDenySummary()
	}
	return nil
}

// summaryOutOfUse takes the summary out of use, as far as it can, when
// ensureSummary could not check it (err): this moat would then add entries
// with their summary bits but not rebuild, and must not leave the filter
// trusting bits it no longer vouches for. The filter looks every source
// up, as before the summary; the next Open tries again.
func (s *Shield) summaryOutOfUse(err error) error {
	if werr := s.writeSummaryState(SummaryState{}); werr != nil {
		return errors.Join(err, werr)
	}
	return err
}

// orSummary ORs marks into the summary map name (deny_summary or
// deny_host_summary) through deny_summary_or or deny_host_summary_or, which
// the kernel runs: an atomic OR cannot undo a bit the data path sets at the
// same moment, where writing a block from here could.
func (s *Shield) orSummary(name string, marks datapath.SummaryMarks) error {
	if len(marks) == 0 {
		return nil
	}
	if s.summaryOr == nil {
		var objs struct {
			Or     *ebpf.Program `ebpf:"deny_summary_or"`
			HostOr *ebpf.Program `ebpf:"deny_host_summary_or"`
		}
		repl := map[string]*ebpf.Map{
			datapath.MoatMapDenySummary:     s.maps[datapath.MoatMapDenySummary],
			datapath.MoatMapDenyHostSummary: s.maps[datapath.MoatMapDenyHostSummary],
		}
		if err := s.spec.LoadAndAssign(&objs, &ebpf.CollectionOptions{MapReplacements: repl}); err != nil {
			return fmt.Errorf("load the deny summary's writers: %w", err)
		}
		s.summaryOr = map[string]*ebpf.Program{datapath.MoatMapDenySummary: objs.Or, datapath.MoatMapDenyHostSummary: objs.HostOr}
	}
	prog := s.summaryOr[name]
	for blk, w := range marks {
		args := datapath.MoatSummaryOrArgs{Block: blk, W: *w}
		ret, err := prog.Run(&ebpf.RunOptions{Context: args})
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
	older, err := s.olderFilterAttached()
	if err != nil {
		return err
	}
	if older != "" {
		if err := s.writeSummaryState(SummaryState{}); err != nil {
			return err
		}
		return userErrorf("the deny summary stays out of use: %s runs a filter of an older moat (moat attach %s replaces it)", older, older)
	}
	// Not built until the end: a rebuild cut short is done again by the
	// next Open.
	if err := s.writeSummaryState(SummaryState{}); err != nil {
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
	m := newDenyMarks()
	for _, read := range s.listReaders(DenyList) {
		if err := read(func(r listRule) { m.add(r.prefix) }); err != nil {
			return fmt.Errorf("read the denylist: %w", err)
		}
	}
	if err := s.orDenyMarks(m); err != nil {
		return err
	}
	return s.writeSummaryState(SummaryState{Ready: summaryFamilies | hostSummaryFamilies, Built: summaryFormat})
}

// clearSummary zeroes every block of both summaries, flags included.
func (s *Shield) clearSummary() error {
	for _, name := range []string{datapath.MoatMapDenySummary, datapath.MoatMapDenyHostSummary} {
		if err := datapath.ClearSummaryBlocks(s.maps[name]); err != nil {
			return fmt.Errorf("clear the deny summary: %w", err)
		}
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
