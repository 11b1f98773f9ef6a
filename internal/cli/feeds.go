package cli

import (
	"fmt"
	"net/http"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/moat-shield/moat/internal/feed"
)

func init() { extraCommands = append(extraCommands, newFeedsCmd) }

// newFeedsCmd shows the daemon's feeds: the rule lists it fetches from
// other hosts, how current each copy is and what went wrong last.
func newFeedsCmd(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "feeds",
		Short: "Show the rule lists the daemon fetches from URLs (lists: with url: in its config): entries, last update, errors",
		Args:  args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.findDaemon(false)
			if err != nil {
				return err
			}
			if c == nil {
				return fmt.Errorf("no moat daemon manages %s: feeds are fetched by the daemon (moat run, lists: with url:)", g.root)
			}
			var feeds []feed.Status
			if err := c.call(http.MethodGet, "/v1/feeds", nil, &feeds); err != nil {
				return err
			}
			if asJSON {
				return writeJSON(cmd.OutOrStdout(), feeds)
			}
			if len(feeds) == 0 {
				fmt.Fprintln(cmd.OutOrStdout(), "no feeds: the daemon's config names no list with a url")
				return nil
			}
			now := time.Now()
			w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "URL\tALLOW\tDENY\tREFRESH\tCONFIRMED\tCHANGED\tFAILURES\tSTATE")
			for _, f := range feeds {
				state := "ok"
				switch {
				case f.Error != "":
					state = "failing: " + f.Error
				case f.FromCache:
					state = "saved copy, server not reached yet"
				case f.LastAttempt.IsZero():
					state = "not fetched yet"
				}
				fmt.Fprintf(w, "%s\t%d\t%d\t%s\t%s\t%s\t%d\t%s\n", f.URL, f.Allow, f.Deny, f.Refresh,
					ago(now, f.LastSuccess), ago(now, f.LastChange), f.Failures, state)
			}
			return w.Flush()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

// ago says how long before now t was, to the second, or "never".
func ago(now, t time.Time) string {
	if t.IsZero() {
		return "never"
	}
	return now.Sub(t).Round(time.Second).String() + " ago"
}
