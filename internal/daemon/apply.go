package daemon

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/moat-shield/moat/internal/config"
	"github.com/moat-shield/moat/internal/datapath"
	"github.com/moat-shield/moat/internal/ratelimit"
	"github.com/moat-shield/moat/internal/rules"
	"github.com/moat-shield/moat/internal/shield"
	"github.com/moat-shield/moat/internal/syncookie"
)

// Changes counts what applying a config changed.
type Changes struct {
	Added     int      `json:"added"`   // allow/deny entries written (new or changed)
	Removed   int      `json:"removed"` // allow/deny entries deleted
	PortRules int      `json:"port_rules"`
	Attached  []string `json:"attached,omitempty"`
	Detached  []string `json:"detached,omitempty"`
	SYNPorts  int      `json:"syn_ports"`
	// Limits counts the rate limits added, changed or removed.
	Limits int `json:"limits"`
	// Policy and LimitSettings name the switches of policy: and
	// limit_settings: whose value changed ("monitor", "gate"...).
	Policy        []string `json:"policy,omitempty"`
	LimitSettings []string `json:"limit_settings,omitempty"`
	// MonitorBlocks is how many of Removed were monitor mode's
	// auto-blocks, deleted because monitor mode was turned off.
	MonitorBlocks int `json:"monitor_blocks,omitempty"`

	// keyRotated: applySYN rotated the SYN cookie key (see newPeriods).
	keyRotated bool

	// applied is what the maps were made to hold; once the whole
	// config is in place, its run-time rules that the config now holds
	// leave the state (dropShadowed), and not before: a later step that
	// fails keeps the old config, whose rules do not hold them.
	applied *wanted
}

// refusal is an error decided before applyDiff changed anything, or after
// it undid all it had changed: the config is refused, not half applied.
type refusal struct{ err error }

func (r *refusal) Error() string { return r.err.Error() }
func (r *refusal) Unwrap() error { return r.err }

func refused(err error) error { return &refusal{err} }

// applyDiff makes the pinned state what cfg (with the rule files read into
// set), its feeds (fs) and the dynamic rules ask for. old is the config applied before, or
// nil at start. Everything that can be checked is checked before the first
// write, and what can fail for reasons outside moat's maps (attaching a
// new interface) is done before the first write too, and undone if a later
// step fails. Entries are written before stale ones are deleted, and
// entries present before and after are not touched, so the data path never
// sees a rule missing that both the old and the new rules hold. An error
// that is a *refusal left everything as it was.
func (d *Daemon) applyDiff(s *shield.Shield, old, cfg *config.Config, set *config.Set, fs *feedSet) (ch Changes, err error) {
	oldIfaces := map[string]config.Interface{}
	if old != nil {
		for _, i := range old.Interfaces {
			oldIfaces[i.Name] = i
		}
	}
	if _, ok := cfg.SYN.CookiePort(); ok {
		// The kernel takes moat's cookie handshakes only with
		// tcp_syncookies set: refuse the config before anything changes
		// rather than protect ports that would stay unprotected.
		notes, err := syncookie.CheckSysctls()
		if err != nil {
			return ch, refused(fmt.Errorf("syn.ports: moat cannot issue cookies in this network namespace: %w", err))
		}
		for _, n := range notes {
			d.log.Warn(n)
		}
	}
	running := map[string]shield.Mode{} // where moat's filter runs, in which mode
	if old != nil {
		atts, err := s.Attachments()
		if err != nil {
			return ch, refused(err)
		}
		for _, a := range atts {
			if ifc, err := net.InterfaceByName(a.Iface); err == nil && a.Present && a.Ifindex == ifc.Index {
				running[a.Iface] = a.Mode
			}
		}
	}
	for _, i := range cfg.Interfaces {
		if _, err := net.InterfaceByName(i.Name); err != nil {
			return ch, refused(fmt.Errorf("interfaces: no interface %q (config line %d)", i.Name, i.Line))
		}
		// Only a mode the filter does not run in needs it detached: auto
		// takes the filter as it is, and native or generic where it
		// runs so already (auto's choice) changes nothing.
		cur, live := running[i.Name]
		if o, ok := oldIfaces[i.Name]; ok && o.Mode != i.Mode && live && i.AttachMode() != shield.ModeAuto && i.AttachMode() != cur {
			return ch, refused(fmt.Errorf("interfaces: %s: the mode changes from %s to %s; that needs a restart (detach, then start)", i.Name, o.Mode, i.Mode))
		}
	}
	want := d.desired(set, fs.lists(nil))
	if len(want.portOverlaps) > 0 {
		held, err := s.PortRules()
		if err != nil {
			return ch, refused(err)
		}
		for _, o := range want.portOverlaps {
			// A reload must not take an applied rule out: its other ports
			// would lose it. At start protection comes first, and a rule
			// left out already stays out.
			if old != nil && slices.ContainsFunc(held, func(r shield.PortRule) bool { return r.Spec == o.runtime }) {
				return ch, refused(fmt.Errorf("ports: %s: remove one of them (moat port remove %s), then reload", o.what, o.runtime))
			}
			d.log.Warn(o.what+"; the config's applies, and the run-time rule waits in the state file, unapplied, until one of them is removed", "runtime", o.runtime)
		}
	}
	plan, err := d.planRules(s, want)
	if err != nil {
		return ch, refused(err)
	}

	// Attach before the first write: at start every interface, which
	// adopts a pinned attachment in place (link.Update, same link,
	// counters kept) and upgrades its program; at a reload only the new
	// ones. A new interface runs the old rules until they are written,
	// as every filter shares the maps. If a later step fails, the
	// interfaces attached here are detached again.
	var attached []string
	adopted := false // a pinned attachment's program was replaced: no undo
	defer func() {
		if err == nil || len(attached) == 0 {
			return
		}
		ch.Attached = nil
		var failed []string
		for _, name := range attached {
			if _, derr := shield.FollowUp(s.Detach(name)); derr != nil {
				// Still attached: the change reports it, and the others
				// are detached all the same.
				d.log.Error("detaching again failed", "iface", name, "err", derr)
				failed = append(failed, name)
				ch.Attached = append(ch.Attached, name)
				continue
			}
			d.log.Info("detached again: the config was not applied", "iface", name)
		}
		if len(failed) > 0 {
			// Not a refusal any more: something changed.
			err = fmt.Errorf("%v; detaching %s again failed (see the log)", err, strings.Join(failed, ", "))
		}
	}()
	live, err := liveAttachments(s)
	if err != nil {
		return ch, refused(err)
	}
	for _, i := range cfg.Interfaces {
		if _, had := oldIfaces[i.Name]; had {
			if live[i.Name] {
				continue
			}
			// Deleted and made again, or detached behind the daemon's
			// back: the config still names it, so the reload attaches it.
			d.log.Warn("the interface had lost moat's filter; attaching it again", "iface", i.Name)
		}
		res, err := s.Attach(i.Name, i.AttachMode())
		// Attached, with a warning: the state around it was not brought
		// up to date (the summary, the SYN slots), which a detach would
		// not mend either.
		warning, err := shield.FollowUp(err)
		if warning != "" {
			d.log.Warn(warning)
		}
		if err != nil {
			if !res.Replaced && s.IsPinned(i.Name) {
				// Attached, then failed part way: detached again below.
				attached = append(attached, i.Name)
			}
			if res.Replaced || adopted {
				return ch, err
			}
			return ch, refused(err)
		}
		if res.Warning != "" {
			d.log.Warn(res.Warning, "iface", i.Name)
		}
		verb := "attached"
		if res.Replaced {
			verb = "adopted the pinned attachment and updated its program"
			adopted = true
		} else {
			attached = append(attached, i.Name)
		}
		d.log.Info(verb, "iface", i.Name, "mode", res.Mode)
		ch.Attached = append(ch.Attached, i.Name)
	}

	// Rate limits first: ratelimit.Apply checks every limit before it
	// changes one.
	if err := d.applyLimits(s, cfg, &ch); err != nil {
		return ch, err
	}
	if err := d.applyRules(s, want, plan, &ch); err != nil {
		return ch, err
	}
	ch.applied = want

	keep := map[string]bool{}
	for _, i := range cfg.Interfaces {
		keep[i.Name] = true
	}
	for name := range oldIfaces {
		// A name whose interface was renamed: its pins went with it,
		// under the new name, which the config may list. This Shield
		// may have moved them, or another before it (the state is opened
		// for other work too); then the name has no pins, and no
		// interface.
		if !keep[name] && !renamedAway(s, name) {
			warning, err := shield.FollowUp(s.Detach(name))
			if err != nil {
				return ch, err
			}
			if warning != "" {
				d.log.Warn(warning)
			}
			d.log.Info("detached", "iface", name)
			ch.Detached = append(ch.Detached, name)
		}
	}
	if old == nil {
		atts, err := s.Attachments()
		if err != nil {
			return ch, err
		}
		for _, a := range atts {
			if !keep[a.Iface] {
				d.log.Warn("moat is attached to an interface the config does not name; left as it is", "iface", a.Iface)
			}
		}
	}

	n, rotated, err := d.applySYN(s, cfg)
	ch.SYNPorts, ch.keyRotated = n, rotated
	return ch, err
}

// liveAttachments tells, by interface name, where moat's filter runs: a
// pinned attachment whose link is on the interface that has the name now
// (an interface deleted and made again has another index).
func liveAttachments(s *shield.Shield) (map[string]bool, error) {
	atts, err := s.Attachments()
	if err != nil {
		return nil, err
	}
	live := map[string]bool{}
	for _, a := range atts {
		// An acceptor left on a bridge that was deleted or that the
		// interface left is as lost as the filter: attached again.
		if ifc, err := net.InterfaceByName(a.Iface); err == nil && a.Present && a.Ifindex == ifc.Index && !a.AcceptorMisplaced {
			live[a.Iface] = true
		}
	}
	return live, nil
}

// applyLimits makes the rate limits the config's. Limits whose kind and
// scope stay are updated in place; new ones go in before old ones go.
// ch counts the limits that changed and names the switches that did.
func (d *Daemon) applyLimits(s *shield.Shield, cfg *config.Config, ch *Changes) error {
	m, err := ratelimit.NewMaps(s.Map)
	if err != nil {
		if len(cfg.Limits) == 0 {
			return nil // pins of a moat without rate limits, and none asked for
		}
		return err
	}
	before, err := m.Limits()
	if err != nil {
		return fmt.Errorf("limits: %w", err)
	}
	if err := ratelimit.Apply(m, cfg.RateLimits()); err != nil {
		return fmt.Errorf("limits: %w", err)
	}
	// Compared as stored, defaults filled in: a limit the config
	// writes otherwise but means the same is no change.
	after, err := m.Limits()
	if err != nil {
		return fmt.Errorf("limits: %w", err)
	}
	ch.Limits = limitChanges(before, after)
	if cfg.LimitSettings.Given() {
		cur, err := m.Config()
		if err != nil {
			return fmt.Errorf("limit settings: %w", err)
		}
		next := cfg.LimitSettings.Apply(cur)
		if next == cur {
			return nil
		}
		if err := m.Configure(next); err != nil {
			return fmt.Errorf("limit settings: %w", err)
		}
		ch.LimitSettings = limitSettingsChanged(cur, next)
		d.log.Info("limit settings changed", "switches", strings.Join(ch.LimitSettings, ","))
	}
	return nil
}

// limitChanges counts the limits added or changed (in after, not as they
// were in before) and removed (their kind and scope gone).
func limitChanges(before, after []ratelimit.Status) int {
	n := 0
	for _, a := range after {
		if !slices.ContainsFunc(before, func(b ratelimit.Status) bool { return b.Limit == a.Limit }) {
			n++
		}
	}
	for _, b := range before {
		if !slices.ContainsFunc(after, func(a ratelimit.Status) bool { return a.Kind == b.Kind && a.Scope == b.Scope }) {
			n++
		}
	}
	return n
}

// limitSettingsChanged names, by their limit_settings keys, the switches
// that differ between a and b.
func limitSettingsChanged(a, b ratelimit.Config) []string {
	var out []string
	if a.Shape != b.Shape {
		out = append(out, "shape")
	}
	if a.HeavyHitters != b.HeavyHitters {
		out = append(out, "heavy_hitters")
	}
	if a.Sample != b.Sample {
		out = append(out, "sample")
	}
	if a.Gate != b.Gate {
		out = append(out, "gate")
	}
	return out
}

// policyChanged names, by their policy keys, the settings that differ
// between a and b.
func policyChanged(a, b rules.Settings) []string {
	var out []string
	if a.Fragments != b.Fragments {
		out = append(out, "fragments")
	}
	if a.Malformed != b.Malformed {
		out = append(out, "malformed")
	}
	if a.Monitor != b.Monitor {
		out = append(out, "monitor")
	}
	return out
}

// wanted is the rules the maps should hold.
type wanted struct {
	// By shield.List, sorted by rules.ComparePrefixes: a million entries
	// are compared with the maps' as two sorted lists (shield.DiffList),
	// not through Go maps, which would take hundreds of MiB at a reload.
	lists    [2][]rules.PrefixEntry
	ports    []rules.PortEntry
	settings rules.Settings
	// shadowed are dynamic entries that the config now holds too; they
	// leave the state file once the config is applied.
	shadowed [2]map[netip.Prefix]bool
	// shadowedPorts are dynamic port rules whose spec the config holds
	// too; they leave the state file once the config is applied.
	shadowedPorts map[rules.PortSpec]bool
	// portOverlaps are the dynamic port rules that overlap a rule of the
	// config's without being the same spec: left out of the maps (the
	// config's applies), kept in the state file. A reload that would take
	// one out of the maps is refused.
	portOverlaps []portOverlap
}

// portOverlap is a dynamic port rule that a rule of the config's overlaps.
type portOverlap struct {
	runtime rules.PortSpec
	what    string
}

// desired merges the config's rules with the dynamic ones and the feeds'.
// A rule in the config and in the dynamic ones is the config's: it has no
// expiry and outlives the dynamic one. A rule added at run time is written
// over a feed's for the same prefix (the operator of this host decided),
// and the config's over both. Where feeds disagree, the first feed in the
// config wins. set is not changed: the daemon keeps it for the feeds'
// changes.
func (d *Daemon) desired(set *config.Set, feeds [2][]rules.PrefixEntry) *wanted {
	rs := set.Rules
	w := &wanted{settings: *rs.Settings, shadowed: [2]map[netip.Prefix]bool{{}, {}}, shadowedPorts: map[rules.PortSpec]bool{}}
	now := time.Now()
	cmp := func(a, b rules.PrefixEntry) int { return rules.ComparePrefixes(a.Prefix, b.Prefix) }
	for li, entries := range [][]rules.PrefixEntry{rs.Allow, rs.Deny} {
		dyn := d.st.Allow
		if li == 1 {
			dyn = d.st.Deny
		}
		// Appending copies: the config's lists (sorted already) stay
		// as they are.
		entries = slices.Clip(entries)
		dynamic := make(map[netip.Prefix]bool, len(dyn))
		for _, e := range dyn {
			dynamic[e.Prefix] = true
		}
		for _, e := range entries {
			if dynamic[e.Prefix] {
				w.shadowed[li][e.Prefix] = true
			}
		}
		for _, e := range dyn {
			if !w.shadowed[li][e.Prefix] && (e.Expires == nil || e.Expires.After(now)) {
				entries = append(entries, e)
			}
		}
		if len(feeds[li]) > 0 {
			// Config, then run-time, then feed entries: the stable
			// sort keeps that order among equal prefixes, and the
			// first of each is kept.
			entries = append(entries, feeds[li]...)
			slices.SortStableFunc(entries, cmp)
			entries = slices.CompactFunc(entries, func(a, b rules.PrefixEntry) bool { return a.Prefix == b.Prefix })
		} else if !slices.IsSortedFunc(entries, cmp) {
			slices.SortFunc(entries, cmp)
		}
		w.lists[li] = entries
	}
	w.ports = append(w.ports, rs.Ports...)
	for _, p := range d.st.Ports {
		clash := false
		for _, c := range rs.Ports {
			switch {
			case c.Spec == p.Spec:
				clash = true
				w.shadowedPorts[p.Spec] = true
				if c != p {
					d.log.Warn("a port rule added at run time has the config's spec; the config's applies", "runtime", p.Spec, "config", c.Spec)
				}
			case c.Spec.Overlaps(p.Spec):
				// Part of the run-time rule's ports the config does
				// not hold: dropping it would lose them for good.
				clash = true
				w.portOverlaps = append(w.portOverlaps, portOverlap{p.Spec,
					fmt.Sprintf("the config's port rule %s (%s) overlaps %s (%s), added at run time", c.Spec, c.Action, p.Spec, p.Action)})
			}
		}
		if !clash {
			w.ports = append(w.ports, p)
		}
	}
	return w
}

// dropShadowed removes from the state the dynamic rules that the config
// now holds: removing one through the API later must not remove the
// config's rule. Called once the config is applied whole; the caller
// saves the state.
func (d *Daemon) dropShadowed(w *wanted) {
	n := 0
	for li, l := range []*[]rules.PrefixEntry{&d.st.Allow, &d.st.Deny} {
		before := len(*l)
		*l = slices.DeleteFunc(*l, func(e rules.PrefixEntry) bool { return w.shadowed[li][e.Prefix] })
		n += before - len(*l)
	}
	before := len(d.st.Ports)
	d.st.Ports = slices.DeleteFunc(d.st.Ports, func(p rules.PortEntry) bool { return w.shadowedPorts[p.Spec] })
	n += before - len(d.st.Ports)
	if n > 0 {
		d.log.Info("rules added at run time are now in the config; they leave the state file", "count", n)
	}
}

// rulePlan is what applyRules writes and deletes, worked out and checked
// before the first write.
type rulePlan struct {
	lists [2]shield.ListDiff
}

// planRules compares the lists with the wanted rules and checks that the
// change fits: new entries are written before stale ones are deleted, so
// each map must hold the old and the new entries together for a moment.
// A change that would run out of room part way is refused here, before
// anything is written.
func (d *Daemon) planRules(s *shield.Shield, w *wanted) (*rulePlan, error) {
	p := &rulePlan{}
	phase := time.Now()
	// Commented prefixes held, by list: the comment map is bounded, so
	// this is too.
	var commented [2]map[netip.Prefix]bool
	for _, l := range []shield.List{shield.AllowList, shield.DenyList} {
		have, err := s.Entries(l)
		if err != nil {
			return nil, err
		}
		commented[l] = map[netip.Prefix]bool{}
		for _, e := range have {
			if e.Comment != "" && !e.Auto { // auto-blocks' reasons have a map of their own
				commented[l][e.Prefix] = true
			}
		}
		p.lists[l] = shield.DiffList(have, w.lists[l])
		d.log.Debug("apply", "step", "read and compare "+l.String(), "took", time.Since(phase).Round(time.Millisecond))
		phase = time.Now()
		if err := checkListRoom(s, l, w.lists[l], p.lists[l].Stale, p.lists[l].AutoKeptIn); err != nil {
			return nil, err
		}
	}

	// Comments of both lists share one map. Written with the new
	// entries; those of stale entries go with them.
	comments := 0
	for l := range commented {
		comments += len(commented[l])
		for _, e := range w.lists[l] {
			if e.Comment != "" && !commented[l][e.Prefix] {
				comments++
			}
		}
	}
	if m := s.Map(datapath.MoatMapComments); m != nil && comments > int(m.MaxEntries()) {
		return nil, userErrorf("comments: the change needs room for %d comments at once (the old and the new, as stale ones go last); the comment map holds %d",
			comments, m.MaxEntries())
	}

	// Port rules: new ones take free ids before the old ones give theirs
	// back.
	if err := s.CheckPortRules(w.ports); err != nil {
		return nil, fmt.Errorf("ports: %w", err)
	}
	return p, nil
}

// listMaps names the maps of a list, in the order of mapIndex.
var listMaps = [2][4]struct{ name, what string }{
	shield.AllowList: {
		{datapath.MoatMapAllowV4Hosts, "IPv4 hosts"}, {datapath.MoatMapAllowV4Nets, "IPv4 networks"},
		{datapath.MoatMapAllowV6Hosts, "IPv6 hosts"}, {datapath.MoatMapAllowV6Nets, "IPv6 networks"},
	},
	shield.DenyList: {
		{datapath.MoatMapDenyV4Hosts, "IPv4 hosts"}, {datapath.MoatMapDenyV4Nets, "IPv4 networks"},
		{datapath.MoatMapDenyV6Hosts, "IPv6 hosts"}, {datapath.MoatMapDenyV6Nets, "IPv6 networks"},
	},
}

// mapIndex is the map of a list that holds p: hosts in hash maps, the rest
// in tries, per family.
func mapIndex(p netip.Prefix) int {
	i := 0
	if !rules.IsHost(p) {
		i = 1
	}
	if p.Addr().Is6() {
		i += 2
	}
	return i
}

// checkListRoom refuses a change whose wanted entries and stale ones,
// present together until the stale ones are deleted, do not fit in one of
// the list's maps beside the auto-blocks it keeps (auto, by mapIndex): a
// flood's auto-blocks can fill the room a reload counted on, and the
// change would then fail part way.
func checkListRoom(s *shield.Shield, l shield.List, want []rules.PrefixEntry, stale []netip.Prefix, auto [4]int) error {
	var wanted, old [4]int
	for _, e := range want {
		wanted[mapIndex(e.Prefix)]++
	}
	for _, p := range stale {
		old[mapIndex(p)]++
	}
	for i, lm := range listMaps[l] {
		m := s.Map(lm.name)
		if m == nil {
			continue
		}
		if n := wanted[i] + old[i] + auto[i]; n > int(m.MaxEntries()) {
			return userErrorf("%s: %s: the change needs room for %d entries at once (%d wanted, %d stale deleted only after the new are written, %d auto-blocks); the map holds %d",
				l, lm.what, n, wanted[i], old[i], auto[i], m.MaxEntries())
		}
	}
	return nil
}

// applyRules writes the allow/deny and port diff planned, then the
// policies, then deletes what is stale.
func (d *Daemon) applyRules(s *shield.Shield, w *wanted, p *rulePlan, ch *Changes) error {
	phase := time.Now()
	lap := func(what string) {
		d.log.Debug("apply", "step", what, "took", time.Since(phase).Round(time.Millisecond))
		phase = time.Now()
	}
	for _, l := range []shield.List{shield.AllowList, shield.DenyList} {
		diff := &p.lists[l]
		if len(diff.Write) > 0 {
			if err := s.Add(l, diff.Write, shield.Upsert); err != nil {
				return err
			}
		}
		ch.Added += len(diff.Write)
		diff.Write = nil
		lap("write " + l.String())
	}

	if err := d.applyPorts(s, w.ports, ch); err != nil {
		return err
	}
	if cur, err := s.Settings(); err != nil {
		return err
	} else if cur != w.settings {
		// Leaving monitor mode deletes the trial's auto-blocks
		// (shield.SetSettings): counted here, as the data path writes
		// no more of them once the monitor bit is off. One read of the
		// denylist, at a change of the policy only.
		monitorBlocks := 0
		if cur.Monitor && !w.settings.Monitor {
			have, err := s.Entries(shield.DenyList)
			if err != nil {
				return err
			}
			for _, e := range have {
				if e.Monitor {
					monitorBlocks++
				}
			}
		}
		if err := s.SetSettings(w.settings); err != nil {
			return err
		}
		ch.Policy = policyChanged(cur, w.settings)
		ch.Removed += monitorBlocks
		ch.MonitorBlocks += monitorBlocks
		d.log.Info("policy changed", "fragments", w.settings.Fragments, "malformed", w.settings.Malformed, "monitor", w.settings.Monitor,
			"monitor_blocks_removed", monitorBlocks)
	}

	for _, l := range []shield.List{shield.AllowList, shield.DenyList} {
		stale := p.lists[l].Stale
		if len(stale) == 0 {
			continue
		}
		if err := s.RemovePrefixes(l, stale); err != nil {
			return err
		}
		ch.Removed += len(stale)
		// Named, so that an entry someone added behind the daemon's back
		// (with no daemon answering) does not vanish without a word.
		d.log.Info("removed entries in neither the config nor the state file",
			"list", l.String(), "count", len(stale), "entries", somePrefixes(stale, 16))
		lap("delete stale " + l.String())
	}
	return nil
}

// somePrefixes names the first n of ps, and how many more there are.
func somePrefixes(ps []netip.Prefix, n int) string {
	var b strings.Builder
	for i, p := range ps {
		if i == n {
			fmt.Fprintf(&b, " and %d more", len(ps)-n)
			break
		}
		if i > 0 {
			b.WriteString(" ")
		}
		b.WriteString(p.String())
	}
	return b.String()
}

// applyPorts makes the port rules equal to want, without a moment where a
// changed rule's ports have no rule (see shield.SetPortRules).
func (d *Daemon) applyPorts(s *shield.Shield, want []rules.PortEntry, ch *Changes) error {
	n, err := s.SetPortRules(want)
	ch.PortRules += n
	return err
}

// applySYN sets the protected ports, installs the first cookie key when
// there is none, and writes the defence's settings. Ports protected
// outside the config are turned off: with the daemon, SYN protection is
// the config's. A port whose settings did not change is left alone, as
// protecting it again would reset its flood state.
// rotated says whether it rotated the key.
func (d *Daemon) applySYN(s *shield.Shield, cfg *config.Config) (changed int, rotated bool, err error) {
	ports, counters := s.Map(datapath.MoatMapSynPorts), s.Map(datapath.MoatMapSynCounters)
	keys, rotation := s.Map(datapath.MoatMapSynKeys), s.Map(datapath.MoatMapSynRotation)
	census := s.Map(datapath.MoatMapSynCensus)
	if ports == nil || counters == nil || keys == nil || rotation == nil || census == nil {
		return 0, false, fmt.Errorf("the pinned state under %s has no SYN defence maps", s.Root())
	}
	// One read of syn_ports for the whole change, not one per port.
	table, err := syncookie.ReadPortTable(ports, counters, census)
	if err != nil {
		return 0, false, err
	}
	if len(cfg.SYN.Ports) > 0 {
		// A rotation is due at once when there is no key yet, or when
		// the last one is a period old or more (the keys of a stopped
		// daemon, or of one that ran with a shorter period): waiting a
		// period for the first tick would leave the data path with keys
		// it takes for stale, and no cookies, until then.
		ks, err := syncookie.Keys(rotation, s.Map(datapath.MoatMapSynSettings))
		if err != nil {
			return 0, false, err
		}
		if ks.Rotations == 0 || ks.Age >= cfg.SYN.RotateEvery {
			gen, err := syncookie.Rotate(keys, rotation)
			if err != nil {
				return 0, false, err
			}
			rotated = true
			d.log.Debug("rotated SYN cookie key", "generation", gen, "previous_age", ks.Age.Round(time.Second))
		}
		// The rotation period too: the data path takes keys older than
		// StaleAfter of it for a stopped rotator and issues no cookies.
		if err := syncookie.Configure(s.Map(datapath.MoatMapSynSettings), syncookie.Config{
			Hold: cfg.SYN.Hold, CookieLifetime: cfg.SYN.CookieLifetime,
			RotationPeriod: cfg.SYN.RotateEvery, ResetsPerSec: cfg.SYN.Resets(),
		}); err != nil {
			return 0, rotated, err
		}
	}
	want := map[uint16]bool{}
	for _, p := range cfg.SYN.Ports {
		want[p.Port] = true
	}
	// Removals first: they free the counters slots new ports take.
	for _, port := range table.Ports() {
		if !want[port] {
			if err := table.Protect(port, syncookie.ModeOff, 0); err != nil {
				return changed, rotated, err
			}
			d.log.Info("SYN protection removed", "port", port)
			changed++
		}
	}
	for _, p := range cfg.SYN.Ports {
		if table.Holds(p.Port, p.ProtectMode(), p.Threshold) {
			continue
		}
		if err := table.Protect(p.Port, p.ProtectMode(), p.Threshold); err != nil {
			return changed, rotated, err
		}
		d.log.Info("SYN protection set", "port", p.Port, "mode", p.Mode, "threshold_per_sec", p.Threshold)
		changed++
	}
	return changed, rotated, nil
}

// renamedAway says whether the pins of interface name went with its
// interface to a new name: this Shield moved them, or the name has no
// pins and no interface.
func renamedAway(s *shield.Shield, name string) bool {
	if _, ok := s.RenamedTo(name); ok {
		return true
	}
	if s.IsPinned(name) {
		return false
	}
	_, err := net.InterfaceByName(name)
	return err != nil
}
