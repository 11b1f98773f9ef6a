package shield_test

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/vishvananda/netlink"

	"github.com/moat-shield/moat/internal/shield"
)

// TestAcceptorFollowsTheBridge: the SYN acceptor of a filter on a bridge
// port runs at the bridge. When the bridge is deleted and made again, or
// the interface leaves it, the acceptor is no longer where the filter
// needs it (cookie handshakes would fail): Attachments and
// MisplacedAcceptors say so, and attaching again puts it right.
func TestAcceptorFollowsTheBridge(t *testing.T) {
	s := openFresh(t)
	defer s.Close()
	port, peer := vethPair(t)
	bridge := func(name string) int {
		t.Helper()
		br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: name}}
		if err := netlink.LinkAdd(br); err != nil {
			t.Fatalf("bridge: %v", err)
		}
		t.Cleanup(func() {
			if l, err := netlink.LinkByName(name); err == nil {
				netlink.LinkDel(l)
			}
		})
		p, err := netlink.LinkByName(port)
		if err == nil {
			err = netlink.LinkSetMaster(p, br)
		}
		if err != nil {
			t.Fatalf("enslave %s: %v", port, err)
		}
		return br.Attrs().Index
	}
	for _, n := range []string{port, peer} {
		if l, err := netlink.LinkByName(n); err == nil {
			netlink.LinkSetUp(l)
		}
	}
	placed := func(step string, wantAt int, wantMisplaced bool) {
		t.Helper()
		atts, err := s.Attachments()
		if err != nil {
			t.Fatal(err)
		}
		i := slices.IndexFunc(atts, func(a shield.Attachment) bool { return a.Iface == port })
		if i < 0 {
			t.Fatalf("%s: %s not among %+v", step, port, atts)
		}
		if a := atts[i]; a.AcceptorIfindex != wantAt || a.AcceptorMisplaced != wantMisplaced {
			t.Errorf("%s: acceptor at %d (misplaced %v), want %d (%v)", step, a.AcceptorIfindex, a.AcceptorMisplaced, wantAt, wantMisplaced)
		}
		names, err := shield.MisplacedAcceptors(s.Root())
		if err != nil {
			t.Fatal(err)
		}
		if got := slices.Contains(names, port); got != wantMisplaced {
			t.Errorf("%s: MisplacedAcceptors %v", step, names)
		}
	}
	attach := func() {
		t.Helper()
		if _, err := s.Attach(port, shield.ModeNative); err != nil {
			t.Fatalf("attach %s: %v", port, err)
		}
	}

	br1 := bridge(port + "b")
	attach()
	placed("on a bridge port", br1, false)

	if l, err := netlink.LinkByName(port + "b"); err == nil {
		netlink.LinkDel(l)
	}
	placed("bridge deleted", 0, true)
	br2 := bridge(port + "c")
	placed("bridge made anew", 0, true)
	attach()
	placed("attached again", br2, false)

	p, err := netlink.LinkByName(port)
	if err == nil {
		err = netlink.LinkSetNoMaster(p)
	}
	if err != nil {
		t.Fatal(err)
	}
	placed("out of the bridge", br2, true)
	attach()
	placed("attached again, no bridge", p.Attrs().Index, false)
}

// TestReplaceOverLeftoverPins: a replacement cut short (the process killed
// between pinning a new program or link beside the old one and renaming it
// into place) leaves a "-new" pin. The next attach used to fail on it
// (EEXIST) for good, and a leftover acceptor link stayed attached; now it
// goes, and the attach replaces the programs as ever.
func TestReplaceOverLeftoverPins(t *testing.T) {
	s := openFresh(t)
	defer s.Close()
	port, _ := vethPair(t)
	if _, err := s.Attach(port, shield.ModeNative); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(s.Root(), "ifaces", port)
	stray, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.XDP, License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 2), asm.Return()}})
	if err != nil {
		t.Fatal(err)
	}
	defer stray.Close()
	for _, name := range []string{"prog-new", "tc-prog-new"} {
		if err := stray.Pin(filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	res, err := s.Attach(port, shield.ModeNative)
	if err != nil || !res.Replaced {
		t.Fatalf("attach over leftover pins: %+v, %v", res, err)
	}
	for _, name := range []string{"prog-new", "tc-prog-new"} {
		if _, err := os.Stat(filepath.Join(dir, name)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s still pinned (%v)", name, err)
		}
	}
}
