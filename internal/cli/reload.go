package cli

import (
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/moat-shield/moat/internal/daemon"
)

func newReloadCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "reload",
		Short: "Make the running daemon read its config again; a bad config is refused and nothing changes",
		Args:  args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.reloadTarget(cmd.Flags().Changed("root") || os.Getenv("MOAT_ROOT") != "")
			if err != nil {
				return err
			}
			var res daemon.ReloadResult
			if err := c.call("POST", "/v1/reload", nil, &res); err != nil {
				return err
			}
			if res.Refused && len(res.Errors) == 1 {
				return usagef("reload refused, the running rules are unchanged: %s", res.Errors[0])
			}
			for _, e := range res.Errors {
				fmt.Fprintln(cmd.ErrOrStderr(), e)
			}
			if res.Refused {
				return usagef("reload refused; the running rules are unchanged")
			}
			if !res.OK {
				return errors.New("reload failed part way; see the daemon's log")
			}
			ch := res.Changes
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "reloaded in %s: %d entries written, %d removed, %d port rule changes, %d SYN port changes",
				res.Took.Round(1e6), ch.Added, ch.Removed, ch.PortRules, ch.SYNPorts)
			if ch.MonitorBlocks > 0 {
				fmt.Fprintf(out, " (of those removed, %d monitor mode auto-blocks)", ch.MonitorBlocks)
			}
			if ch.Limits > 0 {
				fmt.Fprintf(out, ", %d rate limit changes", ch.Limits)
			}
			if len(ch.Policy) > 0 {
				fmt.Fprintf(out, ", policy changed (%s)", strings.Join(ch.Policy, ", "))
			}
			if len(ch.LimitSettings) > 0 {
				fmt.Fprintf(out, ", limit settings changed (%s)", strings.Join(ch.LimitSettings, ", "))
			}
			if len(ch.Attached) > 0 {
				fmt.Fprintf(cmd.OutOrStdout(), ", attached %v", ch.Attached)
			}
			if len(ch.Detached) > 0 {
				fmt.Fprintf(cmd.OutOrStdout(), ", detached %v", ch.Detached)
			}
			fmt.Fprintln(cmd.OutOrStdout())
			return nil
		},
	}
}

// reloadTarget is the daemon that reload asks. A root named on purpose
// (--root, MOAT_ROOT) must be the daemon's: reloading another root's
// daemon would be a surprise, and the daemon that manages it is found as
// every other command finds it, on the socket or through the lock it
// holds on the root (a daemon on a socket of its own). Without one, the
// daemon on the socket is meant, or else the default root's.
func (g *globals) reloadTarget(named bool) (*daemonClient, error) {
	socket := socketPath()
	_, statErr := os.Stat(socket)
	if !named && statErr == nil {
		return newDaemonClient(socket), nil
	}
	c, err := g.findDaemon(false)
	if err != nil || c != nil {
		return c, err
	}
	if statErr != nil {
		return nil, fmt.Errorf("no moat daemon manages %s: none listens on %s, and none holds the root's lock (set MOAT_SOCKET if it listens elsewhere)", g.root, socket)
	}
	var st daemon.Status
	if err := newDaemonClient(socket).call(http.MethodGet, "/v1/status", nil, &st); err != nil {
		return nil, err
	}
	return nil, usagef("the moat daemon on %s manages %s, not %s; set MOAT_SOCKET to the socket of the daemon of %s",
		socket, st.Root, g.root, g.root)
}
