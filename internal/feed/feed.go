// Package feed keeps a fleet's hosts on shared rule lists: it fetches a
// list that another host publishes over HTTP(S) (a moat daemon's share
// endpoint, or any server of plain lists and `moat export` JSON), checks
// it whole, and keeps the last good copy on disk, so a daemon that starts
// again applies the list before the network answers.
//
// A fetch asks with the validators of the last good copy (If-None-Match,
// If-Modified-Since), so an unchanged list costs one small answer. A new
// copy becomes current only through Commit, which the daemon calls once
// the rules are in the maps: a copy the maps refused is fetched again at
// the next refresh, and a restart applies what was applied before.
package feed

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/moat-shield/moat/internal/rules"
	"github.com/moat-shield/moat/internal/state"
)

// Limits of a feed.
const (
	// MaxSize is the largest list a feed takes: a million IPv6 entries
	// with comments in moat's JSON are about 90 MiB.
	MaxSize = 128 << 20
	// MinRefresh is the shortest refresh period.
	MinRefresh = time.Second
	// DefaultRefresh is how often a feed is fetched when the config
	// does not say.
	DefaultRefresh = time.Minute
	// Timeout bounds one fetch, from the request to the last byte.
	Timeout = 30 * time.Second
)

// maxSize is MaxSize; tests make it smaller.
var maxSize int64 = MaxSize

// Source is a feed as the config names it.
type Source struct {
	URL string
	// List is the list the feed fills, deny or allow: a plain list's
	// entries go there, and moat's JSON may hold entries of that list
	// only.
	List    string
	Refresh time.Duration
	// CAFile, if set, holds the only certificate authorities trusted
	// for an https URL (a fleet's own CA); otherwise the system's.
	CAFile string
	// TokenFile, if set, holds a token sent as "Authorization: Bearer";
	// it is read at every fetch, so it can be replaced in place.
	TokenFile string
}

// CheckURL tells whether u can be a feed's address: http or https, with
// a host, and no user or password in it (they would show in logs and
// status; use a token file).
func CheckURL(u string) error {
	p, err := url.Parse(u)
	if err != nil {
		return fmt.Errorf("%q is not a URL", u)
	}
	if p.Scheme != "http" && p.Scheme != "https" {
		return fmt.Errorf("%q: want an http:// or https:// URL", u)
	}
	if p.Host == "" {
		return fmt.Errorf("%q has no host", u)
	}
	if p.User != nil {
		return fmt.Errorf("%q holds a user name or password; put a token in token_file instead", u)
	}
	if p.Fragment != "" {
		return fmt.Errorf("%q holds a fragment (#...), which is never sent", u)
	}
	return nil
}

// Parse reads a feed's body as a rule file and checks that it holds what
// a feed may carry: entries of its own list, with or without expiries.
// Port rules and policy settings are refused (they are the config's), and
// so is the whole list if any entry is bad. Entries whose time passed
// before now are left out.
func Parse(name string, body []byte, list string, now time.Time) (*rules.Ruleset, error) {
	rs, err := rules.ReadRuleset(name, bytes.NewReader(body), list)
	if err != nil {
		return nil, err
	}
	if len(rs.Ports) > 0 {
		return nil, fmt.Errorf("%s holds %d port rules; a feed carries allow and deny entries only", name, len(rs.Ports))
	}
	if rs.Settings != nil {
		return nil, fmt.Errorf("%s holds policy settings; a feed carries allow and deny entries only", name)
	}
	// A feed fills one list: a deny feed that could also allow (a
	// share's whole output, a mistake on the server) would open the host.
	if other := map[string][]rules.PrefixEntry{"deny": rs.Allow, "allow": rs.Deny}[list]; len(other) > 0 {
		return nil, fmt.Errorf("%s holds %d entries for the other list; this feed fills the %s list only (a share serves one list with ?list=%s)",
			name, len(other), list, list)
	}
	rs.DropExpired(now)
	// Sorted, as the daemon's merge and look-ups want them.
	for _, l := range [][]rules.PrefixEntry{rs.Allow, rs.Deny} {
		slices.SortFunc(l, func(a, b rules.PrefixEntry) int { return rules.ComparePrefixes(a.Prefix, b.Prefix) })
	}
	return rs, nil
}

// Status is what a feed's last fetches did.
type Status struct {
	URL         string    `json:"url"`
	List        string    `json:"list"`
	Allow       int       `json:"allow"` // entries of the current copy, by list
	Deny        int       `json:"deny"`
	Refresh     string    `json:"refresh"`
	LastSuccess time.Time `json:"last_success,omitzero"` // the current copy was confirmed or fetched
	LastChange  time.Time `json:"last_change,omitzero"`  // a new copy became current
	LastAttempt time.Time `json:"last_attempt,omitzero"`
	Failures    uint64    `json:"failures"` // fetches or applies that failed, in all
	Error       string    `json:"error,omitempty"`
	// FromCache: the copy is the one saved on disk before this daemon
	// started, not yet confirmed by the server.
	FromCache bool `json:"from_cache,omitempty"`
}

// Feed is one source, its current copy and its fetch state.
type Feed struct {
	Src    Source
	client *http.Client
	cache  string // file of the current copy; cache+".meta" its validators

	caSum [sha256.Size]byte // of the CA file the client trusts

	mu    sync.Mutex
	rules *rules.Ruleset // current copy, expired entries left out
	// nextExpiry is when the first entry of the current copy expires
	// (zero: none has an expiry), so that Expired walks the copy only
	// once one has.
	nextExpiry time.Time
	sum        [sha256.Size]byte
	meta       meta
	st         Status
	fromCache  bool
	unsaved    *Update // the current copy, if saving it failed: saved again at the next fetch
	// refused is the copy the maps refused last, and until when the
	// same bytes are not offered again: each try reads the whole lists.
	refused      [sha256.Size]byte
	refusedUntil time.Time
	refusedErr   string
}

// RetryRefusedAfter is how long a copy the maps refused is not applied
// again while the server keeps serving it (the rules it competes with
// may change meanwhile).
const RetryRefusedAfter = 5 * time.Minute

// meta is what is kept beside a cached copy.
type meta struct {
	URL          string    `json:"url"`
	ETag         string    `json:"etag,omitempty"`
	LastModified string    `json:"last_modified,omitempty"`
	Fetched      time.Time `json:"fetched"`
}

// New makes a feed whose copies are cached in dir (created if need be).
// The CA file, if any, is read here: a feed that cannot check its server
// is refused at once.
func New(src Source, dir string) (*Feed, error) {
	if src.Refresh == 0 {
		src.Refresh = DefaultRefresh
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.Proxy = nil // a fleet's feed is reached directly, whatever the daemon's environment says
	var caSum [sha256.Size]byte
	if src.CAFile != "" {
		pem, err := os.ReadFile(src.CAFile)
		if err != nil {
			return nil, fmt.Errorf("feed %s: %w", src.URL, err)
		}
		caSum = sha256.Sum256(pem)
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("feed %s: %s holds no PEM certificate", src.URL, src.CAFile)
		}
		tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	f := &Feed{
		Src: src,
		client: &http.Client{Transport: tr, Timeout: Timeout,
			// A redirect is answered as an error: the token must reach
			// the URL the config names and no other (an https URL
			// redirected to http would send it in clear).
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }},
		cache: filepath.Join(dir, CacheName(src)),
		caSum: caSum,
	}
	f.st = Status{URL: src.URL, List: src.List, Refresh: src.Refresh.String()}
	return f, nil
}

// ReadToken reads a bearer token from a file: one line, surrounding
// space left out. Feeds send it, a share checks it.
func ReadToken(name string) (string, error) {
	b, err := os.ReadFile(name)
	if err != nil {
		return "", err
	}
	t := strings.TrimSpace(string(b))
	if t == "" || strings.ContainsAny(t, "\r\n") {
		return "", fmt.Errorf("%s: want one line holding the token", name)
	}
	return t, nil
}

// Same tells whether f fetches src as it is now: the same settings, and
// the CA file (read again) unchanged. A reload after a CA was replaced in
// place makes a new client.
func (f *Feed) Same(src Source) bool {
	if src.Refresh == 0 {
		src.Refresh = DefaultRefresh
	}
	if f.Src != src {
		return false
	}
	if src.CAFile == "" {
		return true
	}
	pem, err := os.ReadFile(src.CAFile)
	return err == nil && sha256.Sum256(pem) == f.caSum
}

// CacheName is the file a source's copy is kept in: named by a hash of
// the URL and the list, so two feeds never share one and a changed URL
// never reads another server's copy.
func CacheName(src Source) string {
	h := sha256.Sum256([]byte(src.List + " " + src.URL))
	return "feed-" + hex.EncodeToString(h[:12])
}

// LoadCache makes the copy saved on disk current, if there is one for
// this URL. No copy is not an error; a copy that no longer reads is.
func (f *Feed) LoadCache(now time.Time) error {
	body, err := os.ReadFile(f.cache)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var m meta
	if b, err := os.ReadFile(f.cache + ".meta"); err == nil {
		if json.Unmarshal(b, &m) != nil || m.URL != f.Src.URL {
			m = meta{}
		}
	}
	rs, err := Parse(f.cache, body, f.Src.List, now)
	if err != nil {
		return fmt.Errorf("feed %s: the saved copy: %w", f.Src.URL, err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rules, f.sum, f.meta, f.fromCache = rs, sha256.Sum256(body), m, true
	f.nextExpiry = firstExpiry(rs)
	f.st.Allow, f.st.Deny, f.st.FromCache = len(rs.Allow), len(rs.Deny), true
	f.st.LastChange = m.Fetched
	return nil
}

// Adopt takes over the copy, validators and counts of old, a feed of
// the same URL and list whose other settings (refresh, token, CA) changed:
// the copy in hand stays applied, whatever the disk holds.
func (f *Feed) Adopt(old *Feed) {
	old.mu.Lock()
	rs, next, sum, m, st, fromCache, unsaved := old.rules, old.nextExpiry, old.sum, old.meta, old.st, old.fromCache, old.unsaved
	old.mu.Unlock()
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rules, f.nextExpiry, f.sum, f.meta, f.fromCache, f.unsaved = rs, next, sum, m, fromCache, unsaved
	st.Refresh = f.st.Refresh
	f.st = st
}

// Rules is the current copy (nil before the first). Callers must not
// change it.
func (f *Feed) Rules() *rules.Ruleset {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.rules
}

// Status reports the feed's state.
func (f *Feed) Status() Status {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.st
}

// Update is a new copy fetched but not yet current.
type Update struct {
	Rules *rules.Ruleset
	body  []byte
	meta  meta
}

// Fetch asks the server for the list. It returns nil, nil when the copy
// in hand is still current (304, or the same bytes), and an Update when
// the server has another, checked whole; the caller applies it and then
// calls Commit, or Reject if the maps could not take it.
func (f *Feed) Fetch(ctx context.Context, now time.Time) (*Update, error) {
	f.mu.Lock()
	m, sum, have := f.meta, f.sum, f.rules != nil
	f.st.LastAttempt = now
	f.mu.Unlock()
	up, err := f.fetch(ctx, m, sum, have, now)
	f.mu.Lock()
	defer f.mu.Unlock()
	if err != nil {
		f.st.Failures++
		f.st.Error = err.Error()
		return nil, err
	}
	if up == nil {
		f.st.LastSuccess, f.st.Error = now, ""
		if f.fromCache {
			f.fromCache, f.st.FromCache = false, false
		}
	}
	return up, nil
}

// Unsaved tells whether the current copy still waits to be saved.
func (f *Feed) Unsaved() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.unsaved != nil
}

// SaveUnsaved saves the current copy if an earlier save failed. The
// daemon calls it after a fetch confirmed the copy, under the same lock
// as its reloads, so the copy of a feed a reload dropped (and deleted)
// is never written back.
func (f *Feed) SaveUnsaved() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.unsaved == nil {
		return nil
	}
	if err := f.save(f.unsaved); err != nil {
		f.st.Error = "saving the copy: " + err.Error()
		return err
	}
	f.unsaved = nil
	return nil
}

func (f *Feed) fetch(ctx context.Context, m meta, sum [sha256.Size]byte, have bool, now time.Time) (*Update, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, f.Src.URL, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("User-Agent", "moat-feed")
	if f.Src.TokenFile != "" {
		t, err := ReadToken(f.Src.TokenFile)
		if err != nil {
			return nil, err
		}
		req.Header.Set("Authorization", "Bearer "+t)
	}
	if have {
		if m.ETag != "" {
			req.Header.Set("If-None-Match", m.ETag)
		}
		if m.LastModified != "" {
			req.Header.Set("If-Modified-Since", m.LastModified)
		}
	}
	resp, err := f.client.Do(req)
	if err != nil {
		return nil, errors.Unwrap(err) // *url.Error repeats the URL, which the caller names
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusNotModified && have:
		return nil, nil
	case resp.StatusCode != http.StatusOK:
		io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
		return nil, fmt.Errorf("server answered %s", resp.Status)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxSize+1))
	if err != nil {
		return nil, fmt.Errorf("reading the list: %w", err)
	}
	if int64(len(body)) > maxSize {
		return nil, fmt.Errorf("the list is larger than %d bytes", maxSize)
	}
	nm := meta{URL: f.Src.URL, ETag: resp.Header.Get("ETag"), LastModified: resp.Header.Get("Last-Modified"), Fetched: now}
	if have && sha256.Sum256(body) == sum {
		// Same bytes (a server without validators): only the
		// validators are kept.
		f.mu.Lock()
		f.meta = nm
		f.mu.Unlock()
		return nil, nil
	}
	f.mu.Lock()
	refused := sha256.Sum256(body) == f.refused && now.Before(f.refusedUntil)
	why := f.refusedErr
	f.mu.Unlock()
	if refused {
		return nil, fmt.Errorf("the server still serves the copy refused before (%s); tried again %s after the refusal", why, RetryRefusedAfter)
	}
	rs, err := Parse(f.Src.URL, body, f.Src.List, now)
	if err != nil {
		return nil, err
	}
	return &Update{Rules: rs, body: body, meta: nm}, nil
}

// Commit makes an update current and saves it, after the maps took it.
// A copy that could not be saved is current all the same (the maps hold
// it); the error says the next start will apply the older copy.
func (f *Feed) Commit(up *Update, now time.Time) error {
	f.mu.Lock()
	f.rules, f.sum, f.meta, f.fromCache = up.Rules, sha256.Sum256(up.body), up.meta, false
	f.nextExpiry = firstExpiry(up.Rules)
	f.st.Allow, f.st.Deny = len(up.Rules.Allow), len(up.Rules.Deny)
	f.st.LastSuccess, f.st.LastChange, f.st.Error, f.st.FromCache = now, now, "", false
	f.unsaved = nil
	err := f.save(up)
	if err != nil {
		f.unsaved = up
		f.st.Error = "saving the copy: " + err.Error()
	}
	f.mu.Unlock()
	return err
}

// save writes a copy and its validators to the feed's files. The old
// validators go first and the new ones last, so they never describe
// another copy than the one saved (without them, the next start fetches
// the whole list).
func (f *Feed) save(up *Update) error {
	if err := os.Remove(f.cache + ".meta"); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if err := state.WriteFile(f.cache, up.body); err != nil {
		return err
	}
	mb, _ := json.Marshal(up.meta)
	return state.WriteFile(f.cache+".meta", mb)
}

// Reject records that an update could not be applied; the copy in hand
// stays current. The same copy is offered again only after
// RetryRefusedAfter; another one at the next refresh.
func (f *Feed) Reject(up *Update, err error, now time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.st.Failures++
	f.st.Error = err.Error()
	f.refused, f.refusedUntil, f.refusedErr = sha256.Sum256(up.body), now.Add(RetryRefusedAfter), err.Error()
}

// Expiry is a feed's current copy without the entries whose time has
// passed, made by Expired.
type Expiry struct {
	Rules   *rules.Ruleset
	Dropped int            // entries left out
	from    *rules.Ruleset // the copy it was made from
}

// Expired returns the current copy without the entries whose time has
// passed at now, or nil while none has (without a walk of the copy). The
// server may keep serving such entries (a static file does for ever), and
// the same bytes are no new copy: the caller takes them out of the maps
// and then calls DropExpired.
func (f *Feed) Expired(now time.Time) *Expiry {
	f.mu.Lock()
	rs, next := f.rules, f.nextExpiry
	f.mu.Unlock()
	if rs == nil || next.IsZero() || next.After(now) {
		return nil
	}
	// A new ruleset: the current one is shared with its readers.
	out := &rules.Ruleset{Allow: unexpired(rs.Allow, now), Deny: unexpired(rs.Deny, now), Ports: rs.Ports, Settings: rs.Settings}
	return &Expiry{Rules: out, Dropped: len(rs.Allow) + len(rs.Deny) - len(out.Allow) - len(out.Deny), from: rs}
}

// unexpired is a copy of l without the entries whose time passed before
// now; sorted as l is.
func unexpired(l []rules.PrefixEntry, now time.Time) []rules.PrefixEntry {
	out := make([]rules.PrefixEntry, 0, len(l))
	for _, e := range l {
		if e.Expires == nil || e.Expires.After(now) {
			out = append(out, e)
		}
	}
	return out
}

// DropExpired makes the copy of e current, and the counts with it, once
// the maps no longer hold the entries it left out. The saved copy and the
// validators stay the server's: the entries that expired are left out
// again when the copy is read at a start. If another copy became current
// since e was made, that one stays.
func (f *Feed) DropExpired(e *Expiry) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.rules != e.from {
		return
	}
	f.rules, f.nextExpiry = e.Rules, firstExpiry(e.Rules)
	f.st.Allow, f.st.Deny = len(e.Rules.Allow), len(e.Rules.Deny)
}

// firstExpiry is when the first entry of rs expires; zero if none has an
// expiry.
func firstExpiry(rs *rules.Ruleset) time.Time {
	var first time.Time
	for _, l := range [][]rules.PrefixEntry{rs.Allow, rs.Deny} {
		for _, e := range l {
			if e.Expires != nil && (first.IsZero() || e.Expires.Before(first)) {
				first = *e.Expires
			}
		}
	}
	return first
}

// Forget drops the saved copy of a feed the config no longer names.
func Forget(dir string, src Source) {
	name := filepath.Join(dir, CacheName(src))
	os.Remove(name)
	os.Remove(name + ".meta")
}

// Lookup finds a prefix in a sorted list of entries.
func Lookup(l []rules.PrefixEntry, p netip.Prefix) (rules.PrefixEntry, bool) {
	i, ok := slices.BinarySearchFunc(l, p, func(e rules.PrefixEntry, p netip.Prefix) int { return rules.ComparePrefixes(e.Prefix, p) })
	if !ok {
		return rules.PrefixEntry{}, false
	}
	return l[i], true
}
