package cli

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/moat-shield/moat/internal/ratelimit"
	"github.com/moat-shield/moat/internal/shield"
)

func init() {
	extraCommands = append(extraCommands, newLimitCmd, newTopCmd)
}

// openLimits opens the pinned state with open (g.open, g.openExisting or
// g.openExistingAsIs) and its rate-limit maps; close the shield when done.
func openLimits(open func() (*shield.Shield, error)) (*shield.Shield, ratelimit.Maps, error) {
	s, err := open()
	if err != nil {
		return nil, ratelimit.Maps{}, err
	}
	m, err := ratelimit.NewMaps(s.Map)
	if err != nil {
		s.Close()
		return nil, m, err
	}
	return s, m, nil
}

// rlErr turns the rate-limit package's user errors into usage errors.
func rlErr(err error) error {
	var ue *ratelimit.UserError
	if errors.As(err, &ue) {
		return &usageError{err}
	}
	return err
}

// parseRate reads a count with an optional k, M or G suffix (powers of
// 1000): "5000", "10k", "1.5M".
func parseRate(flag, s string) (uint64, error) {
	mult := 1.0
	t := strings.TrimSpace(s)
	switch {
	case strings.HasSuffix(t, "k"), strings.HasSuffix(t, "K"):
		mult, t = 1e3, t[:len(t)-1]
	case strings.HasSuffix(t, "M"):
		mult, t = 1e6, t[:len(t)-1]
	case strings.HasSuffix(t, "G"):
		mult, t = 1e9, t[:len(t)-1]
	}
	v, err := strconv.ParseFloat(t, 64)
	if err != nil || v < 0 || v*mult > 1<<50 {
		return 0, usagef("invalid --%s %q: want a number with an optional k, M or G", flag, s)
	}
	if n := uint64(v*mult + 0.5); n > 0 || v == 0 {
		return n, nil
	}
	return 0, usagef("invalid --%s %q: at least 1", flag, s)
}

func newLimitCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "limit",
		Short: "Per-source rate limits, flood budgets and their switches",
		Long: "A source limit gives every source address (IPv6: every /64, or --ipv6-prefix) a token bucket; " +
			"a budget gives the whole scope one bucket, whatever the sources. A scope is all, a protocol " +
			"(tcp, udp, icmp, icmpv6) or PROTO/PORT[-PORT] (udp/53, icmp/echo-request), with +syn for TCP SYNs " +
			"only, +tls-hello for TCP segments that open a TLS ClientHello only, or +quic-initial for UDP datagrams " +
			"that open with a QUIC Initial packet only. For each kind the most specific scope whose limit takes the " +
			"packet decides: packets a narrowed limit does not take fall to the next wider scope. Allowlisted " +
			"sources are never limited.",
		Args: args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	cmd.AddCommand(newLimitAddCmd(g), newLimitRemoveCmd(g), newLimitListCmd(g), newLimitConfigCmd(g))
	return cmd
}

func parseKindScope(a []string) (ratelimit.Kind, ratelimit.Scope, error) {
	k, err := ratelimit.ParseKind(a[0])
	if err != nil {
		return 0, ratelimit.Scope{}, &usageError{err}
	}
	sc, err := ratelimit.ParseScope(a[1])
	if err != nil {
		return 0, ratelimit.Scope{}, &usageError{err}
	}
	return k, sc, nil
}

func newLimitAddCmd(g *globals) *cobra.Command {
	var (
		pps, bps, burst, burstBytes string
		prefix                      int
		block                       time.Duration
		replace                     bool
	)
	cmd := &cobra.Command{
		Use:   "add source|budget SCOPE [--pps N] [--bps N] [--burst N] [--burst-bytes N] [--ipv6-prefix N] [--block DURATION]",
		Short: "Add a per-source rate limit or a flood budget",
		Example: "  moat limit add source all --pps 10k --block 1m\n" +
			"  moat limit add budget udp/53 --pps 50k\n" +
			"  moat limit add budget tcp/443+syn --pps 20k\n" +
			"  moat limit add source tcp/443+tls-hello --pps 20 --burst 40 --block 10m\n" +
			"  moat limit add budget udp/443+quic-initial --pps 50k\n" +
			"  moat limit add source icmp/echo-request --pps 10 --bps 100k",
		Args: args(cobra.ExactArgs(2)),
		RunE: func(cmd *cobra.Command, a []string) error {
			k, sc, err := parseKindScope(a)
			if err != nil {
				return err
			}
			l := ratelimit.Limit{Kind: k, Scope: sc, Block: ratelimit.Duration(block)}
			for _, x := range []struct {
				flag, val string
				dst       *uint64
			}{{"pps", pps, &l.PPS}, {"bps", bps, &l.BPS}, {"burst", burst, &l.BurstPackets}, {"burst-bytes", burstBytes, &l.BurstBytes}} {
				if x.val == "" {
					continue
				}
				if *x.dst, err = parseRate(x.flag, x.val); err != nil {
					return err
				}
				// 0 is how a Limit says "the default burst": taken from the
				// flag, it would silently give a tenth of a second instead.
				if *x.dst == 0 && (x.flag == "burst" || x.flag == "burst-bytes") {
					return usagef("invalid --%s 0: a bucket holds at least one packet or frame; leave --%s out for the default (a tenth of a second of the rate)", x.flag, x.flag)
				}
			}
			if cmd.Flags().Changed("ipv6-prefix") {
				if prefix < 1 || prefix > 128 {
					return usagef("invalid --ipv6-prefix %d: want 1..128", prefix)
				}
				l.IPv6Prefix = prefix
			}
			if err := l.Validate(); err != nil {
				return &usageError{err}
			}
			s, m, err := openLimits(g.open)
			if err != nil {
				return err
			}
			defer s.Close()
			if err := m.Add(l, replace); err != nil {
				return rlErr(err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "added %s\n", l)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&pps, "pps", "", "packets per second (k, M, G suffixes)")
	f.StringVar(&bps, "bps", "", "bits per second (k, M, G suffixes)")
	f.StringVar(&burst, "burst", "", "packets the bucket holds (default: a tenth of a second of --pps)")
	f.StringVar(&burstBytes, "burst-bytes", "", "bytes the bucket holds (default: a tenth of a second of --bps, at least 1518)")
	f.IntVar(&prefix, "ipv6-prefix", ratelimit.DefaultIPv6Prefix, "source limits: IPv6 sources share a bucket per prefix of this length")
	f.DurationVar(&block, "block", 0, "source limits: deny a source that goes over the limit for this long (an expiring denylist entry)")
	f.BoolVar(&replace, "replace", false, "replace the limit of this kind on exactly this scope")
	return cmd
}

func newLimitRemoveCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "remove source|budget SCOPE",
		Short: "Remove the limit of a kind on a scope",
		Args:  args(cobra.ExactArgs(2)),
		RunE: func(cmd *cobra.Command, a []string) error {
			k, sc, err := parseKindScope(a)
			if err != nil {
				return err
			}
			// Limits are the config's, as for add: a removal behind the
			// daemon's back would come back at its next reload.
			if err := g.refuseIfManaged(); err != nil {
				return err
			}
			s, m, err := openLimits(g.openExisting)
			if err != nil {
				return err
			}
			defer s.Close()
			if err := m.Remove(k, sc); err != nil {
				return rlErr(err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "removed %s limit on %s\n", k, sc)
			return nil
		},
	}
}

// LimitList is what `moat limit list --json` prints.
type LimitList struct {
	Limits []ratelimit.Status `json:"limits"`
	Config ratelimit.Config   `json:"config"`
}

func newLimitListCmd(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List the limits with what they passed, dropped, monitored and blocked",
		Long: "List the limits with what they passed, dropped, monitored and blocked. MONITORED counts the packets " +
			"over a limit that monitor mode passed (moat policy monitor on): what enforcing would have dropped. " +
			"DROPPED counts only packets that were dropped.",
		Args: args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			s, m, err := openLimits(g.openExistingAsIs)
			if err != nil {
				return err
			}
			defer s.Close()
			ls, err := m.Limits()
			if err != nil {
				return err
			}
			cfg, err := m.Config()
			if err != nil {
				return err
			}
			if name, err := s.LimitCountersOlderFilter(); err == nil && name != "" {
				fmt.Fprintf(cmd.ErrOrStderr(), "moat: warning: %s runs an older moat's filter, whose packets these counters miss; run `moat attach %s` to load this version's\n", name, name)
			}
			if asJSON {
				if ls == nil {
					ls = []ratelimit.Status{}
				}
				return writeJSON(cmd.OutOrStdout(), LimitList{ls, cfg})
			}
			w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "KIND\tSCOPE\tRATE\tBURST\tBLOCK\tPASSED\tDROPPED\tMONITORED\tBLOCKS")
			for _, l := range ls {
				var rate, burst []string
				if l.PPS > 0 {
					rate = append(rate, fmt.Sprintf("%d pps", l.PPS))
					burst = append(burst, fmt.Sprintf("%d pkts", l.BurstPackets))
				}
				if l.BPS > 0 {
					rate = append(rate, fmt.Sprintf("%.3g Mbit/s", float64(l.BPS)/1e6))
					burst = append(burst, humanBytes(l.BurstBytes))
				}
				blk := "-"
				if l.Block > 0 {
					blk = time.Duration(l.Block).String()
				}
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%d\t%d\t%d\t%d\n", l.Kind, l.Scope, strings.Join(rate, ", "),
					strings.Join(burst, ", "), blk, l.Stats.Passed, l.Stats.Dropped, l.Stats.Monitored, l.Stats.Blocks)
			}
			fmt.Fprintf(w, "\nattack shape: %s, heavy hitters: %s (1 in %d), gate: %s\n",
				onOff(cfg.Shape), onOff(cfg.HeavyHitters), cfg.Sample, cfg.Gate)
			return w.Flush()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

func parseOnOff(flag, s string) (bool, error) {
	switch s {
	case "on", "true", "yes":
		return true, nil
	case "off", "false", "no":
		return false, nil
	}
	return false, usagef("invalid --%s %q: want on or off", flag, s)
}

func newLimitConfigCmd(g *globals) *cobra.Command {
	var shape, hh, gate string
	var sample uint32
	cmd := &cobra.Command{
		Use:   "config [--shape on|off] [--heavy-hitters on|off] [--sample N] [--gate sketch|sample|none]",
		Short: "Switch attack-shape counting and heavy-hitter sampling, choose the per-source gate",
		Long: "--sample N samples 1 packet in N (a power of two) for heavy hitters. --gate says when a source " +
			"without a bucket gets one: sample (1 in up to 64 of its packets; the default), sketch (once a " +
			"count-min sketch counts that many in a second) or none (on its first packet).",
		Args: args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			s, m, err := openLimits(g.open)
			if err != nil {
				return err
			}
			defer s.Close()
			cfg, err := m.Config()
			if err != nil {
				return err
			}
			if shape != "" {
				if cfg.Shape, err = parseOnOff("shape", shape); err != nil {
					return err
				}
			}
			if hh != "" {
				if cfg.HeavyHitters, err = parseOnOff("heavy-hitters", hh); err != nil {
					return err
				}
			}
			if cmd.Flags().Changed("sample") {
				if sample == 0 {
					return usagef("invalid --sample 0: want a power of two up to 65536")
				}
				cfg.Sample = sample
			}
			if gate != "" {
				if cfg.Gate, err = ratelimit.ParseGate(gate); err != nil {
					return &usageError{err}
				}
			}
			if err := m.Configure(cfg); err != nil {
				return rlErr(err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "attack shape: %s, heavy hitters: %s (1 in %d), gate: %s\n",
				onOff(cfg.Shape), onOff(cfg.HeavyHitters), cfg.Sample, cfg.Gate)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&shape, "shape", "", "count the attack shape: on or off")
	f.StringVar(&hh, "heavy-hitters", "", "sample heavy hitters: on or off")
	f.Uint32Var(&sample, "sample", 0, "heavy hitters: sample 1 packet in N")
	f.StringVar(&gate, "gate", "", "when a source gets a bucket: sample, sketch or none")
	return cmd
}
