package shield_test

import (
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/moat-shield/moat/internal/shield"
)

// TestAcceptorsBehindOverADefunctLink: after the bridge an acceptor ran
// on is deleted, its tcx link reports no interface. AcceptorsBehind (the
// warning of `moat syn protect`) must go on with the other interfaces,
// not fail on that one.
func TestAcceptorsBehindOverADefunctLink(t *testing.T) {
	s := openFresh(t)
	defer s.Close()
	port, _ := vethPair(t)
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: port + "b"}}
	if err := netlink.LinkAdd(br); err != nil {
		t.Fatal(err)
	}
	defer netlink.LinkDel(br)
	p, err := netlink.LinkByName(port)
	if err == nil {
		err = netlink.LinkSetMaster(p, br)
	}
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Attach(port, shield.ModeNative); err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkDel(br); err != nil {
		t.Fatal(err)
	}
	if _, err := s.AcceptorsBehind(); err != nil {
		t.Errorf("AcceptorsBehind with a defunct acceptor link: %v", err)
	}
}
