package cli

import (
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/moat-shield/moat/internal/ratelimit"
)

// StatsDetail is what `moat stats --detail --json` prints: the attack
// shape, the limits with their counters, and the switches.
type StatsDetail struct {
	Shape  ratelimit.Shape    `json:"shape"`
	Limits []ratelimit.Status `json:"limits"`
	Config ratelimit.Config   `json:"config"`
}

// detailPorts is how many destination ports the detail shows.
const detailPorts = 20

// printDetail prints the attack shape of the traffic that reached the rate
// limits (past the allow and deny lists).
func printDetail(g *globals, w io.Writer, asJSON bool) error {
	s, m, err := openLimits(g.openExistingAsIs)
	if err != nil {
		return err
	}
	defer s.Close()
	var d StatsDetail
	if d.Shape, err = m.Shape(detailPorts); err != nil {
		return err
	}
	if d.Limits, err = m.Limits(); err != nil {
		return err
	}
	if d.Config, err = m.Config(); err != nil {
		return err
	}
	if d.Limits == nil {
		d.Limits = []ratelimit.Status{}
	}
	if asJSON {
		return writeJSON(w, d)
	}
	if !d.Config.Shape {
		fmt.Fprintln(w, "attack shape counting is off (moat limit config --shape on)")
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	section := func(title string, cs []ratelimit.Count) {
		fmt.Fprintf(tw, "%s\t\t\n", title)
		var tot uint64
		for _, c := range cs {
			tot += c.Packets
		}
		for _, c := range cs {
			if c.Packets == 0 {
				continue
			}
			fmt.Fprintf(tw, "  %s\t%d\t%.1f%%\n", c.Name, c.Packets, 100*float64(c.Packets)/float64(tot))
		}
	}
	section("frame size (bytes)", d.Shape.Sizes)
	section("protocol", d.Shape.Protocols)
	if d.Shape.Fragments > 0 {
		fmt.Fprintf(tw, "  fragments\t%d\t\n", d.Shape.Fragments)
	}
	section("TCP flags", d.Shape.TCPFlags)
	section("SYN options", d.Shape.SYNOptions)
	fmt.Fprintf(tw, "other TCP segments\t\t\n  with options\t%d\t\n  without options\t%d\t\n", d.Shape.TCPOptions, d.Shape.TCPNoOptions)
	section(fmt.Sprintf("destination (top %d)", detailPorts), d.Shape.Ports)
	fmt.Fprintf(tw, "limits\t\t\n")
	for _, l := range d.Limits {
		fmt.Fprintf(tw, "  %s\tpassed %d\tdropped %d\tblocks %d", l.Limit, l.Stats.Passed, l.Stats.Dropped, l.Stats.Blocks)
		if l.Stats.Monitored > 0 {
			// Passed in monitor mode; the limit would have dropped them.
			fmt.Fprintf(tw, "\tmonitored %d", l.Stats.Monitored)
		}
		fmt.Fprintln(tw)
	}
	return tw.Flush()
}
