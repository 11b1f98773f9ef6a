package metrics

import (
	"container/heap"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/moat-shield/moat/internal/datapath"
	"github.com/moat-shield/moat/internal/shield"
)

// The collector reads the pins directly instead of through shield.Open:
// Open takes the state's exclusive lock, which a running daemon holds for
// its whole life, so a scrape would block behind it (and would block the
// daemon's writers while it ran). Reading needs no lock: every value read
// here is written by the kernel or with single-element updates. The pin
// layout is the one documented in package shield.

// pinned is a read-only view of the pinned state for one scrape.
type pinned struct {
	root string
	maps map[string]*ebpf.Map
}

// errNotSetUp says nothing is pinned under the root: moat was never set up
// or was removed. A scrape then exports no data-path metrics; that is not
// an error.
var errNotSetUp = errors.New("nothing is pinned")

func openPinned(root string) (*pinned, error) {
	dir := filepath.Join(root, "maps")
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		return nil, errNotSetUp
	}
	p := &pinned{root: root, maps: map[string]*ebpf.Map{}}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	for _, e := range ents {
		// Read-only, so that nothing in the metrics path can ever change a
		// rule. syn_keys is write-only from user space and is not needed.
		if e.Name() == datapath.MoatMapSynKeys {
			continue
		}
		m, err := ebpf.LoadPinnedMap(filepath.Join(dir, e.Name()), &ebpf.LoadPinOptions{ReadOnly: true})
		if err != nil {
			p.close()
			return nil, fmt.Errorf("open pinned map %s: %w", e.Name(), err)
		}
		p.maps[e.Name()] = m
	}
	return p, nil
}

func (p *pinned) close() {
	for _, m := range p.maps {
		m.Close()
	}
}

// mapNamed returns a shared map or an error naming it.
func (p *pinned) mapNamed(name string) (*ebpf.Map, error) {
	m := p.maps[name]
	if m == nil {
		return nil, fmt.Errorf("no pinned map %s under %s", name, p.root)
	}
	return m, nil
}

// pinnedIface is what the pins say about one interface.
type pinnedIface struct {
	name string
	dir  string
}

// ifaces lists the interfaces that have pins, skipping directories still
// being filled (shield pins into tmp-* and renames into place).
func (p *pinned) ifaces() ([]pinnedIface, error) {
	pins, err := shield.PinnedInterfaces(p.root)
	var out []pinnedIface
	for _, pin := range pins {
		out = append(out, pinnedIface{name: pin.Name, dir: pin.Dir})
	}
	return out, err
}

// counters reads an interface's verdict counters. ok is false when the
// interface was detached during the scrape.
func (i pinnedIface) counters() (c shield.Counters, ok bool, err error) {
	m, err := ebpf.LoadPinnedMap(filepath.Join(i.dir, "counters"), &ebpf.LoadPinOptions{ReadOnly: true})
	if errors.Is(err, os.ErrNotExist) {
		return c, false, nil
	}
	if err != nil {
		return c, false, fmt.Errorf("open counters of %s: %w", i.name, err)
	}
	defer m.Close()
	c, err = shield.ReadCounters(m)
	return c, err == nil, err
}

// attachMode says how XDP is attached where the interface's link points:
// "" when the interface has gone (the link is then defunct).
func (i pinnedIface) attachMode() (string, error) {
	// Links take no access flags (EINVAL); nothing here writes to it.
	l, err := link.LoadPinnedLink(filepath.Join(i.dir, "link"), nil)
	if errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("open link of %s: %w", i.name, err)
	}
	defer l.Close()
	info, err := l.Info()
	if err != nil {
		return "", fmt.Errorf("link info of %s: %w", i.name, err)
	}
	x := info.XDP()
	if x == nil || x.Ifindex == 0 {
		return "", nil
	}
	dev, err := netlink.LinkByIndex(int(x.Ifindex))
	if err != nil {
		return "", nil // gone between the two reads
	}
	if a := dev.Attrs().Xdp; a != nil {
		switch a.AttachMode {
		case nl.XDP_ATTACHED_DRV:
			return string(shield.ModeNative), nil
		case nl.XDP_ATTACHED_SKB:
			return string(shield.ModeGeneric), nil
		case nl.XDP_ATTACHED_HW:
			return "offload", nil
		}
	}
	return "", nil
}

// programStats reads the kernel's run-time statistics of one of an
// interface's programs ("prog" or "tc-prog"). ok is false when it is not
// pinned.
func (i pinnedIface) programStats(pin string) (st ebpf.ProgramStats, ok bool, err error) {
	prog, err := ebpf.LoadPinnedProgram(filepath.Join(i.dir, pin), nil)
	if errors.Is(err, os.ErrNotExist) {
		return st, false, nil
	}
	if err != nil {
		return st, false, fmt.Errorf("open %s of %s: %w", pin, i.name, err)
	}
	defer prog.Close()
	s, err := prog.Stats()
	if err != nil {
		return st, false, fmt.Errorf("stats of %s of %s: %w", pin, i.name, err)
	}
	return *s, true, nil
}

// bpfStatsEnabled reads kernel.bpf_stats_enabled: the kernel only counts
// program run time and runs while it is 1 (or while some process holds a
// BPF_ENABLE_STATS descriptor, which this cannot see).
func bpfStatsEnabled() bool {
	b, err := os.ReadFile("/proc/sys/kernel/bpf_stats_enabled")
	return err == nil && strings.TrimSpace(string(b)) == "1"
}

// portRule is one port rule with its hits.
type portRule struct {
	rule   string // as the CLI writes it: tcp/80, udp/1000-2000, icmp/echo-request
	action string
	hits   uint64
}

// portRules reads the definitions table and the per-CPU hit counters, in
// one batched read each.
func (p *pinned) portRules() (rules []portRule, used, capacity int, err error) {
	defsMap, err := p.mapNamed(datapath.MoatMapPortRuleDefs)
	if err != nil {
		return nil, 0, 0, err
	}
	hitsMap, err := p.mapNamed(datapath.MoatMapPortRuleHits)
	if err != nil {
		return nil, 0, 0, err
	}
	var defs = map[uint32]datapath.MoatPortRuleDef{}
	if _, err := scan(defsMap, func(k *uint32, v *datapath.MoatPortRuleDef) {
		if v.Action != 0 {
			defs[*k] = *v
		}
	}); err != nil {
		return nil, 0, 0, fmt.Errorf("read port rules: %w", err)
	}
	ncpu, err := ebpf.PossibleCPU()
	if err != nil {
		return nil, 0, 0, err
	}
	for id, d := range defs {
		var perCPU []uint64
		if err := hitsMap.Lookup(id, &perCPU); err != nil {
			return nil, 0, 0, fmt.Errorf("read hits of port rule %d: %w", id, err)
		}
		var hits uint64
		for _, v := range perCPU[:min(len(perCPU), ncpu)] {
			hits += v
		}
		spec := portSpec(d)
		rules = append(rules, portRule{rule: spec.String(), action: actionName(d.Action), hits: hits})
	}
	sort.Slice(rules, func(i, j int) bool { return rules[i].rule < rules[j].rule })
	// Id 0 means "no rule" in the port table, so one id fewer than the
	// map holds is usable.
	return rules, len(defs), int(defsMap.MaxEntries()) - 1, nil
}

// listEntry is an allow or deny entry and its hits.
type listEntry struct {
	list   string
	prefix netip.Prefix
	hits   uint64
}

// topEntries keeps the n entries with the most hits seen so far.
type topEntries struct {
	n int
	h entryHeap
}

func (t *topEntries) offer(e listEntry) {
	if t.n <= 0 || e.hits == 0 {
		return
	}
	if len(t.h) < t.n {
		heap.Push(&t.h, e)
		return
	}
	if less(t.h[0], e) {
		t.h[0] = e
		heap.Fix(&t.h, 0)
	}
}

// sorted returns the kept entries, most hits first.
func (t *topEntries) sorted() []listEntry {
	out := append([]listEntry(nil), t.h...)
	sort.Slice(out, func(i, j int) bool { return less(out[j], out[i]) })
	return out
}

// less orders entries by hits, then (so that equal hits give a stable
// choice from one scrape to the next) by list and prefix.
func less(a, b listEntry) bool {
	if a.hits != b.hits {
		return a.hits < b.hits
	}
	if a.list != b.list {
		return a.list > b.list
	}
	if c := a.prefix.Addr().Compare(b.prefix.Addr()); c != 0 {
		return c > 0
	}
	return a.prefix.Bits() > b.prefix.Bits()
}

// entryHeap is a min-heap: the weakest kept entry is at the root.
type entryHeap []listEntry

func (h entryHeap) Len() int           { return len(h) }
func (h entryHeap) Less(i, j int) bool { return less(h[i], h[j]) }
func (h entryHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *entryHeap) Push(x any)        { *h = append(*h, x.(listEntry)) }
func (h *entryHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// listMap is one of the eight allow/deny maps.
type listMap struct {
	name string
	list string
	read func(m *ebpf.Map, offer func(netip.Prefix, uint64)) (int, error)
}

var listMaps = []listMap{
	{datapath.MoatMapAllowV4Hosts, "allowlist", readHostsV4},
	{datapath.MoatMapAllowV6Hosts, "allowlist", readHostsV6},
	{datapath.MoatMapAllowV4Nets, "allowlist", readNetsV4},
	{datapath.MoatMapAllowV6Nets, "allowlist", readNetsV6},
	{datapath.MoatMapDenyV4Hosts, "denylist", readHostsV4},
	{datapath.MoatMapDenyV6Hosts, "denylist", readHostsV6},
	{datapath.MoatMapDenyV4Nets, "denylist", readNetsV4},
	{datapath.MoatMapDenyV6Nets, "denylist", readNetsV6},
}

func readHostsV4(m *ebpf.Map, offer func(netip.Prefix, uint64)) (int, error) {
	return scan(m, func(k *datapath.MoatHostV4, v *datapath.MoatPrefixRule) {
		offer(netip.PrefixFrom(netip.AddrFrom4(k.Addr), 32), v.Hits)
	})
}

func readHostsV6(m *ebpf.Map, offer func(netip.Prefix, uint64)) (int, error) {
	return scan(m, func(k *datapath.MoatHostV6, v *datapath.MoatPrefixRule) {
		offer(netip.PrefixFrom(netip.AddrFrom16(k.Addr), 128), v.Hits)
	})
}

func readNetsV4(m *ebpf.Map, offer func(netip.Prefix, uint64)) (int, error) {
	return scan(m, func(k *datapath.MoatNetV4, v *datapath.MoatPrefixRule) {
		offer(netip.PrefixFrom(netip.AddrFrom4(k.Addr), int(k.Prefixlen)), v.Hits)
	})
}

func readNetsV6(m *ebpf.Map, offer func(netip.Prefix, uint64)) (int, error) {
	return scan(m, func(k *datapath.MoatNetV6, v *datapath.MoatPrefixRule) {
		offer(netip.PrefixFrom(netip.AddrFrom16(k.Addr), int(k.Prefixlen)), v.Hits)
	})
}

// scanBatch is how many elements one batched read returns. Large enough
// that a million entries take a few hundred system calls, small enough
// that the buffers stay well under a MiB.
const scanBatch = 4096

// scan calls fn for every element of a map with batched reads, and returns
// how many it saw. Maps that do not support batches are walked key by key.
// A map that changes during the scan gives counts as of no single moment,
// which is fine for metrics; the walk stops after max_entries elements so
// that concurrent deletes cannot make it loop.
func scan[K, V any](m *ebpf.Map, fn func(*K, *V)) (int, error) {
	limit := int(m.MaxEntries())
	keys := make([]K, min(scanBatch, limit))
	vals := make([]V, len(keys))
	var cursor ebpf.MapBatchCursor
	seen := 0
	for seen < limit {
		n, err := m.BatchLookup(&cursor, keys, vals, nil)
		for i := 0; i < n && seen < limit; i++ {
			fn(&keys[i], &vals[i])
			seen++
		}
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return seen, nil
		}
		if errors.Is(err, ebpf.ErrNotSupported) || errors.Is(err, unix.EINVAL) && seen == 0 {
			return walk(m, limit, fn)
		}
		if err != nil {
			return seen, err
		}
	}
	return seen, nil
}

func walk[K, V any](m *ebpf.Map, limit int, fn func(*K, *V)) (int, error) {
	var k K
	var v V
	seen := 0
	it := m.Iterate()
	for seen < limit && it.Next(&k, &v) {
		fn(&k, &v)
		seen++
	}
	return seen, it.Err()
}
