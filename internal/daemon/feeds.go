package daemon

import (
	"context"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/moat-shield/moat/internal/config"
	"github.com/moat-shield/moat/internal/feed"
	"github.com/moat-shield/moat/internal/rules"
	"github.com/moat-shield/moat/internal/shield"
)

// feedSet is the feeds of the applied config, in its order: where two
// feeds hold a prefix, the first one's entry is written.
type feedSet struct {
	feeds []*feed.Feed
}

// openFeeds makes the feeds cfg names. A feed whose source is unchanged
// from old is kept, and one whose URL and list are (a new token or
// refresh) takes over the old one's copy; a new one starts from its copy
// on disk, if any, so a restart applies what the fleet last published.
func (d *Daemon) openFeeds(cfg *config.Config, old *feedSet) (*feedSet, error) {
	keep := map[string]*feed.Feed{}
	if old != nil {
		for _, f := range old.feeds {
			keep[feed.CacheName(f.Src)] = f
		}
	}
	fs := &feedSet{}
	now := time.Now()
	for _, src := range cfg.Feeds() {
		old, same := keep[feed.CacheName(src)]
		if same && old.Same(src) {
			fs.feeds = append(fs.feeds, old)
			continue
		}
		f, err := feed.New(src, cfg.Daemon.FeedDir)
		if err != nil {
			return nil, err
		}
		if same {
			// Same URL and list, other settings: the copy applied
			// now stays, not what the disk holds.
			f.Adopt(old)
		} else if err := f.LoadCache(now); err != nil {
			// Fetched again at once; until then the feed adds nothing.
			d.log.Warn("a feed's saved copy cannot be read; waiting for the server", "url", src.URL, "err", err)
		}
		fs.feeds = append(fs.feeds, f)
	}
	return fs, nil
}

// lists is the entries of every feed by list, a copy in instead standing
// in for its feed's current one. Entries the same feed lists twice cannot
// occur; a prefix two feeds hold is resolved by desired.
func (fs *feedSet) lists(instead map[*feed.Feed]*rules.Ruleset) [2][]rules.PrefixEntry {
	var out [2][]rules.PrefixEntry
	if fs == nil {
		return out
	}
	for _, x := range fs.feeds {
		rs := x.Rules()
		if r, ok := instead[x]; ok {
			rs = r
		}
		if rs == nil {
			continue
		}
		out[shield.AllowList] = append(out[shield.AllowList], rs.Allow...)
		out[shield.DenyList] = append(out[shield.DenyList], rs.Deny...)
	}
	return out
}

// lookup finds the entry a feed gives a prefix, and the feed.
func (fs *feedSet) lookup(l shield.List, p netip.Prefix) (rules.PrefixEntry, *feed.Feed, bool) {
	if fs == nil {
		return rules.PrefixEntry{}, nil, false
	}
	for _, f := range fs.feeds {
		rs := f.Rules()
		if rs == nil {
			continue
		}
		entries := rs.Deny
		if l == shield.AllowList {
			entries = rs.Allow
		}
		if e, ok := feed.Lookup(entries, p); ok {
			return e, f, true
		}
	}
	return rules.PrefixEntry{}, nil, false
}

// statuses reports every feed.
func (fs *feedSet) statuses() []feed.Status {
	out := []feed.Status{}
	if fs == nil {
		return out
	}
	for _, f := range fs.feeds {
		out = append(out, f.Status())
	}
	return out
}

// FeedStatus reports the applied config's feeds, in its order, without
// waiting for a change under way (a scrape of the metrics calls it).
func (d *Daemon) FeedStatus() []feed.Status {
	return d.feedsNow.Load().statuses()
}

// feedRunner fetches each feed of the applied config every refresh
// period, one goroutine a feed, and applies what changed.
type feedRunner struct {
	d       *Daemon
	ctx     context.Context
	mu      sync.Mutex
	cancel  map[*feed.Feed]context.CancelFunc
	stopped bool // a reload still in flight at shutdown starts nothing
	wg      sync.WaitGroup
}

// sync starts a loop for each feed of fs that has none and stops the
// loops of feeds fs no longer holds.
func (r *feedRunner) sync(fs *feedSet) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stopped {
		return
	}
	live := map[*feed.Feed]bool{}
	for _, f := range fs.feeds {
		live[f] = true
		if r.cancel[f] != nil {
			continue
		}
		ctx, cancel := context.WithCancel(r.ctx)
		r.cancel[f] = cancel
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			r.loop(ctx, f)
		}()
	}
	for f, cancel := range r.cancel {
		if !live[f] {
			cancel()
			delete(r.cancel, f)
		}
	}
}

// stop ends every loop and waits for them.
func (r *feedRunner) stop() {
	r.mu.Lock()
	r.stopped = true
	for f, cancel := range r.cancel {
		cancel()
		delete(r.cancel, f)
	}
	r.mu.Unlock()
	r.wg.Wait()
}

// loop fetches a feed at once and then every refresh period. The fetch
// runs without the daemon's lock: a slow server delays nothing else.
func (r *feedRunner) loop(ctx context.Context, f *feed.Feed) {
	for {
		up, err := f.Fetch(ctx, time.Now())
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			r.d.log.Error("feed fetch failed; its last good copy stays applied", "url", f.Src.URL, "err", err)
		case up != nil:
			r.d.applyFeed(f, up)
		case f.Unsaved():
			r.d.saveFeed(f)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(f.Src.Refresh):
		}
	}
}

// applyFeed writes a feed's new copy into the maps as a diff, with every
// other source of rules as it is: the applied config's inline rules and
// rule files (as they were read at the last reload), the other feeds, and
// the rules added at run time.
// The copy becomes the feed's current one only if the maps took it.
func (d *Daemon) applyFeed(f *feed.Feed, up *feed.Update) {
	// As at a reload: a long list passes through several copies, and
	// they are freed once the maps hold it.
	defer releaseMemory()
	defer lowerGC()()
	d.mu.Lock()
	defer d.mu.Unlock()
	if !slices.Contains(d.feeds.feeds, f) {
		return // a reload dropped or changed the feed meanwhile
	}
	start := time.Now()
	var ch Changes
	err := func() error {
		return d.withShield(func(s *shield.Shield) error {
			w := d.desired(d.cfgSet, d.feeds.lists(map[*feed.Feed]*rules.Ruleset{f: up.Rules}))
			p, err := d.planRules(s, w)
			if err != nil {
				return err
			}
			return d.applyRules(s, w, p, &ch)
		})
	}()
	if err != nil {
		f.Reject(up, err, time.Now())
		d.log.Error("feed update refused; its last good copy stays applied", "url", f.Src.URL, "err", err)
		return
	}
	if err := f.Commit(up, time.Now()); err != nil {
		d.log.Error("feed applied, but its copy could not be saved: a restart applies the older one until the next fetch", "url", f.Src.URL, "err", err)
	}
	d.log.Info("feed applied", "url", f.Src.URL, "allow", len(up.Rules.Allow), "deny", len(up.Rules.Deny),
		"added", ch.Added, "removed", ch.Removed, "took", time.Since(start).Round(time.Millisecond))
}

// expireFeeds takes the feeds' entries whose time has passed out of the
// maps and out of the feeds' copies and counts, and says how many went.
// The data path ignores them already, but a server may serve them for a
// while (a static file for ever), and the same bytes are no new copy.
// They go through the diff a feed's new copy takes, all feeds in one: a
// prefix that the config, a run-time rule or another feed also holds
// keeps that entry, written in place of the feed's. Nothing is read while
// no feed entry has come due. Called with d.mu held.
func (d *Daemon) expireFeeds(now time.Time) (int, error) {
	if d.feeds == nil || d.cfgSet == nil {
		return 0, nil // no feeds: the config's rules are not kept
	}
	due := map[*feed.Feed]*feed.Expiry{}
	instead := map[*feed.Feed]*rules.Ruleset{}
	n := 0
	for _, f := range d.feeds.feeds {
		if e := f.Expired(now); e != nil {
			due[f], instead[f] = e, e.Rules
			n += e.Dropped
		}
	}
	if len(due) == 0 {
		return 0, nil
	}
	defer lowerGC()()
	start := time.Now()
	var ch Changes
	err := d.withShield(func(s *shield.Shield) error {
		w := d.desired(d.cfgSet, d.feeds.lists(instead))
		p, err := d.planRules(s, w)
		if err != nil {
			return err
		}
		return d.applyRules(s, w, p, &ch)
	})
	if err != nil {
		// The copies keep the entries: the next run tries again.
		return 0, err
	}
	for f, e := range due {
		f.DropExpired(e)
		d.log.Info("expired feed entries", "url", f.Src.URL, "count", e.Dropped)
	}
	d.log.Debug("expired feed entries applied", "added", ch.Added, "removed", ch.Removed, "took", time.Since(start).Round(time.Millisecond))
	return n, nil
}

// saveFeed saves a feed's copy that could not be saved when it was
// applied, if the feed is still the config's.
func (d *Daemon) saveFeed(f *feed.Feed) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !slices.Contains(d.feeds.feeds, f) {
		return
	}
	if err := f.SaveUnsaved(); err != nil {
		d.log.Error("a feed's copy still cannot be saved: a restart applies the older one until the next fetch", "url", f.Src.URL, "err", err)
	}
}

// overFeeds splits prefixes whose run-time rule goes (it expired, or was
// unblocked) into those a feed also holds, returned as the feed's entries
// to write over them, so the feed's rule applies again with no moment
// without one, and the rest, to delete.
func (d *Daemon) overFeeds(l shield.List, prefixes []netip.Prefix) (rest []netip.Prefix, feedEntries []shield.Entry) {
	for _, p := range prefixes {
		if e, _, ok := d.feeds.lookup(l, p); ok {
			feedEntries = append(feedEntries, shield.EntryOf(e))
		} else {
			rest = append(rest, p)
		}
	}
	return rest, feedEntries
}

// shared is what the share endpoint publishes of a list: its unexpired
// rules added at run time and, in the deny list if autoBlocks, the rate
// limits' auto-blocks, each with its expiry and comment.
func (d *Daemon) shared(list string, autoBlocks bool) (*rules.Ruleset, error) {
	rs := &rules.Ruleset{Allow: []rules.PrefixEntry{}, Deny: []rules.PrefixEntry{}, Ports: []rules.PortEntry{}}
	l, dst := shield.DenyList, &rs.Deny
	if list == "allow" {
		l, dst = shield.AllowList, &rs.Allow
	}
	now := time.Now()
	d.mu.Lock()
	for _, e := range *d.dynamicList(l) {
		if e.Expires == nil || e.Expires.After(now) {
			*dst = append(*dst, rules.PrefixEntry{Prefix: e.Prefix, Expires: e.Expires, Comment: e.Comment})
		}
	}
	d.mu.Unlock()
	if l == shield.DenyList && autoBlocks {
		// Auto-blocks are the data path's: read from the maps, under
		// the state's lock but not the daemon's. The share's cache
		// bounds how much of the time this takes.
		err := d.withShield(func(s *shield.Shield) error {
			have, err := s.Entries(shield.DenyList)
			if err != nil {
				return err
			}
			for _, e := range have {
				// Not monitor mode's: a trial blocks nothing.
				if e.Auto && !e.Monitor && e.Expires.After(now) {
					t := e.Expires.UTC().Truncate(time.Second)
					*dst = append(*dst, rules.PrefixEntry{Prefix: e.Prefix, Expires: &t, Comment: e.Comment})
				}
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	slices.SortStableFunc(*dst, func(a, b rules.PrefixEntry) int { return rules.ComparePrefixes(a.Prefix, b.Prefix) })
	*dst = slices.CompactFunc(*dst, func(a, b rules.PrefixEntry) bool { return a.Prefix == b.Prefix })
	return rs, nil
}
