package daemon

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"time"

	"github.com/moat-shield/moat/internal/feed"
	"github.com/moat-shield/moat/internal/rules"
	"github.com/moat-shield/moat/internal/shield"
	"github.com/moat-shield/moat/internal/state"
)

// The API is HTTP/JSON on a unix socket that only root may open. Every
// request that changes something runs under the daemon's mutex and
// returns once the change is in the maps and in the state file.

// PrefixRequest adds prefixes to or removes them from a list.
type PrefixRequest struct {
	List     string        `json:"list"` // allow or deny
	Prefixes []string      `json:"prefixes"`
	TTL      time.Duration `json:"ttl_ns,omitempty"`
	Comment  string        `json:"comment,omitempty"`
}

// PortRequest adds or removes port rules.
type PortRequest struct {
	Action string   `json:"action"` // drop, allow or remove
	Rules  []string `json:"rules"`
}

// ChangeResponse says what a change did.
type ChangeResponse struct {
	Changed int `json:"changed"`
}

// ErrorResponse is the body of every failed request. User is true when the
// request was refused (nothing changed), false when the system failed.
type ErrorResponse struct {
	Error string `json:"error"`
	User  bool   `json:"user"`
}

// CaptureLimits are the config's bounds on packet capture, for `moat dump`
// to honour when a daemon runs.
type CaptureLimits struct {
	Enabled    bool   `json:"enabled"`
	MaxSnaplen uint32 `json:"max_snaplen"`
	MaxRate    uint32 `json:"max_rate"` // packets per second, 0: no limit
}

// Status describes the daemon.
type Status struct {
	PID        int                 `json:"pid"`
	Root       string              `json:"root"`
	Config     string              `json:"config"`
	StateFile  string              `json:"state_file"`
	Started    time.Time           `json:"started"`
	LastReload time.Time           `json:"last_reload"`
	Reloads    int                 `json:"reloads"`
	Interfaces []shield.Attachment `json:"interfaces"`
	Dynamic    DynamicCounts       `json:"dynamic_rules"`
}

// DynamicCounts counts the rules added at run time.
type DynamicCounts struct {
	Allow int `json:"allow"`
	Deny  int `json:"deny"`
	Ports int `json:"ports"`
}

func (d *Daemon) api() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/status", func(w http.ResponseWriter, r *http.Request) {
		st, err := d.status()
		reply(w, st, err)
	})
	mux.HandleFunc("POST /v1/prefixes/add", change(d.AddPrefixes))
	mux.HandleFunc("POST /v1/prefixes/remove", change(d.RemovePrefixes))
	mux.HandleFunc("POST /v1/ports", change(d.ChangePorts))
	mux.HandleFunc("GET /v1/capture", func(w http.ResponseWriter, r *http.Request) {
		d.mu.Lock()
		c := d.cfg.Capture
		d.mu.Unlock()
		reply(w, CaptureLimits{Enabled: c.On(), MaxSnaplen: c.MaxSnaplen, MaxRate: c.MaxRate}, nil)
	})
	mux.HandleFunc("POST /v1/expire", func(w http.ResponseWriter, r *http.Request) {
		res, err := d.Expire()
		reply(w, res, err)
	})
	mux.HandleFunc("GET /v1/feeds", func(w http.ResponseWriter, r *http.Request) {
		reply(w, d.FeedStatus(), nil)
	})
	mux.HandleFunc("POST /v1/reload", func(w http.ResponseWriter, r *http.Request) {
		reply(w, d.Reload(), nil)
	})
	return mux
}

func readJSON(w http.ResponseWriter, r *http.Request, v any) bool {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 16<<20))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		reply(w, nil, &shield.UserError{Err: fmt.Errorf("bad request: %v", err)})
		return false
	}
	return true
}

func reply(w http.ResponseWriter, v any, err error) {
	w.Header().Set("Content-Type", "application/json")
	if err != nil {
		var ue *shield.UserError
		user := errors.As(err, &ue)
		code := http.StatusInternalServerError
		if user {
			code = http.StatusBadRequest
		}
		w.WriteHeader(code)
		json.NewEncoder(w).Encode(ErrorResponse{Error: err.Error(), User: user})
		return
	}
	json.NewEncoder(w).Encode(v)
}

func userErrorf(format string, args ...any) error {
	return &shield.UserError{Err: fmt.Errorf(format, args...)}
}

func (d *Daemon) status() (Status, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	st := Status{
		PID: os.Getpid(), Root: d.root, Config: d.opts.ConfigPath, StateFile: d.cfg.Daemon.StateFile,
		Started: d.started, LastReload: d.lastReload, Reloads: d.reloads,
		Dynamic: DynamicCounts{len(d.st.Allow), len(d.st.Deny), len(d.st.Ports)},
	}
	err := d.withShield(func(s *shield.Shield) (err error) {
		st.Interfaces, err = s.Attachments()
		return err
	})
	return st, err
}

func parseList(name string) (shield.List, error) {
	switch name {
	case "allow":
		return shield.AllowList, nil
	case "deny":
		return shield.DenyList, nil
	}
	return 0, userErrorf("invalid list %q: want allow or deny", name)
}

// dynamicList is the state's entries of a list.
func (d *Daemon) dynamicList(l shield.List) *[]rules.PrefixEntry {
	if l == shield.AllowList {
		return &d.st.Allow
	}
	return &d.st.Deny
}

// AddPrefixes adds entries to a list, as `moat block` and `moat allow` do:
// nothing changes if any of them is in the list already.
func (d *Daemon) AddPrefixes(req PrefixRequest) (int, error) {
	l, err := parseList(req.List)
	if err != nil {
		return 0, err
	}
	prefixes, err := rules.ParsePrefixes(req.Prefixes)
	if err != nil {
		return 0, &shield.UserError{Err: err}
	}
	if len(prefixes) == 0 {
		return 0, userErrorf("no prefixes given")
	}
	if err := rules.ValidateComment(req.Comment); err != nil {
		return 0, &shield.UserError{Err: err}
	}
	if req.TTL < 0 {
		return 0, userErrorf("invalid TTL %s: must be positive", req.TTL)
	}
	var expires *time.Time
	entries := make([]shield.Entry, len(prefixes))
	if req.TTL > 0 {
		t := time.Now().Add(req.TTL).UTC()
		expires = &t
	}
	for i, p := range prefixes {
		entries[i] = shield.Entry{Prefix: p, Comment: req.Comment}
		if expires != nil {
			entries[i].Expires = *expires
		}
	}

	d.mu.Lock()
	defer d.mu.Unlock()
	return len(entries), d.withShield(func(s *shield.Shield) error {
		// A prefix only a feed holds is written over: the run-time rule
		// (its expiry, its comment) applies while it lasts, and the
		// feed's comes back after it. Any other prefix the list holds
		// refuses the whole change.
		var fresh, over []shield.Entry
		for _, e := range entries {
			if _, _, ok := d.feeds.lookup(l, e.Prefix); ok && !d.inConfig(l, e.Prefix) && !d.isDynamic(l, e.Prefix) {
				over = append(over, e)
			} else {
				fresh = append(fresh, e)
			}
		}
		if err := s.Add(l, fresh, shield.Strict); err != nil {
			return err
		}
		if err := addIfAny(s, l, over, shield.Upsert); err != nil {
			if rerr := d.dropOverFeeds(s, l, prefixesOf(fresh)); rerr != nil {
				d.log.Error("undo a change", "err", rerr)
			}
			return err
		}
		dyn := d.dynamicList(l)
		saved := slices.Clone(*dyn)
		// An expired entry the filter ignored is replaced: one pass over
		// the list, whatever the number of prefixes.
		added := make(map[netip.Prefix]bool, len(prefixes))
		for _, p := range prefixes {
			added[p] = true
		}
		*dyn = slices.DeleteFunc(*dyn, func(e rules.PrefixEntry) bool { return added[e.Prefix] })
		for _, p := range prefixes {
			*dyn = append(*dyn, rules.PrefixEntry{Prefix: p, Comment: req.Comment, Expires: expires})
		}
		if err := state.Save(d.cfg.Daemon.StateFile, d.st); err != nil {
			// Not persisted: take the change back, so that what the
			// filter does never depends on a rule a restart would lose.
			*dyn = saved
			if rerr := d.dropOverFeeds(s, l, prefixes); rerr != nil {
				d.log.Error("undo an unsaved change", "err", rerr)
			}
			return err
		}
		d.log.Info("rules added", "list", l.String(), "count", len(prefixes), "first", prefixes[0], "ttl", req.TTL, "comment", req.Comment)
		return nil
	})
}

// isDynamic tells whether a run-time rule that has not expired holds p.
func (d *Daemon) isDynamic(l shield.List, p netip.Prefix) bool {
	now := time.Now()
	return slices.ContainsFunc(*d.dynamicList(l), func(e rules.PrefixEntry) bool {
		return e.Prefix == p && (e.Expires == nil || e.Expires.After(now))
	})
}

// inConfig tells whether the applied config's rules (inline or from its
// rule files) hold p. It is asked only of prefixes a feed holds, and the
// config's rules are kept while it names feeds.
func (d *Daemon) inConfig(l shield.List, p netip.Prefix) bool {
	if d.cfgSet == nil {
		return false
	}
	entries := d.cfgSet.Rules.Deny
	if l == shield.AllowList {
		entries = d.cfgSet.Rules.Allow
	}
	_, ok := feed.Lookup(entries, p)
	return ok
}

// dropOverFeeds takes run-time rules out of the maps: a prefix a feed
// holds gets the feed's entry back in the same write, the rest are
// deleted.
func (d *Daemon) dropOverFeeds(s *shield.Shield, l shield.List, prefixes []netip.Prefix) error {
	rest, over := d.overFeeds(l, prefixes)
	if err := addIfAny(s, l, over, shield.Upsert); err != nil {
		return err
	}
	if len(rest) > 0 {
		return s.RemovePrefixes(l, rest)
	}
	return nil
}

// prefixesOf lists the prefixes of entries.
func prefixesOf(entries []shield.Entry) []netip.Prefix {
	out := make([]netip.Prefix, len(entries))
	for i, e := range entries {
		out[i] = e.Prefix
	}
	return out
}

// addIfAny adds entries, if there are any.
func addIfAny(s *shield.Shield, l shield.List, entries []shield.Entry, how shield.AddMode) error {
	if len(entries) == 0 {
		return nil
	}
	return s.Add(l, entries, how)
}

// RemovePrefixes deletes entries added at run time, and the rate limits'
// auto-blocks. Entries of the config are refused: they would come back at
// the next reload.
func (d *Daemon) RemovePrefixes(req PrefixRequest) (int, error) {
	l, err := parseList(req.List)
	if err != nil {
		return 0, err
	}
	prefixes, err := rules.ParsePrefixes(req.Prefixes)
	if err != nil {
		return 0, &shield.UserError{Err: err}
	}
	if len(prefixes) == 0 {
		return 0, userErrorf("no prefixes given")
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	dyn := d.dynamicList(l)
	return len(prefixes), d.withShield(func(s *shield.Shield) error {
		byPrefix := map[netip.Prefix]rules.PrefixEntry{}
		for _, e := range *dyn {
			byPrefix[e.Prefix] = e
		}
		for _, p := range prefixes {
			if _, ok := byPrefix[p]; ok {
				continue
			}
			if e, has, err := s.Stored(l, p); err != nil {
				return err
			} else if has {
				if e.Auto && !d.inConfig(l, p) {
					continue // a limit's auto-block: it is the operator's to lift
				}
				if _, f, ok := d.feeds.lookup(l, p); ok && !d.inConfig(l, p) {
					return userErrorf("%s comes from the feed %s: remove it where the feed is published", p, f.Src.URL)
				}
				return userErrorf("%s comes from the config file %s: remove it there and reload", p, d.opts.ConfigPath)
			}
			return userErrorf("%s is not in the %s", p, l)
		}
		if err := d.dropOverFeeds(s, l, prefixes); err != nil {
			return err
		}
		saved := slices.Clone(*dyn)
		gone := map[netip.Prefix]bool{}
		for _, p := range prefixes {
			gone[p] = true
		}
		*dyn = slices.DeleteFunc(*dyn, func(e rules.PrefixEntry) bool { return gone[e.Prefix] })
		if err := state.Save(d.cfg.Daemon.StateFile, d.st); err != nil {
			*dyn = saved
			back := make([]shield.Entry, 0, len(prefixes))
			for _, p := range prefixes {
				if e, ok := byPrefix[p]; ok { // an auto-block lifted stays lifted
					back = append(back, shield.EntryOf(e))
				}
			}
			if rerr := s.Add(l, back, shield.Upsert); rerr != nil {
				d.log.Error("undo an unsaved change", "err", rerr)
			}
			return err
		}
		d.log.Info("rules removed", "list", l.String(), "count", len(prefixes), "first", prefixes[0])
		return nil
	})
}

// ChangePorts adds or removes port rules; nothing changes if any of them
// is refused.
func (d *Daemon) ChangePorts(req PortRequest) (int, error) {
	remove := req.Action == "remove"
	var action rules.Action
	if !remove {
		var err error
		if action, err = rules.ParseAction(req.Action); err != nil {
			return 0, userErrorf("invalid port action %q: want drop, allow or remove", req.Action)
		}
	}
	var specs []rules.PortSpec
	for _, r := range req.Rules {
		spec, err := rules.ParsePortSpec(r)
		if err != nil {
			return 0, &shield.UserError{Err: err}
		}
		for _, o := range specs {
			if o.Overlaps(spec) {
				return 0, userErrorf("port rules %s and %s overlap", o, spec)
			}
		}
		specs = append(specs, spec)
	}
	if len(specs) == 0 {
		return 0, userErrorf("no port rules given")
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(specs), d.withShield(func(s *shield.Shield) error {
		existing, err := s.PortRules()
		if err != nil {
			return err
		}
		dynamic := map[rules.PortSpec]bool{}
		for _, p := range d.st.Ports {
			dynamic[p.Spec] = true
		}
		// Run-time rules the maps do not hold: a rule of the config's
		// overlaps them (see wanted.portOverlaps). Removing one changes
		// the state file alone.
		stateOnly := map[rules.PortSpec]bool{}
		for _, spec := range specs {
			found := false
			for _, r := range existing {
				if remove && r.Spec == spec {
					found = true
					if !dynamic[spec] {
						return userErrorf("port rule %s comes from the config file %s: remove it there and reload", spec, d.opts.ConfigPath)
					}
				}
				if !remove && r.Spec.Overlaps(spec) {
					if r.Spec == spec {
						return userErrorf("port rule %s exists already (%s)", spec, r.Action)
					}
					return userErrorf("port rule %s overlaps the existing rule %s (%s)", spec, r.Spec, r.Action)
				}
			}
			if remove && !found && dynamic[spec] {
				stateOnly[spec], found = true, true
			}
			if remove && !found {
				return userErrorf("no port rule %s", spec)
			}
		}
		if !remove {
			if err := s.CheckRoomFor(specs, action); err != nil { // before the first write
				return err
			}
		}
		saved := slices.Clone(d.st.Ports)
		// undo takes back the changes of done, in the maps and in the
		// state, so that the filter never holds a rule the state file
		// does not.
		undo := func(done []rules.PortSpec, why string) {
			d.st.Ports = saved
			for _, spec := range done {
				var rerr error
				if remove {
					for _, p := range saved {
						if p.Spec == spec && !stateOnly[spec] {
							rerr = s.AddPortRule(spec, p.Action)
						}
					}
				} else {
					rerr = s.RemovePortRule(spec)
				}
				if rerr != nil {
					d.log.Error(why, "rule", spec, "err", rerr)
				}
			}
		}
		for i, spec := range specs {
			switch {
			case remove && stateOnly[spec]:
				err = nil
			case remove:
				err = s.RemovePortRule(spec)
			default:
				err = s.AddPortRule(spec, action)
			}
			if err != nil {
				undo(specs[:i], "undo a port change that failed part way")
				return err
			}
			if remove {
				d.st.Ports = slices.DeleteFunc(d.st.Ports, func(p rules.PortEntry) bool { return p.Spec == spec })
			} else {
				d.st.Ports = append(d.st.Ports, rules.PortEntry{Spec: spec, Action: action})
			}
		}
		if err := state.Save(d.cfg.Daemon.StateFile, d.st); err != nil {
			undo(specs, "undo an unsaved change")
			return err
		}
		verb := "port rules added"
		if remove {
			verb = "port rules removed"
		}
		d.log.Info(verb, "action", req.Action, "rules", req.Rules)
		return nil
	})
}

// change serves a rule change: the request's JSON in, the number of rules
// changed out.
func change[Req any](apply func(Req) (int, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var req Req
		if !readJSON(w, r, &req) {
			return
		}
		n, err := apply(req)
		reply(w, ChangeResponse{n}, err)
	}
}
