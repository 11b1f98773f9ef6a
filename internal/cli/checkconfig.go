package cli

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/moat-shield/moat/internal/config"
)

func newCheckConfigCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "check-config [FILE]",
		Short: "Check a config file, and the rule files it names, reporting every error with its line",
		Args:  args(cobra.MaximumNArgs(1)),
		RunE: func(cmd *cobra.Command, a []string) error {
			path := DefaultConfig
			if len(a) == 1 {
				path = a[0]
			}
			cfg, set, err := config.Load(path)
			if err != nil {
				return configErrors(cmd, err)
			}
			rs := set.Rules
			fmt.Fprintf(cmd.OutOrStdout(), "%s: ok: %d interfaces, %d allow and %d deny entries (%d from rule files), %d port rules, %d SYN-protected ports\n",
				path, len(cfg.Interfaces), len(rs.Allow), len(rs.Deny), set.FromFiles, len(rs.Ports), len(cfg.SYN.Ports))
			return nil
		},
	}
}
