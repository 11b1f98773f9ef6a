package cli

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/moat-shield/moat/internal/datapath"
)

func init() { extraCommands = append(extraCommands, newRebuildSummaryCmd) }

// newRebuildSummaryCmd rebuilds the deny summary from the denylist: the
// repair after a moat from before the summary wrote denylist entries.
func newRebuildSummaryCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "rebuild-summary",
		Short: "Rebuild the deny summary from the denylist (after a downgrade wrote entries, or to clear stale bits now)",
		Args:  args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			s, err := g.openExisting()
			if err != nil {
				return err
			}
			defer s.Close()
			if err := s.RebuildDenySummary(); err != nil {
				return err
			}
			in, err := s.SummaryInUse()
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "deny summary rebuilt (families in use: %s)\n", summaryFamiliesText(in))
			return nil
		},
	}
}

func summaryFamiliesText(in uint32) string {
	switch in {
	case uint32(datapath.MoatDenySummaryFamilySUMMARY_V4 | datapath.MoatDenySummaryFamilySUMMARY_V6):
		return "ipv4, ipv6"
	case uint32(datapath.MoatDenySummaryFamilySUMMARY_V4):
		return "ipv4"
	case uint32(datapath.MoatDenySummaryFamilySUMMARY_V6):
		return "ipv6"
	}
	return "none"
}
