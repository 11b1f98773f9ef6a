package cli

import (
	"fmt"
	"net"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/moat-shield/moat/internal/datapath"
	"github.com/moat-shield/moat/internal/rules"
	"github.com/moat-shield/moat/internal/shield"
)

func newAttachCmd(g *globals) *cobra.Command {
	var mode string
	cmd := &cobra.Command{
		Use:   "attach IFACE...",
		Short: "Attach the filter to interfaces (replaces it in place if attached)",
		Args:  args(cobra.MinimumNArgs(1)),
		RunE: func(cmd *cobra.Command, ifaces []string) error {
			m, err := shield.ParseMode(mode)
			if err != nil {
				return err
			}
			if err := g.refuseIfManaged(); err != nil {
				return err
			}
			// Refuse a missing interface before attaching to any, so that
			// a refused command changes nothing.
			if err := checkNames(ifaces); err != nil {
				return err
			}
			for _, name := range ifaces {
				if _, err := net.InterfaceByName(name); err != nil {
					return usagef("no interface %q", name)
				}
			}
			err = attachAll(cmd, g, ifaces, m)
			if err != nil && g.created {
				// A root this command created holds nothing after a
				// failure: it goes, whatever the error, so that a failed
				// attach leaves nothing pinned. Main must not open it
				// again to discard it.
				g.discard()
				g.created = false
			}
			return err
		},
	}
	cmd.Flags().StringVar(&mode, "mode", "", "XDP mode: native, generic, or auto (the default: native, falling back to generic)")
	return cmd
}

func newDetachCmd(g *globals) *cobra.Command {
	var all, keepRules, removeRules bool
	cmd := &cobra.Command{
		Use:   "detach IFACE... | --all [--remove-rules]",
		Short: "Detach the filter from interfaces; the last detach also removes the rules unless --keep-rules",
		Args: args(func(cmd *cobra.Command, a []string) error {
			if all != (len(a) == 0) {
				return fmt.Errorf("give interface names or --all, not both or neither")
			}
			if removeRules && (!all || keepRules) {
				return fmt.Errorf("--remove-rules goes with --all, and not with --keep-rules")
			}
			return nil
		}),
		RunE: func(cmd *cobra.Command, ifaces []string) error {
			if err := g.refuseIfManaged(); err != nil {
				return err
			}
			s, err := g.openExisting()
			if err != nil {
				return err
			}
			defer s.Close()
			atts, err := s.Attachments()
			if err != nil {
				return err
			}
			attached := map[string]bool{}
			for _, a := range atts {
				attached[a.Iface] = true
			}
			if all {
				// Nothing to detach is not a last detach: the rules of a
				// root set up before its first attach stay, unless asked.
				if len(atts) == 0 && keepRules {
					fmt.Fprintf(cmd.OutOrStdout(), "nothing attached under %s; rules kept\n", g.root)
					return nil
				}
				if len(atts) == 0 && !removeRules {
					return usagef("nothing attached under %s; rules kept (--remove-rules removes them)", g.root)
				}
				for _, a := range atts {
					ifaces = append(ifaces, a.Iface)
				}
			}
			if err := checkNames(ifaces); err != nil {
				return err
			}
			for _, name := range ifaces {
				if !attached[name] {
					return usagef("moat is not attached to %s", name)
				}
			}
			// The whole change first, then what was done: output to a
			// reader that has gone (`| head`) ends the process at its
			// first write, which must not leave the change half made.
			var detached, warnings []string
			for _, name := range ifaces {
				var warning string
				if warning, err = shield.FollowUp(s.Detach(name)); err != nil {
					break
				}
				delete(attached, name)
				detached = append(detached, name)
				warnings = append(warnings, warning)
			}
			removed := false
			if err == nil && len(attached) == 0 && !keepRules {
				err = s.Remove()
				removed = err == nil
			}
			for i, name := range detached {
				if warnings[i] != "" {
					fmt.Fprintf(cmd.ErrOrStderr(), "moat: warning: %s\n", warnings[i])
				}
				fmt.Fprintf(cmd.OutOrStdout(), "detached from %s\n", name)
			}
			if removed {
				fmt.Fprintf(cmd.OutOrStdout(), "removed rules and pins under %s\n", s.Root())
			}
			return err
		},
	}
	cmd.Flags().BoolVar(&all, "all", false, "detach from every interface")
	cmd.Flags().BoolVar(&keepRules, "keep-rules", false, "keep the rule maps pinned after the last detach")
	cmd.Flags().BoolVar(&removeRules, "remove-rules", false, "with --all: remove the rules and pins even when nothing is attached")
	return cmd
}

// attachAll attaches the filter to every interface or to none: if one is
// refused or fails, those it attached are detached again.
func attachAll(cmd *cobra.Command, g *globals, ifaces []string, m shield.Mode) error {
	s, err := g.open()
	if err != nil {
		return err
	}
	defer s.Close()
	atts, err := s.Attachments()
	if err != nil {
		return err
	}
	live := map[string]shield.Attachment{}
	for _, a := range atts {
		if ifc, err := net.InterfaceByName(a.Iface); err == nil && a.Present && a.Ifindex == ifc.Index {
			live[a.Iface] = a
		}
	}
	// Every mode is checked before anything is attached. The interfaces
	// moat is not on go first: a program replaced in place cannot be put
	// back, so the replacements wait until the new attachments are done.
	var fresh, replace []string
	for _, name := range ifaces {
		a, ok := live[name]
		if !ok {
			fresh = append(fresh, name)
			continue
		}
		if m != shield.ModeAuto && m != a.Mode {
			return usagef("%s is attached in %s mode; detach it first to change the mode", name, a.Mode)
		}
		replace = append(replace, name)
	}
	var attached []string // by this command: detached again on failure
	done := map[string]shield.AttachResult{}
	var warnings []string
	for _, name := range append(fresh, replace...) {
		res, err := s.Attach(name, m)
		// Attached, with a warning: what failed after is state the command
		// did not make, and detaching would not mend it.
		warning, err := shield.FollowUp(err)
		if warning != "" {
			warnings = append(warnings, warning)
		}
		if err != nil {
			if !res.Replaced && s.IsPinned(name) {
				// Pinned, then failed part way.
				attached = append(attached, name)
			}
			return undoAttach(s, attached, err)
		}
		if !res.Replaced {
			attached = append(attached, name)
		}
		done[name] = res
	}
	for _, w := range warnings {
		fmt.Fprintf(cmd.ErrOrStderr(), "moat: warning: %s\n", w)
	}
	for _, name := range ifaces {
		res := done[name]
		if res.Warning != "" {
			fmt.Fprintf(cmd.ErrOrStderr(), "moat: warning: %s\n", res.Warning)
		}
		verb := "attached to"
		if res.Replaced {
			verb = "replaced the program on"
		}
		fmt.Fprintf(cmd.OutOrStdout(), "%s %s (%s mode)\n", verb, name, res.Mode)
	}
	return nil
}

// undoAttach detaches the interfaces that a failed attach had attached,
// and returns the attach's error: still a refusal if it was one, unless
// an interface could not be detached, which leaves a change behind.
func undoAttach(s *shield.Shield, attached []string, err error) error {
	var failed []string
	for _, name := range attached {
		if _, derr := shield.FollowUp(s.Detach(name)); derr != nil {
			failed = append(failed, fmt.Sprintf("%s (%v)", name, derr))
		}
	}
	if len(failed) > 0 {
		return fmt.Errorf("%v; detaching again failed: %s", err, strings.Join(failed, ", "))
	}
	return err
}

// checkNames refuses an interface named twice: the second attach or detach
// would act on the state the first had just changed.
func checkNames(ifaces []string) error {
	seen := map[string]bool{}
	for _, name := range ifaces {
		if seen[name] {
			return usagef("interface %s given twice", name)
		}
		seen[name] = true
	}
	return nil
}

// Status is what `moat status --json` prints.
type Status struct {
	Root       string              `json:"root"`
	Interfaces []shield.Attachment `json:"interfaces"`
	Rules      RuleCounts          `json:"rules"`
	Settings   rules.Settings      `json:"settings"`
	Summary    DenySummary         `json:"deny_summary"`
}

// DenySummary says which families the deny summary serves: for a source
// whose summary bit is clear the filter skips the deny lookups. A family is
// off while a filter of an older moat is attached, while the data path has
// flagged it (an IPv6 auto-block shorter than /32, until the rebuild that
// its removal brings), or if the summary could not be built (Error).
type DenySummary struct {
	IPv4 bool `json:"ipv4"`
	IPv6 bool `json:"ipv6"`
	// The host summary: sources of the family with no host entry nearby
	// skip the host lookup.
	HostIPv4 bool `json:"host_ipv4"`
	HostIPv6 bool `json:"host_ipv6"`
	// Entries removed since the last rebuild, whose bits may be stale.
	Removed uint64 `json:"removed_since_rebuild"`
	Error   string `json:"error,omitempty"`
}

// RuleCounts counts rules per kind.
type RuleCounts struct {
	Allow int `json:"allow"`
	Deny  int `json:"deny"`
	Ports int `json:"ports"`
}

func newStatusCmd(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show interfaces, modes, program ids and rule counts",
		Args:  args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if _, err := os.Stat(g.root); err != nil {
				if asJSON {
					// The policies a new state starts with.
					set := rules.Settings{Fragments: "pass", Malformed: "drop"}
					return writeJSON(cmd.OutOrStdout(), Status{Root: g.root, Interfaces: []shield.Attachment{}, Settings: set})
				}
				fmt.Fprintf(cmd.OutOrStdout(), "moat is not set up (nothing pinned under %s)\n", g.root)
				return nil
			}
			s, err := g.openExistingAsIs()
			if err != nil {
				return err
			}
			defer s.Close()
			st := Status{Root: g.root}
			if st.Interfaces, err = s.Attachments(); err != nil {
				return err
			}
			if st.Interfaces == nil {
				st.Interfaces = []shield.Attachment{}
			}
			if st.Rules.Allow, err = s.Count(shield.AllowList); err != nil {
				return err
			}
			if st.Rules.Deny, err = s.Count(shield.DenyList); err != nil {
				return err
			}
			ports, err := s.PortRules()
			if err != nil {
				return err
			}
			st.Rules.Ports = len(ports)
			if st.Settings, err = s.Settings(); err != nil {
				return err
			}
			sum, err := s.DenySummary()
			if err != nil {
				return err
			}
			inUse, err := s.SummaryInUse()
			if err != nil {
				return err
			}
			st.Summary = DenySummary{
				IPv4:     inUse&uint32(datapath.MoatDenySummaryFamilySUMMARY_V4) != 0,
				IPv6:     inUse&uint32(datapath.MoatDenySummaryFamilySUMMARY_V6) != 0,
				HostIPv4: sum.Ready&uint32(datapath.MoatDenySummaryFamilySUMMARY_V4HOSTS) != 0,
				HostIPv6: sum.Ready&uint32(datapath.MoatDenySummaryFamilySUMMARY_V6HOSTS) != 0,
				Removed:  sum.Removed,
			}
			if s.SummaryErr != nil {
				st.Summary.Error = s.SummaryErr.Error()
			}
			if asJSON {
				return writeJSON(cmd.OutOrStdout(), st)
			}
			w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "INTERFACE\tIFINDEX\tMODE\tPROGRAM\tLINK")
			for _, a := range st.Interfaces {
				mode := string(a.Mode)
				if !a.Present {
					mode = "gone"
				}
				fmt.Fprintf(w, "%s\t%d\t%s\t%d\t%d\n", a.Iface, a.Ifindex, mode, a.ProgramID, a.LinkID)
			}
			w.Flush()
			fmt.Fprintf(cmd.OutOrStdout(), "rules: %d allow, %d deny, %d port\npolicy: fragments %s, malformed %s\n",
				st.Rules.Allow, st.Rules.Deny, st.Rules.Ports, st.Settings.Fragments, st.Settings.Malformed)
			for _, a := range st.Interfaces {
				if a.AcceptorMisplaced {
					fmt.Fprintf(cmd.OutOrStdout(), "%s: moat's SYN acceptor is not where the filter needs it (a bridge made anew, or %s "+
						"joined, left or changed bridges): the kernel resets cookie handshakes there until `moat attach %s` "+
						"(a daemon whose config names it does it itself)\n", a.Iface, a.Iface, a.Iface)
				}
			}
			if name, err := s.SettingsOlderFilter(); err == nil && name != "" {
				fmt.Fprintf(cmd.OutOrStdout(), "%s runs an older moat's filter: the policy and monitor mode above do not reach it until `moat attach %s`\n", name, name)
			}
			if st.Settings.Monitor {
				fmt.Fprintln(cmd.OutOrStdout(), "MONITOR MODE: nothing is dropped; what rules would drop passes and is counted as monitored (moat policy monitor off to enforce)")
			}
			fmt.Fprintf(cmd.OutOrStdout(), "deny summary: ipv4 %s, ipv6 %s (host summary: ipv4 %s, ipv6 %s), %d entries removed since the last rebuild\n",
				onOff(st.Summary.IPv4), onOff(st.Summary.IPv6), onOff(st.Summary.HostIPv4), onOff(st.Summary.HostIPv6), st.Summary.Removed)
			if st.Summary.Error != "" {
				fmt.Fprintf(cmd.OutOrStdout(), "deny summary: not in use: %s\n", st.Summary.Error)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}
