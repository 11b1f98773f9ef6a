package shield

import (
	"errors"
	"fmt"
	"net/netip"
	"sort"
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

func toBoot(t time.Time) uint64 {
	if t.IsZero() {
		return 0
	}
	d := time.Until(t)
	now := bootNow()
	if d <= 0 {
		return now // already expired; never 0, which means "never"
	}
	return now + uint64(d)
}

func fromBoot(ns uint64) time.Time {
	if ns == 0 {
		return time.Time{}
	}
	return time.Now().Add(time.Duration(int64(ns) - int64(bootNow()))).Round(time.Second)
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

// Has tells whether p is in list l.
func (s *Shield) Has(l List, p netip.Prefix) (bool, error) {
	m, k := s.mapFor(l, p)
	var v datapath.MoatPrefixRule
	err := m.Lookup(k, &v)
	if errors.Is(err, ebpf.ErrKeyNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	// A trie lookup is a longest-prefix match: it also finds a shorter
	// prefix that covers p, which is not p.
	return int(v.Prefixlen) == p.Bits(), nil
}

// AddMode says what to do with entries that exist already.
type AddMode int

const (
	// Strict refuses the whole change if any entry exists.
	Strict AddMode = iota
	// Upsert overwrites existing entries (their hit counters restart).
	Upsert
)

// Add puts entries in list l. In Strict mode nothing changes if any of the
// entries exists already. Entries are grouped per map and written with
// batched updates.
func (s *Shield) Add(l List, entries []Entry, mode AddMode) error {
	for _, e := range entries {
		if err := rules.ValidateComment(e.Comment); err != nil {
			return &UserError{fmt.Errorf("%s: %w", e.Prefix, err)}
		}
		if mode == Strict {
			ok, err := s.Has(l, e.Prefix)
			if err != nil {
				return err
			}
			if ok {
				return userErrorf("%s is already in the %s", e.Prefix, l)
			}
		}
	}
	b := newBatcher()
	for _, e := range entries {
		m, k := s.mapFor(l, e.Prefix)
		flags := uint32(0)
		if e.Comment != "" {
			flags = 1 // RULE_F_COMMENT
		}
		b.add(m, k, datapath.MoatPrefixRule{
			ExpiresNs: toBoot(e.Expires),
			Prefixlen: uint32(e.Prefix.Bits()),
			Flags:     flags,
		})
	}
	// Comments first, so that a listing never shows a rule whose comment
	// is still missing.
	cb := newBatcher()
	for _, e := range entries {
		if e.Comment != "" {
			var c datapath.MoatComment
			for i := 0; i < len(e.Comment); i++ {
				c.Text[i] = int8(e.Comment[i])
			}
			cb.add(s.maps[datapath.MoatMapComments], commentKey(l, e.Prefix), c)
		}
	}
	if err := cb.update(); err != nil {
		return fmt.Errorf("store comments: %w", err)
	}
	if err := b.update(); err != nil {
		return fmt.Errorf("update %s: %w", l, err)
	}
	if mode == Upsert {
		return s.dropStaleComments(l, entries)
	}
	return nil
}

// dropStaleComments deletes the old comments of entries rewritten without
// one; left behind, they would fill the comment map for nothing.
func (s *Shield) dropStaleComments(l List, entries []Entry) error {
	comments, err := s.comments(l)
	if err != nil || len(comments) == 0 {
		return err
	}
	b := newBatcher()
	for _, e := range entries {
		if _, ok := comments[e.Prefix]; ok && e.Comment == "" {
			b.add(s.maps[datapath.MoatMapComments], commentKey(l, e.Prefix), nil)
		}
	}
	if err := b.delete(); err != nil {
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
	b := newBatcher()
	cb := newBatcher()
	for _, p := range prefixes {
		m, k := s.mapFor(l, p)
		b.add(m, k, nil)
		cb.add(s.maps[datapath.MoatMapComments], commentKey(l, p), nil)
	}
	if err := b.delete(); err != nil {
		return fmt.Errorf("update %s: %w", l, err)
	}
	cb.delete() // entries without a comment have none to delete
	return nil
}

// Entries lists list l, sorted by family, address and length.
func (s *Shield) Entries(l List) ([]Entry, error) {
	var out []Entry
	comments, err := s.comments(l)
	if err != nil {
		return nil, err
	}
	add := func(p netip.Prefix, v datapath.MoatPrefixRule) {
		e := Entry{Prefix: p, Hits: v.Hits, Expires: fromBoot(v.ExpiresNs), expiresNs: v.ExpiresNs}
		if v.Flags&1 != 0 {
			e.Comment = comments[p]
		}
		out = append(out, e)
	}
	for _, v6 := range []bool{false, true} {
		hosts, nets := s.listMaps(l, v6)
		var v datapath.MoatPrefixRule
		if !v6 {
			var hk datapath.MoatHostV4
			it := hosts.Iterate()
			for it.Next(&hk, &v) {
				add(netip.PrefixFrom(netip.AddrFrom4(hk.Addr), 32), v)
			}
			if err := it.Err(); err != nil {
				return nil, err
			}
			var nk datapath.MoatNetV4
			it = nets.Iterate()
			for it.Next(&nk, &v) {
				add(netip.PrefixFrom(netip.AddrFrom4(nk.Addr), int(nk.Prefixlen)), v)
			}
			if err := it.Err(); err != nil {
				return nil, err
			}
			continue
		}
		var hk datapath.MoatHostV6
		it := hosts.Iterate()
		for it.Next(&hk, &v) {
			add(netip.PrefixFrom(netip.AddrFrom16(hk.Addr), 128), v)
		}
		if err := it.Err(); err != nil {
			return nil, err
		}
		var nk datapath.MoatNetV6
		it = nets.Iterate()
		for it.Next(&nk, &v) {
			add(netip.PrefixFrom(netip.AddrFrom16(nk.Addr), int(nk.Prefixlen)), v)
		}
		if err := it.Err(); err != nil {
			return nil, err
		}
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i].Prefix, out[j].Prefix
		if c := a.Addr().Compare(b.Addr()); c != 0 {
			return c < 0
		}
		return a.Bits() < b.Bits()
	})
	return out, nil
}

func (s *Shield) comments(l List) (map[netip.Prefix]string, error) {
	out := map[netip.Prefix]string{}
	var k datapath.MoatCommentKey
	var c datapath.MoatComment
	it := s.maps[datapath.MoatMapComments].Iterate()
	for it.Next(&k, &c) {
		if List(k.List) != l {
			continue
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
	}
	return out, it.Err()
}

// Count returns the number of entries in list l without reading them.
func (s *Shield) Count(l List) (int, error) {
	n := 0
	for _, v6 := range []bool{false, true} {
		hosts, nets := s.listMaps(l, v6)
		for _, m := range []*ebpf.Map{hosts, nets} {
			c, err := countKeys(m)
			if err != nil {
				return 0, err
			}
			n += c
		}
	}
	return n, nil
}

func countKeys(m *ebpf.Map) (int, error) {
	key := make([]byte, m.KeySize())
	n := 0
	it := m.Iterate()
	var skip []byte = make([]byte, m.ValueSize())
	for it.Next(&key, &skip) {
		n++
	}
	return n, it.Err()
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
			if e.expiresNs != 0 && e.expiresNs <= now {
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
