package config

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"golang.org/x/sys/unix"
	"math/big"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/moat-shield/moat/internal/rules"
	"github.com/moat-shield/moat/internal/syncookie"
)

// parseErrors parses text and returns its errors as "LINE: message".
func parseErrors(t *testing.T, text string) []string {
	t.Helper()
	_, _, err := Parse(filepath.Join(t.TempDir(), "moat.yaml"), []byte(text))
	if err == nil {
		return nil
	}
	var ce *Errors
	if !errors.As(err, &ce) {
		t.Fatalf("error is %T, want *Errors: %v", err, err)
	}
	var out []string
	for _, e := range ce.List {
		out = append(out, e.Error())
	}
	return out
}

// Each error class, alone in an otherwise valid config, is reported once
// at the line of the value that causes it.
func TestErrorClassesWithLines(t *testing.T) {
	tests := []struct {
		name, text string
		line       int
		msg        string
	}{
		{"syntax", "interfaces:\n  - name: eth0\n    mode: a: b\n", 3, "syntax error: mapping values are not allowed"},
		{"tab", "deny: []\nports:\n\t- rule: udp/19\n", 3, "syntax error: found character that cannot start any token"},
		{"unknown top-level key", "interfaces: []\ndenny:\n  - 10.0.0.1\n", 2, `unknown key "denny"`},
		{"unknown nested key", "syn:\n  rotate_every: 60s\n  rotate: 30s\n", 3, `syn: unknown key "rotate"`},
		{"unknown key in entry", "deny:\n  - prefix: 10.0.0.0/8\n    coment: typo\n", 3, `unknown key "coment"`},
		{"key twice", "policy:\n  fragments: pass\n  fragments: drop\n", 3, "given twice"},
		{"bad prefix", "deny:\n  - 10.0.0.0/8\n  - 10.0.0.300\n", 3, `invalid address or CIDR "10.0.0.300"`},
		{"host bits", "allow:\n  - 10.1.2.3/8\n", 2, "host bits set"},
		{"duplicate prefix", "deny:\n  - 10.0.0.1\n  - 10.0.0.1/32\n", 3, "listed twice (first at line 2)"},
		{"allow and deny", "allow:\n  - 10.0.0.1\ndeny:\n  - 10.0.0.1\n", 4, "also in the allow list (line 2)"},
		{"long comment", "deny:\n  - prefix: 10.0.0.1\n    comment: " + strings.Repeat("x", 70) + "\n", 2, "at most 63"},
		{"bad port rule", "ports:\n  - rule: udp/70000\n    action: drop\n", 2, "above 65535"},
		{"bad action", "ports:\n  - rule: udp/19\n    action: reject\n", 2, `invalid action "reject"`},
		{"overlapping ports", "ports:\n  - rule: tcp/1000-2000\n    action: drop\n  - rule: tcp/1500\n    action: allow\n", 4, "overlaps tcp/1000-2000 (line 2)"},
		{"wrong kind", "interfaces:\n  name: eth0\n", 2, "want a list"},
		{"not a number", "syn:\n  ports:\n    - port: https\n", 3, "want a whole number"},
		{"port out of range", "syn:\n  ports:\n    - port: 70000\n", 3, `up to 65535, not "70000"`},
		{"bad duration", "syn:\n  rotate_every: 60\n", 2, "want a duration"},
		{"short rotation", "syn:\n  rotate_every: 10ms\n", 2, "syn.rotate_every: 10ms is out of range"},
		{"short hold", "syn:\n  hold: 50ms\n", 2, "syn.hold: 50ms is shorter than 1s"},
		{"negative hold", "syn:\n  hold: -1s\n", 2, "syn.hold: a duration cannot be negative"},
		{"bad syn mode", "syn:\n  ports:\n    - port: 443\n      mode: sometimes\n", 4, `invalid mode "sometimes"`},
		{"duplicate syn port", "syn:\n  ports:\n    - port: 443\n    - port: 443\n", 4, "tcp/443 is listed twice"},
		{"bad iface mode", "interfaces:\n  - name: eth0\n    mode: turbo\n", 3, `invalid mode "turbo"`},
		{"bad iface name", "interfaces:\n  - name: this-name-is-far-too-long\n", 2, "not a valid interface name"},
		{"duplicate iface", "interfaces:\n  - name: eth0\n  - name: eth0\n", 3, "listed twice"},
		{"bad policy", "policy:\n  fragments: maybe\n", 2, `invalid policy "maybe"`},
		{"bad monitor", "policy:\n  monitor: on\n", 2, "want true or false"},
		{"bad metrics address", "metrics:\n  address: localhost\n", 2, "not HOST:PORT"},
		{"snaplen above the data path's", "capture:\n  max_snaplen: 262144\n", 2, "capture.max_snaplen: 262144 is above 9216"},
		{"bad bool", "metrics:\n  enabled: yes please\n", 2, "want true or false"},
		{"relative state file", "daemon:\n  state_file: state.json\n", 2, "absolute path"},
		{"root outside bpffs", "daemon:\n  bpffs_root: /tmp/moat\n", 2, "under /sys/fs/bpf"},
		{"bad log level", "daemon:\n  log_level: chatty\n", 2, `invalid level "chatty"`},
		{"missing list file", "lists:\n  - file: /nonexistent/moat-list\n", 2, "no such file"},
		{"limit without rate", "limits:\n  - kind: source\n    scope: udp/53\n", 2, "give a rate"},
		{"limit burst 0", "limits:\n  - kind: source\n    scope: udp/53\n    pps: 10\n    burst_packets: 0\n", 5, "limits[1].burst_packets: must be at least 1"},
		{"limit byte burst 0", "limits:\n  - kind: budget\n    scope: udp\n    bps: 8000\n    burst_bytes: 0\n", 5, "limits[1].burst_bytes: must be at least 1"},
		{"limit bad scope", "limits:\n  - kind: budget\n    scope: sctp\n    pps: 10\n", 2, "limits[1]: "},
		{"limit bad kind", "limits:\n  - kind: global\n    scope: udp\n    pps: 10\n", 2, `invalid limit kind "global"`},
		{"limit twice", "limits:\n  - {kind: source, scope: udp/53, pps: 10}\n  - {kind: source, scope: udp/53, pps: 20}\n", 3, "given twice (first at line 2)"},
		{"limits overlap", "limits:\n  - {kind: source, scope: udp/53, pps: 10}\n  - {kind: source, scope: udp/50-60, pps: 20}\n", 3, "source limits on udp/50-60 and udp/53 (line 2) overlap"},
		{"unknown limit key", "limits:\n  - kind: source\n    scope: udp/53\n    pps: 10\n    rate: 10\n", 5, `unknown key "rate"`},
		{"limit sample not a power of two", "limit_settings:\n  sample: 100\n", 2, "limit_settings.sample: 100: want a power of two"},
		{"limit gate", "limit_settings:\n  gate: sometimes\n", 2, `limit_settings.gate: invalid gate "sometimes"`},
		{"unknown limit setting", "limit_settings:\n  gates: none\n", 2, `unknown key "gates"`},
		{"two documents", "interfaces: []\n---\ndeny: []\n", 2, "one YAML document"},
		{"feed and file", "lists:\n  - file: /etc/hosts\n    url: https://rules.example/deny.txt\n", 2, "give file or url, not both"},
		{"feed not http", "lists:\n  - url: ftp://rules.example/deny.txt\n", 2, "want an http:// or https:// URL"},
		{"feed with a password", "lists:\n  - url: https://me:pw@rules.example/deny.txt\n", 2, "put a token in token_file"},
		{"feed refresh too short", "lists:\n  - url: https://rules.example/deny.txt\n    refresh: 100ms\n", 2, "refresh 100ms is too short; at least 1s"},
		{"feed relative token", "lists:\n  - url: https://rules.example/deny.txt\n    token_file: token\n", 2, `token_file "token" must be an absolute path`},
		{"feed relative CA", "lists:\n  - url: https://rules.example/deny.txt\n    ca_file: ca.pem\n", 2, `ca_file "ca.pem" must be an absolute path`},
		{"feed CA over http", "lists:\n  - url: http://rules.example/deny.txt\n    ca_file: /etc/hostname\n", 2, "ca_file is for an https url"},
		{"feed twice", "lists:\n  - url: https://rules.example/deny.txt\n  - url: https://rules.example/deny.txt\n", 3, "listed twice (first at line 2)"},
		// The feed metrics name a feed by its URL alone; one body fills
		// one list (a JSON body with both lists is refused by both).
		{"feed in both lists", "lists:\n  - url: https://rules.example/deny.txt\n  - url: https://rules.example/deny.txt\n    list: allow\n", 3, "listed twice (first at line 2)"},
		{"feed bad list", "lists:\n  - url: https://rules.example/deny.txt\n    list: block\n", 2, `invalid list "block"`},
		{"share bad address", "share:\n  address: 9478\n", 2, "share.address: \"9478\" is not HOST:PORT"},
		{"share beyond loopback without a token", "share:\n  address: 0.0.0.0:9478\n", 2, "reachable beyond this host: set share.token_file"},
		{"share switches without address", "share:\n  auto_blocks: true\n", 2, "share.address is missing"},
		{"share cert alone", "share:\n  address: 127.0.0.1:9478\n  cert_file: /etc/moat/share.crt\n", 2, "cert_file and key_file go together"},
		{"share token without address", "share:\n  token_file: /etc/moat/share.token\n", 2, "share.address is missing"},
		{"relative feed dir", "daemon:\n  feed_dir: feeds\n", 2, "daemon.feed_dir: \"feeds\" must be an absolute path"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := parseErrors(t, tc.text)
			if len(got) != 1 {
				t.Fatalf("got %d errors, want 1:\n%s", len(got), strings.Join(got, "\n"))
			}
			want := regexp.MustCompile(`^line ` + strconv.Itoa(tc.line) + `: .*` + regexp.QuoteMeta(tc.msg))
			if !want.MatchString(got[0]) {
				t.Errorf("error %q, want line %d and %q", got[0], tc.line, tc.msg)
			}
		})
	}
}

// All errors of a file are reported in one pass, in line order.
func TestEveryErrorReported(t *testing.T) {
	text := `interfaces:
  - name: eth0
    mode: warp
deny:
  - 10.0.0.0/33
  - 192.0.2.1
ports:
  - rule: sctp/9
    action: drop
bogus: 1
syn:
  rotate_every: soon
`
	got := parseErrors(t, text)
	wantLines := []string{"line 3:", "line 5:", "line 8:", "line 10:", "line 12:"}
	if len(got) != len(wantLines) {
		t.Fatalf("got %d errors, want %d:\n%s", len(got), len(wantLines), strings.Join(got, "\n"))
	}
	for i, w := range wantLines {
		if !strings.HasPrefix(got[i], w) {
			t.Errorf("error %d is %q, want it at %s", i+1, got[i], w)
		}
	}
}

// The error's text names the file and the line, as check-config prints it.
func TestErrorsName(t *testing.T) {
	_, _, err := Parse("/etc/moat/moat.yaml", []byte("deny:\n  - nonsense\n"))
	if err == nil || !strings.Contains(err.Error(), "/etc/moat/moat.yaml:2: deny[1]: ") {
		t.Fatalf("error %v, want it to name /etc/moat/moat.yaml:2 and deny[1]", err)
	}
}

// A full config reads into the rules and settings it describes, with the
// rule files merged (entries repeated across files kept once).
func TestRulesFromConfigAndFiles(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "block.netset"), []byte("# FireHOL style\n203.0.113.0/24\n198.51.100.7 ; scanner\n192.0.2.1\n"), 0o600)
	os.WriteFile(filepath.Join(dir, "friends.txt"), []byte("2001:db8:100::/48\n"), 0o600)
	text := `interfaces:
  - name: eth0
    mode: generic
allow:
  - 192.0.2.10
deny:
  - 192.0.2.1
  - prefix: 10.9.0.0/16
    comment: lab
lists:
  - file: block.netset
  - file: friends.txt
    list: allow
ports:
  - rule: udp/19
    action: drop
policy:
  fragments: drop
  monitor: true
syn:
  rotate_every: 30s
  ports:
    - port: 443
      mode: always
`
	cfg, set, err := Parse(filepath.Join(dir, "moat.yaml"), []byte(text))
	if err != nil {
		t.Fatal(err)
	}
	rs := set.Rules
	var deny []string
	for _, e := range rs.Deny {
		deny = append(deny, e.Prefix.String()+"|"+e.Comment)
	}
	wantDeny := "10.9.0.0/16|lab|192.0.2.1/32||198.51.100.7/32||203.0.113.0/24|" // sorted, each once
	if strings.Join(deny, "|") != wantDeny {
		t.Errorf("deny = %q, want %q", strings.Join(deny, "|"), wantDeny)
	}
	if len(rs.Allow) != 2 || rs.Allow[1].Prefix.String() != "2001:db8:100::/48" {
		t.Errorf("allow = %v", rs.Allow)
	}
	if set.FromFiles != 3 {
		t.Errorf("FromFiles = %d, want 3 (192.0.2.1 is inline already)", set.FromFiles)
	}
	if len(rs.Ports) != 1 || rs.Ports[0].Spec.String() != "udp/19" || rs.Ports[0].Action != rules.Drop {
		t.Errorf("ports = %v", rs.Ports)
	}
	if rs.Settings.Fragments != "drop" || rs.Settings.Malformed != "drop" || !rs.Settings.Monitor {
		t.Errorf("settings = %+v", rs.Settings)
	}
	if cfg.SYN.RotateEvery != 30*time.Second || cfg.SYN.Ports[0].Threshold != 2000 || cfg.SYN.Ports[0].Mode != "always" {
		t.Errorf("syn = %+v", cfg.SYN)
	}
	if cfg.Interfaces[0].AttachMode() != "generic" || cfg.Daemon.StateFile != DefaultStateFile || cfg.Metrics.Address != DefaultMetricsAddr {
		t.Errorf("defaults: %+v %+v", cfg.Interfaces, cfg.Daemon)
	}
}

// A bad line in a rule file is reported at the config line that names
// the file, with the file's own line.
func TestListFileErrorNamesBothLines(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "bad.netset"), []byte("10.0.0.0/8\n10.0.0.999\n"), 0o600)
	got := parseErrors(t, "deny: []\nlists:\n  - file: "+filepath.Join(dir, "bad.netset")+"\n")
	if len(got) != 1 || !strings.HasPrefix(got[0], "line 3: ") || !strings.Contains(got[0], "bad.netset:2:") {
		t.Fatalf("errors %q, want one at line 3 naming bad.netset:2", got)
	}
}

// The example configs shipped with moat pass: dist/moat.yaml and the one
// in the README's daemon section.
func TestExamplesPass(t *testing.T) {
	data, err := os.ReadFile("../../dist/moat.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := Parse("dist/moat.yaml", data); err != nil {
		t.Errorf("dist/moat.yaml: %v", err)
	}
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	block := regexp.MustCompile("(?s)<!-- moat.yaml example -->\\s*```yaml\n(.*?)```").FindSubmatch(readme)
	if block == nil {
		t.Fatal("README.md has no ```yaml block after <!-- moat.yaml example -->")
	}
	if _, _, err := Parse("README.md example", block[1]); err != nil {
		t.Errorf("README example: %v", err)
	}
	// The feed example names files of the fleet's hosts, not this one's.
	feeds := regexp.MustCompile("(?s)```yaml\n(# on every edge host\n.*?)```").FindSubmatch(readme)
	if feeds == nil {
		t.Fatal("README.md has no ```yaml block starting with # on every edge host")
	}
	if _, _, err := Parse("README.md feed example", feeds[1]); err != nil {
		t.Errorf("README feed example: %v", err)
	}
}

func TestTooManySYNPorts(t *testing.T) {
	var b strings.Builder
	b.WriteString("syn:\n  ports:\n")
	for p := 1; p <= syncookie.MaxProtectedPorts+1; p++ {
		fmt.Fprintf(&b, "    - port: %d\n      mode: auto\n", p)
	}
	errs := parseErrors(t, b.String())
	if len(errs) != 1 || !strings.Contains(errs[0], fmt.Sprintf("at most %d can be protected", syncookie.MaxProtectedPorts)) {
		t.Fatalf("errors %q, want one saying how many ports can be protected", errs)
	}
	b.Reset()
	b.WriteString("syn:\n  ports:\n")
	for p := 1; p <= syncookie.MaxProtectedPorts; p++ {
		fmt.Fprintf(&b, "    - port: %d\n      mode: auto\n", p)
	}
	if errs := parseErrors(t, b.String()); len(errs) != 0 {
		t.Fatalf("the most ports allowed: %q", errs)
	}
}

// A metrics address is checked as the daemon will listen on it: a port up
// to 65535 (or a service name), a host that is empty, an IP address or a
// host name.
func TestMetricsAddress(t *testing.T) {
	for _, addr := range []string{"127.0.0.1:99999", "999.1.1.1:80", "[::1]:65536", "127.0.0.1:-1", "bad_host:80", "-x.example:80", "127.0.0.1:nosuchservice", "1.2.3:80"} {
		got := parseErrors(t, "metrics:\n  address: \""+addr+"\"\n")
		if len(got) != 1 || !strings.HasPrefix(got[0], "line 2: metrics.address: ") {
			t.Errorf("metrics.address %q: errors %q, want one at line 2", addr, got)
		}
	}
	for _, addr := range []string{"127.0.0.1:9477", ":9477", "[::1]:0", "localhost:9477", "metrics.example.org:65535", "0.0.0.0:http"} {
		if got := parseErrors(t, "metrics:\n  address: \""+addr+"\"\n"); len(got) != 0 {
			t.Errorf("metrics.address %q: %q", addr, got)
		}
	}
	// Turned off, the address is not used.
	if got := parseErrors(t, "metrics:\n  enabled: false\n  address: \"127.0.0.1:99999\"\n"); len(got) != 0 {
		t.Errorf("metrics off: %q", got)
	}
}

// The rotation period is bounded both ways (syncookie.CheckRotation).
func TestRotationBounds(t *testing.T) {
	for _, d := range []string{"500ms", "25h", "1500000h"} {
		got := parseErrors(t, "syn:\n  rotate_every: "+d+"\n")
		if len(got) != 1 || !strings.HasPrefix(got[0], "line 2: syn.rotate_every: ") || !strings.Contains(got[0], "out of range") {
			t.Errorf("rotate_every %s: errors %q, want one at line 2", d, got)
		}
	}
	for _, d := range []string{"1s", "24h"} {
		if got := parseErrors(t, "syn:\n  rotate_every: "+d+"\n"); len(got) != 0 {
			t.Errorf("rotate_every %s: %q", d, got)
		}
	}
}

// A SYN port's threshold is auto mode's, and at least 1, as `moat syn
// protect --threshold` has it; left out, it is the default.
func TestSYNThreshold(t *testing.T) {
	for _, tc := range []struct{ text, msg string }{
		{"syn:\n  ports:\n    - port: 443\n      threshold: 0\n", "at least 1"},
		{"syn:\n  ports:\n    - port: 443\n      mode: never\n      threshold: 100\n", "never mode has none"},
		{"syn:\n  ports:\n    - port: 443\n      mode: always\n      threshold: 100\n", "always mode has none"},
	} {
		got := parseErrors(t, tc.text)
		if len(got) != 1 || !strings.HasPrefix(got[0], "line 4: syn.ports[1].threshold: ") && !strings.HasPrefix(got[0], "line 5: syn.ports[1].threshold: ") || !strings.Contains(got[0], tc.msg) {
			t.Errorf("%q: errors %q, want one saying %q", tc.text, got, tc.msg)
		}
	}
	cfg, _, err := Parse(filepath.Join(t.TempDir(), "moat.yaml"), []byte("syn:\n  ports:\n    - port: 443\n      threshold: 100\n    - port: 80\n    - port: 22\n      mode: never\n"))
	if err != nil {
		t.Fatal(err)
	}
	if p := cfg.SYN.Ports; p[0].Threshold != 100 || p[1].Threshold != syncookie.DefaultThreshold || p[2].Threshold != syncookie.DefaultThreshold {
		t.Errorf("thresholds %d, %d, %d; want 100 and the default twice", p[0].Threshold, p[1].Threshold, p[2].Threshold)
	}
}

// A rule file the config cannot take as it is, an export of another host
// with expiries or policy settings, or something other than a regular
// file, is refused at the line that names it.
func TestListFilesTheConfigRefuses(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) string { return writeIn(t, dir, name, text) }
	fifo := filepath.Join(dir, "fifo.netset")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ name, file, want string }{
		{"expiries", write("timed.json", `{"deny": [{"prefix": "192.0.2.200/32", "expires": "2020-01-01T00:00:00Z"}, {"prefix": "192.0.2.201/32"}]}`), "holds 1 entries with an expiry; config rules do not expire"},
		{"settings", write("policy.json", `{"deny": [{"prefix": "192.0.2.0/24"}], "settings": {"fragments": "drop", "malformed": "drop"}}`), "holds policy settings; put them in the policy section"},
		{"fifo", fifo, "is not a regular file"},
		{"feed keys", write("plain.txt", "192.0.2.1\n") + "\n    refresh: 1m", "refresh, ca_file and token_file are for lists fetched from a url"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := parseErrors(t, "lists:\n  - file: "+c.file+"\n")
			if len(got) != 1 || !strings.HasPrefix(got[0], "line 2: ") || !strings.Contains(got[0], c.want) {
				t.Fatalf("errors %q, want one at line 2 containing %q", got, c.want)
			}
		})
	}
	// The same file without them is taken.
	if got := parseErrors(t, "lists:\n  - file: "+write("plain.json", `{"deny": [{"prefix": "192.0.2.0/24"}]}`)+"\n"); got != nil {
		t.Fatalf("a plain JSON rule file: %q", got)
	}
}

// A list fetched from a URL is a feed: the config names it with its
// defaults, and its entries are not the config's (the daemon adds them).
func TestFeedsFromTheConfig(t *testing.T) {
	dir := t.TempDir()
	token := filepath.Join(dir, "feed.token")
	if err := os.WriteFile(token, []byte("t\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, set, err := Parse(filepath.Join(dir, "moat.yaml"), []byte("lists:\n  - url: https://rules.example/deny.txt\n  - url: http://10.1.2.3:9478/v1/share\n    list: allow\n    refresh: 10s\n    token_file: "+token+"\n"))
	if err != nil {
		t.Fatal(err)
	}
	got := cfg.Feeds()
	if len(got) != 2 || got[0].URL != "https://rules.example/deny.txt" || got[0].List != "deny" || got[0].Refresh != time.Minute ||
		got[1].List != "allow" || got[1].Refresh != 10*time.Second || got[1].TokenFile != token {
		t.Fatalf("feeds: %+v", got)
	}
	if n := len(set.Rules.Allow) + len(set.Rules.Deny); n != 0 || set.FromFiles != 0 {
		t.Fatalf("the config's set holds %d entries from feeds", n)
	}
	if cfg.Daemon.FeedDir != DefaultFeedDir || cfg.Share.On() {
		t.Fatalf("defaults: feed_dir %q, share %+v", cfg.Daemon.FeedDir, cfg.Share)
	}
}

// selfSignedPEM is a CA certificate, PEM-encoded.
func selfSignedPEM(t *testing.T) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "moat test CA"},
		NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
}

// The files a feed names are looked for on this host by Load, which the
// daemon reads its config with, each error at the feed's line; Parse and
// LoadFileOnly, for a file meant for another host, leave them out.
func TestFeedFilesOnThisHost(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) string { return writeIn(t, dir, name, text) }
	goodCA := write("ca.pem", selfSignedPEM(t))
	token := write("feed.token", "t\n")
	badCA := write("bad.pem", "not a certificate\n")
	for i, c := range []struct{ name, keys, want string }{
		{"missing CA", "ca_file: /nonexistent/ca.pem", "lists[1]: ca_file: stat /nonexistent/ca.pem: no such file or directory"},
		{"CA not a regular file", "ca_file: " + dir, "lists[1]: ca_file: " + dir + " is not a regular file"},
		{"CA without certificates", "ca_file: " + badCA, "lists[1]: ca_file: " + badCA + " holds no PEM certificate"},
		{"missing token", "token_file: /nonexistent/feed.token", "lists[1]: token_file: stat /nonexistent/feed.token: no such file or directory"},
		{"token not a regular file", "token_file: " + dir, "lists[1]: token_file: " + dir + " is not a regular file"},
	} {
		t.Run(c.name, func(t *testing.T) {
			path := write(fmt.Sprintf("moat-%d.yaml", i), "deny:\n  - 192.0.2.1\nlists:\n  - url: https://rules.example/deny.txt\n    "+c.keys+"\n")
			_, _, err := Load(path)
			var ce *Errors
			if !errors.As(err, &ce) || len(ce.List) != 1 || ce.List[0].Error() != "line 4: "+c.want {
				t.Fatalf("Load: %v, want one error: line 4: %s", err, c.want)
			}
			if _, _, err := LoadFileOnly(path); err != nil {
				t.Errorf("LoadFileOnly: %v", err)
			}
		})
	}
	path := write("good.yaml", "lists:\n  - url: https://rules.example/deny.txt\n    ca_file: "+goodCA+"\n    token_file: "+token+"\n")
	if _, _, err := Load(path); err != nil {
		t.Fatalf("Load with a good CA and token: %v", err)
	}
}

// writeIn writes a file of the test's in dir and returns its path.
func writeIn(t *testing.T, dir, name, text string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// syn.stray_ack_resets: left out, the default; 0, none; a number, that
// many; more than a million, an error at its line.
func TestStrayACKResets(t *testing.T) {
	for _, tc := range []struct {
		text string
		want int // syncookie.Config.ResetsPerSec
	}{
		{"syn:\n  rotate_every: 60s\n", 0},
		{"syn:\n  stray_ack_resets: 0\n", -1},
		{"syn:\n  stray_ack_resets: 250\n", 250},
	} {
		cfg, _, err := Parse(filepath.Join(t.TempDir(), "moat.yaml"), []byte(tc.text))
		if err != nil {
			t.Fatal(err)
		}
		if got := cfg.SYN.Resets(); got != tc.want {
			t.Errorf("%q: resets %d, want %d", tc.text, got, tc.want)
		}
	}
	for _, text := range []string{"syn:\n  stray_ack_resets: 2000000\n", "syn:\n  stray_ack_resets: -5\n", "syn:\n  stray_ack_resets: many\n"} {
		if got := parseErrors(t, text); len(got) != 1 || !strings.HasPrefix(got[0], "line 2: ") {
			t.Errorf("%q: errors %q, want one at line 2", text, got)
		}
	}
}
