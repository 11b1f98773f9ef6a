package cli

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/moat-shield/moat/internal/flood"
)

func init() {
	extraCommands = append(extraCommands, func(*globals) *cobra.Command { return newFloodCmd() })
}

// newFloodCmd is the lab traffic generator.
func newFloodCmd() *cobra.Command {
	var (
		kind, iface, nsName, dstMAC, srcMAC, dst, src, sni string
		dstPort, vlan                                      uint16
		size, threads                                      int
		count, rate                                        uint64
		duration                                           time.Duration
		sequential, pin, background, force, asJSON         bool
	)
	kinds := make([]string, len(flood.Kinds))
	for i, k := range flood.Kinds {
		kinds[i] = string(k)
	}
	cmd := &cobra.Command{
		Use:   "flood --kind KIND --interface IFACE --dst-mac MAC --dst IP --src CIDR [flags]",
		Short: "Send a spoofed flood out of a lab veth (a test tool; refuses real interfaces)",
		Long: "Sends a flood generated in the kernel (XDP live frames) out of IFACE, which must be a veth " +
			"outside the initial network namespace unless --force. Kinds: " + strings.Join(kinds, ", ") + ". " +
			"Without --count or --duration it runs until interrupted.",
		Args: args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg := flood.Config{
				Kind: flood.Kind(kind), DstPort: dstPort, Sequential: sequential,
				PayloadSize: size, ServerName: sni, VLAN: vlan,
				Count: count, Duration: duration, Rate: rate, Threads: threads,
				PinCPUs: pin, Background: background, Force: force,
			}
			if iface == "" {
				return usagef("flood: --interface is required")
			}
			var err error
			if cfg.DstMAC, err = parseMAC("--dst-mac", dstMAC); err != nil {
				return err
			}
			if srcMAC != "" {
				if cfg.SrcMAC, err = parseMAC("--src-mac", srcMAC); err != nil {
					return err
				}
			}
			if dst == "" {
				return usagef("flood: --dst is required")
			}
			if cfg.Dst, err = netip.ParseAddr(dst); err != nil {
				return usagef("flood: --dst: %v", err)
			}
			if cfg.Sources, err = parseSources(src); err != nil {
				return err
			}
			if threads < 1 {
				return usagef("flood: --threads must be at least 1")
			}
			cfg.IfIndex = 1 // resolved below, inside the namespace
			if err := cfg.Validate(); err != nil {
				return usagef("flood: %v", err)
			}
			if os.Geteuid() != 0 {
				return errors.New("moat flood needs root (CAP_BPF, CAP_NET_ADMIN and CAP_SYS_ADMIN)")
			}

			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			res, err := floodIn(ctx, nsName, iface, cfg)
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(cmd.OutOrStdout(), res)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "sent %d packets in %s (%.0f pps)\n",
				res.Sent, res.Elapsed.Round(time.Millisecond), res.PPS)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&kind, "kind", "", "attack: "+strings.Join(kinds, ", "))
	f.StringVar(&iface, "interface", "", "sending interface (a veth)")
	acceptIfaceFlag(cmd)
	f.StringVar(&nsName, "netns", "", "network namespace of the interface (a name under /var/run/netns)")
	f.StringVar(&dstMAC, "dst-mac", "", "destination MAC: the peer's address")
	f.StringVar(&srcMAC, "src-mac", "", "source MAC (default: the interface's)")
	f.StringVar(&dst, "dst", "", "destination IP address")
	f.Uint16Var(&dstPort, "dst-port", 0, "destination port (all kinds but icmp and syn-random-port)")
	f.StringVar(&src, "src", "", "spoofed source range, CIDR or a single address")
	f.BoolVar(&sequential, "sequential", false, "walk the source range in order instead of picking at random")
	f.IntVar(&size, "size", 0, fmt.Sprintf("UDP or ICMP payload bytes (default %d for udp, %d for icmp)", flood.DefaultUDPPayload, flood.DefaultICMPPayload))
	f.StringVar(&sni, "sni", flood.DefaultServerName, "server name in tls-hello ClientHellos")
	f.Uint16Var(&vlan, "vlan", 0, "802.1Q VLAN ID to tag frames with (0: untagged)")
	f.Uint64Var(&count, "count", 0, "exact number of packets to send (0: no limit)")
	f.DurationVar(&duration, "duration", 0, "stop after this long (0: no limit)")
	f.Uint64Var(&rate, "rate", 0, "cap in packets per second, over all threads (0: no cap)")
	f.IntVar(&threads, "threads", 1, "sending threads")
	f.BoolVar(&pin, "pin", false, "pin sending thread i to CPU i")
	f.BoolVar(&background, "background", false, "run the sending threads at SCHED_IDLE: full speed on CPU time nothing else in the lab wants, as remote attackers")
	f.BoolVar(&force, "force", false, "send even out of a non-veth or from the initial namespace")
	f.BoolVar(&asJSON, "json", false, "print the result as JSON")
	return cmd
}

func parseMAC(flag, s string) (net.HardwareAddr, error) {
	if s == "" {
		return nil, usagef("flood: %s is required", flag)
	}
	mac, err := net.ParseMAC(s)
	if err != nil || len(mac) != 6 {
		return nil, usagef("flood: %s: %q is not an Ethernet MAC address", flag, s)
	}
	return mac, nil
}

// parseSources takes a prefix, or an address meaning just itself.
func parseSources(s string) (netip.Prefix, error) {
	if s == "" {
		return netip.Prefix{}, usagef("flood: --src is required")
	}
	if !strings.Contains(s, "/") {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return netip.Prefix{}, usagef("flood: --src: %v", err)
		}
		return netip.PrefixFrom(a, a.BitLen()), nil
	}
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return netip.Prefix{}, usagef("flood: --src: %v", err)
	}
	if p != p.Masked() {
		return netip.Prefix{}, usagef("flood: --src %s has host bits set (did you mean %s?)", s, p.Masked())
	}
	return p, nil
}

// floodIn runs the flood from a thread of its own that enters the named
// namespace first, so the interface is looked up and the frames are sent
// there. flood.Run carries that namespace over to its sending threads.
func floodIn(ctx context.Context, nsName, iface string, cfg flood.Config) (flood.Result, error) {
	type outcome struct {
		res flood.Result
		err error
	}
	done := make(chan outcome)
	go func() {
		// Never unlocked: a thread moved to another namespace must end
		// with this goroutine rather than serve others.
		runtime.LockOSThread()
		res, err := func() (flood.Result, error) {
			if nsName != "" {
				ns, err := netns.GetFromName(nsName)
				if err != nil {
					return flood.Result{}, usagef("flood: network namespace %q: %v", nsName, err)
				}
				defer ns.Close()
				if err := netns.Set(ns); err != nil {
					return flood.Result{}, fmt.Errorf("enter network namespace %q: %w", nsName, err)
				}
			}
			link, err := netlink.LinkByName(iface)
			if err != nil {
				return flood.Result{}, usagef("flood: interface %q: %v", iface, err)
			}
			cfg.IfIndex = link.Attrs().Index
			if err := flood.CheckTarget(cfg.IfIndex, cfg.Force); err != nil {
				return flood.Result{}, usagef("%v", err)
			}
			return flood.Run(ctx, cfg)
		}()
		done <- outcome{res, err}
	}()
	o := <-done
	return o.res, o.err
}
