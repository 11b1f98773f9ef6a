package cli

import (
	"fmt"
	"net"
	"slices"

	"github.com/spf13/cobra"

	"github.com/moat-shield/moat/internal/config"
	"github.com/moat-shield/moat/internal/syncookie"
)

func newCheckConfigCmd(g *globals) *cobra.Command {
	var fileOnly bool
	cmd := &cobra.Command{
		Use:   "check-config [FILE]",
		Short: "Check a config file, the rule files it names and what it needs of this host, reporting every error with its line",
		Long: `Check a config file and the rule files it names, reporting every error
with its line. Then check what the daemon would refuse on this host: the
CA and token files of feeds must be here (a CA file holding certificates),
every interface must exist, and ports that issue SYN cookies need the
kernel's net.ipv4.tcp_syncookies (TCP options turned off in the namespace
are noted). --file-only skips the host, to check a file meant for another
machine.`,
		Args: args(cobra.MaximumNArgs(1)),
		RunE: func(cmd *cobra.Command, a []string) error {
			path := DefaultConfig
			if len(a) == 1 {
				path = a[0]
			}
			// Load checks the feeds' files on this host, as the daemon
			// reads the config; LoadFileOnly leaves them out.
			load := config.Load
			if fileOnly {
				load = config.LoadFileOnly
			}
			cfg, set, err := load(path)
			if err != nil {
				return configErrors(cmd, err)
			}
			if !fileOnly {
				if errs := checkHost(cmd, cfg); len(errs) > 0 {
					return configErrors(cmd, &config.Errors{File: path, List: errs})
				}
			}
			rs := set.Rules
			feeds := ""
			if n := len(cfg.Feeds()); n > 0 {
				feeds = ", " + count(n, "feed") + " (the daemon fetches them)"
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s: ok: %s, %d allow and %d deny entries (%d from rule files)%s, %s, %s\n",
				path, count(len(cfg.Interfaces), "interface"), len(rs.Allow), len(rs.Deny), set.FromFiles, feeds,
				count(len(rs.Ports), "port rule"), count(len(cfg.SYN.Ports), "SYN-protected port"))
			return nil
		},
	}
	cmd.Flags().BoolVar(&fileOnly, "file-only", false, "check the file alone, not what it needs of this host")
	return cmd
}

// checkHost returns what the daemon would refuse cfg for on this host (in
// this network namespace), and prints the notes it would log. The feeds'
// files were checked by config.Load.
func checkHost(cmd *cobra.Command, cfg *config.Config) []config.Error {
	var errs []config.Error
	for _, i := range cfg.Interfaces {
		if _, err := net.InterfaceByName(i.Name); err != nil {
			errs = append(errs, config.Error{Line: i.Line, Msg: fmt.Sprintf("interfaces: no interface %q on this host", i.Name)})
		}
	}
	if p, ok := cfg.SYN.CookiePort(); ok {
		notes, err := syncookie.CheckSysctls()
		if err != nil {
			errs = append(errs, config.Error{Line: p.Line, Msg: fmt.Sprintf("syn.ports: moat cannot issue cookies for tcp/%d in this network namespace: %v", p.Port, err)})
		}
		for _, n := range notes {
			fmt.Fprintf(cmd.ErrOrStderr(), "note: %s\n", n)
		}
	}
	slices.SortStableFunc(errs, func(a, b config.Error) int { return a.Line - b.Line })
	return errs
}

// count is n things, "1 thing" or "2 things".
func count(n int, thing string) string {
	if n == 1 {
		return "1 " + thing
	}
	return fmt.Sprintf("%d %ss", n, thing)
}
