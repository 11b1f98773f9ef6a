package cli

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/moat-shield/moat/internal/capture"
)

func init() {
	extraCommands = append(extraCommands, newDumpCmd)
}

// dumpFlags are moat dump's options as given.
type dumpFlags struct {
	iface, out, verdict, host, net, proto, port string
	count                                       uint64
	snaplen, sample                             uint32
}

// filter turns the flags into a capture filter; errors are usage errors.
func (d *dumpFlags) filter(cmd *cobra.Command) (capture.Filter, error) {
	var f capture.Filter
	var err error
	if f.Verdicts, err = capture.ParseVerdicts(d.verdict); err != nil {
		return f, &usageError{err}
	}
	if d.host != "" && d.net != "" {
		return f, usagef("give --host or --net, not both")
	}
	if d.host != "" {
		a, err := netip.ParseAddr(d.host)
		if err != nil {
			return f, usagef("--host %q: not an IP address", d.host)
		}
		a = a.Unmap()
		f.Prefix = netip.PrefixFrom(a, a.BitLen())
	}
	if d.net != "" {
		p, err := netip.ParsePrefix(d.net)
		if err != nil {
			return f, usagef("--net %q: not a prefix such as 198.51.100.0/24", d.net)
		}
		// Shorter, an IPv4-mapped prefix would cover IPv6 addresses that
		// are not mapped.
		if p.Addr().Is4In6() && p.Bits() < 96 {
			return f, usagef("--net %q: an IPv4-mapped prefix must be /96 or longer", d.net)
		}
		// Refused as block refuses it: 10.0.0.1/8 is more likely a typo
		// than a way to write 10.0.0.0/8.
		if p.Masked() != p {
			return f, usagef("--net %q: host bits set (did you mean %s?)", d.net, p.Masked())
		}
		if p.Addr().Is4In6() {
			p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
		}
		f.Prefix = p
	}
	if d.proto != "" {
		if f.Proto, err = capture.ParseProto(d.proto); err != nil {
			return f, &usageError{err}
		}
	}
	if cmd.Flags().Changed("port") {
		n, err := strconv.ParseUint(d.port, 10, 16)
		if err != nil || n == 0 {
			return f, usagef("invalid --port %q: want 1-65535", d.port)
		}
		f.Port, f.HasPort = uint16(n), true
	}
	if cmd.Flags().Changed("snaplen") && (d.snaplen == 0 || d.snaplen > capture.MaxSnaplen) {
		return f, usagef("--snaplen must be 1..%d", capture.MaxSnaplen)
	}
	f.Snaplen = d.snaplen
	if cmd.Flags().Changed("sample") && d.sample == 0 {
		return f, usagef("--sample must be at least 1")
	}
	f.Sample = d.sample
	if err := f.Validate(); err != nil {
		return f, &usageError{err}
	}
	return f, nil
}

func newDumpCmd(g *globals) *cobra.Command {
	var d dumpFlags
	cmd := &cobra.Command{
		Use:   "dump [-i IFACE] [-w FILE|-] [--verdict drop|pass|all] [--host ADDR | --net CIDR] [--proto P] [--port N] [-c COUNT] [-s SNAPLEN] [--sample N]",
		Short: "Capture packets with their verdicts to a pcapng file",
		Long: "Copies packets from moat's data path, as it decides on them, into pcapng that tcpdump, tshark " +
			"and Wireshark read. Each packet carries a comment with its verdict, the reason and the rule " +
			"(\"moat: drop denylist rule=198.51.100.0/24\"; in tshark: -e frame.comment). Packets that do " +
			"not fit in the kernel's ring buffer are counted and reported, on stderr while running and at the " +
			"end. --host, --net and --port match the source or the destination. One dump runs at a time; " +
			"capture stops when it exits, and within a few seconds if it is killed.",
		Args: args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error { return runDump(cmd, g, &d) },
	}
	fl := cmd.Flags()
	fl.StringVarP(&d.iface, "interface", "i", "", "capture on this interface only (default: every interface moat is attached to)")
	fl.StringVarP(&d.out, "write", "w", "-", "pcapng file to write, - for stdout")
	fl.StringVar(&d.verdict, "verdict", "all", "drop, pass or all (pass also selects SYN-ACKs that moat answered with a cookie, written as tx; drop also selects what monitor mode passed, written as monitored)")
	fl.StringVar(&d.host, "host", "", "only packets from or to this address")
	fl.StringVar(&d.net, "net", "", "only packets from or to this prefix")
	fl.StringVar(&d.proto, "proto", "", "only this protocol: tcp, udp, icmp or icmpv6")
	fl.StringVar(&d.port, "port", "", "only TCP or UDP packets from or to this port (1-65535)")
	fl.Uint64VarP(&d.count, "count", "c", 0, "stop after this many packets (0: until interrupted)")
	fl.Uint32VarP(&d.snaplen, "snaplen", "s", 0, fmt.Sprintf("bytes kept of each packet (default and maximum %d)", capture.MaxSnaplen))
	fl.Uint32Var(&d.sample, "sample", 1, "keep one in N matching packets (counted per CPU)")
	return cmd
}

func runDump(cmd *cobra.Command, g *globals, d *dumpFlags) error {
	f, err := d.filter(cmd)
	if err != nil {
		return err
	}
	stderr := cmd.ErrOrStderr()
	var out io.Writer
	var outFile *os.File
	if d.out == "-" {
		if writesToTerminal(cmd.OutOrStdout()) {
			return usagef("will not write pcapng to a terminal: give -w FILE, or pipe into e.g. tshark -r -")
		}
		out = cmd.OutOrStdout()
	}

	// A daemon's config bounds every capture on its host.
	limits, err := g.daemonCaptureLimits()
	if err != nil {
		return err
	}
	var rateCap uint32
	if limits != nil {
		if !limits.Enabled {
			return usagef("captures are turned off in the moat daemon's config (capture.enabled)")
		}
		if limits.MaxSnaplen != 0 && (f.Snaplen == 0 || f.Snaplen > limits.MaxSnaplen) {
			if f.Snaplen > limits.MaxSnaplen {
				fmt.Fprintf(stderr, "moat dump: snaplen lowered to %d by the daemon's config\n", limits.MaxSnaplen)
			}
			f.Snaplen = min(limits.MaxSnaplen, capture.MaxSnaplen)
		}
		rateCap = limits.MaxRate
	}

	s, err := g.openExistingAsIs()
	if err != nil {
		return err
	}
	atts, err := s.Attachments()
	if err != nil {
		s.Close()
		return err
	}
	where := "every interface moat is attached to"
	if d.iface != "" {
		ifc, err := net.InterfaceByName(d.iface)
		if err != nil {
			s.Close()
			return usagef("no interface %q", d.iface)
		}
		attached := false
		for _, a := range atts {
			attached = attached || a.Iface == d.iface
		}
		if !attached {
			s.Close()
			return usagef("moat is not attached to %s: nothing to capture there", d.iface)
		}
		f.Ifindex, where = ifc.Index, d.iface
	} else if len(atts) == 0 {
		s.Close()
		return usagef("moat is not attached to any interface: nothing to capture")
	}
	// The file's interfaces, each declared up front.
	ifindexes := []int{f.Ifindex}
	if f.Ifindex == 0 {
		ifindexes = nil
		for _, a := range atts {
			if a.Present {
				ifindexes = append(ifindexes, a.Ifindex)
			}
		}
	}
	// The capture holds handles of its own: the state's lock is released
	// before capturing, so other commands (and the daemon) keep working.
	maps, err := capture.PinnedMaps(s)
	s.Close()
	if err != nil {
		return err
	}

	// Signals end the capture cleanly. SIGPIPE too: a reader that goes
	// away (tshark -c N) turns into a write error instead of killing
	// moat with capture still on.
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGPIPE)
	defer signal.Stop(sig)

	sess, err := capture.Start(maps, f, capture.LockPath(g.root))
	if err != nil {
		maps.Close()
		if errors.Is(err, capture.ErrBusy) {
			return usagef("%v", err)
		}
		return err
	}
	defer sess.Close()
	// Only once the session is ours: a refused dump must not truncate the
	// file, which may be the running dump's.
	if d.out != "-" {
		if outFile, err = os.Create(d.out); err != nil {
			return &usageError{err}
		}
		defer outFile.Close()
		out = outFile
	}

	snap := f.Snaplen
	if snap == 0 {
		snap = capture.MaxSnaplen
	}
	w, err := capture.NewPcapngWriter(out, snap, ifindexes, ifaceName)
	if err != nil {
		return err
	}
	fmt.Fprintf(stderr, "moat dump: capturing on %s (%s), snaplen %d; interrupt to stop\n", where, describeFilter(d, f), snap)

	portRules := capture.PortRuleNames(maps.PortRuleDefs)
	comment := newCommentCache(portRules).get
	var (
		captured, lostShown, lapsesShown uint64
		lastFlush, lastReport            = time.Now(), time.Now()
		writeErr                         error
		// rateCap: packets written per second at most; the rest of each
		// second's packets are read from the ring and counted, not kept.
		windowStart        = time.Now()
		inWindow, overRate uint64
		overRateShown      uint64
	)
	report := func() {
		lost, _ := sess.Lost()
		if lost != lostShown {
			fmt.Fprintf(stderr, "moat dump: %d packets captured, %d lost so far (ring buffer full)\n", captured, lost)
			lostShown = lost
		}
		if overRate != overRateShown {
			fmt.Fprintf(stderr, "moat dump: %d packets skipped over the daemon's capture.max_rate of %d/s\n", overRate, rateCap)
			overRateShown = overRate
		}
		if l := sess.Lapses(); l != lapsesShown {
			fmt.Fprintln(stderr, "moat dump: capture lapsed (this process was stopped or starved for seconds); packets went uncaptured")
			lapsesShown = l
		}
	}
loop:
	for d.count == 0 || captured < d.count {
		select {
		case s := <-sig:
			if s == syscall.SIGPIPE {
				writeErr = syscall.EPIPE
			}
			break loop
		default:
		}
		p, err := sess.Next(time.Now().Add(200 * time.Millisecond))
		now := time.Now()
		switch {
		case errors.Is(err, capture.ErrTimeout):
		case err != nil:
			return err
		default:
			if now.Sub(windowStart) >= time.Second {
				windowStart, inWindow = now, 0
			}
			if rateCap != 0 && inWindow >= uint64(rateCap) {
				overRate++
				break
			}
			inWindow++
			if writeErr = w.WritePacket(p, comment(p)); writeErr != nil {
				break loop
			}
			captured++
		}
		// Readers on a pipe see packets within about 100 ms.
		if now.Sub(lastFlush) >= 100*time.Millisecond || err != nil {
			if writeErr = w.Flush(); writeErr != nil {
				break loop
			}
			lastFlush = now
		}
		if now.Sub(lastReport) >= time.Second {
			report()
			lastReport = now
		}
	}
	// Off first, so that what follows costs the data path nothing.
	closeErr := sess.Close()
	lost, lostErr := sess.Lost()
	if lostErr != nil {
		lost = lostShown
	}
	if writeErr == nil {
		writeErr = w.WriteStats(fmt.Sprintf("moat: %d packets captured, %d lost (ring buffer full)", captured, lost))
	}
	if writeErr == nil {
		writeErr = w.Flush()
	}
	fmt.Fprintf(stderr, "moat dump: %d packets captured\nmoat dump: %d packets lost (ring buffer full)\n", captured, lost)
	if outFile != nil && writeErr == nil {
		writeErr = outFile.Close()
	}
	if errors.Is(writeErr, syscall.EPIPE) {
		writeErr = nil // the reader had enough
	}
	if writeErr != nil {
		return fmt.Errorf("write %s: %w", d.out, writeErr)
	}
	return closeErr
}

func describeFilter(d *dumpFlags, f capture.Filter) string {
	parts := []string{"verdict " + d.verdict}
	if f.Prefix.IsValid() {
		parts = append(parts, "address "+f.Prefix.String())
	}
	if d.proto != "" {
		parts = append(parts, "proto "+d.proto)
	}
	if f.HasPort {
		parts = append(parts, fmt.Sprintf("port %d", f.Port))
	}
	if f.Sample > 1 {
		parts = append(parts, fmt.Sprintf("1 in %d", f.Sample))
	}
	return strings.Join(parts, ", ")
}

// ifaceName names an interface for the pcapng file, "" if it is gone.
func ifaceName(ifindex int) string {
	if ifc, err := net.InterfaceByIndex(ifindex); err == nil {
		return ifc.Name
	}
	return ""
}

// writesToTerminal says whether w is a terminal, where pcapng is garbage.
func writesToTerminal(w io.Writer) bool {
	f, ok := w.(interface{ Fd() uintptr })
	if !ok {
		return false
	}
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// commentCache formats each packet comment once: a flood repeats a
// handful of them.
type commentCache struct {
	portRules func(uint16) string
	comments  map[commentKey]string
}

// commentKey is what a comment says: every field capture.Comment reads.
type commentKey struct {
	action    uint8
	monitored bool
	reason    uint8
	rule      netip.Prefix
	portRule  uint16
}

func newCommentCache(portRules func(uint16) string) *commentCache {
	return &commentCache{portRules: portRules, comments: map[commentKey]string{}}
}

func (cc *commentCache) get(p capture.Packet) string {
	k := commentKey{p.Action, p.Monitored, uint8(p.Reason), p.Rule, p.PortRule}
	c, ok := cc.comments[k]
	if !ok {
		c = capture.Comment(p, cc.portRules)
		if len(cc.comments) > 4096 { // a spread of rules: start over
			clear(cc.comments)
		}
		cc.comments[k] = c
	}
	return c
}
