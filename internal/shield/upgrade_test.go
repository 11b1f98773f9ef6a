package shield_test

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"path/filepath"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"

	"github.com/moat-shield/moat/internal/datapath"
	"github.com/moat-shield/moat/internal/rules"
	"github.com/moat-shield/moat/internal/shield"
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
// the test ends.
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
	t.Cleanup(func() { netlink.LinkDel(la) })
	return a, b
}
