package daemon_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/moat-shield/moat/internal/feed"
)

// waitRules polls e's rules until cond holds them, for up to 15 s.
func (e *env) waitRules(what string, cond func([]string) bool) {
	e.t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		got := e.rulesNow()
		if cond(got) {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("%s: not within 15 s; rules:\n%s\ndaemon log:\n%s", what, strings.Join(got, "\n"), e.log)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// httpGet asks url with a bearer token ("" none) from inside the lab's
// server namespace and returns the status code.
func (e *env) httpGet(url, token string) int {
	e.t.Helper()
	code := 0
	if err := e.lab.Server.Do(func() error {
		req, err := http.NewRequest(http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		// Dialled here, on the namespace's thread: http.Client dials
		// from goroutines of its own, outside the namespace.
		c, err := net.Dial("tcp", req.URL.Host)
		if err != nil {
			return err
		}
		defer c.Close()
		if err := req.Write(c); err != nil {
			return err
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		code = resp.StatusCode
		return nil
	}); err != nil {
		e.t.Fatal(err)
	}
	return code
}

// feeds reads `moat feeds --json`.
func (e *env) feeds() []feed.Status {
	e.t.Helper()
	var out []feed.Status
	if err := json.Unmarshal([]byte(e.mustMoat("feeds", "--json").stdout), &out); err != nil {
		e.t.Fatal(err)
	}
	return out
}

// TestFleetSharesRunTimeRules runs two daemons as two hosts of a fleet in
// one lab: host A blocks sources at run time and shares them; host B,
// attached where the client's packets arrive, pulls A's share as a feed.
// A block on A must stop the client at B, an unblock free it, a bad
// token or a stopped A must leave B's last good copy in place, a restart
// of B must apply the saved copy before A answers, and A's config rules
// must never travel.
func TestFleetSharesRunTimeRules(t *testing.T) {
	a := newEnv(t)
	b := newEnvIn(t, a.lab)
	client := a.lab.Client.Ifaces[0].IPv4.Addr().String()
	token := filepath.Join(a.dir, "share.token") // A's
	bToken := filepath.Join(b.dir, "feed.token") // what B sends
	for _, f := range []string{token, bToken} {
		if err := os.WriteFile(f, []byte("fleet-secret-1\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	port := 20000 + rand.IntN(20000) // the lab's namespace is new: nothing listens there
	a.writeConfig(fmt.Sprintf("interfaces:\n  - name: %s\ndeny:\n  - 198.51.100.0/24\nshare:\n  address: 127.0.0.1:%d\n  token_file: %s\n"+
		"  auto_blocks: true\nlimits:\n  - {kind: source, scope: udp/9, pps: 20, burst_packets: 20, block: 10m}\nlimit_settings:\n  gate: none\n",
		a.attackerIf(), port, token))
	a.start()
	b.writeConfig(fmt.Sprintf("interfaces:\n  - name: %s\ndeny:\n  - 203.0.113.5\nlists:\n  - url: http://127.0.0.1:%d/v1/share\n    refresh: 1s\n    token_file: %s\n",
		b.clientIf(), port, bToken))
	sink := a.listenUDP()

	a.mustMoat("block", client, "--ttl", "1h", "--comment", "seen scanning")
	a.mustMoat("block", "192.0.2.40", "--ttl", "1h", "--comment", "from A")
	b.start()
	blocked := "deny " + client + "/32 seen scanning"
	b.waitRules("A's block reaches B", func(r []string) bool { return contains(r, blocked) })
	if r := b.rulesNow(); contains(r, "deny 198.51.100.0/24") || !contains(r, "deny 203.0.113.5/32") {
		t.Fatalf("B holds A's config rule, or lost its own:\n%s", strings.Join(r, "\n"))
	}
	if b.sendFromClient(sink, 300*time.Millisecond) {
		t.Fatal("a datagram from the source A blocked passed B")
	}
	if f := b.feeds(); len(f) != 1 || f[0].Deny != 2 || f[0].Error != "" || f[0].LastSuccess.IsZero() {
		t.Fatalf("moat feeds: %+v", f)
	}
	// A source over a rate limit on A, auto-blocked there, is blocked
	// at B too, with A's reason.
	attacker := a.lab.Attacker.Ifaces[0]
	if err := a.lab.Attacker.Do(func() error {
		c, err := net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(attacker.PeerIPv4, 9)))
		if err != nil {
			return err
		}
		defer c.Close()
		for range 100 {
			c.Write([]byte("over the limit"))
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	autoBlocked := "deny " + attacker.IPv4.Addr().String() + "/32 auto-block on udp/9: over 20pps per source"
	b.waitRules("A's auto-block reaches B", func(r []string) bool { return contains(r, autoBlocked) })

	// The share serves the deny list alone, and only with the token.
	shareURL := fmt.Sprintf("http://127.0.0.1:%d/v1/share", port)
	for _, c := range []struct {
		query, token string
		code         int
	}{{"", "fleet-secret-1", 200}, {"?list=deny", "", 401}, {"?list=deny", "guess", 401}, {"?list=allow", "fleet-secret-1", 403}, {"?list=ports", "fleet-secret-1", 400}} {
		if got := a.httpGet(shareURL+c.query, c.token); got != c.code {
			t.Errorf("GET /v1/share%s with token %q: %d, want %d", c.query, c.token, got, c.code)
		}
	}

	// A run-time rule of B's over a prefix only the feed holds applies
	// while it lasts; unblocked, the feed's comes back. An unblock of a
	// feed's prefix names the feed.
	b.mustMoat("block", "192.0.2.40", "--comment", "B's own")
	if r := b.rulesNow(); !contains(r, "deny 192.0.2.40/32 B's own") {
		t.Fatalf("B's block over the feed's entry:\n%s", strings.Join(r, "\n"))
	}
	b.mustMoat("unblock", "192.0.2.40")
	if r := b.rulesNow(); !contains(r, "deny 192.0.2.40/32 from A") {
		t.Fatalf("after B's unblock, the feed's entry is not back:\n%s", strings.Join(r, "\n"))
	}
	if r := b.moat("unblock", "192.0.2.40"); r.code == 0 || !strings.Contains(r.stderr, "comes from the feed http://127.0.0.1") {
		t.Fatalf("unblock of a feed's prefix: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if r := b.moat("block", "203.0.113.5"); r.code == 0 || !strings.Contains(r.stderr, "already in the denylist") {
		t.Fatalf("block of a config prefix: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}

	// A run-time rule of B's own outlives the feed's for the same
	// prefix while it lasts; when it expires, the feed's applies again.
	b.mustMoat("block", "192.0.2.50", "--ttl", "6s", "--comment", "B's own")
	a.mustMoat("block", "192.0.2.50", "--ttl", "1h", "--comment", "A's")
	b.waitRules("the feed carries 192.0.2.50", func([]string) bool { return b.feeds()[0].Deny == 4 })
	if r := b.rulesNow(); !contains(r, "deny 192.0.2.50/32 B's own") {
		t.Fatalf("B's own rule was replaced by the feed's:\n%s", strings.Join(r, "\n"))
	}
	b.waitRules("the feed's rule after B's expires", func(r []string) bool { return contains(r, "deny 192.0.2.50/32 A's") })

	// A wrong token: B's fetches fail, its copy stays applied.
	if err := os.WriteFile(bToken, []byte("wrong\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	b.waitRules("B's fetches fail", func([]string) bool {
		f := b.feeds()[0]
		return strings.Contains(f.Error, "401") && f.Failures > 0
	})
	if r := b.rulesNow(); !contains(r, blocked) || !contains(r, "deny 192.0.2.50/32 A's") {
		t.Fatalf("a refused fetch changed B's rules:\n%s", strings.Join(r, "\n"))
	}
	if err := os.WriteFile(bToken, []byte("fleet-secret-1\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	// An unblock on A frees the client at B.
	a.mustMoat("unblock", client)
	b.waitRules("A's unblock reaches B", func(r []string) bool { return !contains(r, blocked) })
	if !b.sendFromClient(sink, 2*time.Second) {
		t.Fatal("the client is still dropped at B after A's unblock")
	}

	// A restart of B while A is down applies the saved copy at once.
	a.mustMoat("block", client, "--ttl", "1h", "--comment", "seen scanning")
	b.waitRules("A's second block reaches B", func(r []string) bool { return contains(r, blocked) })
	a.stop(syscall.SIGTERM)
	b.stop(syscall.SIGTERM)
	b.start()
	if r := b.rulesNow(); !contains(r, blocked) {
		t.Fatalf("B restarted without the feed's saved copy:\n%s\n%s", strings.Join(r, "\n"), b.log)
	}
	if b.sendFromClient(sink, 300*time.Millisecond) {
		t.Fatal("after B's restart, the source A blocked passed")
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		f := b.feeds()
		if len(f) == 1 && f[0].FromCache && f[0].Failures > 0 && strings.Contains(f[0].Error, "refused") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("moat feeds with A down: %+v", f)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if r := b.rulesNow(); !contains(r, blocked) {
		t.Fatal("a failing fetch dropped the feed's rules")
	}
}

// serveInLab serves h on loopback inside the lab's server namespace,
// where the daemons run, and returns the base URL.
func serveInLab(t *testing.T, e *env, h http.Handler) string {
	t.Helper()
	ln := e.listenLoopback()
	srv := &http.Server{Handler: h}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return "http://" + ln.Addr().String()
}

// TestFeedRefusedAndReloaded: a feed's bad copy changes nothing, a good
// one replaces it as a diff, and a reload that drops the feed removes its
// entries and its saved copy.
func TestFeedRefusedAndReloaded(t *testing.T) {
	e := newEnv(t)
	ls := newListServer(t, e, "192.0.2.0/24\n198.51.100.9\n")
	withFeed := fmt.Sprintf("interfaces:\n  - name: %s\ndeny:\n  - 203.0.113.5\nlists:\n  - url: %s\n    refresh: 1s\n", e.attackerIf(), ls.URL)
	// check-config names the feed; a CA file without certificates is
	// refused there, as the daemon would refuse it.
	badCA := filepath.Join(e.dir, "ca.pem")
	if err := os.WriteFile(badCA, []byte("not a certificate\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	e.writeConfig(strings.Replace(withFeed, "http://", "https://", 1) + "    ca_file: " + badCA + "\n")
	if r := e.moat("check-config", e.cfg); r.code != 2 || !strings.Contains(r.stderr, "holds no PEM certificate") {
		t.Fatalf("check-config with a bad CA file: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	e.writeConfig(withFeed)
	if r := e.mustMoat("check-config", "--file-only", e.cfg); !strings.Contains(r.stdout, "1 feed (the daemon fetches them)") {
		t.Fatalf("check-config: %q", r.stdout)
	}
	if r := e.moat("feeds"); r.code == 0 || !strings.Contains(r.stderr, "no moat daemon manages") {
		t.Fatalf("moat feeds without a daemon: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	e.start()
	e.waitRules("the feed's entries", func(r []string) bool {
		return contains(r, "deny 192.0.2.0/24") && contains(r, "deny 198.51.100.9/32")
	})

	ls.set("192.0.2.0/24\n198.51.100.300\n")
	e.waitRules("a failing feed", func([]string) bool { return strings.Contains(e.feeds()[0].Error, ":2: ") })
	if r := e.rulesNow(); !contains(r, "deny 198.51.100.9/32") || !contains(r, "deny 203.0.113.5/32") {
		t.Fatalf("a bad copy changed the rules:\n%s", strings.Join(r, "\n"))
	}

	ls.set("192.0.2.0/24\n2001:db8::/48\n")
	e.waitRules("the new copy", func(r []string) bool {
		return contains(r, "deny 2001:db8::/48") && !contains(r, "deny 198.51.100.9/32") && contains(r, "deny 192.0.2.0/24")
	})
	if f := e.feeds()[0]; f.Error != "" || f.Deny != 2 {
		t.Fatalf("after a good copy: %+v", f)
	}
	if out := e.mustMoat("feeds").stdout; !strings.Contains(out, ls.URL) || !strings.Contains(out, " ok") {
		t.Fatalf("moat feeds:\n%s", out)
	}
	saved, _ := filepath.Glob(filepath.Join(e.dir, "feeds", "feed-*"))
	if len(saved) != 2 {
		t.Fatalf("saved copy and its validators: %v", saved)
	}

	// A reload that changes the feed's refresh keeps the copy in hand,
	// even when the disk has none and the server fails.
	ls.fail()
	for _, f := range saved {
		os.Remove(f)
	}
	e.writeConfig(strings.Replace(withFeed, "refresh: 1s", "refresh: 2s", 1))
	e.mustMoat("reload")
	e.waitRules("a failing fetch after the reload", func([]string) bool { return strings.Contains(e.feeds()[0].Error, "503") })
	if out := e.mustMoat("feeds").stdout; !strings.Contains(out, "failing: server answered 503") {
		t.Fatalf("moat feeds of a failing feed:\n%s", out)
	}
	if r := e.rulesNow(); !contains(r, "deny 2001:db8::/48") || !contains(r, "deny 192.0.2.0/24") {
		t.Fatalf("a reload that changed the refresh lost the feed's copy:\n%s", strings.Join(r, "\n"))
	}
	if f := e.feeds()[0]; f.Refresh != "2s" || f.Deny != 2 {
		t.Fatalf("after the reload: %+v", f)
	}

	e.writeConfig(fmt.Sprintf("interfaces:\n  - name: %s\ndeny:\n  - 203.0.113.5\n", e.attackerIf()))
	e.mustMoat("reload")
	if r := e.rulesNow(); contains(r, "deny 192.0.2.0/24") || contains(r, "deny 2001:db8::/48") || !contains(r, "deny 203.0.113.5/32") {
		t.Fatalf("after the feed left the config:\n%s", strings.Join(r, "\n"))
	}
	if saved, _ := filepath.Glob(filepath.Join(e.dir, "feeds", "feed-*")); len(saved) != 0 {
		t.Fatalf("a dropped feed's copy is left: %v", saved)
	}
	if out := e.mustMoat("feeds").stdout; !strings.Contains(out, "no feeds") {
		t.Fatalf("moat feeds: %q", out)
	}
}

// listServer serves a plain list in the lab whose body a test changes;
// fail makes it answer 503.
type listServer struct {
	URL    string
	mu     sync.Mutex
	body   string
	failed bool
}

func newListServer(t *testing.T, e *env, body string) *listServer {
	ls := &listServer{body: body}
	ls.URL = serveInLab(t, e, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ls.mu.Lock()
		defer ls.mu.Unlock()
		if ls.failed {
			http.Error(w, "down", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprint(w, ls.body)
	})) + "/list.txt"
	return ls
}

func (ls *listServer) set(body string) { ls.mu.Lock(); ls.body = body; ls.mu.Unlock() }
func (ls *listServer) fail()           { ls.mu.Lock(); ls.failed = true; ls.mu.Unlock() }

// A reload that fails part way keeps the old config, and with it the
// run-time rules the new config would have held: a feed's change after it
// must not delete one, nor may a block after it forget one.
func TestFeedAfterAPartialReload(t *testing.T) {
	e := newEnv(t)
	ls := newListServer(t, e, "192.0.2.1\n")
	feedPart := fmt.Sprintf("lists:\n  - url: %s\n    refresh: 1s\n", ls.URL)
	e.writeConfig(fmt.Sprintf("interfaces:\n  - name: %s\n  - name: %s\n", e.attackerIf(), e.clientIf()) + feedPart)
	e.start()
	e.waitRules("the feed", func(r []string) bool { return contains(r, "deny 192.0.2.1/32") })
	e.mustMoat("block", "198.51.100.7", "--ttl", "1h", "--comment", "run time")
	// The client interface's pins vanish behind the daemon's back: the
	// reload that detaches it fails after the rules are written.
	if err := os.RemoveAll(filepath.Join(e.root, "ifaces", e.clientIf())); err != nil {
		t.Fatal(err)
	}
	e.writeConfig(fmt.Sprintf("interfaces:\n  - name: %s\ndeny:\n  - 198.51.100.7\n", e.attackerIf()) + feedPart)
	if r := e.moat("reload"); r.code == 0 {
		t.Fatalf("the reload did not fail: %s", r.stdout)
	}
	ls.set("192.0.2.1\n192.0.2.2\n")
	e.waitRules("the feed's change", func(r []string) bool { return contains(r, "deny 192.0.2.2/32") })
	if r := e.rulesNow(); !contains(r, "deny 198.51.100.7/32 run time") {
		t.Fatalf("the run-time rule is gone after the feed's change:\n%s", strings.Join(r, "\n"))
	}
	e.mustMoat("block", "198.51.100.8")
	if st, err := os.ReadFile(e.stateFile); err != nil || !strings.Contains(string(st), "198.51.100.7") {
		t.Fatalf("the state file lost the run-time rule (%v):\n%s", err, st)
	}
}

// A run-time rule over a feed's entry that expired, but that the expiry
// run has not removed yet, does not stand in the way of a new block.
func TestBlockAgainOverAFeedAfterExpiry(t *testing.T) {
	e := newEnv(t)
	e.expireEvery = "1h" // the state keeps the expired rule
	ls := newListServer(t, e, "192.0.2.60\n")
	e.writeConfig(fmt.Sprintf("interfaces:\n  - name: %s\nlists:\n  - url: %s\n    refresh: 1s\n", e.attackerIf(), ls.URL))
	e.start()
	e.waitRules("the feed", func(r []string) bool { return contains(r, "deny 192.0.2.60/32") })
	e.mustMoat("block", "192.0.2.60", "--ttl", "1s", "--comment", "short")
	time.Sleep(1500 * time.Millisecond)
	ls.set("192.0.2.60\n192.0.2.70\n") // the change writes the feed's entry back
	e.waitRules("the feed's change", func(r []string) bool { return contains(r, "deny 192.0.2.60/32") && contains(r, "deny 192.0.2.70/32") })
	e.mustMoat("block", "192.0.2.60", "--ttl", "1h", "--comment", "again")
	if r := e.rulesNow(); !contains(r, "deny 192.0.2.60/32 again") {
		t.Fatalf("the new block is not in place:\n%s", strings.Join(r, "\n"))
	}
}

// timedList is a feed's JSON deny list: each entry a prefix and its
// expiry ("" none), commented "feed one".
func timedList(entries ...[2]string) string {
	var parts []string
	for _, x := range entries {
		e := fmt.Sprintf(`{"prefix":%q,"comment":"feed one"`, x[0])
		if x[1] != "" {
			e += fmt.Sprintf(`,"expires":%q`, x[1])
		}
		parts = append(parts, e+"}")
	}
	return `{"deny":[` + strings.Join(parts, ",") + "]}\n"
}

// TestFeedEntriesExpire: a feed's entries whose time has passed leave the
// maps and the feed's counts, through moat expire and through the
// daemon's timer, though the server serves the same bytes for ever. A
// prefix the config or another feed also holds keeps that entry.
func TestFeedEntriesExpire(t *testing.T) {
	e := newEnv(t)
	e.expireEvery = "1h" // moat expire first; the timer after a reload
	timed := newListServer(t, e, timedList([2]string{"198.18.9.20", ""}))
	plain := newListServer(t, e, "198.18.9.14\n")
	body := "interfaces:\n  - name: %s\ndeny:\n  - prefix: 198.18.9.13\n    comment: config\nlists:\n  - url: %s\n    refresh: 1s\n  - url: %s\n    refresh: 1s\n"
	e.writeConfig(fmt.Sprintf(body, e.attackerIf(), timed.URL, plain.URL))
	e.start()
	// Set once the daemon runs: an entry expired when fetched is left
	// out at once.
	expires := time.Now().Add(5 * time.Second).UTC().Truncate(time.Second)
	at := expires.Format(time.RFC3339)
	timed.set(timedList([2]string{"198.18.9.12", at}, [2]string{"198.18.9.13", at}, [2]string{"198.18.9.14", at}, [2]string{"198.18.9.20", ""}))
	e.waitRules("the timed entries", func(r []string) bool {
		return contains(r, "deny 198.18.9.12/32 feed one") && contains(r, "deny 198.18.9.14/32 feed one")
	})
	time.Sleep(time.Until(expires) + 200*time.Millisecond)
	if f := e.feeds(); f[0].Deny != 4 || f[1].Deny != 1 {
		t.Fatalf("feeds before moat expire: %+v", f)
	}

	if r := e.mustMoat("expire"); !strings.Contains(r.stdout, "removed 3 expired entries") {
		t.Errorf("moat expire after the feed's entries expired said %q\ndaemon log:\n%s", r.stdout, e.log)
	}
	r := e.rulesNow()
	for _, want := range []string{"deny 198.18.9.13/32 config", "deny 198.18.9.14/32", "deny 198.18.9.20/32 feed one"} {
		if !contains(r, want) {
			t.Errorf("after moat expire, rules lack %q:\n%s", want, strings.Join(r, "\n"))
		}
	}
	if slices.ContainsFunc(r, func(l string) bool { return strings.HasPrefix(l, "deny 198.18.9.12/32") }) {
		t.Errorf("after moat expire, the expired feed entry is still listed:\n%s", strings.Join(r, "\n"))
	}
	if f := e.feeds(); f[0].Deny != 1 || f[1].Deny != 1 {
		t.Errorf("feeds after moat expire: %+v, want 1 entry each", f)
	}

	e.expireEvery = "1s"
	e.writeConfig(fmt.Sprintf(body, e.attackerIf(), timed.URL, plain.URL))
	e.mustMoat("reload")
	at = time.Now().Add(4 * time.Second).UTC().Format(time.RFC3339)
	timed.set(timedList([2]string{"198.18.9.15", at}, [2]string{"198.18.9.20", ""}))
	e.waitRules("the second timed entry", func(r []string) bool { return contains(r, "deny 198.18.9.15/32 feed one") })
	e.waitRules("the timer expires it", func(r []string) bool {
		return !contains(r, "deny 198.18.9.15/32 feed one") && contains(r, "deny 198.18.9.20/32 feed one")
	})
	if f := e.feeds(); f[0].Deny != 1 {
		t.Errorf("feeds after the timer: %+v, want 1 entry in the first", f)
	}
}
