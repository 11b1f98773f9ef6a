package cli

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/cilium/ebpf"
	"github.com/spf13/cobra"
	"github.com/vishvananda/netlink"

	"github.com/moat-shield/moat/internal/datapath"
	"github.com/moat-shield/moat/internal/shield"
	"github.com/moat-shield/moat/internal/syncookie"
)

func init() {
	extraCommands = append(extraCommands, newSynCmd)
}

// synMaps are the pinned maps of the SYN defence.
type synMaps struct {
	ports, counters, keys, rotation, settings, census *ebpf.Map
}

func openSynMaps(s *shield.Shield) (synMaps, error) {
	m := synMaps{
		ports:    s.Map(datapath.MoatMapSynPorts),
		counters: s.Map(datapath.MoatMapSynCounters),
		keys:     s.Map(datapath.MoatMapSynKeys),
		rotation: s.Map(datapath.MoatMapSynRotation),
		settings: s.Map(datapath.MoatMapSynSettings),
		census:   s.Map(datapath.MoatMapSynCensus),
	}
	if m.ports == nil || m.counters == nil || m.keys == nil || m.rotation == nil || m.settings == nil || m.census == nil {
		return m, fmt.Errorf("the pinned state under %s has no SYN defence maps", s.Root())
	}
	return m, nil
}

// parseTCPPort reads "tcp/443".
func parseTCPPort(arg string) (uint16, error) {
	proto, port, ok := strings.Cut(arg, "/")
	if !ok || proto != "tcp" {
		return 0, usagef("%q: want tcp/PORT (SYN protection is for TCP only)", arg)
	}
	n, err := strconv.ParseUint(port, 10, 16)
	if err != nil || n == 0 {
		return 0, usagef("%q: invalid port", arg)
	}
	return uint16(n), nil
}

func newSynCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "syn",
		Short: "SYN flood defence: SYN cookies issued in XDP that keep every TCP option",
		Args:  args(cobra.NoArgs),
		RunE:  func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	cmd.AddCommand(newSynProtectCmd(g), newSynStatusCmd(g), newSynRotateCmd(g))
	return cmd
}

func newSynProtectCmd(g *globals) *cobra.Command {
	var (
		mode      string
		threshold uint32
	)
	cmd := &cobra.Command{
		Use:   "protect tcp/PORT... [--mode auto|always|never|off]",
		Short: "Set how SYNs to TCP ports are answered",
		Long: "always: every SYN is answered by moat with a cookie; auto: only while a SYN flood is " +
			"detected (--threshold SYNs per second); never: counted, left to the kernel; off: not protected. " +
			"Under cookies a server-speaks-first protocol (SSH, SMTP) loses the connection if the client's " +
			"third ACK is lost: prefer auto or never for such ports. moat leaves the SYNs of an MPTCP listener " +
			"(Go makes listeners MPTCP by default) to the kernel, which makes no connection from a moat cookie for " +
			"one: only the kernel's SYN queue and its own cookies defend it (`moat syn status` counts those SYNs).\n\n" +
			"moat answers SYNs only for listeners in the network namespace of the device it is attached to; " +
			"SYNs for containers in other namespaces, DNAT or routed traffic go to the kernel. In cookie mode " +
			"SYNs moat will not answer (with data, FIN or RST, IP options or IPv6 extension headers, " +
			"fragmented, to or from non-unicast addresses) are dropped; double-tagged (QinQ) SYNs, and SYNs signed " +
			"with TCP-MD5 or TCP-AO (BGP) for a listener that holds keys, go to the kernel.\n\n" +
			"Keys must rotate: the daemon rotates them every minute, or run `moat syn rotate --every 1m`. " +
			"When the last rotation is older than 2.5 periods moat issues no more cookies and SYNs go to the " +
			"kernel (`moat syn status` shows the key age).\n\n" +
			"Not handled: with rx-vlan-offload a NIC strips VLAN tags before XDP, so SYN-ACKs would leave " +
			"untagged (turn it off with `ethtool -K DEV rxvlan off` or use never mode on such devices); the " +
			"MSS moat announces is the device's MTU less the headers (or the listener's TCP_MAXSEG if lower): a " +
			"route's smaller MTU or advmss is not looked at; SYN-ACKs go back the way the " +
			"SYN came whatever rp_filter or the routing table say, so spoofed SYNs draw SYN-ACKs to their forged " +
			"sources as with kernel cookies.",
		Args: args(cobra.MinimumNArgs(1)),
		RunE: func(cmd *cobra.Command, a []string) error {
			m, err := syncookie.ParseMode(mode)
			if err != nil {
				return &usageError{err}
			}
			var ports []uint16
			for _, arg := range a {
				p, err := parseTCPPort(arg)
				if err != nil {
					return err
				}
				if slices.Contains(ports, p) {
					return usagef("port tcp/%d given twice", p)
				}
				ports = append(ports, p)
			}
			if cmd.Flags().Changed("threshold") {
				if m != syncookie.ModeAuto {
					return usagef("--threshold is the flood threshold of auto mode; %s mode has none", m)
				}
				if threshold == 0 {
					return usagef("--threshold must be at least 1 SYN per second")
				}
			}
			if m == syncookie.ModeAlways || m == syncookie.ModeAuto {
				// Decided before anything is written: a refusal, like a
				// bad argument, whose remedy is the namespace's setting.
				notes, err := syncookie.CheckSysctls()
				if err != nil {
					return usagef("moat cannot issue cookies in this network namespace: %w", err)
				}
				for _, n := range notes {
					fmt.Fprintf(cmd.ErrOrStderr(), "note: %s\n", n)
				}
			}
			var s *shield.Shield
			if m == syncookie.ModeOff {
				// Nothing to turn off where nothing is pinned: create no
				// state (and install no key) for it.
				if err = g.refuseIfManaged(); err == nil {
					s, err = g.openExisting()
				}
			} else {
				s, err = g.open()
			}
			if err != nil {
				return err
			}
			defer s.Close()
			sm, err := openSynMaps(s)
			if err != nil {
				return err
			}
			table, err := syncookie.ReadPortTable(sm.ports, sm.counters, sm.census)
			if err != nil {
				return err
			}
			if m != syncookie.ModeOff {
				// All or nothing: refuse before the first port if the
				// slots cannot hold the ports not yet protected.
				if err := checkSlots(table, ports); err != nil {
					return err
				}
			}
			// The first protection installs a key: without one the data
			// path issues no cookies.
			gen, err := syncookie.Generation(sm.rotation)
			if err != nil {
				return err
			}
			if gen == 0 && m != syncookie.ModeOff {
				if _, err := syncookie.Rotate(sm.keys, sm.rotation); err != nil {
					return err
				}
				if err := syncookie.Configure(sm.settings, syncookie.Config{}); err != nil {
					return err
				}
			}
			// Every port first, then what was done: output to a reader
			// that has gone (`| head`) ends the process at its first
			// write, which must not leave the change half made.
			unprotected := map[uint16]bool{}
			for _, p := range ports {
				if m == syncookie.ModeOff && !table.Protected(p) {
					unprotected[p] = true
					continue
				}
				if err := table.Protect(p, m, threshold); err != nil {
					return err
				}
			}
			for _, p := range ports {
				if unprotected[p] {
					fmt.Fprintf(cmd.ErrOrStderr(), "note: tcp/%d was not protected\n", p)
					continue
				}
				fmt.Fprintf(cmd.OutOrStdout(), "tcp/%d: %s\n", p, m)
				if m == syncookie.ModeAuto {
					if kept := syncookie.StoredThreshold(threshold); kept != uint64(threshold) {
						fmt.Fprintf(cmd.ErrOrStderr(), "note: tcp/%d: auto mode counts SYNs per CPU in 100 ms windows, "+
							"so the threshold of %d/s is kept as %d/s (%d CPUs online)\n",
							p, threshold, kept, syncookie.OnlineCPUs())
					}
				}
				if m == syncookie.ModeAlways || m == syncookie.ModeAuto {
					if ok, err := syncookie.Listening(p); err == nil && !ok {
						fmt.Fprintf(cmd.ErrOrStderr(), "warning: nothing listens on tcp/%d in this network namespace: "+
							"moat leaves SYNs for it to the kernel (listeners in other namespaces, DNAT and "+
							"routed traffic are not protected)\n", p)
					}
				}
			}
			if m != syncookie.ModeOff {
				atts, err := s.Attachments()
				if err == nil && len(atts) == 0 {
					fmt.Fprintf(cmd.ErrOrStderr(), "warning: moat is attached to no interface yet: "+
						"the protection takes effect once `moat attach IFACE` runs\n")
				}
				if m == syncookie.ModeAlways || m == syncookie.ModeAuto {
					for _, a := range atts {
						if l, err := netlink.LinkByIndex(a.Ifindex); err == nil && l.Type() == "veth" && a.Present {
							fmt.Fprintf(cmd.ErrOrStderr(), "note: %s is a veth: its peer receives moat's SYN-ACKs (XDP_TX) only while "+
								"the peer runs NAPI; attach an XDP program to the peer (one that passes everything will do)\n", a.Iface)
						}
					}
					if behind, err := s.AcceptorsBehind(); err == nil {
						for _, a := range atts {
							if n := behind[a.Iface]; n > 0 {
								fmt.Fprintf(cmd.ErrOrStderr(), "warning: on %s, %d tcx ingress program(s) run before moat's SYN acceptor: "+
									"one that ends the chain (as Cilium's do) keeps the third ACKs of moat's cookies from it, and the "+
									"kernel resets those handshakes; run `moat attach %s` again to put the acceptor first\n", a.Iface, n, a.Iface)
							}
						}
					}
				}
			}
			if gen == 0 && m != syncookie.ModeOff && m != syncookie.ModeNever {
				fmt.Fprintf(cmd.ErrOrStderr(), "note: keys must rotate (the daemon does it, or `moat syn rotate --every 1m`); "+
					"moat stops issuing cookies once the last rotation is %s old\n", syncookie.StaleAfter(syncookie.DefaultRotation))
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&mode, "mode", "auto", "always, never, auto or off")
	cmd.Flags().Uint32Var(&threshold, "threshold", syncookie.DefaultThreshold, "auto mode: SYNs per second that mean a flood")
	return cmd
}

func newSynStatusCmd(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show protected ports, their flood state and counters",
		Args:  args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			s, err := g.openExistingAsIs()
			if err != nil {
				return err
			}
			defer s.Close()
			sm, err := openSynMaps(s)
			if err != nil {
				return err
			}
			ports, err := syncookie.Status(sm.ports, sm.counters)
			if err != nil {
				return err
			}
			// Rotations are shown as a count and an age; the keys never
			// leave the kernel (the keys map is write-only from user space).
			keys, err := syncookie.Keys(sm.rotation, sm.settings)
			if err != nil {
				return err
			}
			census, err := syncookie.ReadCensus(sm.census)
			if err != nil {
				return err
			}
			var warnings []string
			if s.SynErr != nil {
				warnings = append(warnings, fmt.Sprintf("some protected ports have no counters slot, and moat leaves their SYNs to the kernel: %v", s.SynErr))
			}
			cookies := slices.ContainsFunc(ports, func(p syncookie.PortStatus) bool { return p.Mode != syncookie.ModeNever.String() })
			if _, err := syncookie.CheckSysctls(); err != nil && cookies {
				warnings = append(warnings, err.Error())
			}
			if len(s.Older) > 0 {
				warnings = append(warnings, fmt.Sprintf("the maps %s are an older moat's, read as they are: `moat attach` (or this version's daemon) "+
					"replaces them; then restart the daemon or `moat syn rotate --every` with this version, since the older one cannot open them",
					strings.Join(s.Older, ", ")))
			}
			if s.SynOlderFilter != "" {
				warnings = append(warnings, fmt.Sprintf("%s runs an older moat filter, which counts in a map of its own (and may protect only the ports it was given); "+
					"run `moat attach %s` to load this version's", s.SynOlderFilter, s.SynOlderFilter))
			}
			if asJSON {
				return writeJSON(cmd.OutOrStdout(), struct {
					syncookie.KeyStatus
					RotationPeriodSeconds float64                `json:"rotation_period_seconds"`
					Census                syncookie.CensusStatus `json:"socket_census"`
					Ports                 []syncookie.PortStatus `json:"ports"`
					Warnings              []string               `json:"warnings,omitempty"`
				}{keys, keys.Period.Seconds(), census, ports, warnings})
			}
			for _, w := range warnings {
				fmt.Fprintln(cmd.ErrOrStderr(), "warning: "+w)
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "key rotations: %d", keys.Rotations)
			if keys.Rotations > 0 {
				fmt.Fprintf(out, ", last %s ago (every %s expected)", keys.Age.Round(time.Second), keys.Period)
			}
			fmt.Fprintln(out)
			if keys.Stale {
				fmt.Fprintf(out, "STALE KEYS: no rotation for over %s; moat issues no cookies and SYNs go to the kernel. "+
					"Is the daemon (or `moat syn rotate --every`) running?\n", syncookie.StaleAfter(keys.Period))
			}
			if census.Trusted {
				fmt.Fprintf(out, "socket census: current (%d passes; sockets of protected ports at the last: %d); "+
					"SYNs and ACKs whose tuple no socket owns skip the socket lookup\n", census.Passes, census.Sockets)
			} else {
				fmt.Fprintf(out, "socket census: not current (%d passes); every SYN and ACK of a protected port pays a socket lookup. "+
					"The daemon (or `moat syn rotate --every`) takes a pass every %s\n", census.Passes, syncookie.DefaultCensusEvery)
			}
			return writeSynPorts(out, ports)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

// writeSynPorts prints the protected ports' counters as a table, then a
// hint for each port whose counters point at something to look into.
func writeSynPorts(out io.Writer, ports []syncookie.PortStatus) error {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "PORT\tMODE\tFLOOD\tSINCE\tSYNS\tCOOKIES\tACCEPTED\tREJECTED\tACKS DROPPED\tRESETS\tSYNS DROPPED\tSYNS PASSED\tACCEPT ERRORS\tQUEUE FULL")
	for _, p := range ports {
		flood, since := "no", "-"
		if p.Flooding {
			flood = "yes"
		}
		if !p.LastChange.IsZero() {
			since = p.LastChange.Local().Format(time.DateTime)
		}
		fmt.Fprintf(w, "tcp/%d\t%s\t%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\n", p.Port, p.Mode, flood, since,
			p.SYNs, p.CookiesIssued, p.CookiesAccepted, p.CookiesRejected, p.ACKsDropped, p.ResetsSent, p.SYNsDropped, p.SYNsPassed, p.AcceptErrors, p.AcceptQueueFull)
	}
	if err := w.Flush(); err != nil {
		return err
	}
	for _, p := range ports {
		if p.AcceptErrors > 0 {
			fmt.Fprintf(out, "tcp/%d: %d valid cookies the kernel refused: were net.ipv4.tcp_syncookies or tcp_window_scaling "+
				"turned off during handshakes, or the listener replaced by an MPTCP one?\n", p.Port, p.AcceptErrors)
		}
		if p.MPTCPSYNs > 0 {
			fmt.Fprintf(out, "tcp/%d: %d SYNs went to the kernel because the listener is MPTCP (Go makes listeners MPTCP by default): "+
				"the kernel makes no connection from a moat cookie for one, so only its own SYN queue and cookies defend this port. "+
				"A plain TCP listener has moat answer its SYNs.\n", p.Port, p.MPTCPSYNs)
		}
		if p.NATSYNs > 0 {
			fmt.Fprintf(out, "tcp/%d: %d SYNs went to the kernel while NAT ran in the listener's namespace (a NAT rule with "+
				"connection tracking, as on hosts of Docker, Kubernetes or libvirt): the kernel drops the request socket of a moat "+
				"cookie handshake there, so only its own SYN queue and cookies defend this port for that address family.\n", p.Port, p.NATSYNs)
		}
		if p.AcceptQueueFull > 0 {
			fmt.Fprintf(out, "tcp/%d: %d valid cookies came while the listener's accept queue was full; the kernel dropped "+
				"those connections and the clients sent again. Does the service accept too slowly, or is its backlog too small?\n", p.Port, p.AcceptQueueFull)
		}
	}
	return nil
}

func newSynRotateCmd(g *globals) *cobra.Command {
	var every time.Duration
	cmd := &cobra.Command{
		Use:   "rotate [--every DURATION]",
		Short: "Install a new cookie key (cookies stay valid for one more rotation); with --every, keep rotating and keep the socket census current, as the daemon does",
		Args:  args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if cmd.Flags().Changed("every") {
				if err := syncookie.CheckRotation(every); err != nil {
					return usagef("invalid --every: %v", err)
				}
			}
			if c, err := g.daemon(); err != nil {
				return err
			} else if c != nil {
				return usagef("a moat daemon manages %s (%s): it rotates the keys itself (syn.rotate_every in its config)", g.root, c.socket)
			}
			// The state is opened, and so locked, for each rotation only:
			// a rotator that runs for days must not block every other
			// command.
			first := true
			rotate := func() error {
				// Keys for a root where nothing is pinned would be read by
				// no filter: refuse rather than create the maps for them.
				if err := g.refuseIfManaged(); err != nil {
					return err
				}
				s, err := g.openExisting()
				if err != nil {
					return err
				}
				defer s.Close()
				sm, err := openSynMaps(s)
				if err != nil {
					return err
				}
				// The data path takes keys older than 2.5 periods for a
				// dead rotator; tell it the period this loop keeps.
				if first && every != 0 {
					if err := syncookie.SetRotationPeriod(sm.settings, every); err != nil {
						return err
					}
				}
				first = false
				gen, err := syncookie.Rotate(sm.keys, sm.rotation)
				if err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "key rotation %d\n", gen)
				// Not a reason to stop rotating: the window scale only
				// misses a changed sysctl.
				if err := syncookie.NoteRmemMax(sm.settings); err != nil {
					fmt.Fprintf(cmd.ErrOrStderr(), "warning: net.core.rmem_max not passed to the data path: %v\n", err)
				}
				if every == 0 {
					// One rotation: say how long its keys are good for.
					if ks, err := syncookie.Keys(sm.rotation, sm.settings); err == nil {
						fmt.Fprintf(cmd.ErrOrStderr(), "note: the data path expects a rotation every %s (set by the daemon or the last --every): "+
							"without a rotator it issues no cookies after %s\n", ks.Period, syncookie.StaleAfter(ks.Period))
					}
				}
				return nil
			}
			if err := rotate(); err != nil || every == 0 {
				return err
			}
			// A rotator stands in for the daemon: it keeps the socket
			// census current too, without which every SYN and ACK pays a
			// socket lookup.
			// While another process (a daemon) takes it, the rotator tries
			// again until it can.
			errOut := cmd.ErrOrStderr()
			census := shield.HoldCensus(func() (func(), error) { return startCensus(g, errOut) }, func(err error) {
				if err != nil {
					fmt.Fprintf(errOut, "warning: socket census: %v; every SYN and ACK of a protected port pays a socket lookup; trying again every %s\n", err, shield.CensusRetryEvery)
				} else {
					fmt.Fprintln(errOut, "note: socket census taken")
				}
			})
			defer census.Stop()
			sig := make(chan os.Signal, 1)
			signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
			defer signal.Stop(sig)
			tick := time.NewTicker(every)
			defer tick.Stop()
			for {
				select {
				case <-sig:
					return nil
				case <-tick.C:
					if err := rotate(); err != nil {
						return err
					}
				case <-census.Retry():
					census.Take()
				}
			}
		},
	}
	cmd.Flags().DurationVar(&every, "every", 0, "rotate on this schedule until interrupted (e.g. 1m)")
	return cmd
}

// checkSlots fails with a user error if protecting ports would need more
// counters slots than are free.
func checkSlots(table *syncookie.PortTable, ports []uint16) error {
	if err := table.CheckRoom(ports); err != nil {
		if errors.Is(err, syncookie.ErrNoFreeSlot) {
			return &shield.UserError{Err: err}
		}
		return err
	}
	return nil
}

// startCensus keeps the socket census current in this process's network
// namespace until the returned function is called; failed passes are
// reported on errOut.
func startCensus(g *globals, errOut io.Writer) (stop func(), err error) {
	s, err := g.open()
	if err != nil {
		return nil, err
	}
	defer s.Close()
	return s.StartCensus(func(_ syncookie.CensusPass, err error) {
		if err != nil {
			fmt.Fprintf(errOut, "warning: socket census: %v\n", err)
		} else {
			fmt.Fprintln(errOut, "note: socket census works again")
		}
	})
}
