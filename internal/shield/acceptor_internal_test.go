package shield

import (
	"errors"
	"testing"

	"github.com/vishvananda/netlink"
)

// TestAcceptorIfindexThroughABond: the acceptor of a filter on a NIC
// enslaved to a bond that is a bridge's port runs at the bridge, past
// its netfilter, as for a NIC that is the bridge's port itself; a bond's
// slave outside any bridge keeps it.
func TestAcceptorIfindexThroughABond(t *testing.T) {
	links := map[int]netlink.Link{
		2: &netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: 2, Name: "eth0", MasterIndex: 4}},
		3: &netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: 3, Name: "eth1", MasterIndex: 5}},
		4: &netlink.Bond{LinkAttrs: netlink.LinkAttrs{Index: 4, Name: "bond0", MasterIndex: 6}},
		5: &netlink.Bond{LinkAttrs: netlink.LinkAttrs{Index: 5, Name: "bond1"}},
		6: &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Index: 6, Name: "vmbr0"}},
		7: &netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: 7, Name: "eth2", MasterIndex: 6}},
	}
	byIndex := func(i int) (netlink.Link, error) {
		if l, ok := links[i]; ok {
			return l, nil
		}
		return nil, errors.New("no such link")
	}
	for _, c := range []struct {
		ifindex, want int
		bridge        string
	}{
		{2, 6, "vmbr0"}, // NIC, bond, bridge
		{7, 6, "vmbr0"}, // NIC, bridge
		{3, 3, ""},      // NIC, bond: no bridge
		{6, 6, ""},      // the bridge itself
	} {
		if got, br := acceptorIfindexWith(c.ifindex, byIndex); got != c.want || br != c.bridge {
			t.Errorf("ifindex %d: acceptor at %d (%q), want %d (%q)", c.ifindex, got, br, c.want, c.bridge)
		}
	}
}
