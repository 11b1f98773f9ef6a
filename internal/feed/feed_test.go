package feed_test

import (
	"context"
	"encoding/pem"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moat-shield/moat/internal/feed"
	"github.com/moat-shield/moat/internal/rules"
)

// server serves a list whose body, validators and required token a test
// changes as it goes, and counts what it was asked.
type server struct {
	mu       sync.Mutex
	body     string
	etag     string // "" sends none
	token    string // "" asks for none
	status   int    // 0: 200
	requests int
	notMod   int
	lastAuth string
}

func (s *server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.requests++
	s.lastAuth = r.Header.Get("Authorization")
	if s.token != "" && s.lastAuth != "Bearer "+s.token {
		http.Error(w, "no", http.StatusUnauthorized)
		return
	}
	if s.status != 0 {
		http.Error(w, "broken", s.status)
		return
	}
	if s.etag != "" {
		w.Header().Set("ETag", s.etag)
		if r.Header.Get("If-None-Match") == s.etag {
			s.notMod++
			w.WriteHeader(http.StatusNotModified)
			return
		}
	}
	fmt.Fprint(w, s.body)
}

func (s *server) set(f func(*server)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f(s)
}

func prefixes(l []rules.PrefixEntry) string {
	var out []string
	for _, e := range l {
		out = append(out, e.Prefix.String())
	}
	return strings.Join(out, " ")
}

func mustNew(t *testing.T, src feed.Source, dir string) *feed.Feed {
	t.Helper()
	f, err := feed.New(src, dir)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// TestFetchCommitAndCache follows a feed through a first fetch, a 304, a
// change, a server without validators and a restart from the saved copy.
func TestFetchCommitAndCache(t *testing.T) {
	srv := &server{body: "# a list\n203.0.113.9\n198.51.100.0/24 ; a net\n192.0.2.1\n", etag: `"v1"`}
	ts := httptest.NewServer(srv)
	defer ts.Close()
	dir := t.TempDir()
	src := feed.Source{URL: ts.URL + "/deny.txt", List: "deny", Refresh: time.Second}
	f := mustNew(t, src, dir)
	if err := f.LoadCache(time.Now()); err != nil || f.Rules() != nil {
		t.Fatalf("no saved copy yet: %v %v", err, f.Rules())
	}
	ctx := context.Background()

	up, err := f.Fetch(ctx, time.Now())
	if err != nil || up == nil {
		t.Fatalf("first fetch: %v %v", up, err)
	}
	// Sorted by address, whatever the server's order.
	if got := prefixes(up.Rules.Deny); got != "192.0.2.1/32 198.51.100.0/24 203.0.113.9/32" || len(up.Rules.Allow) != 0 {
		t.Fatalf("first copy: deny %q allow %d", got, len(up.Rules.Allow))
	}
	if f.Rules() != nil {
		t.Fatal("an update is current before Commit")
	}
	if err := f.Commit(up, time.Now()); err != nil {
		t.Fatal(err)
	}
	if st := f.Status(); st.Deny != 3 || st.LastChange.IsZero() || st.Error != "" {
		t.Fatalf("status after commit: %+v", st)
	}

	// Unchanged: the validator gets a 304.
	if up, err := f.Fetch(ctx, time.Now()); up != nil || err != nil {
		t.Fatalf("unchanged list: %v %v", up, err)
	}
	if srv.notMod != 1 {
		t.Fatalf("the second fetch did not ask with If-None-Match (304s: %d)", srv.notMod)
	}

	// Changed; and a copy that is rejected stays out.
	srv.set(func(s *server) { s.body, s.etag = "203.0.113.9\n", `"v2"` })
	up, err = f.Fetch(ctx, time.Now())
	if err != nil || up == nil || prefixes(up.Rules.Deny) != "203.0.113.9/32" {
		t.Fatalf("changed list: %v %v", up, err)
	}
	f.Reject(up, fmt.Errorf("maps full"), time.Now())
	if st := f.Status(); st.Deny != 3 || st.Error != "maps full" || st.Failures != 1 {
		t.Fatalf("after a rejected update: %+v", st)
	}
	// The same bytes are not offered again for a while; then they are.
	if up, err := f.Fetch(ctx, time.Now()); up != nil || err == nil || !strings.Contains(err.Error(), "still serves the copy refused before (maps full)") {
		t.Fatalf("the refused copy again at once: %v %v", up, err)
	}
	up, err = f.Fetch(ctx, time.Now().Add(feed.RetryRefusedAfter+time.Second))
	if err != nil || up == nil {
		t.Fatalf("a refused update is offered again later: %v %v", up, err)
	}
	if err := f.Commit(up, time.Now()); err != nil {
		t.Fatal(err)
	}

	// No validators: the same bytes are no update.
	srv.set(func(s *server) { s.etag = "" })
	if up, err := f.Fetch(ctx, time.Now()); up != nil || err != nil {
		t.Fatalf("same bytes without validators: %v %v", up, err)
	}

	// A new feed for the same source starts from the saved copy.
	g := mustNew(t, src, dir)
	if err := g.LoadCache(time.Now()); err != nil {
		t.Fatal(err)
	}
	if g.Rules() == nil || prefixes(g.Rules().Deny) != "203.0.113.9/32" || !g.Status().FromCache {
		t.Fatalf("restart from the saved copy: %+v", g.Status())
	}
	// Another URL never reads it.
	h := mustNew(t, feed.Source{URL: ts.URL + "/other.txt", List: "deny"}, dir)
	if err := h.LoadCache(time.Now()); err != nil || h.Rules() != nil {
		t.Fatalf("another URL read the saved copy: %v", err)
	}
	// Forget deletes it.
	feed.Forget(dir, src)
	if files, _ := filepath.Glob(filepath.Join(dir, "feed-*")); len(files) != 0 {
		t.Fatalf("left after Forget: %v", files)
	}
}

// TestFetchRefusals: a list that is not whole and valid never becomes
// current, and says why.
func TestFetchRefusals(t *testing.T) {
	defer feed.SetMaxSize(4096)()
	past := time.Now().Add(-time.Hour).UTC().Format(time.RFC3339)
	future := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	for _, tc := range []struct {
		name, body string
		status     int
		want       string // in the error; "" for none
		deny       string // prefixes of a good copy
	}{
		{name: "bad line", body: "203.0.113.9\n203.0.113.300\n", want: ":2: "},
		{name: "port rules", body: `{"allow":[],"deny":[],"ports":[{"rule":"udp/19","action":"drop"}]}`, want: "port rules"},
		{name: "settings", body: `{"allow":[],"deny":[],"settings":{"fragments":"drop","malformed":"drop"}}`, want: "policy settings"},
		{name: "the other list", body: `{"allow":[{"prefix":"0.0.0.0/0"}],"deny":[{"prefix":"192.0.2.7"}]}`, want: "1 entries for the other list; this feed fills the deny list only"},
		{name: "too large", body: strings.Repeat("203.0.113.9\n", 400), want: "larger than 4096 bytes"},
		{name: "server error", status: http.StatusServiceUnavailable, want: "503"},
		{name: "json with expiries", body: `{"deny":[{"prefix":"192.0.2.7","expires":"` + past + `"},{"prefix":"192.0.2.8","expires":"` + future + `","comment":"x"}]}`,
			deny: "192.0.2.8/32"},
		{name: "empty", body: "", deny: ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := &server{body: tc.body, status: tc.status}
			ts := httptest.NewServer(srv)
			defer ts.Close()
			f := mustNew(t, feed.Source{URL: ts.URL, List: "deny"}, t.TempDir())
			up, err := f.Fetch(context.Background(), time.Now())
			if tc.want == "" {
				if err != nil || up == nil || prefixes(up.Rules.Deny) != tc.deny {
					t.Fatalf("got %v, %v; want deny %q", up, err, tc.deny)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want it to say %q", err, tc.want)
			}
			if up != nil || f.Rules() != nil {
				t.Fatal("a refused list became an update")
			}
			if st := f.Status(); st.Failures != 1 || st.Error == "" {
				t.Fatalf("status: %+v", st)
			}
		})
	}
}

// TestFetchTokenAndCA: the token file is read at every fetch and sent as
// a bearer token; a CA file makes it the only trusted authority.
func TestFetchTokenAndCA(t *testing.T) {
	srv := &server{body: "192.0.2.1\n", token: "s3cret"}
	ts := httptest.NewTLSServer(srv)
	defer ts.Close()
	dir := t.TempDir()
	ca := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ts.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	tok := filepath.Join(dir, "token")
	if err := os.WriteFile(tok, []byte("wrong\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()

	// The system's authorities do not know the test server.
	f := mustNew(t, feed.Source{URL: ts.URL, List: "deny", TokenFile: tok}, dir)
	if _, err := f.Fetch(ctx, time.Now()); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("without the CA: %v", err)
	}

	f = mustNew(t, feed.Source{URL: ts.URL, List: "deny", TokenFile: tok, CAFile: ca}, dir)
	if _, err := f.Fetch(ctx, time.Now()); err == nil || !strings.Contains(err.Error(), "401") {
		t.Fatalf("a wrong token: %v", err)
	}
	if err := os.WriteFile(tok, []byte("  s3cret \n"), 0o600); err != nil {
		t.Fatal(err)
	}
	up, err := f.Fetch(ctx, time.Now())
	if err != nil || up == nil || prefixes(up.Rules.Deny) != "192.0.2.1/32" {
		t.Fatalf("with the token: %v %v", up, err)
	}
	if srv.lastAuth != "Bearer s3cret" {
		t.Fatalf("sent %q", srv.lastAuth)
	}
	// A redirect is not followed: the token stays with the URL named.
	redirect := httptest.NewServer(http.RedirectHandler(ts.URL, http.StatusFound))
	defer redirect.Close()
	g := mustNew(t, feed.Source{URL: redirect.URL, List: "deny", TokenFile: tok}, dir)
	if _, err := g.Fetch(ctx, time.Now()); err == nil || !strings.Contains(err.Error(), "302") {
		t.Fatalf("a redirect: %v", err)
	}

	if err := os.WriteFile(tok, []byte(""), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Fetch(ctx, time.Now()); err == nil || !strings.Contains(err.Error(), "one line holding the token") {
		t.Fatalf("an empty token file: %v", err)
	}

	bad := filepath.Join(dir, "bad.pem")
	os.WriteFile(bad, []byte("not a certificate"), 0o600)
	if _, err := feed.New(feed.Source{URL: ts.URL, List: "deny", CAFile: bad}, dir); err == nil || !strings.Contains(err.Error(), "no PEM certificate") {
		t.Fatalf("a CA file without certificates: %v", err)
	}
}

func TestCheckURL(t *testing.T) {
	for u, want := range map[string]string{
		"https://rules.example/deny.txt":  "",
		"http://10.0.0.1:9478/v1/share":   "",
		"ftp://rules.example/deny.txt":    "http:// or https://",
		"https:///deny.txt":               "no host",
		"https://user:pw@rules.example/x": "token_file",
		"https://rules.example/x#part":    "fragment",
		"rules.example/deny.txt":          "http:// or https://",
		"http://[::1/v1":                  "not a URL",
	} {
		err := feed.CheckURL(u)
		if (want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), want)) {
			t.Errorf("CheckURL(%q) = %v, want %q", u, err, want)
		}
	}
}

// A copy that could not be saved is current all the same, and saved at
// the next fetch that confirms it; a feed that adopts another takes its
// copy, validators and counts, not what the disk holds.
func TestUnsavedCopyAndAdopt(t *testing.T) {
	srv := &server{body: "192.0.2.1\n", etag: `"v1"`}
	ts := httptest.NewServer(srv)
	defer ts.Close()
	dir := filepath.Join(t.TempDir(), "feeds")
	if err := os.WriteFile(dir, nil, 0o600); err != nil { // a file where the directory should be
		t.Fatal(err)
	}
	src := feed.Source{URL: ts.URL, List: "deny", Refresh: time.Second}
	f := mustNew(t, src, dir)
	ctx := context.Background()
	up, err := f.Fetch(ctx, time.Now())
	if err != nil || up == nil {
		t.Fatal(up, err)
	}
	if err := f.Commit(up, time.Now()); err == nil {
		t.Fatal("saving into a file as a directory worked")
	}
	if st := f.Status(); f.Rules() == nil || !strings.HasPrefix(st.Error, "saving the copy: ") {
		t.Fatalf("after a failed save: %+v", st)
	}

	g := mustNew(t, feed.Source{URL: ts.URL, List: "deny", Refresh: 2 * time.Second}, dir)
	g.Adopt(f)
	if g.Rules() == nil || prefixes(g.Rules().Deny) != "192.0.2.1/32" || g.Status().Refresh != "2s" || g.Status().Deny != 1 {
		t.Fatalf("adopted: %+v", g.Status())
	}

	os.Remove(dir)
	if up, err := g.Fetch(ctx, time.Now()); up != nil || err != nil {
		t.Fatalf("a 304 after adoption (validators carried over): %v %v", up, err)
	}
	if srv.notMod != 1 {
		t.Fatalf("304s: %d", srv.notMod)
	}
	if !g.Unsaved() {
		t.Fatal("the copy no longer waits to be saved, but was not")
	}
	if err := g.SaveUnsaved(); err != nil || g.Unsaved() {
		t.Fatalf("the retried save: %v", err)
	}
	h := mustNew(t, src, dir)
	if err := h.LoadCache(time.Now()); err != nil || h.Rules() == nil || prefixes(h.Rules().Deny) != "192.0.2.1/32" {
		t.Fatalf("the copy saved at the retry: %v", err)
	}
}

// Same compares the settings and the CA file's bytes: a CA replaced in
// place makes the daemon build a new client at the next reload.
func TestSameSeesACAReplacedInPlace(t *testing.T) {
	dir := t.TempDir()
	ts := httptest.NewTLSServer(&server{})
	defer ts.Close()
	ca := filepath.Join(dir, "ca.pem")
	write := func() {
		if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ts.Certificate().Raw}), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write()
	src := feed.Source{URL: ts.URL, List: "deny", CAFile: ca}
	f := mustNew(t, src, dir)
	if !f.Same(src) || !f.Same(feed.Source{URL: ts.URL, List: "deny", CAFile: ca, Refresh: feed.DefaultRefresh}) {
		t.Fatal("the same source is not Same")
	}
	if f.Same(feed.Source{URL: ts.URL, List: "deny", CAFile: ca, Refresh: time.Hour}) {
		t.Fatal("another refresh is Same")
	}
	if err := os.WriteFile(ca, append([]byte("# rotated\n"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ts.Certificate().Raw})...), 0o600); err != nil {
		t.Fatal(err)
	}
	if f.Same(src) {
		t.Fatal("a CA file replaced in place is Same")
	}
}

// TestExpiredEntriesLeaveTheCopy: once an entry's time has passed,
// Expired offers the copy without it, leaving the current copy as it is
// until DropExpired, which makes the shorter copy and its counts current.
// The server's bytes are still no new copy, and a copy committed between
// Expired and DropExpired stays.
func TestExpiredEntriesLeaveTheCopy(t *testing.T) {
	now := time.Now()
	at := func(d time.Duration) string { return now.Add(d).UTC().Format(time.RFC3339) }
	body := fmt.Sprintf(`{"deny":[{"prefix":"192.0.2.1","expires":%q},{"prefix":"192.0.2.2","expires":%q},{"prefix":"192.0.2.3"}]}`, at(10*time.Second), at(time.Hour))
	srv := &server{body: body}
	ts := httptest.NewServer(srv)
	defer ts.Close()
	f := mustNew(t, feed.Source{URL: ts.URL, List: "deny"}, t.TempDir())
	ctx := context.Background()
	up, err := f.Fetch(ctx, now)
	if err != nil || up == nil {
		t.Fatal(up, err)
	}
	if err := f.Commit(up, now); err != nil {
		t.Fatal(err)
	}
	if e := f.Expired(now.Add(5 * time.Second)); e != nil {
		t.Fatalf("nothing has expired yet, Expired offers %d entries less", e.Dropped)
	}

	later := now.Add(20 * time.Second)
	e := f.Expired(later)
	if e == nil || e.Dropped != 1 || prefixes(e.Rules.Deny) != "192.0.2.2/32 192.0.2.3/32" {
		t.Fatalf("Expired after the first expiry: %+v", e)
	}
	if prefixes(f.Rules().Deny) != "192.0.2.1/32 192.0.2.2/32 192.0.2.3/32" || f.Status().Deny != 3 {
		t.Fatalf("Expired changed the current copy: %s, %+v", prefixes(f.Rules().Deny), f.Status())
	}
	f.DropExpired(e)
	if prefixes(f.Rules().Deny) != "192.0.2.2/32 192.0.2.3/32" || f.Status().Deny != 2 {
		t.Fatalf("after DropExpired: %s, %+v", prefixes(f.Rules().Deny), f.Status())
	}
	if e := f.Expired(later); e != nil {
		t.Fatalf("Expired again at once offers %d entries less", e.Dropped)
	}
	if up, err := f.Fetch(ctx, later); up != nil || err != nil {
		t.Fatalf("the same bytes after DropExpired: %v %v", up, err)
	}

	// A new copy committed meanwhile is not replaced by the old one's
	// shorter copy.
	e = f.Expired(now.Add(2 * time.Hour))
	srv.set(func(s *server) { s.body = "192.0.2.9\n" })
	up, err = f.Fetch(ctx, later)
	if err != nil || up == nil {
		t.Fatal(up, err)
	}
	if err := f.Commit(up, later); err != nil {
		t.Fatal(err)
	}
	f.DropExpired(e)
	if prefixes(f.Rules().Deny) != "192.0.2.9/32" || f.Status().Deny != 1 {
		t.Fatalf("DropExpired replaced a newer copy: %s, %+v", prefixes(f.Rules().Deny), f.Status())
	}
}
