package cli

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/moat-shield/moat/internal/rules"
	"github.com/moat-shield/moat/internal/shield"
)

func newListCmd(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List every rule with its hit counter and time left",
		Args:  args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			s, err := g.openExistingAsIs()
			if err != nil {
				return err
			}
			defer s.Close()
			rs, err := s.Snapshot()
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(cmd.OutOrStdout(), rs)
			}
			w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "LIST\tRULE\tHITS\tEXPIRES\tCOMMENT")
			now := time.Now()
			for _, x := range []struct {
				name    string
				entries []rules.PrefixEntry
			}{{"allow", rs.Allow}, {"deny", rs.Deny}} {
				for _, e := range x.entries {
					fmt.Fprintf(w, "%s\t%s\t%d\t%s\t%s\n", x.name, e.Prefix, e.Hits, timeLeft(e.Expires, now), e.Comment)
				}
			}
			for _, p := range rs.Ports {
				fmt.Fprintf(w, "port %s\t%s\t%d\t-\t\n", p.Action, p.Spec, p.Hits)
			}
			return w.Flush()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON (the format import reads)")
	return cmd
}

func timeLeft(t *time.Time, now time.Time) string {
	if t == nil {
		return "never"
	}
	d := t.Sub(now)
	if d <= 0 {
		return "expired"
	}
	return "in " + d.Round(time.Second).String()
}

// StatsReport is what `moat stats --json` prints per interface.
type StatsReport struct {
	Iface string `json:"iface"`
	shield.Counters
	Rates *Rates `json:"rates,omitempty"`
}

// Rates are per-second rates over the last watch interval.
type Rates struct {
	PassedPPS   float64 `json:"passed_pps"`
	DroppedPPS  float64 `json:"dropped_pps"`
	PassedMbps  float64 `json:"passed_mbps"`
	DroppedMbps float64 `json:"dropped_mbps"`
	// SYNs answered with cookies (XDP_TX).
	AnsweredPPS  float64 `json:"answered_pps"`
	AnsweredMbps float64 `json:"answered_mbps"`
	// Packets passed in monitor mode that a rule would have dropped.
	MonitoredPPS  float64 `json:"monitored_pps"`
	MonitoredMbps float64 `json:"monitored_mbps"`
}

func newStatsCmd(g *globals) *cobra.Command {
	var asJSON bool
	var watch time.Duration
	var ifaceFilter []string
	var detail bool // attack shape and limits (stats_detail.go)
	cmd := &cobra.Command{
		Use:   "stats",
		Short: "Show packets and bytes per verdict and reason, per interface",
		Args:  args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if detail {
				return printDetail(g, cmd.OutOrStdout(), asJSON)
			}
			if watch < 0 || (cmd.Flags().Changed("watch") && watch < 10*time.Millisecond) {
				return usagef("invalid --watch %s: want an interval of at least 10ms", watch)
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
			names := ifaceFilter
			if len(names) == 0 {
				for _, a := range atts {
					names = append(names, a.Iface)
				}
			}
			read := func() ([]StatsReport, error) {
				var out []StatsReport
				for _, n := range names {
					c, err := s.Counters(n)
					if err != nil {
						return nil, err
					}
					out = append(out, StatsReport{Iface: n, Counters: c})
				}
				return out, nil
			}
			prev, err := read()
			// The lock would stall other commands while watching.
			s.Close()
			if err != nil {
				return err
			}
			if watch == 0 {
				return printStats(cmd.OutOrStdout(), prev, asJSON)
			}
			last := time.Now()
			for {
				time.Sleep(watch)
				s, err := g.openExistingAsIs()
				if err != nil {
					return err
				}
				cur, err := read()
				s.Close()
				if err != nil {
					return err
				}
				now := time.Now()
				dt := now.Sub(last).Seconds()
				for i := range cur {
					cur[i].Rates = watchRates(prev[i].Counters, cur[i].Counters, dt)
				}
				if asJSON {
					// One object per interface and interval, a line each.
					for _, r := range cur {
						if err := writeJSONLine(cmd.OutOrStdout(), r); err != nil {
							return err
						}
					}
				} else if err := printStats(cmd.OutOrStdout(), cur, asJSON); err != nil {
					return err
				}
				prev, last = cur, now
			}
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON (one object per line when watching)")
	cmd.Flags().DurationVar(&watch, "watch", 0, "print again every INTERVAL with rates (pps, Mbit/s)")
	cmd.Flags().StringSliceVarP(&ifaceFilter, "interface", "i", nil, "only these interfaces")
	acceptIfaceFlag(cmd)
	cmd.Flags().BoolVar(&detail, "detail", false, "show the attack shape (sizes, TCP flags and options, ports) and the rate limits instead")
	return cmd
}

// watchRates are the rates between two reads dt seconds apart.
func watchRates(p, c shield.Counters, dt float64) *Rates {
	pps := func(p, c shield.Count) float64 { return float64(since(p.Packets, c.Packets)) / dt }
	mbps := func(p, c shield.Count) float64 { return float64(since(p.Bytes, c.Bytes)) * 8 / dt / 1e6 }
	return &Rates{
		PassedPPS:     pps(p.Passed, c.Passed),
		DroppedPPS:    pps(p.Dropped, c.Dropped),
		PassedMbps:    mbps(p.Passed, c.Passed),
		DroppedMbps:   mbps(p.Dropped, c.Dropped),
		AnsweredPPS:   pps(p.Answered, c.Answered),
		AnsweredMbps:  mbps(p.Answered, c.Answered),
		MonitoredPPS:  pps(p.Monitored, c.Monitored),
		MonitoredMbps: mbps(p.Monitored, c.Monitored),
	}
}

// since is what a counter added from prev to cur. A counter lower than
// before was reset (a re-attach recreates the counters at zero): it
// counted cur since.
func since(prev, cur uint64) uint64 {
	if cur < prev {
		return cur
	}
	return cur - prev
}

func printStats(w io.Writer, reports []StatsReport, asJSON bool) error {
	if asJSON {
		if reports == nil {
			reports = []StatsReport{}
		}
		return writeJSON(w, reports)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	for _, r := range reports {
		fmt.Fprintf(tw, "%s\tpackets\tbytes\t", r.Iface)
		if r.Rates != nil {
			fmt.Fprint(tw, "pps\tMbit/s\t")
		}
		fmt.Fprintln(tw)
		row := func(name string, c shield.Count, pps, mbps float64) {
			fmt.Fprintf(tw, "%s\t%d\t%s\t", name, c.Packets, humanBytes(c.Bytes))
			if r.Rates != nil {
				fmt.Fprintf(tw, "%.0f\t%.2f\t", pps, mbps)
			}
			fmt.Fprintln(tw)
		}
		var pr, dr Rates
		if r.Rates != nil {
			pr, dr = *r.Rates, *r.Rates
		}
		row("passed", r.Passed, pr.PassedPPS, pr.PassedMbps)
		row("dropped", r.Dropped, dr.DroppedPPS, dr.DroppedMbps)
		if r.Answered.Packets > 0 {
			row("answered", r.Answered, pr.AnsweredPPS, pr.AnsweredMbps)
		}
		if r.Monitored.Packets > 0 {
			// Passed in monitor mode; a rule would have dropped them.
			row("monitored", r.Monitored, pr.MonitoredPPS, pr.MonitoredMbps)
		}
		reasons := make([]string, 0, len(r.ByReason))
		for k := range r.ByReason {
			reasons = append(reasons, k)
		}
		sort.Strings(reasons)
		for _, k := range reasons {
			rc := r.ByReason[k]
			if rc.Passed.Packets > 0 {
				fmt.Fprintf(tw, "  %s passed\t%d\t%s\t\n", k, rc.Passed.Packets, humanBytes(rc.Passed.Bytes))
			}
			if rc.Dropped.Packets > 0 {
				fmt.Fprintf(tw, "  %s dropped\t%d\t%s\t\n", k, rc.Dropped.Packets, humanBytes(rc.Dropped.Bytes))
			}
			if rc.Answered.Packets > 0 {
				fmt.Fprintf(tw, "  %s answered\t%d\t%s\t\n", k, rc.Answered.Packets, humanBytes(rc.Answered.Bytes))
			}
			if rc.Monitored.Packets > 0 {
				fmt.Fprintf(tw, "  %s monitored\t%d\t%s\t\n", k, rc.Monitored.Packets, humanBytes(rc.Monitored.Bytes))
			}
		}
	}
	return tw.Flush()
}

func humanBytes(b uint64) string {
	const unit = 1024
	if b < unit {
		return fmt.Sprintf("%d B", b)
	}
	div, exp := uint64(unit), 0
	for n := b / unit; n >= unit; n /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(b)/float64(div), "KMGTPE"[exp])
}

func newImportCmd(g *globals) *cobra.Command {
	var list string
	var replace bool
	cmd := &cobra.Command{
		Use:   "import FILE|-",
		Short: "Load rules from JSON (as export writes) or a plain list of addresses/CIDRs (ipset, FireHOL netsets)",
		Args:  args(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, a []string) error {
			if list != "deny" && list != "allow" {
				return usagef("invalid --list %q: want deny or allow", list)
			}
			var r io.Reader = cmd.InOrStdin()
			name := a[0]
			if name != "-" {
				f, err := os.Open(name)
				if err != nil {
					return usagef("%v", err)
				}
				defer f.Close()
				// The file itself, not a buffer over it: ReadAll refuses
				// one too large by its size, before reading it.
				r = f
			}
			data, err := rules.ReadAll(name, r)
			if err != nil {
				return &usageError{err}
			}
			// JSON holds both lists; a --list the import would ignore is
			// a mistake better said than passed over.
			t := bytes.TrimSpace(data)
			isJSON := len(t) > 0 && t[0] == '{'
			if isJSON && cmd.Flags().Changed("list") {
				return usagef("--list picks the list of a plain file; JSON holds every list")
			}
			rs, err := rules.ReadRuleset(name, bytes.NewReader(data), list)
			if err != nil {
				return &usageError{err}
			}
			// An entry whose time is up would only wait in the maps for
			// the next expiry run (an old export, restored late).
			if n := rs.DropExpired(time.Now()); n > 0 {
				fmt.Fprintf(cmd.ErrOrStderr(), "note: %d allow/deny entries expired before the import and are left out\n", n)
			}
			s, err := g.open()
			if err != nil {
				return err
			}
			defer s.Close()
			start := time.Now()
			var res shield.ApplyResult
			if replace && !isJSON {
				res, err = replaceList(s, rs, list)
			} else {
				res, err = s.Apply(rs, replace)
			}
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), importReport(res, time.Since(start)))
			return nil
		},
	}
	cmd.Flags().StringVar(&list, "list", "deny", "list that a plain file goes to: deny or allow")
	cmd.Flags().BoolVar(&replace, "replace", false, "make the rules equal to the file (new entries go in before old ones go out); a plain list replaces only the list named by --list")
	return cmd
}

// replaceList makes one list equal to a plain file. A plain file holds one
// list only, so --replace must not empty the other list and the port
// rules, as replacing with the whole (mostly empty) ruleset would.
func replaceList(s *shield.Shield, rs *rules.Ruleset, list string) (shield.ApplyResult, error) {
	if list == "allow" {
		return s.ReplaceList(shield.AllowList, rs.Allow)
	}
	return s.ReplaceList(shield.DenyList, rs.Deny)
}

// importReport says what an import changed. Entries and port rules that
// the import found as it wanted them were left alone, hit counts and all.
func importReport(res shield.ApplyResult, took time.Duration) string {
	took = took.Round(time.Millisecond)
	if !res.Changed() {
		return fmt.Sprintf("no change: %d allow/deny entries already as imported, in %s", res.Unchanged, took)
	}
	out := fmt.Sprintf("imported: %d allow/deny entries added, %d updated, %d removed, %d unchanged; %d port rule changes",
		res.Added, res.Updated, res.Removed, res.Unchanged, res.PortRules)
	if res.Settings {
		out += "; policy changed"
	}
	return fmt.Sprintf("%s; in %s", out, took)
}

func newExportCmd(g *globals) *cobra.Command {
	var format, list string
	cmd := &cobra.Command{
		Use:   "export",
		Short: "Write every rule as JSON (or one list as plain CIDRs) to stdout",
		Args:  args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if format != "json" && format != "plain" {
				return usagef("invalid --format %q: want json or plain", format)
			}
			if list != "deny" && list != "allow" {
				return usagef("invalid --list %q: want deny or allow", list)
			}
			// JSON holds both lists; a --list the output would ignore is
			// a mistake better said than passed over.
			if cmd.Flags().Changed("list") && format != "plain" {
				return usagef("--list picks the list of --format plain; JSON holds every list")
			}
			s, err := g.openExistingAsIs()
			if err != nil {
				return err
			}
			defer s.Close()
			if format == "json" {
				rs, err := s.Export()
				if err != nil {
					return err
				}
				return writeJSON(cmd.OutOrStdout(), rs)
			}
			l := shield.DenyList
			if list == "allow" {
				l = shield.AllowList
			}
			all, err := s.Entries(l)
			if err != nil {
				return err
			}
			// A plain list has no expiry: an entry whose time is up, which
			// the filter ignores, would come back for good when the file is
			// imported. Nor does it hold auto-blocks, which are the rate
			// limits', not rules: imported, one would block for good. An
			// entry with an expiry still to come is written without it.
			var expired, auto, timed int
			entries := slices.DeleteFunc(all, func(e shield.Entry) bool {
				switch {
				case !e.Live():
					expired++
				case e.Auto:
					auto++
				default:
					if !e.Expires.IsZero() {
						timed++
					}
					return false
				}
				return true
			})
			if expired > 0 {
				fmt.Fprintf(cmd.ErrOrStderr(), "note: %d expired entries left out\n", expired)
			}
			if auto > 0 {
				fmt.Fprintf(cmd.ErrOrStderr(), "note: %d auto-blocks left out\n", auto)
			}
			if timed > 0 {
				fmt.Fprintf(cmd.ErrOrStderr(), "note: %d entries written without their expiry (a plain list has none)\n", timed)
			}
			w := bufio.NewWriter(cmd.OutOrStdout())
			fmt.Fprintf(w, "# moat %slist, %d entries, exported %s\n", list, len(entries), time.Now().UTC().Format(time.RFC3339))
			for _, e := range entries {
				line := e.Prefix.String()
				if e.Comment != "" {
					line += " # " + strings.ReplaceAll(e.Comment, "#", "")
				}
				fmt.Fprintln(w, line)
			}
			return w.Flush()
		},
	}
	cmd.Flags().StringVar(&format, "format", "json", "json or plain")
	cmd.Flags().StringVar(&list, "list", "deny", "with --format plain: deny or allow")
	return cmd
}
