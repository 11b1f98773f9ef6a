package cli_test

import (
	"errors"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/moat-shield/moat/internal/lab"
)

// TestLabGenericModeBigTCP: in generic mode the filter judges the stack's
// aggregates, which BIG TCP lets grow past 64 KiB: IPv6 jumbograms
// (payload length 0 before a hop-by-hop header) and IPv4 datagrams of
// total length 0. A bulk transfer in each family reaches the server
// whole, the filter counts nothing malformed, and what it passed averages
// more than 64 KiB a packet: the aggregates were there to judge.
func TestLabGenericModeBigTCP(t *testing.T) {
	t.Parallel()
	sl := newShieldLab(t)
	toClient, _ := sl.ifaces()
	const bigTCP = 185000
	for _, end := range []struct {
		h    *lab.Host
		name string
	}{{sl.lab.Client, sl.lab.Client.Ifaces[0].Name}, {sl.lab.Server, toClient}} {
		err := end.h.Do(func() error {
			l, err := netlink.LinkByName(end.name)
			if err != nil {
				return err
			}
			return errors.Join(netlink.LinkSetGSOMaxSize(l, bigTCP), netlink.LinkSetGROMaxSize(l, bigTCP),
				netlink.LinkSetGSOIPv4MaxSize(l, bigTCP), netlink.LinkSetGROIPv4MaxSize(l, bigTCP))
		})
		if err != nil {
			t.Fatalf("turn on BIG TCP on %s: %v", end.name, err)
		}
	}
	if err := sl.lab.Client.OffloadSegmentation(sl.lab.Client.Ifaces[0].Name); err != nil {
		t.Fatal(err)
	}
	sl.mustMoat("attach", "--mode", "generic", toClient)

	const size = 32 << 20
	for _, v6 := range []bool{true, false} {
		name := "ipv4"
		if v6 {
			name = "ipv6"
		}
		t.Run(name, func(t *testing.T) {
			sl.t = t
			before := sl.stats()[toClient]
			got, err := sl.bulkTransfer(v6, size)
			if err != nil || got != size {
				t.Errorf("the server received %d of %d bytes: %v", got, size, err)
			}
			after := sl.stats()[toClient]
			if n := after.ByReason["malformed"].Dropped.Packets - before.ByReason["malformed"].Dropped.Packets; n != 0 {
				t.Errorf("%d packets of the transfer dropped as malformed", n)
			}
			packets := after.Passed.Packets - before.Passed.Packets
			bytes := after.Passed.Bytes - before.Passed.Bytes
			if packets == 0 || bytes/packets <= 0xffff {
				t.Errorf("passed %d packets of %d bytes: no aggregates past 64 KiB to judge", packets, bytes)
			}
		})
	}
}

// bulkTransfer sends size bytes from the client to a sink in the server's
// namespace and returns how many the sink read.
func (sl *shieldLab) bulkTransfer(v6 bool, size int) (int64, error) {
	var ln net.Listener
	err := sl.lab.Server.Do(func() (err error) {
		ln, err = net.Listen("tcp", "[::]:0")
		return err
	})
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	read := make(chan int64, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			read <- 0
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(30 * time.Second))
		n, _ := io.Copy(io.Discard, c)
		read <- n
	}()
	dst := netip.AddrPortFrom(sl.serverAddr(sl.lab.Client, v6), uint16(ln.Addr().(*net.TCPAddr).Port))
	err = sl.lab.Client.Do(func() error {
		c, err := net.DialTimeout("tcp", dst.String(), passWait)
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(30 * time.Second))
		if _, err := c.Write(make([]byte, size)); err != nil {
			return err
		}
		return c.(*net.TCPConn).CloseWrite()
	})
	if err != nil {
		ln.Close()
	}
	return <-read, err
}
