package cli_test

import (
	"fmt"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
)

// TestSynCookiesOnABridgePort: moat attached to an interface that is a
// port of a bridge which holds this host's addresses (a hypervisor's NIC
// in vmbr0, a node's uplink in a bridge), with the bridge's netfilter on
// (net.bridge.bridge-nf-call-iptables and -ip6tables, which Kubernetes,
// Docker and Proxmox hosts turn on). br_netfilter orphans every skb it
// passes to the IP hooks, so a request socket that moat's acceptor handed
// the kernel at the port's tcx ingress was gone when the third ACK reached
// TCP, and the kernel reset every cookie handshake, while `moat syn
// status` counted them accepted. The acceptor now runs at the bridge's
// ingress, past the bridge's netfilter.
func TestSynCookiesOnABridgePort(t *testing.T) {
	sl := newShieldLab(t)
	port := sl.lab.Server.Ifaces[0]
	sl.lab.Client.AttachPassXDPT(t)
	cli := sl.lab.Client.Ifaces[0]

	// The server's addresses on the client's link move to a bridge whose
	// only port is that link, with the port's MAC (the client's static
	// neighbours name it), and the bridge's netfilter on.
	if err := sl.lab.Server.Do(func() error {
		for _, f := range []string{"bridge-nf-call-iptables", "bridge-nf-call-ip6tables"} {
			if err := os.WriteFile("/proc/sys/net/bridge/"+f, []byte("1"), 0); err != nil {
				if os.IsNotExist(err) {
					t.Skipf("no br_netfilter: %v", err)
				}
				return err
			}
		}
		pl, err := netlink.LinkByIndex(port.Index)
		if err != nil {
			return err
		}
		br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "br-lab", HardwareAddr: port.MAC}}
		if err := netlink.LinkAdd(br); err != nil {
			return err
		}
		for _, a := range []netip.Prefix{port.IPv4, port.IPv6} {
			addr, _ := netlink.ParseAddr(a.String())
			if err := netlink.AddrDel(pl, addr); err != nil {
				return fmt.Errorf("move %s: %w", a, err)
			}
			addr.Flags = 0x02 // IFA_F_NODAD: the lab sends nothing unasked
			if err := netlink.AddrAdd(br, addr); err != nil {
				return fmt.Errorf("move %s: %w", a, err)
			}
		}
		if err := netlink.LinkSetMaster(pl, br); err != nil {
			return err
		}
		if err := netlink.LinkSetUp(br); err != nil {
			return err
		}
		for _, a := range []netip.Addr{cli.IPv4.Addr(), cli.IPv6.Addr()} {
			fam := netlink.FAMILY_V4
			if a.Is6() {
				fam = netlink.FAMILY_V6
			}
			if err := netlink.NeighSet(&netlink.Neigh{LinkIndex: br.Attrs().Index, Family: fam, State: netlink.NUD_PERMANENT,
				IP: a.AsSlice(), HardwareAddr: cli.MAC}); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // the bridge port forwarding (no STP)

	lport := sl.greeter(t)

	sl.mustMoat("attach", port.Name)
	r := sl.mustMoat("syn", "protect", fmt.Sprintf("tcp/%d", lport), "--mode", "always")
	t.Log(strings.TrimSpace(r.stderr))
	for i, dst := range []netip.Addr{port.IPv4.Addr(), port.IPv6.Addr()} {
		err := sl.readGreeting(dst, lport)
		if err != nil {
			t.Fatalf("connect to %s through moat on a bridge port: %v", dst, err)
		}
		var st struct {
			Ports []struct {
				CookiesAccepted uint64 `json:"cookies_accepted"`
			} `json:"ports"`
		}
		sl.moatJSON(&st, "syn", "status")
		if len(st.Ports) != 1 || st.Ports[0].CookiesAccepted != uint64(i+1) {
			t.Fatalf("syn status %+v: want %d handshakes accepted by moat", st, i+1)
		}
	}
}
