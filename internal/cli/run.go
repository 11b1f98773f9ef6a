package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/moat-shield/moat/internal/config"
	"github.com/moat-shield/moat/internal/daemon"
)

// DefaultConfig is where `moat run` and `moat check-config` look for the
// config file when none is named.
const DefaultConfig = "/etc/moat/moat.yaml"

func init() {
	extraCommands = append(extraCommands, newRunCmd, newReloadCmd, newCheckConfigCmd)
}

func newRunCmd(g *globals) *cobra.Command {
	var cfgPath string
	cmd := &cobra.Command{
		Use:   "run [--config FILE]",
		Short: "Run the moat daemon in the foreground (for systemd): attach, apply the config, serve the API and metrics",
		Long: "The daemon attaches to the configured interfaces, applies the config's rules and the rules " +
			"added at run time (kept in the state file), rotates the SYN cookie keys, expires timed rules and " +
			"serves the API on a unix socket and the metrics over HTTP. SIGHUP or `moat reload` reloads the " +
			"config; SIGTERM stops the daemon and leaves the filter attached with its rules.",
		Args: args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if os.Geteuid() != 0 {
				return errors.New("moat needs root (CAP_BPF and CAP_NET_ADMIN)")
			}
			opts := daemon.Options{ConfigPath: cfgPath}
			if cmd.Flags().Changed("root") || os.Getenv("MOAT_ROOT") != "" {
				opts.Root = g.root
			}
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			err := daemon.Run(ctx, opts)
			return configErrors(cmd, err)
		},
	}
	cmd.Flags().StringVarP(&cfgPath, "config", "c", DefaultConfig, "config file")
	return cmd
}

// configErrors prints each error of a config on its own line (FILE:LINE:
// message) and turns them into a usage error.
func configErrors(cmd *cobra.Command, err error) error {
	var ce *config.Errors
	if !errors.As(err, &ce) {
		return err
	}
	for _, e := range ce.List {
		fmt.Fprintln(cmd.ErrOrStderr(), (&config.Errors{File: ce.File, List: []config.Error{e}}).Error())
	}
	n := len(ce.List)
	if n == 1 {
		return usagef("%s: 1 error", ce.File)
	}
	return usagef("%s: %d errors", ce.File, n)
}
