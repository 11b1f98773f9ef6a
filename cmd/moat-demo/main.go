// Command moat-demo shows moat at work in a throw-away lab: a server, a
// legitimate client and an attacker in network namespaces. Part one sends
// the same traffic twice, without and with moat's filter, and prints what
// got through; part two (synflood.go) floods a TCP port with spoofed SYNs
// while the client keeps connecting, with the kernel alone and then with
// moat's SYN cookies. Everything is torn down at the end, or on failure.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/moat-shield/moat/internal/flood"
	"github.com/moat-shield/moat/internal/lab"
)

const (
	tcpPort   = 8080
	udpPort   = 5353
	conns     = 20
	datagrams = 200
)

func main() {
	floodCount := flag.Uint64("flood", 500_000, "packets in the spoofed UDP flood")
	synFor := flag.Duration("syn-flood", 5*time.Second, "length of each spoofed SYN flood round")
	flag.Parse()
	// An interrupt cancels the run instead of killing it, so the deferred
	// teardown (namespaces, XDP programs, pins) still runs.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *floodCount, *synFor); err != nil {
		stop()
		fmt.Fprintf(os.Stderr, "moat-demo: %v\n", err)
		os.Exit(1)
	}
}

// received counts what the server's sockets saw, by sender.
type received struct {
	udpClient, udpAttacker, udpSpoofed atomic.Uint64
	tcpClient, tcpAttacker             atomic.Uint64
}

type round struct {
	clientTCP, attackerTCP int
	udpClient, udpAttacker uint64
	udpSpoofed, floodSent  uint64
}

func run(ctx context.Context, floodCount uint64, synFor time.Duration) error {
	if os.Geteuid() != 0 {
		return errors.New("the demo needs root (network namespaces, XDP)")
	}
	moat, err := moatBinary()
	if err != nil {
		return err
	}
	fmt.Println("== building the lab: server, client and attacker namespaces joined by veth pairs")
	l, err := lab.New("mdemo")
	if err != nil {
		return err
	}
	defer l.Close()
	root := fmt.Sprintf("/sys/fs/bpf/moat-demo-%d", os.Getpid())
	defer removeRoot(root)

	srv, cli, att := l.Server, l.Client, l.Attacker
	fmt.Printf("   server %s (%s, %s), client %s, attacker %s, spoofed sources %s\n",
		srv.Ifaces[0].IPv4.Addr(), srv.Ifaces[0].Name, srv.Ifaces[1].Name,
		cli.Ifaces[0].IPv4.Addr(), att.Ifaces[0].IPv4.Addr(), l.SpoofV4)

	var got received
	stop, err := serve(l, &got)
	if err != nil {
		return err
	}
	defer stop()

	moatCmd := moatIn(srv, moat, root)

	fmt.Println("\n== round 1: no protection")
	before, err := traffic(ctx, l, &got, floodCount)
	if err != nil {
		return err
	}

	fmt.Println("\n== attaching moat to both server interfaces and blocking the attacker")
	steps := [][]string{
		{"attach", srv.Ifaces[0].Name, srv.Ifaces[1].Name},
		{"block", att.Ifaces[0].IPv4.Addr().String(), att.Ifaces[0].IPv6.Addr().String(), "--comment", "attacker host"},
		{"block", l.SpoofV4.String(), l.SpoofV6.String(), "--ttl", "1h", "--comment", "spoofed flood range"},
		{"port", "drop", "udp/19", "udp/1900"},
	}
	for _, s := range steps {
		if err := moatCmd(s...); err != nil {
			return err
		}
	}

	fmt.Println("\n== round 2: with moat")
	after, err := traffic(ctx, l, &got, floodCount)
	if err != nil {
		return err
	}

	fmt.Println("\n== what reached the server")
	w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "traffic\twithout moat\twith moat\t")
	row := func(name string, a, b uint64, total uint64) {
		fmt.Fprintf(w, "%s\t%d/%d\t%d/%d\t\n", name, a, total, b, total)
	}
	row("client TCP connections", uint64(before.clientTCP), uint64(after.clientTCP), conns)
	row("client UDP datagrams", before.udpClient, after.udpClient, datagrams)
	row("attacker TCP connections", uint64(before.attackerTCP), uint64(after.attackerTCP), conns)
	row("attacker UDP datagrams", before.udpAttacker, after.udpAttacker, datagrams)
	fmt.Fprintf(w, "spoofed UDP flood from %s\t%d/%d\t%d/%d\t\n", l.SpoofV4, before.udpSpoofed, before.floodSent, after.udpSpoofed, after.floodSent)
	w.Flush()
	fmt.Println("   (without moat the flood also overflows the server's socket buffer, so not every flood packet is read)")

	fmt.Println("\n== moat's view")
	if err := moatCmd("stats"); err != nil {
		return err
	}
	if err := moatCmd("list"); err != nil {
		return err
	}

	fmt.Println("\n== tearing down")
	if err := moatCmd("detach", "--all"); err != nil {
		return err
	}
	if after.clientTCP != conns || after.udpClient != datagrams || after.attackerTCP != 0 || after.udpAttacker != 0 || after.udpSpoofed != 0 {
		return errors.New("moat did not behave as the demo expects (see the table above)")
	}
	fmt.Println("done: the client was served, the attacker and the flood were dropped in XDP.")

	// Part two gets its own pin root: part one's detach removed its own.
	synRoot := root + "-syn"
	defer removeRoot(synRoot)
	return synFloodPart(ctx, l, moat, synRoot, synFor)
}

// moatIn returns a function that runs the moat CLI in h's namespace with
// its pins under root, echoing the command and its output.
func moatIn(h *lab.Host, bin, root string) func(args ...string) error {
	return func(args ...string) error {
		_, err := moatOutput(h, bin, root, true, args...)
		return err
	}
}

// moatOutput runs the moat CLI in h's namespace and returns its combined
// output, echoing the command and the output when echo is set.
func moatOutput(h *lab.Host, bin, root string, echo bool, args ...string) ([]byte, error) {
	cmd := h.Command(context.Background(), bin, append([]string{"--root", root}, args...)...)
	out, err := cmd.CombinedOutput()
	if echo {
		fmt.Printf("   $ moat %s\n", strings.Join(args, " "))
		for _, line := range strings.Split(strings.TrimRight(string(out), "\n"), "\n") {
			if line != "" {
				fmt.Printf("     %s\n", line)
			}
		}
	}
	if err != nil {
		return out, fmt.Errorf("moat %s: %v", strings.Join(args, " "), err)
	}
	return out, nil
}

// moatBinary finds the moat CLI next to this program, or on the PATH.
func moatBinary() (string, error) {
	if exe, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(exe), "moat")
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	if p, err := exec.LookPath("moat"); err == nil {
		return p, nil
	}
	return "", errors.New("cannot find the moat binary: run `make demo`, which builds bin/moat beside bin/moat-demo")
}

// serve starts a TCP echo server and a UDP sink in the server namespace.
func serve(l *lab.Lab, got *received) (func(), error) {
	var ln net.Listener
	var pc net.PacketConn
	err := l.Server.Do(func() error {
		var err error
		if ln, err = net.Listen("tcp", fmt.Sprintf(":%d", tcpPort)); err != nil {
			return err
		}
		pc, err = net.ListenPacket("udp", fmt.Sprintf(":%d", udpPort))
		return err
	})
	if err != nil {
		return nil, err
	}
	clientNet := l.Client.Ifaces[0].IPv4.Masked()
	attacker := l.Attacker.Ifaces[0].IPv4.Addr()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			from := c.RemoteAddr().(*net.TCPAddr).AddrPort().Addr().Unmap()
			switch {
			case clientNet.Contains(from):
				got.tcpClient.Add(1)
			case from == attacker:
				got.tcpAttacker.Add(1)
			}
			go func() { io.Copy(c, c); c.Close() }()
		}
	}()
	go func() {
		buf := make([]byte, 2048)
		for {
			_, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			a := from.(*net.UDPAddr).AddrPort().Addr().Unmap()
			switch {
			case clientNet.Contains(a):
				got.udpClient.Add(1)
			case a == attacker:
				got.udpAttacker.Add(1)
			case l.SpoofV4.Contains(a):
				got.udpSpoofed.Add(1)
			}
		}
	}()
	return func() { ln.Close(); pc.Close() }, nil
}

// traffic sends one round: TCP connections and datagrams from the client
// and the attacker, then a spoofed UDP flood from the attacker.
func traffic(ctx context.Context, l *lab.Lab, got *received, floodCount uint64) (round, error) {
	var r round
	base := struct{ tc, ta, uc, ua, us uint64 }{got.tcpClient.Load(), got.tcpAttacker.Load(), got.udpClient.Load(), got.udpAttacker.Load(), got.udpSpoofed.Load()}
	dst := l.Server.Ifaces[0].IPv4.Addr()
	dstAtt := l.Server.Ifaces[1].IPv4.Addr()

	var err error
	if r.clientTCP, err = connects(l.Client, dst); err != nil {
		return r, err
	}
	if r.attackerTCP, err = connects(l.Attacker, dstAtt); err != nil {
		return r, err
	}
	if err := sendDatagrams(l.Client, dst); err != nil {
		return r, err
	}
	if err := sendDatagrams(l.Attacker, dstAtt); err != nil {
		return r, err
	}
	fmt.Printf("   client and attacker: %d TCP connections and %d UDP datagrams each\n", conns, datagrams)

	att := l.Attacker.Ifaces[0]
	var res flood.Result
	err = l.Attacker.Do(func() error {
		var err error
		res, err = flood.Run(ctx, flood.Config{
			Kind: flood.KindUDP, IfIndex: att.Index, DstMAC: att.PeerMAC,
			Sources: l.SpoofV4, Dst: dstAtt, DstPort: udpPort, Count: floodCount,
			Force: true, // the demo built this namespace itself
		})
		return err
	})
	if err != nil {
		return r, fmt.Errorf("flood: %w", err)
	}
	fmt.Printf("   attacker: spoofed UDP flood of %d packets from %s at %.2f Mpps\n", res.Sent, l.SpoofV4, res.PPS/1e6)
	r.floodSent = res.Sent
	time.Sleep(300 * time.Millisecond) // let the sockets drain

	r.udpClient = got.udpClient.Load() - base.uc
	r.udpAttacker = got.udpAttacker.Load() - base.ua
	r.udpSpoofed = got.udpSpoofed.Load() - base.us
	return r, nil
}

// connects opens conns TCP connections at once from h to dst, each echoing
// a line, and returns how many succeeded within a second.
func connects(h *lab.Host, dst netip.Addr) (int, error) {
	var ok atomic.Int64
	var wg sync.WaitGroup
	d := net.Dialer{Timeout: time.Second}
	for i := 0; i < conns; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Dial in the namespace; the socket stays there, so the
			// exchange can run on any thread.
			var c net.Conn
			err := h.Do(func() error {
				var err error
				c, err = d.Dial("tcp", netip.AddrPortFrom(dst, tcpPort).String())
				return err
			})
			if err != nil {
				return
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(time.Second))
			if _, err := c.Write([]byte("hello\n")); err != nil {
				return
			}
			buf := make([]byte, 6)
			if _, err := io.ReadFull(c, buf); err == nil && string(buf) == "hello\n" {
				ok.Add(1)
			}
		}()
	}
	wg.Wait()
	return int(ok.Load()), nil
}

func sendDatagrams(h *lab.Host, dst netip.Addr) error {
	return h.Do(func() error {
		c, err := net.Dial("udp", netip.AddrPortFrom(dst, udpPort).String())
		if err != nil {
			return err
		}
		defer c.Close()
		for i := 0; i < datagrams; i++ {
			if _, err := c.Write([]byte("datagram")); err != nil {
				return err
			}
			if i%50 == 49 {
				time.Sleep(time.Millisecond) // stay below the socket buffer
			}
		}
		return nil
	})
}

// removeRoot removes a pin root of the demo's own and the lock files that
// moat's commands left for it in /run (the state's and the capture's):
// the root is gone, so is the need for its locks.
func removeRoot(root string) {
	os.RemoveAll(root)
	locks, _ := filepath.Glob("/run/moat-*-" + filepath.Base(root) + ".lock")
	for _, l := range locks {
		os.Remove(l)
	}
}
