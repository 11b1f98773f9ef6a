package shield_test

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/vishvananda/netlink"

	"github.com/moat-shield/moat/internal/datapath"
	"github.com/moat-shield/moat/internal/ratelimit"
	"github.com/moat-shield/moat/internal/rules"
	"github.com/moat-shield/moat/internal/shield"
	"github.com/moat-shield/moat/internal/syncookie"
)

// TestOpenAddsMapsOfNewerVersions checks the upgrade path: state pinned by
// an older moat lacks the maps that later versions added; Open adds them
// and keeps every rule that was there.
func TestOpenAddsMapsOfNewerVersions(t *testing.T) {
	s := openFresh(t)
	root := s.Root()
	if err := s.Add(shield.DenyList, entries("198.51.100.0/24"), shield.Strict); err != nil {
		t.Fatal(err)
	}
	s.Close()

	// Remove a map, as if this state came from a version without it.
	missing := filepath.Join(root, "maps", datapath.MoatMapPortRuleDefs)
	if err := os.Remove(missing); err != nil {
		t.Fatal(err)
	}
	s, err := shield.Open(root)
	if err != nil {
		t.Fatalf("open state that lacks a map: %v", err)
	}
	defer s.Close()
	if _, err := os.Stat(missing); err != nil {
		t.Fatalf("the missing map was not pinned again: %v", err)
	}
	if got := listOf(t, s, shield.DenyList); got != "198.51.100.0/24" {
		t.Fatalf("denylist after upgrade = %q", got)
	}
	spec, _ := rules.ParsePortSpec("udp/19")
	if err := s.AddPortRule(spec, rules.Drop); err != nil {
		t.Fatalf("the added map does not work: %v", err)
	}
}

// TestReattachReplacesOutgrownCounters checks re-attaching over an
// interface whose counters map an older moat made with fewer slots: the
// program is replaced in place and the interface gets counters that fit.
func TestReattachReplacesOutgrownCounters(t *testing.T) {
	s := openFresh(t)
	a, b := vethPair(t)
	if _, err := s.Attach(a, shield.ModeGeneric); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(s.Root(), "ifaces", a)
	// Swap in a counters map with fewer slots, as an older version made.
	old, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.PerCPUArray, KeySize: 4, ValueSize: 16, MaxEntries: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	os.Remove(filepath.Join(dir, "counters"))
	if err := old.Pin(filepath.Join(dir, "counters")); err != nil {
		t.Fatal(err)
	}
	res, err := s.Attach(a, shield.ModeAuto)
	if err != nil {
		t.Fatalf("re-attach over old counters: %v", err)
	}
	if !res.Replaced {
		t.Fatalf("re-attach did not replace in place: %+v", res)
	}
	m, err := ebpf.LoadPinnedMap(filepath.Join(dir, "counters"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if m.MaxEntries() <= 4 {
		t.Fatalf("counters still have %d slots", m.MaxEntries())
	}
	if _, err := s.Counters(a); err != nil {
		t.Fatalf("read counters after upgrade: %v", err)
	}
	_ = b
}

// vethPair makes a veth pair with names unique to this run, removed when
// the test ends: by name, as a test may have made the pair again.
func vethPair(t *testing.T) (string, string) {
	t.Helper()
	var rnd [4]byte
	rand.Read(rnd[:])
	a := "mu" + hex.EncodeToString(rnd[:])
	b := a + "p"
	la := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: a}, PeerName: b}
	if err := netlink.LinkAdd(la); err != nil {
		t.Skipf("no veth: %v", err)
	}
	t.Cleanup(func() {
		if l, err := netlink.LinkByName(a); err == nil {
			netlink.LinkDel(l)
		}
	})
	return a, b
}

// TestOpenMovesSynCountersIntoSlots checks the upgrade from state in which
// SYN counters lived in a per-CPU hash keyed by port (syn_stats) and port
// entries named no slot: Open gives each protected port a slot of
// syn_counters, carries its counters over and unpins the old map.
func TestOpenMovesSynCountersIntoSlots(t *testing.T) {
	s := openFresh(t)
	root := s.Root()
	ports := s.Map(datapath.MoatMapSynPorts)
	for _, port := range []uint32{443, 22} {
		e := datapath.MoatSynPort{Mode: uint8(syncookie.ModeAlways), WindowThreshold: 5}
		if err := ports.Update(port, e, ebpf.UpdateAny); err != nil {
			t.Fatal(err)
		}
	}
	legacy, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.PerCPUHash, KeySize: 4, ValueSize: 80, MaxEntries: 1024})
	if err != nil {
		t.Fatal(err)
	}
	defer legacy.Close()
	old := make([][10]uint64, ebpf.MustPossibleCPU())
	old[0][0], old[0][1], old[0][7] = 7, 5, 2 // syns, cookies_issued, stale_key_syns
	if err := legacy.Update(uint32(443), old, ebpf.UpdateAny); err != nil {
		t.Fatal(err)
	}
	legacyPin := filepath.Join(root, "maps", "syn_stats")
	if err := legacy.Pin(legacyPin); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(root, "maps", datapath.MoatMapSynCounters)); err != nil {
		t.Fatal(err)
	}
	s.Close()

	for round := 0; round < 2; round++ { // the second Open finds nothing to do
		s, err := shield.Open(root)
		if err != nil {
			t.Fatalf("open state with SYN counters by port: %v", err)
		}
		st, err := syncookie.Status(s.Map(datapath.MoatMapSynPorts), s.Map(datapath.MoatMapSynCounters))
		if err != nil {
			t.Fatal(err)
		}
		if len(st) != 2 || st[0].Port != 22 || st[1].Port != 443 {
			t.Fatalf("round %d: status %+v, want tcp/22 and tcp/443", round, st)
		}
		if p := st[1]; p.SYNs != 7 || p.CookiesIssued != 5 || p.StaleKeySYNs != 2 || p.Mode != "always" {
			t.Errorf("round %d: tcp/443 %+v, want its old counters", round, p)
		}
		if p := st[0]; p.SYNs != 0 || p.ThresholdPerSec == 0 {
			t.Errorf("round %d: tcp/22 %+v, want zero counters and its threshold", round, p)
		}
		pe, err := syncookie.ProtectedPorts(s.Map(datapath.MoatMapSynPorts))
		if err != nil {
			t.Fatal(err)
		}
		if pe[0].Entry.Slot == 0 || pe[1].Entry.Slot == 0 || pe[0].Entry.Slot == pe[1].Entry.Slot {
			t.Errorf("round %d: slots %d and %d, want two distinct ones", round, pe[0].Entry.Slot, pe[1].Entry.Slot)
		}
		if _, err := os.Stat(legacyPin); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("round %d: the old map is still pinned (%v)", round, err)
		}
		s.Close()
	}
}

// TestOlderFilterKeepsTheOldSynCounters checks the upgrade while a filter
// of the older moat is still attached: the old counters map stays pinned,
// a port protected after the upgrade gets an entry there too (the older
// filter protects only ports it finds in it), Open names the interface,
// and replacing the filter removes the old map.
func TestOlderFilterKeepsTheOldSynCounters(t *testing.T) {
	s := openFresh(t)
	root := s.Root()
	a, _ := vethPair(t)
	if _, err := s.Attach(a, shield.ModeGeneric); err != nil {
		t.Fatal(err)
	}
	older, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.XDP, License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, xdpPass), asm.Return()}})
	if err != nil {
		t.Fatal(err)
	}
	defer older.Close()
	pin := filepath.Join(root, "ifaces", a, "prog")
	if err := os.Remove(pin); err != nil {
		t.Fatal(err)
	}
	if err := older.Pin(pin); err != nil {
		t.Fatal(err)
	}
	legacy, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.PerCPUHash, KeySize: 4, ValueSize: 80, MaxEntries: 1024})
	if err != nil {
		t.Fatal(err)
	}
	defer legacy.Close()
	legacyPin := filepath.Join(root, "maps", "syn_stats")
	if err := legacy.Pin(legacyPin); err != nil {
		t.Fatal(err)
	}
	ports, counters := s.Map(datapath.MoatMapSynPorts), s.Map(datapath.MoatMapSynCounters)
	if err := syncookie.Protect(ports, counters, s.Map(datapath.MoatMapSynCensus), 8443, syncookie.ModeAlways, 0); err != nil {
		t.Fatal(err)
	}
	s.Close()

	s, err = shield.Open(root)
	if err != nil {
		t.Fatal(err)
	}
	if s.SynOlderFilter != a || s.SynErr != nil {
		t.Fatalf("older filter %q (error %v), want %s named", s.SynOlderFilter, s.SynErr, a)
	}
	if _, err := os.Stat(legacyPin); err != nil {
		t.Fatalf("the old map was unpinned while an older filter uses it: %v", err)
	}
	var per [][]byte
	if err := legacy.Lookup(uint32(8443), &per); err != nil {
		t.Fatalf("tcp/8443 has no entry in the old map, so the older filter would not protect it: %v", err)
	}
	if _, err := s.Attach(a, shield.ModeAuto); err != nil {
		t.Fatal(err)
	}
	if s.SynOlderFilter != "" {
		t.Errorf("after replacing the filter, older filter %q still named", s.SynOlderFilter)
	}
	if _, err := os.Stat(legacyPin); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the old map is still pinned after the older filter was replaced (%v)", err)
	}
	s.Close()
}

// TestAttachAfterTheInterfaceWasMadeAgain: an interface deleted and made
// again under the same name leaves moat's pinned links severed. Attach
// must give the new interface a filter, not fail on the dead link.
func TestAttachAfterTheInterfaceWasMadeAgain(t *testing.T) {
	s := openFresh(t)
	a, b := vethPair(t)
	if _, err := s.Attach(a, shield.ModeGeneric); err != nil {
		t.Fatal(err)
	}
	la, err := netlink.LinkByName(a)
	if err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkDel(la); err != nil {
		t.Fatal(err)
	}
	again := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: a}, PeerName: b}
	if err := netlink.LinkAdd(again); err != nil {
		t.Fatal(err)
	}
	res, err := s.Attach(a, shield.ModeGeneric)
	if err != nil {
		t.Fatalf("attach to the new %s: %v", a, err)
	}
	if res.Replaced || !strings.Contains(res.Warning, "made again") {
		t.Errorf("attach result %+v: want a fresh attachment and a warning that says why", res)
	}
	nl, err := netlink.LinkByName(a)
	if err != nil {
		t.Fatal(err)
	}
	if x := nl.Attrs().Xdp; x == nil || !x.Attached {
		t.Fatalf("no XDP program on the new %s: %+v", a, x)
	}
	atts, err := s.Attachments()
	if err != nil {
		t.Fatal(err)
	}
	if len(atts) != 1 || atts[0].Iface != a || atts[0].LinkID == 0 {
		t.Fatalf("attachments %+v, want %s", atts, a)
	}
	// Attaching again now replaces in place, as on any live interface.
	if res, err := s.Attach(a, shield.ModeGeneric); err != nil || !res.Replaced {
		t.Fatalf("attach again: %+v, %v", res, err)
	}
}

// TestOpenTakesOverResizedSynCounters checks the upgrade from state whose
// syn_counters values another moat made another size (its data path kept
// fewer per-CPU caches after the counters, or had no mptcp_syns or
// resets_sent yet, or counted more after them): Open replaces the map with one of this version's
// shape and carries every port's counters over; a filter still attached
// from before counts in the old map, which Open names, until attach
// replaces it.
func TestOpenTakesOverResizedSynCounters(t *testing.T) {
	queueFullAt := int(unsafe.Offsetof(datapath.MoatSynPortStats{}.AcceptQueueFull))
	mptcpAt := int(unsafe.Offsetof(datapath.MoatSynPortStats{}.MptcpSyns))
	resetsAt := int(unsafe.Offsetof(datapath.MoatSynPortStats{}.ResetsSent))
	size := binary.Size(datapath.MoatSynPortStats{})
	for _, tc := range []struct {
		name      string
		size      int    // of the pinned values
		queueFull uint64 // accept_queue_full carried, per CPU
		mptcp     uint64 // mptcp_syns carried, per CPU
		resets    uint64 // resets_sent carried, per CPU
	}{
		{"older, before accept_queue_full", 200, 0, 0, 0},
		{"older, before mptcp_syns", mptcpAt, 3, 0, 0},
		{"older, before resets_sent", resetsAt, 3, 4, 0},
		{"newer, more after resets_sent", size + 16, 3, 4, 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := openFresh(t)
			root := s.Root()
			a, _ := vethPair(t)
			if _, err := s.Attach(a, shield.ModeGeneric); err != nil {
				t.Fatal(err)
			}
			ports, counters := s.Map(datapath.MoatMapSynPorts), s.Map(datapath.MoatMapSynCounters)
			if err := syncookie.Protect(ports, counters, s.Map(datapath.MoatMapSynCensus), 443, syncookie.ModeAlways, 0); err != nil {
				t.Fatal(err)
			}
			pe, err := syncookie.ProtectedPorts(ports)
			if err != nil || len(pe) != 1 {
				t.Fatalf("protected ports %v (%v)", pe, err)
			}
			slot := uint32(pe[0].Entry.Slot)

			// The other shape: counters first, then the other data path's
			// windows and caches (and accept_queue_full, where it fits).
			older, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.PerCPUArray, KeySize: 4, ValueSize: uint32(tc.size), MaxEntries: counters.MaxEntries()})
			if err != nil {
				t.Fatal(err)
			}
			defer older.Close()
			vals := make([][]byte, ebpf.MustPossibleCPU())
			for cpu := range vals {
				vals[cpu] = make([]byte, tc.size)
				binary.NativeEndian.PutUint64(vals[cpu][0:], 7)  // syns
				binary.NativeEndian.PutUint64(vals[cpu][8:], 5)  // cookies_issued
				binary.NativeEndian.PutUint64(vals[cpu][64:], 2) // syns_passed
				for i := 72; i < tc.size; i++ {
					vals[cpu][i] = 0xee
				}
				if tc.queueFull != 0 {
					binary.NativeEndian.PutUint64(vals[cpu][queueFullAt:], tc.queueFull)
				}
				if tc.mptcp != 0 {
					binary.NativeEndian.PutUint64(vals[cpu][mptcpAt:], tc.mptcp)
				}
				if tc.resets != 0 {
					binary.NativeEndian.PutUint64(vals[cpu][resetsAt:], tc.resets)
				}
			}
			if err := older.Update(slot, vals, ebpf.UpdateAny); err != nil {
				t.Fatal(err)
			}
			pinInstead(t, root, datapath.MoatMapSynCounters, older)
			s.Close()

			ncpu := uint64(ebpf.MustPossibleCPU())
			for round := 0; round < 2; round++ { // the second Open finds nothing to do
				s, err = shield.Open(root)
				if err != nil {
					t.Fatalf("round %d: open state with syn_counters values of %d bytes: %v", round, tc.size, err)
				}
				m := s.Map(datapath.MoatMapSynCounters)
				if m.ValueSize() != uint32(size) {
					t.Errorf("round %d: syn_counters values of %d bytes, want %d", round, m.ValueSize(), size)
				}
				st, err := syncookie.Status(s.Map(datapath.MoatMapSynPorts), m)
				if err != nil {
					t.Fatal(err)
				}
				if len(st) != 1 || st[0].SYNs != 7*ncpu || st[0].CookiesIssued != 5*ncpu || st[0].SYNsPassed != 2*ncpu ||
					st[0].AcceptQueueFull != tc.queueFull*ncpu || st[0].MPTCPSYNs != tc.mptcp*ncpu ||
					st[0].ResetsSent != tc.resets*ncpu {
					t.Errorf("round %d: status %+v, want the old counters of tcp/443", round, st)
				}
				var per []datapath.MoatSynPortStats
				if err := m.Lookup(slot, &per); err != nil {
					t.Fatal(err)
				}
				if per[0].ClockJiffies != 0 || per[0].WinSyns != 0 || per[0].ListenerMss != 0 {
					t.Errorf("round %d: the old caches came along: %+v", round, per[0])
				}
				// The old value says nothing of the census: the port waits for
				// the first pass after the upgrade (generation 0 + 1 here).
				for cpu := range per {
					if per[cpu].CensusFrom != 1 {
						t.Errorf("round %d: cpu %d census_from %d, want 1", round, cpu, per[cpu].CensusFrom)
					}
				}
				if s.SynOlderFilter != a {
					t.Errorf("round %d: older filter %q, want %s, which still counts in the old map", round, s.SynOlderFilter, a)
				}
				s.Close()
			}
			s, err = shield.Open(root)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			if _, err := s.Attach(a, shield.ModeAuto); err != nil {
				t.Fatal(err)
			}
			if s.SynOlderFilter != "" {
				t.Errorf("after replacing the filter, older filter %q still named", s.SynOlderFilter)
			}
		})
	}
}

// TestOpenRefusesSynCountersItCannotCarry: pinned syn_counters whose
// values are too small to hold the counters cannot be taken over. Open
// says so and changes nothing: the old map stays pinned, and no half-made
// replacement is left beside it.
func TestOpenRefusesSynCountersItCannotCarry(t *testing.T) {
	const tooSmall = 16
	root, pin, olderID := pinOlderMap(t, datapath.MoatMapSynCounters, tooSmall)

	if s, err := shield.Open(root); err == nil {
		s.Close()
		t.Fatal("open with syn_counters values of 16 bytes succeeded")
	} else if !strings.Contains(err.Error(), "syn_counters") || !strings.Contains(err.Error(), "hold no counters") {
		t.Errorf("error %q does not say which map and why", err)
	}
	wantPinnedMap(t, pin, olderID)
	if _, err := os.Stat(pin + "-new"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a replacement was left pinned beside the old map: %v", err)
	}
}

// pinOlderMap makes fresh state whose shared map name is a map of an
// older shape, with values of valueSize bytes, as an older moat would have
// pinned it; the map stays pinned (and alive) after the test's handle is
// closed. It returns the state's root, the pin's path and the map's id.
func pinOlderMap(t *testing.T, name string, valueSize uint32) (root, pin string, id ebpf.MapID) {
	t.Helper()
	s := openFresh(t)
	defer s.Close()
	older := olderMap(t, s, name, valueSize)
	defer older.Close()
	info, err := older.Info()
	if err != nil {
		t.Fatal(err)
	}
	id, _ = info.ID()
	return s.Root(), pinInstead(t, s.Root(), name, older), id
}

// olderMap makes a map of the type, key and size of the shared map name
// of s, but with values of valueSize bytes, as an older moat pinned it.
func olderMap(t *testing.T, s *shield.Shield, name string, valueSize uint32) *ebpf.Map {
	t.Helper()
	cur := s.Map(name)
	m, err := ebpf.NewMap(&ebpf.MapSpec{Type: cur.Type(), KeySize: cur.KeySize(), ValueSize: valueSize, MaxEntries: cur.MaxEntries()})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// wantPinnedMap checks that the map pinned at pin is the map id.
func wantPinnedMap(t *testing.T, pin string, id ebpf.MapID) {
	t.Helper()
	m, err := ebpf.LoadPinnedMap(pin, nil)
	if err != nil {
		t.Fatalf("the old map's pin: %v", err)
	}
	defer m.Close()
	info, err := m.Info()
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := info.ID(); got != id {
		t.Errorf("pinned at %s: map %d, want the old map %d", pin, got, id)
	}
}

// pinInstead pins m where the state under root pins the shared map name,
// as an older moat would have left it, and returns the pin's path.
func pinInstead(t *testing.T, root, name string, m *ebpf.Map) string {
	t.Helper()
	pin := filepath.Join(root, "maps", name)
	if err := os.Remove(pin); err != nil {
		t.Fatal(err)
	}
	if err := m.Pin(pin); err != nil {
		t.Fatal(err)
	}
	return pin
}

// TestOpenKeepsSynCountersWhenTheNewPinFails: when the resized map cannot
// be pinned beside the old one (here a directory holds the name), Open
// fails with the map's name, the old map stays pinned, and a later Open,
// once the way is clear, takes it over.
func TestOpenKeepsSynCountersWhenTheNewPinFails(t *testing.T) {
	const oldSize = 200 // counters first: a size Open can carry over
	root, pin, olderID := pinOlderMap(t, datapath.MoatMapSynCounters, oldSize)

	blocker := pin + "-new"
	if err := os.MkdirAll(filepath.Join(blocker, "busy"), 0o700); err != nil {
		t.Fatal(err)
	}
	if s, err := shield.Open(root); err == nil {
		s.Close()
		t.Fatal("open succeeded with the replacement's pin path taken")
	} else if !strings.Contains(err.Error(), "syn_counters") || !strings.Contains(err.Error(), "file exists") {
		t.Errorf("error %q does not name the map and the pin's failure", err)
	}
	wantPinnedMap(t, pin, olderID)

	if err := os.RemoveAll(blocker); err != nil {
		t.Fatal(err)
	}
	s, err := shield.Open(root)
	if err != nil {
		t.Fatalf("open once the way is clear: %v", err)
	}
	defer s.Close()
	if want := uint32(binary.Size(datapath.MoatSynPortStats{})); s.Map(datapath.MoatMapSynCounters).ValueSize() != want {
		t.Errorf("syn_counters values of %d bytes after the retry, want %d", s.Map(datapath.MoatMapSynCounters).ValueSize(), want)
	}
}

// TestFiltersDrawTheirOwnHeavyHitterSeed: every filter loaded keys its
// heavy-hitter gate with a seed of its own, so that no one can pick
// sources that share the gate's slots and fingerprints.
func TestFiltersDrawTheirOwnHeavyHitterSeed(t *testing.T) {
	s := openFresh(t)
	a, b := s.FilterSeed(t), s.FilterSeed(t)
	if a == 0 || b == 0 || a == b {
		t.Errorf("seeds of two filters: %#x and %#x, want two different random values", a, b)
	}
}

// TestOpenCarriesOlderSettings: an older moat pinned settings without the
// monitor field (12-byte values). Open replaces the map with one of this
// version's shape and carries the policies and the allowlist's in-use bits
// over; monitor mode starts off.
func TestOpenCarriesOlderSettings(t *testing.T) {
	s := openFresh(t)
	root := s.Root()
	older, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 12, MaxEntries: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer older.Close()
	var v [12]byte
	binary.NativeEndian.PutUint32(v[0:], uint32(datapath.MoatFragmentPolicyFRAGMENTS_DROP))
	binary.NativeEndian.PutUint32(v[4:], uint32(datapath.MoatMalformedPolicyMALFORMED_PASS))
	binary.NativeEndian.PutUint32(v[8:], uint32(datapath.MoatAllowInUseALLOW_IN_USE_V6))
	if err := older.Put(uint32(0), v[:]); err != nil {
		t.Fatal(err)
	}
	pinInstead(t, root, datapath.MoatMapSettings, older)
	s.Close()

	s, err = shield.Open(root)
	if err != nil {
		t.Fatalf("open over 12-byte settings: %v", err)
	}
	defer s.Close()
	set, err := s.Settings()
	if err != nil {
		t.Fatal(err)
	}
	if want := (rules.Settings{Fragments: "drop", Malformed: "pass"}); set != want {
		t.Errorf("settings %+v, want %+v", set, want)
	}
	var cur datapath.MoatRuntimeSettings
	if err := s.Map(datapath.MoatMapSettings).Lookup(uint32(0), &cur); err != nil {
		t.Fatalf("read the new settings map: %v", err)
	}
	if cur.AllowInUse != uint32(datapath.MoatAllowInUseALLOW_IN_USE_V6) || cur.Monitor != 0 {
		t.Errorf("settings %+v: want the allowlist's v6 bit kept and monitor off", cur)
	}
	if err := s.SetSettings(rules.Settings{Fragments: "drop", Malformed: "pass", Monitor: true}); err != nil {
		t.Fatal(err)
	}
	if set, err := s.Settings(); err != nil || !set.Monitor {
		t.Errorf("settings %+v, %v after turning monitor mode on", set, err)
	}
}

// TestOpenCarriesOlderCensus: a socket census an older moat pinned with
// 32-bit generations for marks gives way to one of this version's layout
// that keeps its generation (the ports' census_from counts in it) and its
// tally of passes, but trusts nothing until the next passes.
func TestOpenCarriesOlderCensus(t *testing.T) {
	const olderSize = 32 + 4<<17
	root, _, _ := pinOlderMap(t, datapath.MoatMapSynCensus, olderSize)
	older, err := ebpf.LoadPinnedMap(filepath.Join(root, "maps", datapath.MoatMapSynCensus), nil)
	if err != nil {
		t.Fatal(err)
	}
	v := make([]byte, olderSize)
	binary.NativeEndian.PutUint32(v[0:], 41)            // generation
	binary.NativeEndian.PutUint32(v[4:], 40)            // floor
	binary.NativeEndian.PutUint64(v[8:], math.MaxInt64) // valid until
	binary.NativeEndian.PutUint64(v[16:], 7)            // sockets
	binary.NativeEndian.PutUint64(v[24:], 40)           // passes
	binary.NativeEndian.PutUint32(v[32+4*1234:], 41)    // a mark
	err = older.Put(uint32(0), v)
	older.Close()
	if err != nil {
		t.Fatal(err)
	}

	s, err := shield.Open(root)
	if err != nil {
		t.Fatalf("open over an older census: %v", err)
	}
	defer s.Close()
	m := s.Map(datapath.MoatMapSynCensus)
	if m.ValueSize() == olderSize {
		t.Fatal("the older census is still in use")
	}
	var c datapath.MoatSynCensusTable
	if err := m.Lookup(uint32(0), &c); err != nil {
		t.Fatal(err)
	}
	if c.Generation != 41 || c.Floor != 0 || c.ValidUntilNs != 0 || c.Sockets != 7 || c.Passes != 40 {
		t.Errorf("census header %d %d %d %d %d, want generation 41 and 40 passes kept, nothing trusted", c.Generation, c.Floor, c.ValidUntilNs, c.Sockets, c.Passes)
	}
	for i, w := range c.Marks {
		if w != 0 {
			t.Fatalf("word %d of marks is %x, want none carried", i, w)
		}
	}
	if st, err := syncookie.ReadCensus(m); err != nil || st.Trusted {
		t.Errorf("census %+v, %v: want it untrusted", st, err)
	}
}

// TestCountersOfAnOlderLayout: an interface not attached again since an
// older moat made its counters (two slots per reason, none for monitored
// packets) still has them read; the monitored counts are zero.
func TestCountersOfAnOlderLayout(t *testing.T) {
	s := openFresh(t)
	a, _ := vethPair(t)
	if _, err := s.Attach(a, shield.ModeGeneric); err != nil {
		t.Fatal(err)
	}
	reasons := uint32(datapath.MoatVerdictReasonREASON_MAX)
	old, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.PerCPUArray, KeySize: 4, ValueSize: 16, MaxEntries: reasons * 2})
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	ncpu, err := ebpf.PossibleCPU()
	if err != nil {
		t.Fatal(err)
	}
	per := make([]datapath.MoatVerdictCounter, ncpu)
	per[0] = datapath.MoatVerdictCounter{Packets: 7, Bytes: 700}
	if err := old.Put(uint32(datapath.MoatVerdictReasonREASON_DENYLIST)*2+1, per); err != nil {
		t.Fatal(err)
	}
	pin := filepath.Join(s.Root(), "ifaces", a, "counters")
	os.Remove(pin)
	if err := old.Pin(pin); err != nil {
		t.Fatal(err)
	}
	c, err := s.Counters(a)
	if err != nil {
		t.Fatalf("read counters of the older layout: %v", err)
	}
	if c.Dropped.Packets != 7 || c.ByReason["denylist"].Dropped.Bytes != 700 || c.Monitored != (shield.Count{}) {
		t.Errorf("counters %+v: want 7 denylist drops of 700 bytes, nothing monitored", c)
	}
}

// TestSettingsOlderFilterNamed: a filter loaded before the settings map was
// replaced (by an Open over an older moat's settings) reads the old map;
// SettingsOlderFilter names its interface until an attach replaces it.
func TestSettingsOlderFilterNamed(t *testing.T) {
	s := openFresh(t)
	root := s.Root()
	a, _ := vethPair(t)
	if _, err := s.Attach(a, shield.ModeGeneric); err != nil {
		t.Fatal(err)
	}
	if name, err := s.SettingsOlderFilter(); err != nil || name != "" {
		t.Fatalf("SettingsOlderFilter %q, %v before any upgrade", name, err)
	}
	older, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 12, MaxEntries: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer older.Close()
	pinInstead(t, root, datapath.MoatMapSettings, older)
	s.Close()

	s, err = shield.Open(root)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if name, err := s.SettingsOlderFilter(); err != nil || name != a {
		t.Errorf("SettingsOlderFilter %q, %v; want %s, whose filter reads the replaced map", name, err, a)
	}
	if _, err := s.Attach(a, shield.ModeAuto); err != nil {
		t.Fatal(err)
	}
	if name, err := s.SettingsOlderFilter(); err != nil || name != "" {
		t.Errorf("SettingsOlderFilter %q, %v after the attach", name, err)
	}
}

// TestOpenCarriesOlderRuleStats: an older moat pinned the rate limits'
// counters without the monitored fields (64-byte values). Open replaces
// the map with one of this version's shape and carries every limit's
// counters over, monitored at zero; a filter still attached from before
// counts in the old map, which LimitCountersOlderFilter names until attach
// replaces it.
func TestOpenCarriesOlderRuleStats(t *testing.T) {
	s := openFresh(t)
	root := s.Root()
	a, _ := vethPair(t)
	if _, err := s.Attach(a, shield.ModeGeneric); err != nil {
		t.Fatal(err)
	}
	rl, err := ratelimit.NewMaps(s.Map)
	if err != nil {
		t.Fatal(err)
	}
	sc, err := ratelimit.ParseScope("udp/53")
	if err != nil {
		t.Fatal(err)
	}
	if err := rl.Add(ratelimit.Limit{Kind: ratelimit.Budget, Scope: sc, PPS: 10}, false); err != nil {
		t.Fatal(err)
	}
	const oldSize = 64
	older := olderMap(t, s, datapath.MoatMapRlStats, oldSize)
	defer older.Close()
	vals := make([][]byte, ebpf.MustPossibleCPU())
	for cpu := range vals {
		vals[cpu] = make([]byte, oldSize)
		// passed, passed_bytes, dropped, dropped_bytes, untracked,
		// tracked, blocks, block_errors
		for i, n := range []uint64{3, 300, 5, 500, 0, 0, 0, 0} {
			binary.NativeEndian.PutUint64(vals[cpu][8*i:], n)
		}
	}
	if err := older.Update(uint32(1), vals, ebpf.UpdateAny); err != nil {
		t.Fatal(err)
	}
	pinInstead(t, root, datapath.MoatMapRlStats, older)
	s.Close()

	n := uint64(ebpf.MustPossibleCPU())
	want := ratelimit.RuleStats{Passed: 3 * n, PassedBytes: 300 * n, Dropped: 5 * n, DroppedBytes: 500 * n}
	for round := 0; round < 2; round++ { // the second Open finds nothing to do
		s, err = shield.Open(root)
		if err != nil {
			t.Fatalf("round %d: open over 64-byte rate limit counters: %v", round, err)
		}
		if want := uint32(binary.Size(datapath.MoatRlRuleStats{})); s.Map(datapath.MoatMapRlStats).ValueSize() != want {
			t.Errorf("round %d: rl_stats values of %d bytes, want %d", round, s.Map(datapath.MoatMapRlStats).ValueSize(), want)
		}
		rl, err := ratelimit.NewMaps(s.Map)
		if err != nil {
			t.Fatal(err)
		}
		ls, err := rl.Limits()
		if err != nil {
			t.Fatal(err)
		}
		if len(ls) != 1 || ls[0].Stats != want {
			t.Errorf("round %d: limits %+v, want one with the old counters %+v", round, ls, want)
		}
		if name, err := s.LimitCountersOlderFilter(); err != nil || name != a {
			t.Errorf("round %d: LimitCountersOlderFilter %q, %v; want %s, which still counts in the old map", round, name, err, a)
		}
		s.Close()
	}
	attachEndsOlderFilter(t, root, a, "LimitCountersOlderFilter", (*shield.Shield).LimitCountersOlderFilter)
}

// attachEndsOlderFilter opens the state under root, attaches to iface
// again, and checks that olderFilter (named name) then finds no filter of
// an older moat: the attach replaced it.
func attachEndsOlderFilter(t *testing.T, root, iface, name string, olderFilter func(*shield.Shield) (string, error)) {
	t.Helper()
	s, err := shield.Open(root)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Attach(iface, shield.ModeAuto); err != nil {
		t.Fatal(err)
	}
	if got, err := olderFilter(s); err != nil || got != "" {
		t.Errorf("%s %q, %v after the attach", name, got, err)
	}
}

// TestOpenRefusesShortLayouts: pinned rl_stats or hh_sources values too
// short to hold the counts every version had, or a census value too short
// for its header, are not an older layout;
// Open says so, naming the map, and leaves it pinned.
func TestOpenRefusesShortLayouts(t *testing.T) {
	for _, name := range []string{datapath.MoatMapRlStats, datapath.MoatMapHhSources, datapath.MoatMapSynCensus} {
		t.Run(name, func(t *testing.T) {
			root, pin, id := pinOlderMap(t, name, 16)
			if s, err := shield.Open(root); err == nil {
				s.Close()
				t.Fatalf("open with %s values of 16 bytes succeeded", name)
			} else if !strings.Contains(err.Error(), name) {
				t.Errorf("error %q does not name the map", err)
			}
			wantPinnedMap(t, pin, id)
		})
	}
}
