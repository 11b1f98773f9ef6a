// Package cli is the moat command line: thin commands over internal/shield
// and internal/rules.
package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/moat-shield/moat/internal/shield"
)

// Exit statuses.
const (
	exitOK      = 0
	exitFailure = 1 // the system failed us
	exitUsage   = 2 // the user asked for something wrong; nothing changed
)

// usageError marks a bad argument or flag.
type usageError struct{ err error }

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

func usagef(format string, args ...any) error { return &usageError{fmt.Errorf(format, args...)} }

// Main runs the command line and returns the process exit status.
func Main(args []string, stdout, stderr io.Writer) int {
	g := &globals{}
	root := newRoot(g)
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.Execute()
	if err == nil {
		return exitOK
	}
	fmt.Fprintf(stderr, "moat: %v\n", err)
	var ue *usageError
	var se *shield.UserError
	if errors.As(err, &ue) || errors.As(err, &se) || isFlagError(err) {
		if g.created {
			g.discard()
		}
		return exitUsage
	}
	return exitFailure
}

// isFlagError recognises cobra's own argument and flag errors, which carry
// no type of their own.
func isFlagError(err error) bool {
	_, ok := err.(flagError)
	return ok
}

type flagError struct{ error }

type globals struct {
	root    string
	created bool      // open found no state under root and so created it
	errOut  io.Writer // the running command's stderr, for warnings
	warned  bool      // the warning that no daemon answers was given
}

// NewRoot builds the command tree.
func NewRoot() *cobra.Command { return newRoot(&globals{}) }

func newRoot(g *globals) *cobra.Command {
	root := &cobra.Command{
		Use:           "moat",
		Short:         "moat: an XDP/eBPF DDoS shield",
		SilenceUsage:  true,
		SilenceErrors: true,
		// With Args and RunE set, cobra hands a mistyped command to the
		// root, which refuses it as a usage error; otherwise cobra fails
		// with an untyped, multi-line "unknown command" error.
		Args: args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			g.errOut = cmd.ErrOrStderr()
			// A root is named by its absolute path wherever it is
			// compared or named: a daemon's root, the name of its lock.
			// Abs would take "" for the working directory.
			if g.root == "" {
				return usagef("--root is empty")
			}
			abs, err := filepath.Abs(g.root)
			if err != nil {
				return usagef("--root %s: %v", g.root, err)
			}
			g.root = abs
			return nil
		},
	}
	def := os.Getenv("MOAT_ROOT")
	if def == "" {
		def = shield.DefaultRoot
	}
	root.PersistentFlags().StringVar(&g.root, "root", def, "bpffs directory of moat's pinned state (env MOAT_ROOT)")
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return flagError{err} })

	root.AddCommand(
		newAttachCmd(g), newDetachCmd(g), newStatusCmd(g),
		newBlockCmd(g), newUnblockCmd(g), newAllowCmd(g), newDisallowCmd(g),
		newPortCmd(g), newListCmd(g), newStatsCmd(g),
		newImportCmd(g), newExportCmd(g), newPolicyCmd(g), newExpireCmd(g),
	)
	for _, extra := range extraCommands {
		root.AddCommand(extra(g))
	}
	return root
}

// extraCommands lets feature files (flood, syn, ...) register themselves.
var extraCommands []func(*globals) *cobra.Command

// open opens the pinned state to change it. Where a daemon manages this
// root it refuses: the daemon is the one writer, and a change made behind
// its back would be neither persisted nor kept at its next reload. The
// commands whose changes the daemon takes through its API ask it first.
func (g *globals) open() (*shield.Shield, error) {
	if err := g.refuseIfManaged(); err != nil {
		return nil, err
	}
	return g.openState()
}

// refuseIfManaged fails with a usage error when a daemon manages g.root.
func (g *globals) refuseIfManaged() error {
	c, err := g.daemon()
	if err != nil {
		return err
	}
	if c != nil {
		return usagef("a moat daemon manages %s (%s): change its config file and run `moat reload`", g.root, c.socket)
	}
	return nil
}

// openState opens the pinned state, creating it if need be.
func (g *globals) openState() (*shield.Shield, error) { return g.openWith(shield.Open) }

// openWith is openState with the given opener.
func (g *globals) openWith(open func(string) (*shield.Shield, error)) (*shield.Shield, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("moat needs root (CAP_BPF and CAP_NET_ADMIN)")
	}
	if _, err := os.Stat(g.root); errors.Is(err, fs.ErrNotExist) {
		g.created = true
	}
	s, err := open(g.root)
	if err == nil {
		for _, r := range s.Renamed {
			fmt.Fprintf(os.Stderr, "moat: note: %s\n", r)
		}
		if s.StrandedCensusTaker {
			errOut := g.errOut
			if errOut == nil {
				errOut = os.Stderr
			}
			fmt.Fprintf(errOut, "moat: warning: this version replaced maps of %s (their layout changed), which an older moat's daemon or "+
				"`moat syn rotate --every` still running uses (it takes the socket census): it can no longer open the state "+
				"and stops at its next key rotation, and moat issues no cookies once the keys are 2.5 rotation periods old; "+
				"restart it with this version now\n", g.root)
		}
	}
	return s, err
}

// openExisting opens the pinned state for commands that only read it or
// remove from it: where nothing is pinned they refuse rather than create
// the maps (tens of MiB of kernel memory) just to find them empty.
func (g *globals) openExisting() (*shield.Shield, error) {
	if _, err := os.Stat(g.root); errors.Is(err, fs.ErrNotExist) {
		return nil, usagef("moat is not set up: nothing is pinned under %s", g.root)
	}
	return g.openState()
}

// openExistingAsIs is openExisting for commands that only read, and for
// expire: maps an older moat pinned stay as they are (shield.OpenAsIs),
// so that a look at the state before an upgrade takes nothing from under
// the older moat's filter, daemon or rotator.
func (g *globals) openExistingAsIs() (*shield.Shield, error) {
	if _, err := os.Stat(g.root); errors.Is(err, fs.ErrNotExist) {
		return nil, usagef("moat is not set up: nothing is pinned under %s", g.root)
	}
	return g.openWith(shield.OpenAsIs)
}

// openAsIs is open for commands that change only the allow and deny
// lists and the port rules, whose maps keep their layout across
// versions: maps an older moat pinned stay as they are (shield.OpenAsIs).
// A block in the middle of a flood, with this version's binary installed
// while the older moat's rotator still runs, must not stop that rotator.
func (g *globals) openAsIs() (*shield.Shield, error) {
	if err := g.refuseIfManaged(); err != nil {
		return nil, err
	}
	return g.openWith(shield.OpenAsIs)
}

// discard removes the empty state that a refused command created, so that
// a refused command changes nothing on a host where moat was not set up.
func (g *globals) discard() {
	s, err := shield.Open(g.root)
	if err != nil {
		return
	}
	defer s.Close()
	atts, err := s.Attachments()
	if err != nil || len(atts) > 0 {
		return
	}
	rs, err := s.Snapshot()
	if err != nil || len(rs.Allow)+len(rs.Deny)+len(rs.Ports) > 0 {
		return
	}
	s.Remove()
}

// args wraps cobra's positional-argument checks so their errors count as
// usage errors.
func args(check cobra.PositionalArgs) cobra.PositionalArgs {
	return func(cmd *cobra.Command, a []string) error {
		if err := check(cmd, a); err != nil {
			return &usageError{err}
		}
		return nil
	}
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// acceptIfaceFlag lets a command's --interface also be given as --iface,
// the name stats and flood first had (dump and the config say interface).
func acceptIfaceFlag(cmd *cobra.Command) {
	cmd.Flags().SetNormalizeFunc(func(_ *pflag.FlagSet, name string) pflag.NormalizedName {
		if name == "iface" {
			name = "interface"
		}
		return pflag.NormalizedName(name)
	})
}
