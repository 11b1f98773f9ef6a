package ratelimit_test

import (
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// connNetns is a network namespace held by a thread of its own, with one
// established TCP connection for each client-server pair given: the
// socket lookups of the data path (a +tls-hello limit counts segments of
// established connections only) find them when the program runs on that
// thread. Do runs a function there; BPF_PROG_TEST_RUN looks sockets up in
// the namespace of the thread that runs it.
type connNetns struct {
	work chan func()
}

func newConnNetns(tb testing.TB, pairs ...[2]netip.AddrPort) *connNetns {
	tb.Helper()
	c := &connNetns{work: make(chan func())}
	ready := make(chan error)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the namespace
		ns, err := netns.New()
		if err != nil {
			ready <- err
			return
		}
		defer ns.Close()
		var conns []net.Conn
		defer func() {
			for _, x := range conns {
				x.Close()
			}
		}()
		err = func() error {
			lo, err := netlink.LinkByName("lo")
			if err != nil {
				return err
			}
			if err := netlink.LinkSetUp(lo); err != nil {
				return err
			}
			added := map[netip.Addr]bool{}
			for _, p := range pairs {
				for _, a := range []netip.Addr{p[0].Addr(), p[1].Addr()} {
					if added[a] {
						continue
					}
					added[a] = true
					addr := &netlink.Addr{IPNet: netlink.NewIPNet(a.AsSlice()), Flags: 0x02} // IFA_F_NODAD
					if err := netlink.AddrAdd(lo, addr); err != nil {
						return err
					}
				}
			}
			// IPv6 addresses get their local route from the kernel's
			// address work, after AddrAdd returns.
			for a := range added {
				for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
					rs, err := netlink.RouteGet(a.AsSlice())
					if err == nil && len(rs) > 0 && rs[0].Type == unix.RTN_LOCAL {
						break
					}
					if time.Now().After(deadline) {
						return fmt.Errorf("no local route to %s: %v %v", a, rs, err)
					}
				}
			}
			for _, p := range pairs {
				ln, err := net.ListenTCP("tcp", net.TCPAddrFromAddrPort(p[1]))
				if err != nil {
					return err
				}
				d := net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(p[0])}
				client, err := d.Dial("tcp", p[1].String())
				if err != nil {
					ln.Close()
					return err
				}
				server, err := ln.Accept()
				ln.Close()
				if err != nil {
					client.Close()
					return err
				}
				conns = append(conns, client, server)
			}
			return nil
		}()
		ready <- err
		if err != nil {
			return
		}
		for fn := range c.work {
			fn()
		}
	}()
	if err := <-ready; err != nil {
		tb.Fatalf("connections in a namespace: %v", err)
	}
	tb.Cleanup(func() { close(c.work) })
	return c
}

// Do runs fn on the namespace's thread and waits for it.
func (c *connNetns) Do(fn func()) {
	done := make(chan struct{})
	c.work <- func() { defer close(done); fn() }
	<-done
}
