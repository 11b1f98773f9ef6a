// Package shield owns moat's pinned state on bpffs: the rule maps shared by
// every interface, and per interface the XDP program, its bpf_link and its
// counters. Every command of the CLI works through it.
//
// Layout under the root (default /sys/fs/bpf/moat):
//
//	maps/<name>              rule maps and settings, shared
//	ifaces/<ifname>/link     the XDP bpf_link; keeps the program attached
//	ifaces/<ifname>/prog     the program the link runs
//	ifaces/<ifname>/counters per-interface verdict counters
//	ifaces/<ifname>/tc-link  the tcx ingress link of the SYN cookie acceptor
//	ifaces/<ifname>/tc-prog  its program
package shield

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"unsafe"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/moat-shield/moat/internal/datapath"
	"github.com/moat-shield/moat/internal/syncookie"
)

// DefaultRoot is where moat pins its state.
const DefaultRoot = "/sys/fs/bpf/moat"

// tmpPrefix starts the names of directories being filled before they are
// renamed into place. bpffs refuses dots in names, so no dot-files here.
const tmpPrefix = "tmp-"

// sharedMaps are the maps every attached interface uses; everything else in
// the object (the counters) is per interface.
var sharedMaps = []string{
	datapath.MoatMapAllowV4Hosts, datapath.MoatMapAllowV6Hosts,
	datapath.MoatMapAllowV4Nets, datapath.MoatMapAllowV6Nets,
	datapath.MoatMapDenyV4Hosts, datapath.MoatMapDenyV6Hosts,
	datapath.MoatMapDenyV4Nets, datapath.MoatMapDenyV6Nets,
	datapath.MoatMapDenySummary, datapath.MoatMapDenyHostSummary, datapath.MoatMapDenySummaryState,
	datapath.MoatMapComments, datapath.MoatMapAutoReasons, datapath.MoatMapPortRules,
	datapath.MoatMapPortRuleHits, datapath.MoatMapPortRuleDefs, datapath.MoatMapSettings,
	// The census before the counters: carrying counters over reads it.
	datapath.MoatMapSynPorts, datapath.MoatMapSynCensus, datapath.MoatMapSynCounters, datapath.MoatMapSynKeys,
	datapath.MoatMapSynRotation, datapath.MoatMapSynSettings, datapath.MoatMapSynRecent,
	datapath.MoatMapRlRules, datapath.MoatMapRlPortScopes, datapath.MoatMapRlClassScopes, datapath.MoatMapRlBudgets, datapath.MoatMapRlSources, datapath.MoatMapRlSketch, datapath.MoatMapRlStats, datapath.MoatMapRlSettings, datapath.MoatMapHhSources, datapath.MoatMapShape, datapath.MoatMapShapePorts, // rate limits (internal/ratelimit)
	datapath.MoatMapCaptureSettings, datapath.MoatMapCaptureRing, datapath.MoatMapCaptureLost, datapath.MoatMapCaptureSeen, // packet capture (internal/capture)
}

// UserError marks an error caused by what the user asked for (a bad
// prefix, a rule that exists, a missing interface), as opposed to a
// failure of the system. The CLI exits with status 2 for these.
type UserError struct{ Err error }

func (e *UserError) Error() string { return e.Err.Error() }
func (e *UserError) Unwrap() error { return e.Err }

func userErrorf(format string, args ...any) error {
	return &UserError{fmt.Errorf(format, args...)}
}

// Shield is an open handle on the pinned state.
type Shield struct {
	root string
	spec *ebpf.CollectionSpec
	maps map[string]*ebpf.Map
	lock *os.File

	summaryOr map[string]*ebpf.Program // the writers of the summaries, by map; loaded on first use

	// SummaryErr is why Open could not bring the deny summary into use,
	// if it could not.
	SummaryErr error
	// SynErr is why Open could not give every protected port a counters
	// slot (state of an older moat), if it could not; such ports are
	// left to the kernel until it can.
	SynErr error
	// SynOlderFilter names an interface whose filter is an older moat's,
	// which keeps SYN counters in the old map (and protects only the ports
	// it knows), until `moat attach` replaces it.
	SynOlderFilter string
	// Renamed says which interfaces Open found renamed since moat
	// attached to them, whose pins it moved under the new names.
	Renamed []string
	renamed map[string]string // old name to new, of every move (RenamedTo)
	// Older names the shared maps that an older moat pinned with values
	// of another size and that OpenAsIs left as they are (Open
	// replaces them).
	Older []string
	// StrandedCensusTaker: Open replaced shared maps of an older moat
	// (the socket census, the SYN counters, the settings, the rate
	// limits' counters or the heavy hitters: an older moat refuses or
	// cannot open each of them at this version's size) while another
	// process takes the census, which can only be that moat's daemon or
	// `moat syn rotate --every`: it can no longer open the state, and it
	// stops at its next key rotation, so that the keys go stale (no
	// cookies) unless it is restarted with this version.
	StrandedCensusTaker bool

	keepOlder     bool // OpenAsIs: leave maps of an older layout as they are
	replacedOlder bool // openMaps replaced a map of an older moat
}

// Open opens the pinned state under root, creating the shared maps if they
// do not exist yet. It takes an exclusive lock on the state that is held
// until Close, so concurrent commands never interleave their changes.
func Open(root string) (*Shield, error) { return open(root, nil) }

// OpenAsIs is Open for commands that load no filter and change none of
// the maps whose layout changes between versions (status, syn status,
// list, stats, block, allow, port, expire...): a shared map that an
// older moat pinned with values of another size is left as it is and
// read as such (Older names it), not replaced. A replacement takes the
// map from under the older moat's filter, which goes on counting in a
// map no one reads until `moat attach` replaces it, and from under its
// daemon or rotator, which cannot open the state any more (no key
// rotation, so no cookies 2.5 periods later; no expiry; no change through
// its API): that is the upgrade's step (Attach, the daemon's start), not
// a reader's.
func OpenAsIs(root string) (*Shield, error) { return openWith(root, nil, true) }

// open is Open with the shared maps given other sizes (by name) than the
// BPF object's, for tests that fill a map: a root must always be opened
// with the sizes it was created with.
func open(root string, sizes map[string]uint32) (*Shield, error) {
	return openWith(root, sizes, false)
}

// openWith is open; keepOlder leaves maps of an older layout as they are
// (OpenAsIs).
func openWith(root string, sizes map[string]uint32, keepOlder bool) (*Shield, error) {
	if err := ensureBPFFS(root); err != nil {
		return nil, err
	}
	spec, err := datapath.LoadMoat()
	if err != nil {
		return nil, fmt.Errorf("load BPF object: %w", err)
	}
	for name, n := range sizes {
		spec.Maps[name].MaxEntries = n
	}
	s := &Shield{root: root, spec: spec, maps: map[string]*ebpf.Map{}, keepOlder: keepOlder}
	if err := s.lockRoot(); err != nil {
		return nil, err
	}
	if err := s.openMaps(); err != nil {
		s.Close()
		return nil, err
	}
	if s.replacedOlder {
		s.StrandedCensusTaker = s.censusTaken()
	}
	// Like the summary's, a failure here must not stop commands such as
	// detach; syn status reports it.
	s.SynErr = s.ensureSynSlots()
	// New state, state pinned before the deny summary existed, or filters
	// of an older moat still attached. A failure leaves the summary out of
	// use, which costs lookups, not verdicts: commands such as detach must
	// still work, and status reports it.
	s.SummaryErr = s.ensureSummary()
	// Interfaces renamed since moat attached to them (followRenames). A
	// failure is no reason to refuse the state: attach reports it.
	s.Renamed, _ = s.followRenames()
	return s, nil
}

// Root is the bpffs directory of this state.
func (s *Shield) Root() string { return s.root }

// Close releases the maps and the lock. Pinned state stays in place.
func (s *Shield) Close() error {
	for _, m := range s.maps {
		m.Close()
	}
	s.maps = nil
	for _, p := range s.summaryOr {
		p.Close()
	}
	s.summaryOr = nil
	if s.lock != nil {
		s.lock.Close()
		s.lock = nil
	}
	return nil
}

// Map returns one of the shared maps by its name in the BPF object.
func (s *Shield) Map(name string) *ebpf.Map { return s.maps[name] }

// ensureBPFFS mounts bpffs on the directory of root if that is
// /sys/fs/bpf and not mounted, as on a fresh boot of a minimal system.
func ensureBPFFS(root string) error {
	dir := filepath.Dir(root)
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err == nil && st.Type == unix.BPF_FS_MAGIC {
		return nil
	}
	if dir != "/sys/fs/bpf" {
		// A wrong --root is the operator's mistake (exit status 2): say
		// which root, and what one looks like, since the root is a
		// directory inside a bpffs mount, not the mount itself.
		return userErrorf("root %s: %s is not a bpf filesystem (want a directory inside a bpffs mount, such as /sys/fs/bpf/moat)", root, dir)
	}
	if err := unix.Mount("bpf", dir, "bpf", 0, "mode=0700"); err != nil {
		return fmt.Errorf("mount bpffs on %s: %w", dir, err)
	}
	return nil
}

// lockRoot serialises writers. The lock file lives in /run, not on bpffs,
// so that it never appears among the pins.
func (s *Shield) lockRoot() error {
	f, err := os.OpenFile(s.lockPath(""), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("lock moat state: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		f.Close()
		return fmt.Errorf("lock moat state: %w", err)
	}
	s.lock = f
	return nil
}

// lockPath is the name of a lock file of the root, with what (say
// ".census") telling one lock from another.
func (s *Shield) lockPath(what string) string {
	return "/run/moat-" + RootLockID(s.root) + what + ".lock"
}

// RootLockID names root in the lock files of /run: the device and inode of
// its directory and its base name. The inode alone is not enough: every
// bpffs mount's top directory is inode 1, so /sys/fs/bpf/moat and a root
// of the same name on another bpffs mount would share their locks (one
// census, one dump and one writer at a time for both). A root named
// through a symbolic link is named as the directory it leads to: the
// same state must have one lock, whichever path a command was given.
func RootLockID(root string) string {
	root = ResolveRoot(root)
	// os.Stat's Sys() is a *syscall.Stat_t, never a *unix.Stat_t, so ask
	// unix directly.
	var st unix.Stat_t
	if err := unix.Stat(filepath.Dir(root), &st); err == nil {
		return fmt.Sprintf("%d-%d-%s", st.Dev, st.Ino, filepath.Base(root))
	}
	return filepath.Base(root)
}

// ResolveRoot is root with the symbolic links on its way resolved, as far
// as they exist: the longest part of its path that exists is resolved, and
// the names that do not exist yet follow it, so a root names the same
// directory before and after it is made. The locks that say who works on
// a root (RootLockID, the daemon's) go by it, so that a root reached
// through a link is not taken for another one.
func ResolveRoot(root string) string {
	abs, err := filepath.Abs(root)
	if err != nil {
		return root
	}
	var rest []string
	for dir := abs; ; dir = filepath.Dir(dir) {
		if r, err := filepath.EvalSymlinks(dir); err == nil {
			return filepath.Join(append([]string{r}, rest...)...)
		}
		if filepath.Dir(dir) == dir {
			return abs
		}
		rest = append([]string{filepath.Base(dir)}, rest...)
	}
}

func (s *Shield) mapsDir() string { return filepath.Join(s.root, "maps") }

// openMaps loads the pinned shared maps, or creates and pins them. New maps
// are pinned in a temporary directory that is renamed into place, so a
// reader never sees half a set.
func (s *Shield) openMaps() error {
	if _, err := os.Stat(s.mapsDir()); err == nil {
		for _, name := range sharedMaps {
			path := filepath.Join(s.mapsDir(), name)
			m, err := ebpf.LoadPinnedMap(path, nil)
			if errors.Is(err, os.ErrNotExist) {
				// Pinned by an older moat that did not have this map yet:
				// add it, empty, beside the others. Programs loaded from now
				// on use it; the attached ones keep running until replaced.
				m, err = s.addMap(name, path)
			}
			if err != nil {
				return fmt.Errorf("open pinned map %s: %w", name, err)
			}
			want := s.spec.Maps[name].Copy()
			want.Flags = withAccessFlags(want.Flags, m)
			if err := want.Compatible(m); err != nil {
				migrate, ok := resizable[name]
				if !ok || m.Type() != want.Type || m.KeySize() != want.KeySize || m.MaxEntries() != want.MaxEntries {
					m.Close()
					return fmt.Errorf("pinned map %s does not match this version of moat: %w", name, err)
				}
				// Pinned by a moat whose values had another size.
				if s.keepOlder {
					s.Older = append(s.Older, name)
					s.maps[name] = m
					continue
				}
				if m, err = s.replaceMap(name, path, m, migrate); err != nil {
					return fmt.Errorf("replace pinned map %s of an older moat: %w", name, err)
				}
				s.replacedOlder = true
			}
			s.maps[name] = m
		}
		return nil
	}

	if err := os.MkdirAll(s.root, 0o700); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(s.root, tmpPrefix+"maps-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	for _, name := range sharedMaps {
		m, err := ebpf.NewMap(s.spec.Maps[name])
		if err != nil {
			return fmt.Errorf("create map %s: %w", name, err)
		}
		s.maps[name] = m
		if err := m.Pin(filepath.Join(tmp, name)); err != nil {
			return fmt.Errorf("pin map %s: %w", name, err)
		}
	}
	if err := s.writeSettings(defaultSettings()); err != nil {
		return err
	}
	if err := os.Rename(tmp, s.mapsDir()); err != nil {
		return fmt.Errorf("pin maps: %w", err)
	}
	return nil
}

// resizable are the shared maps whose values an older moat pinned at
// another size and that a newer one may take over: openMaps replaces such
// a map with one of this version's shape and the function carries over
// what still means the same.
var resizable = map[string]func(s *Shield, old, cur *ebpf.Map) error{
	datapath.MoatMapSynCounters: carrySynCounters,
	datapath.MoatMapSettings:    carrySettings,
	datapath.MoatMapRlStats:     carryRuleStats,
	datapath.MoatMapHhSources:   carryHeavyHitters,
	datapath.MoatMapSynCensus:   carryCensus,
}

// replaceMap creates name anew, lets migrate fill it from old, and pins it
// in old's place (a rename: a reader opens one or the other, never
// neither). Programs attached earlier keep the old map until they are
// replaced, as `moat attach` and the daemon's start do.
func (s *Shield) replaceMap(name, path string, old *ebpf.Map, migrate func(s *Shield, old, cur *ebpf.Map) error) (*ebpf.Map, error) {
	defer old.Close()
	m, err := ebpf.NewMap(s.spec.Maps[name])
	if err != nil {
		return nil, err
	}
	if err := migrate(s, old, m); err != nil {
		m.Close()
		return nil, fmt.Errorf("carry %s over: %w", name, err)
	}
	next := path + "-new"
	os.Remove(next)
	if err := m.Pin(next); err != nil {
		m.Close()
		return nil, err
	}
	if err := os.Rename(next, path); err != nil {
		m.Unpin()
		m.Close()
		return nil, err
	}
	return m, nil
}

// carrySynCounters copies every protected port's counters (per CPU, by
// slot), which lead struct syn_port_stats in every version, and those
// from accept_queue_full on, which follow the caches (accept_queue_full,
// mptcp_syns, and in a newer layout counters this version does not know,
// which it leaves), as far as the old value holds them; the fields between
// are the data path's flood windows and caches, which start afresh, but
// for census_from: an older value may not hold it, so every slot waits for
// the next census pass, as a port protected now would.
func carrySynCounters(s *Shield, old, cur *ebpf.Map) error {
	n := int(unsafe.Offsetof(datapath.MoatSynPortStats{}.WinStartNs))
	full := int(unsafe.Offsetof(datapath.MoatSynPortStats{}.AcceptQueueFull))
	if int(old.ValueSize()) < n {
		return fmt.Errorf("values of %d bytes hold no counters of %d", old.ValueSize(), n)
	}
	gen, err := syncookie.CensusGeneration(s.maps[datapath.MoatMapSynCensus])
	if err != nil {
		return err
	}
	from := binary.NativeEndian.AppendUint32(nil, gen+1)
	fromAt := int(unsafe.Offsetof(datapath.MoatSynPortStats{}.CensusFrom))
	var in [][]byte
	for slot := uint32(0); slot < old.MaxEntries(); slot++ {
		if err := old.Lookup(slot, &in); err != nil {
			return err
		}
		out := make([][]byte, len(in))
		for cpu, v := range in {
			out[cpu] = make([]byte, cur.ValueSize())
			copy(out[cpu], v[:n])
			if len(v) > full {
				copy(out[cpu][full:], v[full:])
			}
			copy(out[cpu][fromAt:], from)
		}
		if err := cur.Update(slot, out, ebpf.UpdateAny); err != nil {
			return err
		}
	}
	return nil
}

// carryCensus keeps the generation of an older moat's socket census,
// whose marks were another size (32-bit generations), so that the ports'
// census_from, counted in it, still holds; the marks start empty and the
// floor at 0, so nothing is trusted until the next passes, and the
// passes' tally goes on.
func carryCensus(s *Shield, old, cur *ebpf.Map) error {
	var t datapath.MoatSynCensusTable
	n := int(unsafe.Offsetof(t.Marks))
	if int(old.ValueSize()) < n {
		return fmt.Errorf("values of %d bytes hold no census header of %d", old.ValueSize(), n)
	}
	var in []byte
	if err := old.Lookup(uint32(0), &in); err != nil {
		return err
	}
	out := make([]byte, cur.ValueSize())
	copy(out, in[:n])
	binary.NativeEndian.PutUint32(out[unsafe.Offsetof(t.Floor):], 0)
	binary.NativeEndian.PutUint64(out[unsafe.Offsetof(t.ValidUntilNs):], 0)
	return cur.Update(uint32(0), out, ebpf.UpdateAny)
}

// carrySettings copies the policies of a moat that pinned fewer of them:
// the fields it had lead struct runtime_settings in every version, and a
// field it lacked starts at zero, its default (monitor mode off).
func carrySettings(s *Shield, old, cur *ebpf.Map) error {
	if old.ValueSize() > cur.ValueSize() {
		return fmt.Errorf("values of %d bytes hold more policies than this version knows (%d bytes)", old.ValueSize(), cur.ValueSize())
	}
	var in []byte
	if err := old.Lookup(uint32(0), &in); err != nil {
		return err
	}
	out := make([]byte, cur.ValueSize())
	copy(out, in)
	return cur.Update(uint32(0), out, ebpf.UpdateAny)
}

// carryRuleStats copies every rate limit's counters (per CPU, by rule id)
// of a moat whose struct rl_rule_stats was shorter: fields are only added
// at its end, so the old ones lead the new value and those it lacked (the
// monitored counts) start at zero. An older filter counted the packets
// monitor mode passed as drops; those stay drops.
func carryRuleStats(s *Shield, old, cur *ebpf.Map) error {
	n := int(unsafe.Offsetof(datapath.MoatRlRuleStats{}.Monitored))
	if int(old.ValueSize()) < n || old.ValueSize() > cur.ValueSize() {
		return fmt.Errorf("values of %d bytes are not an older layout of this version's %d (counters in the first %d)", old.ValueSize(), cur.ValueSize(), n)
	}
	var in [][]byte
	for id := uint32(0); id < old.MaxEntries(); id++ {
		if err := old.Lookup(id, &in); err != nil {
			return err
		}
		out := make([][]byte, len(in))
		for cpu, v := range in {
			out[cpu] = make([]byte, cur.ValueSize())
			copy(out[cpu], v)
		}
		if err := cur.Update(id, out, ebpf.UpdateAny); err != nil {
			return err
		}
	}
	return nil
}

// carryHeavyHitters copies the sampled sources of a moat whose struct
// hh_counts was shorter: fields are only added at its end, so the old ones
// lead the new value and those it lacked (the monitored count) start at
// zero. The counts are cumulative since a source entered the table, and
// `moat top` and the metrics read them as such: carried, they go on, where
// an empty table would restart every source. The oldest go in first, so
// that if the LRU makes room (it may before it is quite full) it drops
// those.
func carryHeavyHitters(s *Shield, old, cur *ebpf.Map) error {
	n := int(unsafe.Offsetof(datapath.MoatHhCounts{}.Monitored))
	if int(old.ValueSize()) < n || old.ValueSize() > cur.ValueSize() {
		return fmt.Errorf("values of %d bytes are not an older layout of this version's %d (counts in the first %d)", old.ValueSize(), cur.ValueSize(), n)
	}
	type entry struct {
		key, val []byte
		last     uint64
	}
	var es []entry
	var k, v []byte
	lastAt := int(unsafe.Offsetof(datapath.MoatHhCounts{}.LastNs))
	it := old.Iterate()
	for len(es) < int(old.MaxEntries()) && it.Next(&k, &v) {
		val := make([]byte, cur.ValueSize())
		copy(val, v)
		es = append(es, entry{k, val, binary.NativeEndian.Uint64(val[lastAt:])})
	}
	if err := it.Err(); err != nil {
		return err
	}
	slices.SortFunc(es, func(a, b entry) int { return cmp.Compare(a.last, b.last) })
	for _, e := range es {
		if err := cur.Update(e.key, e.val, ebpf.UpdateAny); err != nil {
			return err
		}
	}
	return nil
}

// HeavyHittersOlderFilter names an interface whose filter samples its
// heavy hitters into the table this one replaced (an older moat's, whose
// values were shorter: see carryHeavyHitters), or "" if none does: `moat
// top` misses its sources until `moat attach` replaces it.
func (s *Shield) HeavyHittersOlderFilter() (string, error) {
	return s.filterWithout(datapath.MoatMapHhSources)
}

// LimitCountersOlderFilter names an interface whose filter counts its
// rate limits' packets in the counters map this one replaced (an older
// moat's, whose values were shorter: see carryRuleStats), or "" if none
// does: the counters read now miss its packets until `moat attach`
// replaces it.
func (s *Shield) LimitCountersOlderFilter() (string, error) {
	return s.filterWithout(datapath.MoatMapRlStats)
}

// addMap creates one shared map and pins it at path.
func (s *Shield) addMap(name, path string) (*ebpf.Map, error) {
	m, err := ebpf.NewMap(s.spec.Maps[name])
	if err != nil {
		return nil, err
	}
	if err := m.Pin(path); err != nil {
		m.Close()
		return nil, err
	}
	return m, nil
}

// withAccessFlags takes the user-space access flags (syn_keys is write-only
// from user space) from the map as it was opened: a map loaded from a pin
// does not report them as its spec states them, and they say nothing about
// the map's shape.
func withAccessFlags(flags uint32, m *ebpf.Map) uint32 {
	const access = unix.BPF_F_WRONLY | unix.BPF_F_RDONLY
	return flags&^access | m.Flags()&access
}

// Remove unpins everything under the root: every interface's program and
// link (which detaches them) and the shared maps.
func (s *Shield) Remove() error {
	ifaces, err := s.attachedNames()
	if err != nil {
		return err
	}
	for _, name := range ifaces {
		if err := s.detach(name); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	return os.RemoveAll(s.root)
}
