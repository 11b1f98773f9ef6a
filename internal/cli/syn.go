package cli

import (
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/cilium/ebpf"
	"github.com/spf13/cobra"

	"github.com/moat-shield/moat/internal/datapath"
	"github.com/moat-shield/moat/internal/shield"
	"github.com/moat-shield/moat/internal/syncookie"
)

func init() {
	extraCommands = append(extraCommands, newSynCmd)
}

// synMaps are the pinned maps of the SYN defence.
type synMaps struct {
	ports, stats, keys, rotation, settings *ebpf.Map
}

func openSynMaps(s *shield.Shield) (synMaps, error) {
	m := synMaps{
		ports:    s.Map(datapath.MoatMapSynPorts),
		stats:    s.Map(datapath.MoatMapSynStats),
		keys:     s.Map(datapath.MoatMapSynKeys),
		rotation: s.Map(datapath.MoatMapSynRotation),
		settings: s.Map(datapath.MoatMapSynSettings),
	}
	if m.ports == nil || m.stats == nil || m.keys == nil || m.rotation == nil || m.settings == nil {
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
			"third ACK is lost: prefer auto or never for such ports. Listeners on protected ports must not " +
			"use MPTCP (Go enables it by default on listeners): the kernel refuses cookie handshakes for them.",
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
				ports = append(ports, p)
			}
			if m == syncookie.ModeAlways || m == syncookie.ModeAuto {
				if err := syncookie.CheckSysctls(); err != nil {
					return fmt.Errorf("moat cannot issue cookies here:\n%w", err)
				}
			}
			s, err := g.open()
			if err != nil {
				return err
			}
			defer s.Close()
			sm, err := openSynMaps(s)
			if err != nil {
				return err
			}
			// The first protection installs a key: without one the data
			// path issues no cookies.
			gen, err := syncookie.Generation(sm.rotation)
			if err != nil {
				return err
			}
			if gen == 0 {
				if _, err := syncookie.Rotate(sm.keys, sm.rotation); err != nil {
					return err
				}
				if err := syncookie.Configure(sm.settings, syncookie.Config{ECN: syncookie.ECNEnabled()}); err != nil {
					return err
				}
			}
			for _, p := range ports {
				if err := syncookie.Protect(sm.ports, sm.stats, p, m, threshold); err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "tcp/%d: %s\n", p, m)
			}
			if gen == 0 && m != syncookie.ModeOff && m != syncookie.ModeNever {
				fmt.Fprintln(cmd.ErrOrStderr(), "note: keys rotate only while `moat syn rotate --every 1m` runs")
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
			s, err := g.openExisting()
			if err != nil {
				return err
			}
			defer s.Close()
			sm, err := openSynMaps(s)
			if err != nil {
				return err
			}
			ports, err := syncookie.Status(sm.ports, sm.stats)
			if err != nil {
				return err
			}
			// Rotations are shown as a count; the keys never leave the kernel
			// (the keys map is write-only from user space).
			gen, err := syncookie.Generation(sm.rotation)
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(cmd.OutOrStdout(), struct {
					KeyRotations uint64                 `json:"key_rotations"`
					Ports        []syncookie.PortStatus `json:"ports"`
				}{gen, ports})
			}
			fmt.Fprintf(cmd.OutOrStdout(), "key rotations: %d\n", gen)
			w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "PORT\tMODE\tFLOOD\tSINCE\tSYNS\tCOOKIES\tACCEPTED\tREJECTED\tACKS DROPPED")
			for _, p := range ports {
				flood, since := "no", "-"
				if p.Flooding {
					flood = "yes"
				}
				if !p.LastChange.IsZero() {
					since = p.LastChange.Local().Format(time.DateTime)
				}
				fmt.Fprintf(w, "tcp/%d\t%s\t%s\t%s\t%d\t%d\t%d\t%d\t%d\n", p.Port, p.Mode, flood, since,
					p.SYNs, p.CookiesIssued, p.CookiesAccepted, p.CookiesRejected, p.ACKsDropped)
			}
			return w.Flush()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func newSynRotateCmd(g *globals) *cobra.Command {
	var every time.Duration
	cmd := &cobra.Command{
		Use:   "rotate [--every DURATION]",
		Short: "Install a new cookie key (cookies stay valid for one more rotation); with --every, keep rotating",
		Args:  args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if every != 0 && every < time.Second {
				return usagef("--every must be at least 1s")
			}
			s, err := g.open()
			if err != nil {
				return err
			}
			defer s.Close()
			sm, err := openSynMaps(s)
			if err != nil {
				return err
			}
			rotate := func() error {
				gen, err := syncookie.Rotate(sm.keys, sm.rotation)
				if err == nil {
					fmt.Fprintf(cmd.OutOrStdout(), "key rotation %d\n", gen)
				}
				return err
			}
			if err := rotate(); err != nil || every == 0 {
				return err
			}
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
				}
			}
		},
	}
	cmd.Flags().DurationVar(&every, "every", 0, "rotate on this schedule until interrupted (e.g. 1m)")
	return cmd
}
