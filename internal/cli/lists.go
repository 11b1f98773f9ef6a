package cli

import (
	"fmt"
	"net/http"
	"net/netip"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/moat-shield/moat/internal/daemon"
	"github.com/moat-shield/moat/internal/rules"
	"github.com/moat-shield/moat/internal/shield"
)

// addCmd builds `block` and `allow`.
func addCmd(g *globals, use, short string, l shield.List) *cobra.Command {
	var ttl time.Duration
	var comment string
	cmd := &cobra.Command{
		Use:   use + " PREFIX...",
		Short: short,
		Args:  args(cobra.MinimumNArgs(1)),
		RunE: func(cmd *cobra.Command, a []string) error {
			prefixes, err := rules.ParsePrefixes(a)
			if err != nil {
				return &usageError{err}
			}
			if ttl < 0 || (cmd.Flags().Changed("ttl") && ttl == 0) {
				return usagef("invalid --ttl %s: must be positive", ttl)
			}
			if err := rules.ValidateComment(comment); err != nil {
				return &usageError{err}
			}
			var expires time.Time
			if ttl > 0 {
				expires = time.Now().Add(ttl)
			}
			entries := make([]shield.Entry, len(prefixes))
			for i, p := range prefixes {
				entries[i] = shield.Entry{Prefix: p, Expires: expires, Comment: comment}
			}
			if c, err := g.daemon(); err != nil {
				return err
			} else if c != nil {
				req := daemon.PrefixRequest{List: listName(l), Prefixes: a, TTL: ttl, Comment: comment}
				if err := c.call("POST", "/v1/prefixes/add", req, nil); err != nil {
					return err
				}
				c.via(cmd.ErrOrStderr())
				fmt.Fprintf(cmd.OutOrStdout(), "added %d to the %s\n", len(entries), l)
				return nil
			}
			s, err := g.openAsIs()
			if err != nil {
				return err
			}
			defer s.Close()
			// An expired entry counts as absent: the filter ignores it, and
			// the new entry takes its place.
			replaced, err := s.Insert(l, entries)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "added %d to the %s%s\n", len(entries), l, replacedNote(replaced))
			if l == shield.AllowList { // the families in use are settings
				warnSettingsOlderFilter(cmd, s)
			}
			return nil
		},
	}
	cmd.Flags().DurationVar(&ttl, "ttl", 0, "remove the entries after this long (e.g. 10m, 24h)")
	cmd.Flags().StringVar(&comment, "comment", "", "a note kept with the entries")
	return cmd
}

// replacedNote tells which expired entries and auto-blocks an add took
// the place of.
func replacedNote(r shield.Replaced) string {
	var parts []string
	for _, c := range []struct {
		what, many string
		ps         []netip.Prefix
	}{
		{"an expired entry", "expired entries", r.Expired},
		{"an auto-block", "auto-blocks", r.AutoBlocks},
	} {
		switch len(c.ps) {
		case 0:
		case 1:
			parts = append(parts, fmt.Sprintf("replaced %s: %s", c.what, c.ps[0]))
		default:
			parts = append(parts, fmt.Sprintf("replaced %d %s", len(c.ps), c.many))
		}
	}
	if len(parts) == 0 {
		return ""
	}
	return " (" + strings.Join(parts, "; ") + ")"
}

// removeCmd builds `unblock` and `disallow`.
func removeCmd(g *globals, use, short string, l shield.List) *cobra.Command {
	return &cobra.Command{
		Use:   use + " PREFIX...",
		Short: short,
		Args:  args(cobra.MinimumNArgs(1)),
		RunE: func(cmd *cobra.Command, a []string) error {
			prefixes, err := rules.ParsePrefixes(a)
			if err != nil {
				return &usageError{err}
			}
			if c, err := g.daemon(); err != nil {
				return err
			} else if c != nil {
				req := daemon.PrefixRequest{List: listName(l), Prefixes: a}
				if err := c.call("POST", "/v1/prefixes/remove", req, nil); err != nil {
					return err
				}
				c.via(cmd.ErrOrStderr())
				fmt.Fprintf(cmd.OutOrStdout(), "removed %d from the %s\n", len(prefixes), l)
				return nil
			}
			s, err := g.openAsIs()
			if err != nil {
				return err
			}
			defer s.Close()
			if err := s.RemovePrefixes(l, prefixes); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "removed %d from the %s\n", len(prefixes), l)
			return nil
		},
	}
}

// listName is a list's name in the daemon's API.
func listName(l shield.List) string {
	if l == shield.AllowList {
		return "allow"
	}
	return "deny"
}

func newBlockCmd(g *globals) *cobra.Command {
	return addCmd(g, "block", "Drop all traffic from addresses or CIDRs", shield.DenyList)
}

func newUnblockCmd(g *globals) *cobra.Command {
	return removeCmd(g, "unblock", "Remove addresses or CIDRs from the denylist", shield.DenyList)
}

func newAllowCmd(g *globals) *cobra.Command {
	return addCmd(g, "allow", "Pass all traffic from addresses or CIDRs, before any other rule", shield.AllowList)
}

func newDisallowCmd(g *globals) *cobra.Command {
	return removeCmd(g, "disallow", "Remove addresses or CIDRs from the allowlist", shield.AllowList)
}

func newPortCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "port drop|allow|remove PROTO/PORT[-PORT]...",
		Short: "Drop or allow by protocol and destination port, or by ICMP type (icmp/echo-request, icmpv6/128)",
		Args:  args(cobra.MinimumNArgs(2)),
		RunE: func(cmd *cobra.Command, a []string) error {
			verb := a[0]
			var action rules.Action
			if verb != "remove" {
				var err error
				if action, err = rules.ParseAction(verb); err != nil {
					return usagef("invalid port command %q: want drop, allow or remove", verb)
				}
			}
			var specs []rules.PortSpec
			for _, arg := range a[1:] {
				spec, err := rules.ParsePortSpec(arg)
				if err != nil {
					return &usageError{err}
				}
				for _, o := range specs {
					if o.Overlaps(spec) {
						return usagef("port rules %s and %s overlap", o, spec)
					}
				}
				specs = append(specs, spec)
			}
			if c, err := g.daemon(); err != nil {
				return err
			} else if c != nil {
				if err := c.call("POST", "/v1/ports", daemon.PortRequest{Action: verb, Rules: a[1:]}, nil); err != nil {
					return err
				}
				c.via(cmd.ErrOrStderr())
				for _, spec := range specs {
					fmt.Fprintf(cmd.OutOrStdout(), "%s %s\n", map[bool]string{true: "removed", false: verb}[verb == "remove"], spec)
				}
				return nil
			}
			s, err := g.openAsIs()
			if err != nil {
				return err
			}
			defer s.Close()
			// Check every spec before changing anything.
			existing, err := s.PortRules()
			if err != nil {
				return err
			}
			for _, spec := range specs {
				if err := checkPortChange(existing, spec, verb == "remove"); err != nil {
					return err
				}
			}
			if verb != "remove" {
				// Room for all of them, as the daemon checks.
				if err := s.CheckRoomFor(specs, action); err != nil {
					return err
				}
			}
			for i, spec := range specs {
				if verb == "remove" {
					err = s.RemovePortRule(spec)
				} else {
					err = s.AddPortRule(spec, action)
				}
				if err != nil {
					return undoPortChange(s, existing, specs[:i], verb == "remove", err)
				}
			}
			for _, spec := range specs {
				fmt.Fprintf(cmd.OutOrStdout(), "%s %s\n", map[bool]string{true: "removed", false: verb}[verb == "remove"], spec)
			}
			return nil
		},
	}
	return cmd
}

// checkPortChange mirrors the checks of AddPortRule and RemovePortRule so a
// command with several specs changes nothing if any of them is refused.
func checkPortChange(existing []shield.PortRule, spec rules.PortSpec, remove bool) error {
	for _, r := range existing {
		if remove && r.Spec == spec {
			return nil
		}
		if !remove && r.Spec.Overlaps(spec) {
			if r.Spec == spec {
				return usagef("port rule %s exists already (%s)", spec, r.Action)
			}
			return usagef("port rule %s overlaps the existing rule %s (%s)", spec, r.Spec, r.Action)
		}
	}
	if remove {
		return usagef("no port rule %s", spec)
	}
	return nil
}

// undoPortChange takes back the rules that a port command had added or
// removed (done) before it failed with err, and returns err: still a
// refusal if it was one, unless a rule could not be put back.
func undoPortChange(s *shield.Shield, existing []shield.PortRule, done []rules.PortSpec, remove bool, err error) error {
	var failed []string
	for _, spec := range done {
		var uerr error
		if remove {
			for _, r := range existing {
				if r.Spec == spec {
					uerr = s.AddPortRule(spec, r.Action)
				}
			}
		} else {
			uerr = s.RemovePortRule(spec)
		}
		if uerr != nil {
			failed = append(failed, fmt.Sprintf("%s (%v)", spec, uerr))
		}
	}
	if len(failed) > 0 {
		return fmt.Errorf("%v; putting back the rules changed before failed: %s", err, strings.Join(failed, ", "))
	}
	return err
}

func newPolicyCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "policy [fragments pass|drop] [malformed drop|pass] [monitor on|off]",
		Short: "Show or set what happens to non-first fragments and to malformed packets, and monitor mode",
		Long: "Show or set what happens to non-first fragments (they carry no ports: pass, the default, or drop) and to malformed packets (truncated or inconsistent headers: drop, the default, or pass).\n\n" +
			"monitor on puts moat in monitor mode, to try rules on live traffic: every packet a rule, limit or policy would drop passes and is counted as monitored under its reason (moat stats), and the SYN defence stands down (SYNs and ACKs go to the kernel as with mode never). Rate limits still charge their sources and auto-block, so the deny list shows what enforcing would have blocked. monitor off (the default) enforces.\n\n" +
			"Headers the kernel would see through where the filter cannot (a third VLAN tag, an IPv6 extension chain longer than eight headers, an IPv4 TCP fragment at offset 8 bytes, a first fragment that cuts its TCP, UDP or ICMP header) are dropped whatever the malformed policy: passed, they would skip every rule.",
		Args: args(func(_ *cobra.Command, a []string) error {
			if len(a)%2 != 0 {
				return fmt.Errorf("give policy names with values, e.g. fragments drop")
			}
			return nil
		}),
		RunE: func(cmd *cobra.Command, a []string) error {
			// Names first, before anything is opened: with a policy given
			// twice, which value was meant is anyone's guess.
			seen := map[string]bool{}
			for i := 0; i < len(a); i += 2 {
				switch a[i] {
				case "fragments", "malformed":
				case "monitor":
					if a[i+1] != "on" && a[i+1] != "off" {
						return usagef("invalid monitor mode %q: want on or off", a[i+1])
					}
				default:
					return usagef("unknown policy %q: want fragments, malformed or monitor", a[i])
				}
				if seen[a[i]] {
					return usagef("policy %s given twice", a[i])
				}
				seen[a[i]] = true
			}
			open := g.open
			if len(a) == 0 { // only shows the policy
				open = g.openExistingAsIs
			}
			s, err := open()
			if err != nil {
				return err
			}
			defer s.Close()
			set, err := s.Settings()
			if err != nil {
				return err
			}
			for i := 0; i < len(a); i += 2 {
				switch a[i] {
				case "fragments":
					set.Fragments = a[i+1]
				case "malformed":
					set.Malformed = a[i+1]
				case "monitor":
					set.Monitor = a[i+1] == "on"
				}
			}
			if err := set.Validate(); err != nil {
				return &usageError{err}
			}
			if len(a) > 0 {
				if err := s.SetSettings(set); err != nil {
					return err
				}
				warnSettingsOlderFilter(cmd, s)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "fragments %s\nmalformed %s\nmonitor %s\n", set.Fragments, set.Malformed, onOff(set.Monitor))
			return nil
		},
	}
}

func newExpireCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "expire",
		Short: "Delete allow and deny entries whose time has passed (the filter already ignores them)",
		Args:  args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			// Under a daemon the timed rules are the daemon's: it removes
			// them from its state file too.
			c, err := g.findDaemon(true)
			if err != nil {
				return err
			}
			if c != nil {
				var res daemon.ExpireResult
				if err := c.call(http.MethodPost, "/v1/expire", nil, &res); err != nil {
					return err
				}
				c.via(cmd.ErrOrStderr())
				fmt.Fprintf(cmd.OutOrStdout(), "removed %d expired entries\n", res.Removed)
				return nil
			}
			s, err := g.openExistingAsIs()
			if err != nil {
				return err
			}
			defer s.Close()
			n, err := s.ExpireStale()
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "removed %d expired entries\n", n)
			return nil
		},
	}
}

// warnSettingsOlderFilter warns when an interface runs a filter of an
// older moat that does not read the settings written now.
func warnSettingsOlderFilter(cmd *cobra.Command, s *shield.Shield) {
	if name, err := s.SettingsOlderFilter(); err == nil && name != "" {
		fmt.Fprintf(cmd.ErrOrStderr(), "moat: warning: %s runs an older moat's filter, which does not see this change; run `moat attach %s` to load this version's\n", name, name)
	}
}
