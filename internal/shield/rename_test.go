package shield_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/moat-shield/moat/internal/lab"
	"github.com/moat-shield/moat/internal/shield"
)

// xdpProg is the ID of the XDP program on the interface name, 0 for none.
func xdpProg(t *testing.T, name string) uint32 {
	t.Helper()
	l, err := netlink.LinkByName(name)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	if x := l.Attrs().Xdp; x != nil && x.Attached {
		return x.ProgId
	}
	return 0
}

func rename(t *testing.T, from, to string) {
	t.Helper()
	l, err := netlink.LinkByName(from)
	if err == nil {
		err = netlink.LinkSetDown(l)
	}
	if err == nil {
		err = netlink.LinkSetName(l, to)
	}
	if err == nil {
		err = netlink.LinkSetUp(l)
	}
	if err != nil {
		t.Fatalf("rename %s to %s: %v", from, to, err)
	}
	t.Cleanup(func() {
		if l, err := netlink.LinkByName(to); err == nil {
			netlink.LinkDel(l)
		}
	})
}

// TestRenamedInterfaceKeepsItsFilter: pins go by interface name, links by
// index. An interface renamed since attach keeps its filter, and its pins
// follow it to the new name: status shows the new name, attach to the new
// name replaces the program in place (it met moat's own program before),
// and attach to a new interface of the old name gets a filter of its own
// and leaves the renamed one's alone (it took it away before, saying the
// interface had been deleted and made again).
func TestRenamedInterfaceKeepsItsFilter(t *testing.T) {
	s := openFresh(t)
	a, _ := vethPair(t)
	if _, err := s.Attach(a, shield.ModeGeneric); err != nil {
		t.Fatal(err)
	}
	moved := a + "x"
	rename(t, a, moved)
	prog := xdpProg(t, moved)
	if prog == 0 {
		t.Fatal("the renamed interface lost its program")
	}

	// A new interface of the old name.
	b, _ := vethPair(t)
	rename(t, b, a)
	res, err := s.Attach(a, shield.ModeGeneric)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(res.Warning, a+" was renamed "+moved) || strings.Contains(res.Warning, "deleted") {
		t.Errorf("warning %q, want one saying %s was renamed %s", res.Warning, a, moved)
	}
	if xdpProg(t, moved) != prog {
		t.Fatalf("attaching to the new %s took the filter off %s", a, moved)
	}
	if xdpProg(t, a) == 0 {
		t.Fatalf("the new %s has no program", a)
	}
	atts, err := s.Attachments()
	if err != nil {
		t.Fatal(err)
	}
	present := map[string]bool{}
	for _, at := range atts {
		present[at.Iface] = at.Present
	}
	if !present[a] || !present[moved] || len(atts) != 2 {
		t.Errorf("attachments %+v, want %s and %s, both present", atts, a, moved)
	}

	// Attach to the new name replaces in place.
	res, err = s.Attach(moved, shield.ModeGeneric)
	if err != nil || !res.Replaced {
		t.Fatalf("attach to %s: %+v, %v; want the program replaced in place", moved, res, err)
	}

	// A rename that Open finds: its pins move, and Open says so.
	again := a + "y"
	rename(t, moved, again)
	root := s.Root()
	s.Close()
	s2, err := shield.Open(root)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if len(s2.Renamed) != 1 || !strings.Contains(s2.Renamed[0], moved+" was renamed "+again) {
		t.Errorf("Open found renamed %q, want %s renamed %s", s2.Renamed, moved, again)
	}
	if !s2.IsPinned(again) || s2.IsPinned(moved) {
		t.Errorf("pins of %s: %t, of %s: %t; want them under the new name", again, s2.IsPinned(again), moved, s2.IsPinned(moved))
	}
	if err := s2.Detach(again); err != nil {
		t.Errorf("detach %s: %v", again, err)
	}
	if xdpProg(t, again) != 0 {
		t.Errorf("%s keeps a program after detach", again)
	}
}

// TestRenameLeavesOtherNamespacesAlone: an interface index names an
// interface of one network namespace. Pins of a filter attached from
// within another namespace are not taken for a rename when the state is
// opened from this one, where the same index may name any interface.
func TestRenameLeavesOtherNamespacesAlone(t *testing.T) {
	s := openFresh(t)
	root := s.Root()
	l := lab.NewT(t)
	ifc := l.Server.Ifaces[1]
	if err := l.Server.Do(func() error { _, err := s.Attach(ifc.Name, shield.ModeGeneric); return err }); err != nil {
		t.Fatal(err)
	}
	s.Close()
	t.Cleanup(func() {
		l.Server.Do(func() error {
			s, err := shield.Open(root)
			if err == nil {
				err = s.Detach(ifc.Name)
				s.Close()
			}
			return err
		})
	})
	here, err := netlink.LinkByIndex(ifc.Index)
	if err != nil {
		t.Logf("no interface %d in this namespace: the test shows less", ifc.Index)
	} else {
		t.Logf("interface %d is %s here, %s in the lab's server", ifc.Index, here.Attrs().Name, ifc.Name)
	}
	s2, err := shield.Open(root)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if len(s2.Renamed) != 0 || !s2.IsPinned(ifc.Name) {
		t.Errorf("opened from another namespace: renamed %q, %s pinned %t; want the pins left alone", s2.Renamed, ifc.Name, s2.IsPinned(ifc.Name))
	}
}

// TestSwappedAndStaleNames: two attached interfaces that swap names swap
// their pins too (through temporary names), so detach by name takes the
// filter off the interface that now has the name; and an interface renamed
// to the name of a deleted one, whose pins moat still has, takes that name
// over (it stayed under its old name, and attach to the new name failed
// against its own program).
func TestSwappedAndStaleNames(t *testing.T) {
	s := openFresh(t)
	a, _ := vethPair(t)
	b, _ := vethPair(t)
	for _, n := range []string{a, b} {
		if _, err := s.Attach(n, shield.ModeGeneric); err != nil {
			t.Fatal(err)
		}
	}
	progA, progB := xdpProg(t, a), xdpProg(t, b)
	tmp := a + "t"
	rename(t, a, tmp)
	rename(t, b, a)
	rename(t, tmp, b)
	root := s.Root()
	s.Close()
	s, err := shield.Open(root)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { s.Close() }()
	if len(s.Renamed) != 2 {
		t.Errorf("renamed %q, want both", s.Renamed)
	}
	if err := s.Detach(a); err != nil {
		t.Fatal(err)
	}
	// a is the interface that had b's name, and b's program.
	if xdpProg(t, a) != 0 || xdpProg(t, b) != progA {
		t.Errorf("after detach %s: programs %d on %s and %d on %s; want none and %d (%d was %s's)",
			a, xdpProg(t, a), a, xdpProg(t, b), b, progA, progB, b)
	}

	// b stays attached; a new interface c is attached and deleted, its pins
	// left behind; then b is renamed c.
	c, _ := vethPair(t)
	if _, err := s.Attach(c, shield.ModeGeneric); err != nil {
		t.Fatal(err)
	}
	if l, err := netlink.LinkByName(c); err == nil {
		netlink.LinkDel(l)
	}
	rename(t, b, c)
	res, err := s.Attach(c, shield.ModeGeneric)
	if err != nil {
		t.Fatalf("attach %s: %v", c, err)
	}
	if !res.Replaced || !strings.Contains(res.Warning, b+" was renamed "+c) {
		t.Errorf("attach %s: %+v; want the program replaced in place, and the rename said", c, res)
	}
	if s.IsPinned(b) || !s.IsPinned(c) || xdpProg(t, c) == 0 {
		t.Errorf("pins of %s: %t, of %s: %t, program on %s: %d", b, s.IsPinned(b), c, s.IsPinned(c), c, xdpProg(t, c))
	}
}

// TestRenameCutShortIsRecovered: pins that a move cut short left under a
// temporary name (which the pin listings skip) are moved back under their
// interface's name the next time the state is opened.
func TestRenameCutShortIsRecovered(t *testing.T) {
	s := openFresh(t)
	a, _ := vethPair(t)
	if _, err := s.Attach(a, shield.ModeGeneric); err != nil {
		t.Fatal(err)
	}
	root := s.Root()
	s.Close()
	ifaces := filepath.Join(root, "ifaces")
	if err := os.Rename(filepath.Join(ifaces, a), filepath.Join(ifaces, "tmp-rename-1-0")); err != nil {
		t.Fatal(err)
	}
	s, err := shield.Open(root)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if !s.IsPinned(a) || len(s.Renamed) != 1 || !strings.Contains(s.Renamed[0], "back under its name") {
		t.Errorf("pinned %t, renamed %q; want %s's pins back under its name", s.IsPinned(a), s.Renamed, a)
	}
	if err := s.Detach(a); err != nil || xdpProg(t, a) != 0 {
		t.Errorf("detach %s: %v; program %d after it", a, err, xdpProg(t, a))
	}
}
