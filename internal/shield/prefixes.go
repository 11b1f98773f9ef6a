package shield

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/moat-shield/moat/internal/datapath"
	"github.com/moat-shield/moat/internal/rules"
)

// List names the allowlist or the denylist.
type List uint8

const (
	AllowList List = 0
	DenyList  List = 1
)

func (l List) String() string {
	if l == AllowList {
		return "allowlist"
	}
	return "denylist"
}

// Entry is an allow or deny entry as stored.
type Entry struct {
	Prefix  netip.Prefix
	Expires time.Time // zero: never
	Comment string
	Hits    uint64
	Auto    bool // written by the data path: a rate limit's auto-block
	// Monitor: an auto-block written in monitor mode, in force only
	// while moat monitors; it goes when monitor mode is turned off.
	Monitor bool

	expiresNs uint64 // the stored deadline, CLOCK_BOOTTIME
}

// listMaps returns the host map and the trie for a list and family.
func (s *Shield) listMaps(l List, v6 bool) (hosts, nets *ebpf.Map) {
	switch {
	case l == AllowList && !v6:
		return s.maps[datapath.MoatMapAllowV4Hosts], s.maps[datapath.MoatMapAllowV4Nets]
	case l == AllowList && v6:
		return s.maps[datapath.MoatMapAllowV6Hosts], s.maps[datapath.MoatMapAllowV6Nets]
	case !v6:
		return s.maps[datapath.MoatMapDenyV4Hosts], s.maps[datapath.MoatMapDenyV4Nets]
	default:
		return s.maps[datapath.MoatMapDenyV6Hosts], s.maps[datapath.MoatMapDenyV6Nets]
	}
}

// The data path compares expiry deadlines with bpf_ktime_get_boot_ns, so
// wall-clock times are converted through CLOCK_BOOTTIME at the moment of
// the change.
func bootNow() uint64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		panic(err) // CLOCK_BOOTTIME exists on every kernel moat runs on
	}
	return uint64(ts.Nano())
}

// bootDeadline converts an expiry time to the data path's clock, given
// CLOCK_BOOTTIME now; zero stays zero (never).
func bootDeadline(t time.Time, now uint64) uint64 {
	if t.IsZero() {
		return 0
	}
	d := time.Until(t)
	if d <= 0 {
		return now // already expired; never 0, which means "never"
	}
	return now + uint64(d)
}

// wallDeadline converts a stored deadline back, given the wall clock and
// CLOCK_BOOTTIME read at one moment.
func wallDeadline(ns uint64, now time.Time, bootNs uint64) time.Time {
	if ns == 0 {
		return time.Time{}
	}
	return now.Add(time.Duration(int64(ns) - int64(bootNs))).Round(time.Second)
}

func hostKey(p netip.Prefix) any {
	a := p.Addr()
	if a.Is4() {
		return datapath.MoatHostV4{Addr: a.As4()}
	}
	return datapath.MoatHostV6{Addr: a.As16()}
}

func netKey(p netip.Prefix) any {
	a := p.Addr()
	if a.Is4() {
		return datapath.MoatNetV4{Prefixlen: uint32(p.Bits()), Addr: a.As4()}
	}
	return datapath.MoatNetV6{Prefixlen: uint32(p.Bits()), Addr: a.As16()}
}

func commentKey(l List, p netip.Prefix) datapath.MoatCommentKey {
	k := datapath.MoatCommentKey{List: uint8(l), Prefixlen: uint8(p.Bits()), Family: 4}
	if p.Addr().Is6() {
		k.Family = 6
	}
	copy(k.Addr[:], p.Addr().AsSlice())
	return k
}

// mapFor returns the map and key that hold p in list l.
func (s *Shield) mapFor(l List, p netip.Prefix) (*ebpf.Map, any) {
	hosts, nets := s.listMaps(l, p.Addr().Is6())
	if rules.IsHost(p) {
		return hosts, hostKey(p)
	}
	return nets, netKey(p)
}

// Has tells whether p is in list l, live or expired.
func (s *Shield) Has(l List, p netip.Prefix) (bool, error) {
	_, ok, err := s.lookup(l, p)
	return ok, err
}

// lookup returns the stored rule of p in list l.
func (s *Shield) lookup(l List, p netip.Prefix) (datapath.MoatPrefixRule, bool, error) {
	m, k := s.mapFor(l, p)
	var v datapath.MoatPrefixRule
	err := m.Lookup(k, &v)
	if errors.Is(err, ebpf.ErrKeyNotExist) {
		return v, false, nil
	}
	if err != nil {
		return v, false, err
	}
	// A trie lookup is a longest-prefix match: it also finds a shorter
	// prefix that covers p, which is not p.
	return v, int(v.Prefixlen) == p.Bits(), nil
}

// expired tells whether a stored deadline has passed at now (both
// CLOCK_BOOTTIME), as the data path decides it: from then on the filter
// ignores the entry.
func expired(expiresNs, now uint64) bool {
	return expiresNs != 0 && expiresNs <= now
}

// Live tells whether the filter still applies e, as read by Entries: its
// expiry, if it has one, has not passed.
func (e Entry) Live() bool { return !expired(e.expiresNs, bootNow()) }

// AddMode says what to do with entries that exist already.
type AddMode int

const (
	// Strict refuses the whole change if any entry exists and has not
	// expired (see Insert).
	Strict AddMode = iota
	// Upsert overwrites existing entries (their hit counters restart).
	Upsert
)

// Add puts entries in list l. In Strict mode nothing changes if any of the
// entries exists already, has not expired and is no auto-block (Insert). Nothing changes either if
// the list's maps or the comment map cannot hold the entries with those
// they hold. Entries are grouped per map and written with batched
// updates, all maps at once.
func (s *Shield) Add(l List, entries []Entry, mode AddMode) error {
	if mode == Strict {
		_, err := s.Insert(l, entries)
		return err
	}
	return s.add(l, entries, mode)
}

// Replaced is what an Insert took the place of.
type Replaced struct {
	// Expired: entries whose expiry had passed, which the filter ignores.
	Expired []netip.Prefix
	// AutoBlocks: live auto-blocks of rate limits. An auto-block is the
	// limit's, not the operator's: it lapses at its expiry, and monitor
	// mode's at the end of the trial, so the operator's entry takes its
	// place rather than be refused.
	AutoBlocks []netip.Prefix
}

// Insert adds entries that list l does not hold, as `moat block` and
// `moat allow` do: nothing changes if any of them is in the list and live.
// An entry whose expiry has passed counts as absent, since the filter
// ignores it, and so does an auto-block: the new entry takes its place
// (its hits start from zero), and Insert says which it replaced.
func (s *Shield) Insert(l List, entries []Entry) (Replaced, error) {
	if err := validateComments(entries); err != nil { // before the lookups, as before any write
		return Replaced{}, err
	}
	p, found, stale, auto, err := s.anyListed(l, entries)
	if err != nil {
		return Replaced{}, err
	}
	if found {
		return Replaced{}, userErrorf("%s is already in the %s", p, l)
	}
	if err := s.add(l, entries, Strict); err != nil {
		return Replaced{}, err
	}
	var r Replaced
	// A replaced entry's comment outlives it in the comment map unless the
	// new entry writes one over it.
	var replacedEntries []Entry
	for _, j := range stale {
		replacedEntries = append(replacedEntries, entries[j])
		r.Expired = append(r.Expired, entries[j].Prefix)
	}
	for _, j := range auto {
		replacedEntries = append(replacedEntries, entries[j])
		r.AutoBlocks = append(r.AutoBlocks, entries[j].Prefix)
	}
	if len(replacedEntries) == 0 {
		return r, nil
	}
	if l == DenyList {
		s.dropAutoReasons(r.AutoBlocks)
	}
	return r, s.dropStaleComments(l, replacedEntries)
}

func validateComments(entries []Entry) error {
	for _, e := range entries {
		if err := rules.ValidateComment(e.Comment); err != nil {
			return &UserError{fmt.Errorf("%s: %w", e.Prefix, err)}
		}
	}
	return nil
}

// add writes entries, overwriting those that exist; Upsert also drops the
// comments of overwritten entries that the new ones lack. It is all or
// nothing: a change the maps cannot hold is refused before the first
// write, and one that fails midway is taken back (see commit).
func (s *Shield) add(l List, entries []Entry, mode AddMode) error {
	if mode == Upsert {
		if err := validateComments(entries); err != nil {
			return err
		}
	}
	if len(entries) <= fewEntries {
		return s.addFew(l, entries, mode)
	}
	c, err := s.prepareAdd(l, entries, mode)
	if err != nil {
		return err
	}
	if err := s.checkCommentRoom(c); err != nil {
		return err
	}
	return s.commit(c)
}

// stored is what the maps hold for e: its rule, and its comment if it has
// one (the rule's flag then says so).
func stored(e Entry, now uint64) (datapath.MoatPrefixRule, datapath.MoatComment) {
	v := datapath.MoatPrefixRule{ExpiresNs: bootDeadline(e.Expires, now), Prefixlen: uint32(e.Prefix.Bits())}
	var t datapath.MoatComment
	if e.Comment != "" {
		v.Flags = ruleFComment
		for i := 0; i < len(e.Comment); i++ {
			t.Text[i] = int8(e.Comment[i])
		}
	}
	return v, t
}

// fewEntries is the largest change addFew makes. Counting what a map holds
// means reading it whole, which for a million entries takes a few hundred
// milliseconds: too much for `moat block` of one address. A change of up
// to this many entries looks up its own keys instead (about 2 µs each) and
// lets a full map refuse it.
var fewEntries = 16384 // a variable for tests of both paths

// addFew is add for a few entries, all or nothing as well: it looks up
// which of its keys the maps hold, writes the new keys first (comments,
// then entries), and deletes them again if one does not fit; only then
// does it overwrite the keys that were there, which needs no room. A new
// key is written only if still absent: one the data path wrote meanwhile
// (an auto-block) counts as held, so that taking the change back never
// deletes it.
func (s *Shield) addFew(l List, entries []Entry, mode AddMode) error {
	type key struct {
		m *ebpf.Map
		k any
	}
	type write struct {
		key
		v      any
		held   bool
		prefix netip.Prefix // of an entry; invalid for a comment
	}
	comments := s.maps[datapath.MoatMapComments]
	var writes []write // in order: each entry's comment, then the entry
	now := bootNow()
	for _, e := range entries {
		v, t := stored(e, now)
		if e.Comment != "" {
			ck := commentKey(l, e.Prefix)
			var old datapath.MoatComment
			held, err := present(comments.Lookup(ck, &old))
			if err != nil {
				return err
			}
			writes = append(writes, write{key{comments, ck}, t, held, netip.Prefix{}})
		}
		_, held, err := s.lookup(l, e.Prefix)
		if err != nil {
			return err
		}
		m, k := s.mapFor(l, e.Prefix)
		writes = append(writes, write{key{m, k}, v, held, e.Prefix})
	}

	if l == AllowList {
		var bits uint32
		for _, e := range entries {
			bits |= familyBit(e.Prefix)
		}
		if err := s.updateAllowInUse(func(in uint32) uint32 { return in | bits }); err != nil {
			return err
		}
	} else if err := s.markDeny(entries); err != nil {
		return err
	}
	var added []write
	takeBack := func(err error) error {
		var gone []netip.Prefix
		for _, w := range added {
			if derr := w.m.Delete(w.k); derr != nil && !errors.Is(derr, ebpf.ErrKeyNotExist) {
				return fmt.Errorf("%w; taking the change back failed too: %v", err, derr)
			}
			if w.prefix.IsValid() {
				gone = append(gone, w.prefix)
			}
		}
		if l == AllowList {
			return cmp.Or(err, s.clearEmptyAllowFamilies())
		}
		return cmp.Or(err, s.noteRemoved(gone))
	}
	for _, held := range []bool{false, true} {
		for i := range writes {
			w := &writes[i]
			if w.held != held {
				continue
			}
			flag := ebpf.UpdateAny
			if !held {
				flag = ebpf.UpdateNoExist
			}
			err := w.m.Update(w.k, w.v, flag)
			if !held && errors.Is(err, ebpf.ErrKeyExist) {
				w.held = true // written meanwhile: overwritten with the held keys
				continue
			}
			if err != nil {
				if errors.Is(err, unix.E2BIG) || errors.Is(err, unix.ENOSPC) {
					err = userErrorf("the comment map holds at most %d comments (allowlist and denylist together); it has no room for this change", w.m.MaxEntries())
					if w.prefix.IsValid() {
						err = userErrorf("the %s holds at most %d %s; it has no room for this change", l, w.m.MaxEntries(), classNames[prefixClass(w.prefix)])
					}
				} else {
					err = fmt.Errorf("update %s: map %s: %w", l, mapName(w.m), err)
				}
				return takeBack(err)
			}
			if !held {
				added = append(added, *w)
			}
		}
	}
	if mode == Upsert {
		return s.dropStaleComments(l, entries)
	}
	return nil
}

// present turns a lookup's error into whether the key was there.
func present(err error) (bool, error) {
	if errors.Is(err, ebpf.ErrKeyNotExist) {
		return false, nil
	}
	return err == nil, err
}

// listChange is one list's part of an add: the entries queued per map, and
// which of the queued keys the maps held before, so that a failed write
// can delete exactly what it added.
type listChange struct {
	l       List
	entries []Entry
	mode    AddMode
	b       *prefixBatches
	cb      mapBatch[datapath.MoatCommentKey, datapath.MoatComment]

	held         [4][]bool // by map (see prefixClass), by queued key; nil: none held
	heldComments []bool
}

// prepareAdd queues entries for list l and refuses, before anything is
// written, a change that one of the list's maps cannot hold. The maps hold
// what they hold now plus every queued key they do not: stale entries of a
// replace are deleted only after the writes, so this is also the peak.
func (s *Shield) prepareAdd(l List, entries []Entry, mode AddMode) (*listChange, error) {
	c := &listChange{l: l, entries: entries, mode: mode, b: s.newPrefixBatches(l)}
	c.cb.m = s.maps[datapath.MoatMapComments]
	c.b.reserve(entries)
	now := bootNow()
	for _, e := range entries {
		v, t := stored(e, now)
		if e.Comment != "" {
			c.cb.add(commentKey(l, e.Prefix), t)
		}
		c.b.add(e.Prefix, v)
	}
	var got [4]room
	err := runJobs([]job{
		{1, func() (err error) { got[classHosts4], err = roomFor(c.b.hosts4.m, &c.b.hosts4); return err }},
		{1, func() (err error) { got[classNets4], err = roomFor(c.b.nets4.m, &c.b.nets4); return err }},
		{1, func() (err error) { got[classHosts6], err = roomFor(c.b.hosts6.m, &c.b.hosts6); return err }},
		{1, func() (err error) { got[classNets6], err = roomFor(c.b.nets6.m, &c.b.nets6); return err }},
	})
	if err != nil {
		return nil, err
	}
	for i, r := range got {
		if need := r.have + r.added; need > r.max {
			return nil, userErrorf("the %s holds at most %d %s; this change needs %d", l, r.max, classNames[i], need)
		}
		c.held[i] = r.held[0]
	}
	return c, nil
}

// checkCommentRoom refuses changes whose comments the comment map, which
// both lists share, cannot hold with those it holds.
func (s *Shield) checkCommentRoom(cs ...*listChange) error {
	var bs []*mapBatch[datapath.MoatCommentKey, datapath.MoatComment]
	for _, c := range cs {
		bs = append(bs, &c.cb)
	}
	r, err := roomFor(s.maps[datapath.MoatMapComments], bs...)
	if err != nil {
		return err
	}
	if need := r.have + r.added; need > r.max {
		return userErrorf("the comment map holds at most %d comments (allowlist and denylist together); this change needs %d", r.max, need)
	}
	for i, c := range cs {
		c.heldComments = r.held[i]
	}
	return nil
}

// room is what a map holds and what a change adds to it.
type room struct {
	max, have int
	added     int      // queued keys the map does not hold, each counted once
	held      [][]bool // by batch, by queued key; nil where the map held none
}

// roomFor reads m, which batches queue keys for, and counts its keys and
// the queued ones it lacks. The kernel keeps no count that user space can
// read, so m is read whole; the queued keys go in a set only once the map
// turns out not to be empty.
func roomFor[K comparable, V any](m *ebpf.Map, batches ...*mapBatch[K, V]) (room, error) {
	r := room{max: int(m.MaxEntries()), held: make([][]bool, len(batches))}
	queued := 0
	for _, b := range batches {
		queued += len(b.keys)
	}
	if queued == 0 {
		return r, nil
	}
	type ref struct{ batch, i int32 }
	var index map[K]ref
	err := readAll(m, func(k *K, _ *V) {
		r.have++
		if index == nil {
			index = make(map[K]ref, queued)
			for bi, b := range batches {
				for i, k := range b.keys {
					if _, dup := index[k]; !dup {
						index[k] = ref{int32(bi), int32(i)}
					}
				}
			}
		}
		if at, ok := index[*k]; ok {
			if r.held[at.batch] == nil {
				r.held[at.batch] = make([]bool, len(batches[at.batch].keys))
			}
			r.held[at.batch][at.i] = true
		}
	})
	if err != nil {
		return r, err
	}
	if index == nil {
		r.added = queued
		return r, nil
	}
	for _, at := range index {
		if r.held[at.batch] == nil || !r.held[at.batch][at.i] {
			r.added++
		}
	}
	return r, nil
}

// commit writes changes in order. If a write fails, what the changes
// added (keys their maps did not hold) is deleted again, so that no half
// of a change stays in place; entries they overwrote keep the new values.
func (s *Shield) commit(cs ...*listChange) error {
	for i, c := range cs {
		err := s.write(c)
		if err == nil {
			continue
		}
		for j := i; j >= 0; j-- {
			if uerr := s.undo(cs[j]); uerr != nil {
				return fmt.Errorf("%w; taking the change back failed too: %v", err, uerr)
			}
		}
		return err
	}
	return nil
}

func (s *Shield) write(c *listChange) error {
	if c.l == AllowList {
		// Before the entries: the data path skips the lookups of a
		// family whose bit is clear.
		var bits uint32
		for _, e := range c.entries {
			bits |= familyBit(e.Prefix)
		}
		if err := s.updateAllowInUse(func(in uint32) uint32 { return in | bits }); err != nil {
			return err
		}
	}
	if c.l == DenyList {
		// Before the entries: the data path skips the lookups of a
		// source whose summary bit is clear.
		if err := s.markDeny(c.entries); err != nil {
			return err
		}
	}
	// Comments first, so that a listing never shows a rule whose comment
	// is still missing.
	if err := runJobs(c.cb.updateJobs()); err != nil {
		return fmt.Errorf("store comments: %w", err)
	}
	if err := runJobs(c.b.updateJobs()); err != nil {
		return fmt.Errorf("update %s: %w", c.l, err)
	}
	if c.mode == Upsert {
		return s.dropStaleComments(c.l, c.entries)
	}
	return nil
}

// undo deletes the entries and comments that c added where its maps held
// none. The summary bits c set stay: a stale bit costs a lookup, not a
// verdict.
func (s *Shield) undo(c *listChange) error {
	isHeld := func(held []bool, i int) bool { return held != nil && held[i] }
	var gone []netip.Prefix
	var next [4]int
	comment := 0
	cb := mapBatch[datapath.MoatCommentKey, datapath.MoatComment]{m: c.cb.m}
	for _, e := range c.entries {
		k := prefixClass(e.Prefix)
		if !isHeld(c.held[k], next[k]) {
			gone = append(gone, e.Prefix)
		}
		next[k]++
		if e.Comment != "" {
			if !isHeld(c.heldComments, comment) {
				cb.addKey(c.cb.keys[comment])
			}
			comment++
		}
	}
	b := s.newPrefixBatches(c.l)
	for _, p := range gone {
		b.addKey(p)
	}
	// Each part as far as it goes: a key the kernel refused to write may
	// be refused again, which must not keep the comments in place.
	var first error
	if err := runJobs(b.deleteJobs()); err != nil {
		first = fmt.Errorf("update %s: %w", c.l, err)
	}
	if err := runJobs(cb.deleteJobs()); err != nil && first == nil {
		first = fmt.Errorf("delete comments: %w", err)
	}
	var err error
	if c.l == AllowList {
		err = s.clearEmptyAllowFamilies()
	} else {
		err = s.noteRemoved(gone)
	}
	return cmp.Or(first, err)
}

// prefixBatches queues one list's changes per map: hosts in the hash maps,
// the rest in the tries.
type prefixBatches struct {
	hosts4 mapBatch[datapath.MoatHostV4, datapath.MoatPrefixRule]
	hosts6 mapBatch[datapath.MoatHostV6, datapath.MoatPrefixRule]
	nets4  mapBatch[datapath.MoatNetV4, datapath.MoatPrefixRule]
	nets6  mapBatch[datapath.MoatNetV6, datapath.MoatPrefixRule]
}

func (s *Shield) newPrefixBatches(l List) *prefixBatches {
	b := &prefixBatches{}
	b.hosts4.m, b.nets4.m = s.listMaps(l, false)
	b.hosts6.m, b.nets6.m = s.listMaps(l, true)
	return b
}

// reserve sizes the queues for entries, sparing a million appends their
// regrowing.
func (b *prefixBatches) reserve(entries []Entry) {
	var n [4]int
	for _, e := range entries {
		n[prefixClass(e.Prefix)]++
	}
	b.hosts4.reserve(n[classHosts4])
	b.nets4.reserve(n[classNets4])
	b.hosts6.reserve(n[classHosts6])
	b.nets6.reserve(n[classNets6])
}

// The maps of a list, in the order of listReaders.
const (
	classHosts4 = iota
	classNets4
	classHosts6
	classNets6
)

// classNames name what each map of a list holds, for messages.
var classNames = [4]string{"IPv4 hosts", "IPv4 networks", "IPv6 hosts", "IPv6 networks"}

// prefixClass tells which of a list's maps holds p.
func prefixClass(p netip.Prefix) int {
	switch v4, host := p.Addr().Is4(), rules.IsHost(p); {
	case v4 && host:
		return classHosts4
	case v4:
		return classNets4
	case host:
		return classHosts6
	default:
		return classNets6
	}
}

func (b *prefixBatches) add(p netip.Prefix, v datapath.MoatPrefixRule) {
	a := p.Addr()
	switch {
	case a.Is4() && rules.IsHost(p):
		b.hosts4.add(datapath.MoatHostV4{Addr: a.As4()}, v)
	case a.Is4():
		b.nets4.add(datapath.MoatNetV4{Prefixlen: uint32(p.Bits()), Addr: a.As4()}, v)
	case rules.IsHost(p):
		b.hosts6.add(datapath.MoatHostV6{Addr: a.As16()}, v)
	default:
		b.nets6.add(datapath.MoatNetV6{Prefixlen: uint32(p.Bits()), Addr: a.As16()}, v)
	}
}

func (b *prefixBatches) addKey(p netip.Prefix) {
	a := p.Addr()
	switch {
	case a.Is4() && rules.IsHost(p):
		b.hosts4.addKey(datapath.MoatHostV4{Addr: a.As4()})
	case a.Is4():
		b.nets4.addKey(datapath.MoatNetV4{Prefixlen: uint32(p.Bits()), Addr: a.As4()})
	case rules.IsHost(p):
		b.hosts6.addKey(datapath.MoatHostV6{Addr: a.As16()})
	default:
		b.nets6.addKey(datapath.MoatNetV6{Prefixlen: uint32(p.Bits()), Addr: a.As16()})
	}
}

func cmpNet4(a, b datapath.MoatNetV4) int {
	if c := bytes.Compare(a.Addr[:], b.Addr[:]); c != 0 {
		return c
	}
	return cmp.Compare(a.Prefixlen, b.Prefixlen)
}

func cmpNet6(a, b datapath.MoatNetV6) int {
	if c := bytes.Compare(a.Addr[:], b.Addr[:]); c != 0 {
		return c
	}
	return cmp.Compare(a.Prefixlen, b.Prefixlen)
}

// updateJobs returns the work of writing every queued entry. Trie entries
// go in address order, which the trie inserts fastest (see batch.go); the
// sorting is part of the trie's job, so that it runs beside the hash maps'.
func (b *prefixBatches) updateJobs() []job {
	return slices.Concat(b.hosts4.updateJobs(), b.hosts6.updateJobs(),
		sortedFirst(b.nets4.updateJobs(), func() { b.nets4.sortBy(cmpNet4) }),
		sortedFirst(b.nets6.updateJobs(), func() { b.nets6.sortBy(cmpNet6) }))
}

// sortedFirst makes a map's single job sort its queue before writing it.
// The job reads the queue only when it runs, so sorting then is in time.
// Several jobs (a map that is not a trie) would sort up front.
func sortedFirst(jobs []job, sort func()) []job {
	if len(jobs) != 1 {
		sort()
		return jobs
	}
	write := jobs[0].run
	jobs[0].run = func() error {
		sort()
		return write()
	}
	return jobs
}

func (b *prefixBatches) deleteJobs() []job {
	return slices.Concat(b.hosts4.deleteJobs(), b.hosts6.deleteJobs(), b.nets4.deleteJobs(), b.nets6.deleteJobs())
}

// anyListed returns the first of entries that list l holds live and not as
// an auto-block, the indexes of those it holds expired, and those it holds
// as live auto-blocks. Each check is a lookup syscall, so a long list of
// entries is checked on all CPUs.
func (s *Shield) anyListed(l List, entries []Entry) (netip.Prefix, bool, []int, []int, error) {
	const perJob = 4096
	found := make([]bool, len(entries))
	stale := make([][]int, (len(entries)+perJob-1)/perJob) // one part per job
	auto := make([][]int, len(stale))
	var jobs []job
	now := bootNow()
	for lo := 0; lo < len(entries); lo += perJob {
		hi := min(lo+perJob, len(entries))
		part, autoPart := &stale[lo/perJob], &auto[lo/perJob]
		jobs = append(jobs, job{hi - lo, func() error {
			for i := lo; i < hi; i++ {
				v, ok, err := s.lookup(l, entries[i].Prefix)
				if err != nil {
					return err
				}
				if !ok {
					continue
				}
				if expired(v.ExpiresNs, now) {
					*part = append(*part, i)
					continue
				}
				if v.Flags&ruleFAuto != 0 {
					*autoPart = append(*autoPart, i)
					continue
				}
				found[i] = true
				return nil
			}
			return nil
		}})
	}
	if err := runJobs(jobs); err != nil {
		return netip.Prefix{}, false, nil, nil, err
	}
	if i := slices.Index(found, true); i >= 0 {
		return entries[i].Prefix, true, nil, nil, nil
	}
	return netip.Prefix{}, false, slices.Concat(stale...), slices.Concat(auto...), nil
}

// dropAutoReasons deletes the auto-block reasons of prefixes, those that
// have one. A reason left behind would only wait for the map to evict it:
// an entry reads the map only while it is an auto-block, and every
// auto-block writes its own reason first.
func (s *Shield) dropAutoReasons(prefixes []netip.Prefix) {
	b := mapBatch[datapath.MoatCommentKey, datapath.MoatComment]{m: s.maps[datapath.MoatMapAutoReasons]}
	for _, p := range prefixes {
		b.addKey(commentKey(DenyList, p))
	}
	runJobs(b.deleteJobs())
}

// dropStaleComments deletes the old comments of entries rewritten without
// one; left behind, they would fill the comment map for nothing.
func (s *Shield) dropStaleComments(l List, entries []Entry) error {
	comments, err := s.comments(l)
	if err != nil || len(comments) == 0 {
		return err
	}
	b := mapBatch[datapath.MoatCommentKey, datapath.MoatComment]{m: s.maps[datapath.MoatMapComments]}
	for _, e := range entries {
		if _, ok := comments[e.Prefix]; ok && e.Comment == "" {
			b.addKey(commentKey(l, e.Prefix))
		}
	}
	if err := runJobs(b.deleteJobs()); err != nil {
		return fmt.Errorf("delete comments: %w", err)
	}
	return nil
}

// Remove deletes prefixes from list l. Nothing changes if any of them is
// not in the list.
func (s *Shield) RemovePrefixes(l List, prefixes []netip.Prefix) error {
	for _, p := range prefixes {
		ok, err := s.Has(l, p)
		if err != nil {
			return err
		}
		if !ok {
			return userErrorf("%s is not in the %s", p, l)
		}
	}
	return s.deletePrefixes(l, prefixes)
}

func (s *Shield) deletePrefixes(l List, prefixes []netip.Prefix) error {
	b := s.newPrefixBatches(l)
	cb := mapBatch[datapath.MoatCommentKey, datapath.MoatComment]{m: s.maps[datapath.MoatMapComments]}
	for _, p := range prefixes {
		b.addKey(p)
		cb.addKey(commentKey(l, p))
	}
	if err := runJobs(b.deleteJobs()); err != nil {
		return fmt.Errorf("update %s: %w", l, err)
	}
	runJobs(cb.deleteJobs()) // entries without a comment have none to delete
	if l == DenyList {
		s.dropAutoReasons(prefixes)
	}
	if l == AllowList {
		return s.clearEmptyAllowFamilies()
	}
	return s.noteRemoved(prefixes)
}

func familyBit(p netip.Prefix) uint32 {
	if p.Addr().Is4() {
		return uint32(datapath.MoatAllowInUseALLOW_IN_USE_V4)
	}
	return uint32(datapath.MoatAllowInUseALLOW_IN_USE_V6)
}

// clearEmptyAllowFamilies clears the in-use bit of each family whose allow
// maps are empty, after entries were removed.
func (s *Shield) clearEmptyAllowFamilies() error {
	var empty uint32
	for _, v6 := range []bool{false, true} {
		hosts, nets := s.listMaps(AllowList, v6)
		n := 0
		for _, m := range []*ebpf.Map{hosts, nets} {
			var key []byte
			if err := m.NextKey(nil, &key); err == nil {
				n++
			} else if !errors.Is(err, ebpf.ErrKeyNotExist) {
				return err
			}
		}
		if n == 0 {
			if v6 {
				empty |= uint32(datapath.MoatAllowInUseALLOW_IN_USE_V6)
			} else {
				empty |= uint32(datapath.MoatAllowInUseALLOW_IN_USE_V4)
			}
		}
	}
	return s.updateAllowInUse(func(in uint32) uint32 { return in &^ empty })
}

// listRule is an entry as read from its map, before it is decorated.
type listRule struct {
	prefix netip.Prefix
	rule   datapath.MoatPrefixRule
}

// listReaders returns a reader for each of list l's four maps (IPv4
// hosts, IPv4 networks, IPv6 hosts, IPv6 networks), which calls each for
// every entry of its map.
func (s *Shield) listReaders(l List) [4]func(each func(listRule)) error {
	hosts4, nets4 := s.listMaps(l, false)
	hosts6, nets6 := s.listMaps(l, true)
	return [4]func(func(listRule)) error{
		func(each func(listRule)) error {
			return readAll(hosts4, func(k *datapath.MoatHostV4, v *datapath.MoatPrefixRule) {
				each(listRule{netip.PrefixFrom(netip.AddrFrom4(k.Addr), 32), *v})
			})
		},
		func(each func(listRule)) error {
			return readAll(nets4, func(k *datapath.MoatNetV4, v *datapath.MoatPrefixRule) {
				each(listRule{netip.PrefixFrom(netip.AddrFrom4(k.Addr), int(k.Prefixlen)), *v})
			})
		},
		func(each func(listRule)) error {
			return readAll(hosts6, func(k *datapath.MoatHostV6, v *datapath.MoatPrefixRule) {
				each(listRule{netip.PrefixFrom(netip.AddrFrom16(k.Addr), 128), *v})
			})
		},
		func(each func(listRule)) error {
			return readAll(nets6, func(k *datapath.MoatNetV6, v *datapath.MoatPrefixRule) {
				each(listRule{netip.PrefixFrom(netip.AddrFrom16(k.Addr), int(k.Prefixlen)), *v})
			})
		},
	}
}

// readList reads every entry of list l, sorted by family, address and
// length. Each map is read and sorted in its own job, so that the sorting,
// which costs as much as the reading, runs on every CPU; the sorted parts
// are merged after.
func (s *Shield) readList(l List) ([]listRule, error) {
	var parts [4][]listRule
	var jobs []job
	for i, read := range s.listReaders(l) {
		jobs = append(jobs, job{1, func() error {
			if err := read(func(r listRule) { parts[i] = append(parts[i], r) }); err != nil {
				return err
			}
			slices.SortFunc(parts[i], cmpListRule)
			return nil
		}})
	}
	if err := runJobs(jobs); err != nil {
		return nil, err
	}
	// Every IPv4 entry sorts before every IPv6 one.
	out := make([]listRule, 0, len(parts[0])+len(parts[1])+len(parts[2])+len(parts[3]))
	out = mergeSorted(out, parts[0], parts[1], cmpListRule)
	return mergeSorted(out, parts[2], parts[3], cmpListRule), nil
}

// cmpListRule orders by address, then length. Stored prefixes are masked,
// so this is netip.Prefix.Compare without its masking on every call, which
// made it the larger part of sorting a million entries.
func cmpListRule(a, b listRule) int {
	if c := a.prefix.Addr().Compare(b.prefix.Addr()); c != 0 {
		return c
	}
	return cmp.Compare(a.prefix.Bits(), b.prefix.Bits())
}

// mergeSorted appends the merge of two sorted slices to out.
func mergeSorted[T any](out, a, b []T, cmp func(T, T) int) []T {
	for len(a) > 0 && len(b) > 0 {
		if cmp(a[0], b[0]) <= 0 {
			out, a = append(out, a[0]), a[1:]
		} else {
			out, b = append(out, b[0]), b[1:]
		}
	}
	return append(append(out, a...), b...)
}

// Entries lists list l, sorted by family, address and length.
func (s *Shield) Entries(l List) ([]Entry, error) {
	comments, err := s.comments(l)
	if err != nil {
		return nil, err
	}
	rs, err := s.readList(l)
	if err != nil {
		return nil, err
	}
	var reasons map[netip.Prefix]string
	if l == DenyList && slices.ContainsFunc(rs, func(r listRule) bool { return r.rule.Flags&(ruleFAuto|ruleFComment) == ruleFAuto|ruleFComment }) {
		if reasons, err = readComments(s.maps[datapath.MoatMapAutoReasons], DenyList); err != nil {
			return nil, err
		}
	}
	out := make([]Entry, len(rs))
	now, bootNs := time.Now(), bootNow()
	for i, r := range rs {
		out[i] = Entry{Prefix: r.prefix, Hits: r.rule.Hits, Expires: wallDeadline(r.rule.ExpiresNs, now, bootNs),
			Auto: r.rule.Flags&ruleFAuto != 0, Monitor: r.rule.Flags&ruleFMonitor != 0, expiresNs: r.rule.ExpiresNs}
		if r.rule.Flags&ruleFComment == 0 {
			continue
		}
		// An auto-block's reason is in its own map; one written by an
		// older moat is a comment.
		c, ok := reasons[r.prefix]
		if !ok || !out[i].Auto {
			c = comments[r.prefix]
		}
		out[i].Comment = c
	}
	return out, nil
}

// comments returns the operators' comments of list l (and, from older
// versions of moat, auto-blocks' reasons).
func (s *Shield) comments(l List) (map[netip.Prefix]string, error) {
	return readComments(s.maps[datapath.MoatMapComments], l)
}

// readComments reads a map of comments (the comments or auto_reasons map),
// those of list l.
func readComments(m *ebpf.Map, l List) (map[netip.Prefix]string, error) {
	out := map[netip.Prefix]string{}
	err := readAll(m, func(k *datapath.MoatCommentKey, c *datapath.MoatComment) {
		if List(k.List) != l {
			return
		}
		var a netip.Addr
		if k.Family == 4 {
			a = netip.AddrFrom4([4]byte(k.Addr[:4]))
		} else {
			a = netip.AddrFrom16(k.Addr)
		}
		b := make([]byte, 0, len(c.Text))
		for _, ch := range c.Text {
			if ch == 0 {
				break
			}
			b = append(b, byte(ch))
		}
		out[netip.PrefixFrom(a, int(k.Prefixlen))] = string(b)
	})
	return out, err
}

// Count returns the number of entries in list l.
func (s *Shield) Count(l List) (int, error) {
	hosts4, nets4 := s.listMaps(l, false)
	hosts6, nets6 := s.listMaps(l, true)
	var n [4]int
	err := runJobs([]job{
		{1, func() error { return countAll[datapath.MoatHostV4](hosts4, &n[0]) }},
		{1, func() error { return countAll[datapath.MoatNetV4](nets4, &n[1]) }},
		{1, func() error { return countAll[datapath.MoatHostV6](hosts6, &n[2]) }},
		{1, func() error { return countAll[datapath.MoatNetV6](nets6, &n[3]) }},
	})
	return n[0] + n[1] + n[2] + n[3], err
}

// countAll counts the elements of a list map. The kernel keeps no count of
// a hash map's or a trie's elements that user space can read, so they are
// read, values and all, in batches.
func countAll[K any](m *ebpf.Map, n *int) error {
	return readAll(m, func(*K, *datapath.MoatPrefixRule) { *n++ })
}

// Stored returns the entry list l holds for exactly p, without its
// comment, and whether there is one.
func (s *Shield) Stored(l List, p netip.Prefix) (Entry, bool, error) {
	v, ok, err := s.lookup(l, p)
	if !ok || err != nil {
		return Entry{}, ok, err
	}
	return Entry{Prefix: p, Hits: v.Hits, Expires: wallDeadline(v.ExpiresNs, time.Now(), bootNow()),
		Auto: v.Flags&ruleFAuto != 0, Monitor: v.Flags&ruleFMonitor != 0, expiresNs: v.ExpiresNs}, true, nil
}

// ExpiredAutoBlocks lists the rate limits' auto-blocks (denylist entries
// the data path wrote) whose time has passed, and says how long until the
// next of those left expires (0: none left). Other entries are left to
// whoever wrote them: a daemon removes an expired rule of its own with the
// rule. An entry written again since the list was read (a new auto-block
// for the same source) is left out.
func (s *Shield) ExpiredAutoBlocks() (due []netip.Prefix, next time.Duration, err error) {
	rs, err := s.readList(DenyList)
	if err != nil {
		return nil, 0, err
	}
	now := bootNow()
	var stale []netip.Prefix
	var nextNs uint64
	for _, r := range rs {
		switch {
		case r.rule.Flags&ruleFAuto == 0 || r.rule.ExpiresNs == 0:
		case expired(r.rule.ExpiresNs, now):
			stale = append(stale, r.prefix)
		case nextNs == 0 || r.rule.ExpiresNs < nextNs:
			nextNs = r.rule.ExpiresNs
		}
	}
	due = stale[:0]
	for _, p := range stale {
		v, ok, err := s.lookup(DenyList, p)
		if err != nil {
			return nil, 0, err
		}
		if ok && v.Flags&ruleFAuto != 0 && expired(v.ExpiresNs, bootNow()) {
			due = append(due, p)
		}
	}
	if nextNs != 0 {
		next = max(time.Duration(nextNs-now), 1)
	}
	return due, next, nil
}

// Flags of a stored entry (RULE_F_* in bpf/include/moat_structs.h).
const (
	ruleFComment = 1 << iota
	ruleFAuto
	ruleFMonitor
)

// dropMonitorBlocks deletes the auto-blocks written in monitor mode: once
// it ends the data path ignores them already.
func (s *Shield) dropMonitorBlocks() error {
	rs, err := s.readList(DenyList)
	if err != nil {
		return err
	}
	var gone []netip.Prefix
	for _, r := range rs {
		if r.rule.Flags&ruleFMonitor != 0 {
			gone = append(gone, r.prefix)
		}
	}
	if len(gone) == 0 {
		return nil
	}
	return s.deletePrefixes(DenyList, gone)
}

// ExpireStale deletes entries whose time has passed. The data path already
// ignores them; this gives their memory back and keeps listings honest.
func (s *Shield) ExpireStale() (int, error) {
	now := bootNow()
	n := 0
	for _, l := range []List{AllowList, DenyList} {
		entries, err := s.Entries(l)
		if err != nil {
			return n, err
		}
		var stale []netip.Prefix
		for _, e := range entries {
			if expired(e.expiresNs, now) {
				stale = append(stale, e.Prefix)
			}
		}
		if err := s.deletePrefixes(l, stale); err != nil {
			return n, err
		}
		n += len(stale)
	}
	return n, nil
}
