package flood

import (
	"fmt"
	"os"
	"strings"
	"syscall"

	"github.com/vishvananda/netlink"
)

// CheckTarget refuses a sending device that could put a flood on a real
// network: anything but a veth, or a veth in the initial network namespace
// (where it may be bridged to a real port). force skips the refusal but not
// the check that the device exists. The device is looked up in the calling
// OS thread's network namespace.
func CheckTarget(ifindex int, force bool) error {
	link, err := netlink.LinkByIndex(ifindex)
	if err != nil {
		return fmt.Errorf("interface %d: %w", ifindex, err)
	}
	if force {
		return nil
	}
	name := link.Attrs().Name
	if typ := link.Type(); typ != "veth" {
		if typ == "device" { // netlink's name for "no rtnl kind": loopback, NICs
			typ = link.Attrs().EncapType
			if typ == "ether" {
				typ = "physical"
			}
		}
		return fmt.Errorf("moat flood is a lab tool: %s is a %s device, not a veth (override with --force)", name, typ)
	}
	initial, err := inInitialNetns()
	if err != nil {
		return fmt.Errorf("moat flood is a lab tool: cannot tell whether %s is in the initial network namespace: %v (override with --force)", name, err)
	}
	if initial {
		return fmt.Errorf("moat flood is a lab tool: %s is in the initial network namespace (override with --force)", name)
	}
	return nil
}

// inInitialNetns reports whether the calling thread's network namespace is
// the one of PID 1. Where PID 1's namespace links are closed to us (some
// sandboxes make it non-dumpable), kthreadd stands in: kernel threads
// always live in the initial namespaces.
func inInitialNetns() (bool, error) {
	self, err := nsID("/proc/thread-self/ns/net")
	if err != nil {
		return false, err
	}
	initial, err := nsID("/proc/1/ns/net")
	if err != nil {
		comm, cerr := os.ReadFile("/proc/2/comm")
		if cerr != nil || strings.TrimSpace(string(comm)) != "kthreadd" {
			return false, err
		}
		if initial, err = nsID("/proc/2/ns/net"); err != nil {
			return false, err
		}
	}
	return self == initial, nil
}

type nsKey struct{ dev, ino uint64 }

func nsID(path string) (nsKey, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nsKey{}, err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return nsKey{}, fmt.Errorf("%s: no inode", path)
	}
	return nsKey{uint64(st.Dev), st.Ino}, nil
}
