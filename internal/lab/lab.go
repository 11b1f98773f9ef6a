// Package lab builds a throw-away three-namespace network for integration
// tests, demos and benchmarks: a server with one direct veth link to a client
// and one to an attacker. Everything lives in network namespaces the lab
// creates, so tests never send traffic to real networks.
//
//	client  to-server 198.18.1.2/24 2001:db8:1::2/64 ── to-client   198.18.1.1/24 2001:db8:1::1/64  server
//	attacker to-server 198.18.2.2/24 2001:db8:2::2/64 ── to-attacker 198.18.2.1/24 2001:db8:2::1/64  server
//
// The server routes the spoofed ranges 198.19.0.0/16 and 2001:db8:f00::/48
// to the attacker, and the attacker treats them as local (AnyIP routes), so
// replies to spoofed sources, such as SYN-ACKs, reach sockets and programs
// on the attacker side.
//
// New returns only when every link can carry traffic both ways, and an idle
// lab sends nothing (static neighbours, no DAD, no router solicitations, and
// the kernel's multicast listener reports dropped by an nftables table
// "lab_quiet" in each namespace), so tests may count packets exactly. Every
// veth end has GRO on, so test-run live frames are delivered; frames that a
// server's XDP program sends back with XDP_TX reach a client or attacker
// only while that end runs an XDP program too (Host.AttachPassXDP). The
// client and attacker ends have tx checksum offload off, so the server's
// XDP program sees complete checksums.
//
// Work inside a namespace with Host.Do (sockets, netlink, XDP attach by
// ifindex, BPF_PROG_TEST_RUN with an ingress ifindex) or run a program there
// with Host.Command.
package lab

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/moat-shield/moat/internal/netnsrun"
)

// ErrUnsupported is wrapped by New's error when the kernel lacks network
// namespaces or veth devices; NewT skips the test only in that case.
var ErrUnsupported = errors.New("network namespaces or veth devices not supported")

// netnsDir is where named namespaces are bind-mounted; it is the directory
// iproute2 uses, so `ip netns` and `nsenter --net` see the lab's namespaces.
const netnsDir = "/run/netns"

// Interface names are fixed because each veth end is created directly in its
// namespace: names only need to be unique there, never in the init namespace.
const (
	ifServerToClient   = "to-client"
	ifServerToAttacker = "to-attacker"
	ifToServer         = "to-server"
)

// Addressing plan, all from the benchmarking (RFC 2544) and documentation
// (RFC 3849) ranges.
var (
	serverClientV4   = netip.MustParsePrefix("198.18.1.1/24")
	clientV4         = netip.MustParsePrefix("198.18.1.2/24")
	serverClientV6   = netip.MustParsePrefix("2001:db8:1::1/64")
	clientV6         = netip.MustParsePrefix("2001:db8:1::2/64")
	serverAttackerV4 = netip.MustParsePrefix("198.18.2.1/24")
	attackerV4       = netip.MustParsePrefix("198.18.2.2/24")
	serverAttackerV6 = netip.MustParsePrefix("2001:db8:2::1/64")
	attackerV6       = netip.MustParsePrefix("2001:db8:2::2/64")

	// Source ranges the attacker may forge while still receiving the
	// replies; exposed as Lab.SpoofV4 and Lab.SpoofV6.
	spoofV4 = netip.MustParsePrefix("198.19.0.0/16")
	spoofV6 = netip.MustParsePrefix("2001:db8:f00::/48")
)

// Host is one network namespace of the lab.
type Host struct {
	Name   string  // namespace name, unique per lab
	NSPath string  // bind mount of the namespace, usable with nsenter --net=NSPath
	Ifaces []Iface // server: [to client, to attacker]; client and attacker: [to server]

	mu sync.Mutex
	ns netns.NsHandle // kept open so Do needs no path lookup; closed by Lab.Close
}

// Iface is one veth end and what is at the other end of the wire.
type Iface struct {
	Name     string
	Index    int // ifindex inside the host's namespace
	MAC      net.HardwareAddr
	IPv4     netip.Prefix // own address with the link's prefix length
	IPv6     netip.Prefix
	PeerMAC  net.HardwareAddr
	PeerIPv4 netip.Addr
	PeerIPv6 netip.Addr
}

// Lab is a server, a client and an attacker wired by two veth pairs.
type Lab struct {
	Server, Client, Attacker *Host
	SpoofV4, SpoofV6         netip.Prefix

	closeOnce sync.Once
	closeErr  error
}

var (
	prefixPattern = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,32}$`)
	notAlnum      = regexp.MustCompile(`[^A-Za-z0-9]`)
)

// New builds a lab whose namespaces are named PREFIX-RANDOM-{server,client,attacker}.
// On error it removes whatever it had created.
func New(prefix string) (*Lab, error) {
	if !prefixPattern.MatchString(prefix) {
		return nil, fmt.Errorf("lab: prefix %q must be 1-32 characters of [A-Za-z0-9_.-]", prefix)
	}
	var rnd [4]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		return nil, fmt.Errorf("lab: random suffix: %w", err)
	}
	base := prefix + "-" + hex.EncodeToString(rnd[:])

	l := &Lab{SpoofV4: spoofV4, SpoofV6: spoofV6}
	var err error
	for _, h := range []struct {
		dst  **Host
		role string
	}{{&l.Server, "server"}, {&l.Client, "client"}, {&l.Attacker, "attacker"}} {
		if *h.dst, err = newHost(base + "-" + h.role); err != nil {
			l.Close()
			return nil, err
		}
	}
	if err := l.wire(); err != nil {
		l.Close()
		return nil, err
	}
	return l, nil
}

// NewT builds a lab for a test and removes it when the test ends. It skips
// the test only if the kernel cannot provide namespaces or veth devices.
func NewT(t testing.TB) *Lab {
	t.Helper()
	prefix := notAlnum.ReplaceAllString(t.Name(), "")
	if len(prefix) > 16 {
		prefix = prefix[:16]
	}
	if prefix == "" {
		prefix = "lab"
	}
	l, err := New(prefix)
	if errors.Is(err, ErrUnsupported) {
		t.Skipf("lab: %v", err)
	}
	if err != nil {
		t.Fatalf("lab: %v", err)
	}
	t.Cleanup(func() {
		if err := l.Close(); err != nil {
			t.Errorf("lab: close: %v", err)
		}
	})
	return l
}

// hosts returns server, client and attacker, skipping any not yet created.
func (l *Lab) hosts() []*Host {
	var hs []*Host
	for _, h := range []*Host{l.Server, l.Client, l.Attacker} {
		if h != nil {
			hs = append(hs, h)
		}
	}
	return hs
}

// Close deletes the veth links and the namespaces. Links are deleted
// explicitly so they vanish even if a leaked socket or process keeps a
// namespace alive. It is safe to call more than once.
func (l *Lab) Close() error {
	l.closeOnce.Do(func() {
		var errs []error
		if l.Server != nil {
			if err := l.Server.deleteLinks(); err != nil {
				errs = append(errs, err)
			}
		}
		for _, h := range l.hosts() {
			if err := h.close(); err != nil {
				errs = append(errs, err)
			}
		}
		l.closeErr = errors.Join(errs...)
	})
	return l.closeErr
}

// sharedNetnsDir makes netnsDir a shared mount point, as `ip netns add`
// does before its first namespace: bound onto itself if it is not a mount
// point yet. Otherwise an `ip netns add` while a lab runs binds netnsDir
// onto itself above the lab's namespace mounts, whose copies the lab then
// unmounts while the mounts themselves stay, hidden: the namespaces and
// their files outlive the lab.
func sharedNetnsDir() error {
	if err := os.MkdirAll(netnsDir, 0o755); err != nil {
		return err
	}
	err := unix.Mount("", netnsDir, "none", unix.MS_SHARED|unix.MS_REC, "")
	if errors.Is(err, unix.EINVAL) { // not a mount point
		if err = unix.Mount(netnsDir, netnsDir, "none", unix.MS_BIND|unix.MS_REC, ""); err == nil {
			err = unix.Mount("", netnsDir, "none", unix.MS_SHARED|unix.MS_REC, "")
		}
	}
	if err != nil {
		return fmt.Errorf("make %s a shared mount point: %w", netnsDir, err)
	}
	return nil
}

// newHost creates a network namespace bind-mounted at netnsDir/name without
// moving the calling goroutine into it.
func newHost(name string) (*Host, error) {
	if err := sharedNetnsDir(); err != nil {
		return nil, fmt.Errorf("lab: %w", err)
	}
	nsPath := filepath.Join(netnsDir, name)
	// O_EXCL: a name clash must fail rather than hijack another lab.
	f, err := os.OpenFile(nsPath, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0o444)
	if err != nil {
		return nil, fmt.Errorf("lab: create %s: %w", nsPath, err)
	}
	f.Close()

	type result struct {
		ns  netns.NsHandle
		err error
	}
	done := make(chan result, 1)
	// The goroutine ends with its thread still locked and inside the new
	// namespace, so the runtime discards that thread instead of reusing it.
	go func() {
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS) {
				err = fmt.Errorf("%w: %w", ErrUnsupported, err)
			}
			done <- result{netns.None(), fmt.Errorf("unshare: %w", err)}
			return
		}
		self := fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid())
		if err := unix.Mount(self, nsPath, "", unix.MS_BIND, ""); err != nil {
			done <- result{netns.None(), fmt.Errorf("bind mount: %w", err)}
			return
		}
		ns, err := netns.Get()
		done <- result{ns, err}
	}()
	r := <-done
	if r.err != nil {
		unix.Unmount(nsPath, unix.MNT_DETACH)
		os.Remove(nsPath)
		return nil, fmt.Errorf("lab: create namespace %s: %w", name, r.err)
	}
	return &Host{Name: name, NSPath: nsPath, ns: r.ns}, nil
}

func (h *Host) close() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.ns.IsOpen() {
		h.ns.Close()
	}
	h.ns = netns.None()
	// EINVAL/ENOENT: not mounted (any more); the file may still be there.
	if err := unix.Unmount(h.NSPath, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("lab: unmount %s: %w", h.NSPath, err)
	}
	if err := os.Remove(h.NSPath); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("lab: remove %s: %w", h.NSPath, err)
	}
	return nil
}

// deleteLinks removes the server's veth ends, which also removes their peers.
func (h *Host) deleteLinks() error {
	nh, err := h.handle()
	if err != nil {
		return err
	}
	defer nh.Close()
	var errs []error
	for _, name := range []string{ifServerToClient, ifServerToAttacker} {
		link, err := nh.LinkByName(name)
		if err != nil {
			continue // never created or already gone
		}
		if err := nh.LinkDel(link); err != nil {
			errs = append(errs, fmt.Errorf("lab: delete %s in %s: %w", name, h.Name, err))
		}
	}
	return errors.Join(errs...)
}

// handle opens a netlink socket inside h's namespace.
func (h *Host) handle() (*netlink.Handle, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.ns.IsOpen() {
		return nil, fmt.Errorf("lab: host %s is closed", h.Name)
	}
	nh, err := netlink.NewHandleAt(h.ns)
	if err != nil {
		return nil, fmt.Errorf("lab: netlink in %s: %w", h.Name, err)
	}
	return nh, nil
}

// Do runs fn on a locked OS thread that is switched into h's network
// namespace (the mount namespace, and so /sys and bpffs, stay the host's).
// Sockets that fn creates stay in h's namespace after Do returns. Goroutines
// that fn starts run in the caller's namespace, not h's; use IP literals, as
// name resolution may start goroutines.
func (h *Host) Do(fn func() error) error {
	h.mu.Lock()
	target := h.ns
	if !target.IsOpen() {
		h.mu.Unlock()
		return fmt.Errorf("lab: host %s is closed", h.Name)
	}
	// Duplicate so a concurrent Close cannot invalidate the fd mid-switch.
	fd, err := unix.FcntlInt(uintptr(target), unix.F_DUPFD_CLOEXEC, 0)
	h.mu.Unlock()
	if err != nil {
		return fmt.Errorf("lab: dup namespace fd of %s: %w", h.Name, err)
	}
	target = netns.NsHandle(fd)
	defer target.Close()
	return netnsrun.In(target, fn)
}

// Command prepares (does not start) name with args in h's network namespace
// through nsenter --net. Unlike `ip netns exec` it keeps the host's /sys, so
// pins under /sys/fs/bpf remain visible to the program.
func (h *Host) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, "nsenter", append([]string{"--net=" + h.NSPath, "--", name}, args...)...)
}

// wire creates both veth pairs directly in their namespaces and configures
// addresses, neighbours, routes and offloads.
func (l *Lab) wire() error {
	for _, h := range l.hosts() {
		if err := h.Do(tuneSysctls); err != nil {
			return err
		}
		if err := h.silenceIPv6Chatter(); err != nil {
			return err
		}
	}
	links := []struct {
		far            *Host
		nearName       string
		nearV4, nearV6 netip.Prefix
		farV4, farV6   netip.Prefix
	}{
		{l.Client, ifServerToClient, serverClientV4, serverClientV6, clientV4, clientV6},
		{l.Attacker, ifServerToAttacker, serverAttackerV4, serverAttackerV6, attackerV4, attackerV6},
	}
	for _, lk := range links {
		near, far, err := l.Server.vethTo(lk.far, lk.nearName, ifToServer)
		if err != nil {
			return err
		}
		nearIf := Iface{Name: lk.nearName, IPv4: lk.nearV4, IPv6: lk.nearV6,
			PeerIPv4: lk.farV4.Addr(), PeerIPv6: lk.farV6.Addr()}
		farIf := Iface{Name: ifToServer, IPv4: lk.farV4, IPv6: lk.farV6,
			PeerIPv4: lk.nearV4.Addr(), PeerIPv6: lk.nearV6.Addr()}
		nearIf.Index, nearIf.MAC = near.Attrs().Index, near.Attrs().HardwareAddr
		farIf.Index, farIf.MAC = far.Attrs().Index, far.Attrs().HardwareAddr
		nearIf.PeerMAC, farIf.PeerMAC = farIf.MAC, nearIf.MAC
		l.Server.Ifaces = append(l.Server.Ifaces, nearIf)
		lk.far.Ifaces = append(lk.far.Ifaces, farIf)
	}
	for _, h := range l.hosts() {
		// Only the client and attacker send socket traffic that the server's
		// XDP program checks, so only they compute checksums in software.
		txCsum := h == l.Server
		if err := h.configure(txCsum); err != nil {
			return err
		}
	}
	if err := l.Server.routeSpoofedVia(l.Server.Ifaces[1]); err != nil {
		return err
	}
	if err := l.Attacker.acceptSpoofed(); err != nil {
		return err
	}
	for _, h := range l.hosts() {
		if err := h.waitReady(); err != nil {
			return err
		}
	}
	return nil
}

// readyTimeout bounds the wait for the kernel's deferred link and address
// work, which normally takes milliseconds but may lag under load.
const readyTimeout = 5 * time.Second

// waitReady waits until every interface of h can carry traffic both ways.
// Two pieces of the kernel's work finish after the netlink calls return:
//   - a veth end brought up before its peer gets carrier only when the peer
//     comes up, and the kernel swaps its "noop" qdisc, which drops every
//     packet, for a real one later, from a work queue;
//   - IPv6 addresses added before carrier get their local route only when
//     the address work runs after carrier, until then the host drops
//     packets sent to them.
func (h *Host) waitReady() error {
	nh, err := h.handle()
	if err != nil {
		return err
	}
	defer nh.Close()
	return h.Do(func() error {
		deadline := time.Now().Add(readyTimeout)
		for _, ifc := range h.Ifaces {
			for {
				ready, state, err := ifaceReady(nh, ifc)
				if err != nil {
					return fmt.Errorf("lab: state of %s in %s: %w", ifc.Name, h.Name, err)
				}
				if ready {
					break
				}
				if time.Now().After(deadline) {
					return fmt.Errorf("lab: %s in %s not ready after %v: %s", ifc.Name, h.Name, readyTimeout, state)
				}
				time.Sleep(time.Millisecond)
			}
		}
		return nil
	})
}

// ifaceReady checks ifc's transmit path and the routes to and from its
// addresses. It must run inside the interface's namespace (for txReady).
func ifaceReady(nh *netlink.Handle, ifc Iface) (bool, string, error) {
	ready, state, err := txReady(ifc.Index)
	if err != nil || !ready {
		return false, state, err
	}
	for _, c := range []struct {
		dst      netip.Addr
		wantType int
	}{
		{ifc.IPv4.Addr(), unix.RTN_LOCAL},
		{ifc.IPv6.Addr(), unix.RTN_LOCAL},
		{ifc.PeerIPv4, unix.RTN_UNICAST},
		{ifc.PeerIPv6, unix.RTN_UNICAST},
	} {
		routes, err := nh.RouteGet(net.IP(c.dst.AsSlice()))
		if err != nil {
			if errors.Is(err, unix.ENETUNREACH) || errors.Is(err, unix.EHOSTUNREACH) {
				return false, fmt.Sprintf("no route to %s yet", c.dst), nil
			}
			return false, "", err
		}
		if len(routes) == 0 || routes[0].Type != c.wantType {
			return false, fmt.Sprintf("route to %s: %v", c.dst, routes), nil
		}
	}
	return true, "", nil
}

// txReady reports whether the link with index (in the calling thread's
// namespace) is operationally up with a qdisc other than noop. The netlink
// package does not decode IFLA_QDISC, hence the raw request.
func txReady(index int) (bool, string, error) {
	req := nl.NewNetlinkRequest(unix.RTM_GETLINK, unix.NLM_F_ACK)
	msg := nl.NewIfInfomsg(unix.AF_UNSPEC)
	msg.Index = int32(index)
	req.AddData(msg)
	msgs, err := req.Execute(unix.NETLINK_ROUTE, unix.RTM_NEWLINK)
	if err != nil {
		return false, "", err
	}
	if len(msgs) != 1 || len(msgs[0]) < unix.SizeofIfInfomsg {
		return false, "", fmt.Errorf("unexpected RTM_GETLINK answer (%d messages)", len(msgs))
	}
	attrs, err := nl.ParseRouteAttr(msgs[0][unix.SizeofIfInfomsg:])
	if err != nil {
		return false, "", err
	}
	var qdisc string
	oper := uint8(netlink.OperUnknown)
	for _, a := range attrs {
		switch a.Attr.Type {
		case unix.IFLA_QDISC:
			qdisc = strings.TrimRight(string(a.Value), "\x00")
		case unix.IFLA_OPERSTATE:
			if len(a.Value) > 0 {
				oper = a.Value[0]
			}
		}
	}
	state := fmt.Sprintf("operstate %s, qdisc %q", netlink.LinkOperState(oper), qdisc)
	return netlink.LinkOperState(oper) == netlink.OperUp && qdisc != "" && qdisc != "noop", state, nil
}

// tuneSysctls runs inside a namespace before its links exist, so the
// defaults apply to them: addresses are usable at once without DAD, and
// there is no router discovery on links that have no router.
func tuneSysctls() error {
	for _, s := range []struct{ path, value string }{
		{"/proc/sys/net/ipv6/conf/all/accept_dad", "0"},
		{"/proc/sys/net/ipv6/conf/default/accept_dad", "0"},
		{"/proc/sys/net/ipv6/conf/all/accept_ra", "0"},
		{"/proc/sys/net/ipv6/conf/default/accept_ra", "0"},
		{"/proc/sys/net/ipv6/conf/all/router_solicitations", "0"},
		{"/proc/sys/net/ipv6/conf/default/router_solicitations", "0"},
	} {
		if err := os.WriteFile(s.path, []byte(s.value), 0); err != nil {
			if errors.Is(err, os.ErrNotExist) {
				continue // IPv6 disabled: address setup will report it
			}
			return fmt.Errorf("lab: sysctl %s: %w", s.path, err)
		}
	}
	return nil
}

// quietRuleset drops the multicast listener reports the kernel sends on its
// own for a second or so after a link comes up (their timing follows
// link-state events, so no sysctl or wait makes it deterministic). Without
// it, tests that count packets at the server see stray ICMPv6. It is an ip6
// output hook, so XDP-generated floods and IPv4 never cross it.
const quietRuleset = `table ip6 lab_quiet {
	chain output {
		type filter hook output priority 0; policy accept;
		icmpv6 type { mld-listener-report, mld2-listener-report, mld-listener-done, nd-router-solicit } drop
	}
}
`

// silenceIPv6Chatter installs quietRuleset in h. There is no nftables
// library among the module's dependencies, hence the nft program.
func (h *Host) silenceIPv6Chatter() error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cmd := h.Command(ctx, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(quietRuleset)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("lab: nft in %s: %w: %s", h.Name, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// vethTo creates a veth pair with one end named nearName in h and the other
// named farName in far, and returns both links as seen in their namespaces.
func (h *Host) vethTo(far *Host, nearName, farName string) (netlink.Link, netlink.Link, error) {
	nh, err := h.handle()
	if err != nil {
		return nil, nil, err
	}
	defer nh.Close()
	fh, err := far.handle()
	if err != nil {
		return nil, nil, err
	}
	defer fh.Close()

	far.mu.Lock()
	farFd := far.ns
	far.mu.Unlock()
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: nearName},
		PeerName:      farName,
		PeerNamespace: netlink.NsFd(farFd),
	}
	if err := nh.LinkAdd(veth); err != nil {
		if errors.Is(err, unix.EOPNOTSUPP) {
			return nil, nil, fmt.Errorf("lab: create veth %s: %w: %w", nearName, ErrUnsupported, err)
		}
		return nil, nil, fmt.Errorf("lab: create veth %s in %s: %w", nearName, h.Name, err)
	}
	near, err := nh.LinkByName(nearName)
	if err != nil {
		return nil, nil, fmt.Errorf("lab: find %s in %s: %w", nearName, h.Name, err)
	}
	farLink, err := fh.LinkByName(farName)
	if err != nil {
		return nil, nil, fmt.Errorf("lab: find %s in %s: %w", farName, far.Name, err)
	}
	return near, farLink, nil
}

// configure brings up loopback and every interface of h with its addresses,
// static neighbours and offload settings.
func (h *Host) configure(txCsum bool) error {
	nh, err := h.handle()
	if err != nil {
		return err
	}
	defer nh.Close()
	lo, err := nh.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("lab: loopback in %s: %w", h.Name, err)
	}
	if err := nh.LinkSetUp(lo); err != nil {
		return fmt.Errorf("lab: loopback up in %s: %w", h.Name, err)
	}
	for _, ifc := range h.Ifaces {
		link, err := nh.LinkByIndex(ifc.Index)
		if err != nil {
			return fmt.Errorf("lab: %s in %s: %w", ifc.Name, h.Name, err)
		}
		for _, p := range []netip.Prefix{ifc.IPv4, ifc.IPv6} {
			addr := &netlink.Addr{IPNet: prefixNet(p), Flags: unix.IFA_F_NODAD}
			if err := nh.AddrAdd(link, addr); err != nil {
				return fmt.Errorf("lab: add %s to %s in %s: %w", p, ifc.Name, h.Name, err)
			}
		}
		// Static entries: no ARP/NDP round trip before the first packet, and
		// no resolution traffic mixed into what tests count.
		for _, peer := range []netip.Addr{ifc.PeerIPv4, ifc.PeerIPv6} {
			family := netlink.FAMILY_V4
			if peer.Is6() {
				family = netlink.FAMILY_V6
			}
			neigh := &netlink.Neigh{
				LinkIndex:    ifc.Index,
				Family:       family,
				State:        netlink.NUD_PERMANENT,
				IP:           net.IP(peer.AsSlice()),
				HardwareAddr: ifc.PeerMAC,
			}
			if err := nh.NeighSet(neigh); err != nil {
				return fmt.Errorf("lab: neighbour %s on %s in %s: %w", peer, ifc.Name, h.Name, err)
			}
		}
		if err := nh.LinkSetUp(link); err != nil {
			return fmt.Errorf("lab: %s up in %s: %w", ifc.Name, h.Name, err)
		}
	}
	return h.Do(func() error {
		for _, ifc := range h.Ifaces {
			// GRO starts NAPI on the veth, without which test-run live
			// frames are never delivered.
			if err := setEthtoolFlag(ifc.Name, unix.ETHTOOL_GGRO, unix.ETHTOOL_SGRO, true); err != nil {
				return fmt.Errorf("lab: gro on %s in %s: %w", ifc.Name, h.Name, err)
			}
			if err := setEthtoolFlag(ifc.Name, unix.ETHTOOL_GTXCSUM, unix.ETHTOOL_STXCSUM, txCsum); err != nil {
				return fmt.Errorf("lab: tx checksum on %s in %s: %w", ifc.Name, h.Name, err)
			}
		}
		return nil
	})
}

// routeSpoofedVia sends replies for the spoofed ranges to the attacker.
func (h *Host) routeSpoofedVia(ifc Iface) error {
	nh, err := h.handle()
	if err != nil {
		return err
	}
	defer nh.Close()
	for _, r := range []struct {
		dst netip.Prefix
		gw  netip.Addr
	}{{spoofV4, ifc.PeerIPv4}, {spoofV6, ifc.PeerIPv6}} {
		route := &netlink.Route{LinkIndex: ifc.Index, Dst: prefixNet(r.dst), Gw: net.IP(r.gw.AsSlice())}
		if err := nh.RouteAdd(route); err != nil {
			return fmt.Errorf("lab: route %s via %s in %s: %w", r.dst, r.gw, h.Name, err)
		}
	}
	return nil
}

// acceptSpoofed adds local (AnyIP) routes for the spoofed ranges so the
// attacker's kernel delivers replies to them locally. IPv4 sockets can then
// bind any spoofed address; IPv6 sockets need IPV6_FREEBIND.
func (h *Host) acceptSpoofed() error {
	nh, err := h.handle()
	if err != nil {
		return err
	}
	defer nh.Close()
	lo, err := nh.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("lab: loopback in %s: %w", h.Name, err)
	}
	for _, p := range []netip.Prefix{spoofV4, spoofV6} {
		route := &netlink.Route{
			LinkIndex: lo.Attrs().Index,
			Dst:       prefixNet(p),
			Type:      unix.RTN_LOCAL,
			Table:     unix.RT_TABLE_LOCAL,
			Scope:     netlink.SCOPE_HOST,
		}
		if err := nh.RouteAdd(route); err != nil {
			return fmt.Errorf("lab: local route %s in %s: %w", p, h.Name, err)
		}
	}
	return nil
}

func prefixNet(p netip.Prefix) *net.IPNet {
	bits := 32
	if p.Addr().Is6() {
		bits = 128
	}
	return &net.IPNet{IP: net.IP(p.Addr().AsSlice()), Mask: net.CIDRMask(p.Bits(), bits)}
}
