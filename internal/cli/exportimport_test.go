package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/moat-shield/moat/internal/datapath"
	"github.com/moat-shield/moat/internal/rules"
	"github.com/moat-shield/moat/internal/shield"
)

// moatHere runs the real binary in the test's own namespace; rule commands
// need no interface.
func moatHere(t *testing.T, root string, args ...string) result {
	t.Helper()
	r := runBinary(t, nil, root, args...)
	if r.code != 0 {
		t.Fatalf("moat %s: %v", strings.Join(args, " "), r)
	}
	return r
}

// runBinary runs the real binary on root with env added to this process's
// environment.
func runBinary(t *testing.T, env []string, root string, args ...string) result {
	t.Helper()
	return runBinaryIn(t, "", env, root, args...)
}

// runBinaryIn is runBinary in the working directory dir ("": this
// process's), where a relative root is taken from.
func runBinaryIn(t *testing.T, dir string, env []string, root string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), cmdTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, moatBin, append(append([]string{}, args...), "--root", root)...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Dir = dir
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("run moat: %v", err)
	}
	return result{code, out.String(), errb.String()}
}

// listed returns `moat list --json` without hit counts.
func listed(t *testing.T, root string) *rules.Ruleset {
	t.Helper()
	var rs rules.Ruleset
	if err := json.Unmarshal([]byte(moatHere(t, root, "list", "--json").stdout), &rs); err != nil {
		t.Fatal(err)
	}
	for i := range rs.Allow {
		rs.Allow[i].Hits = 0
	}
	for i := range rs.Deny {
		rs.Deny[i].Hits = 0
	}
	for i := range rs.Ports {
		rs.Ports[i].Hits = 0
	}
	return &rs
}

func prefixes(es []rules.PrefixEntry) string {
	var out []string
	for _, e := range es {
		out = append(out, e.Prefix.String())
	}
	return strings.Join(out, " ")
}

func TestExportImportRoundTrip(t *testing.T) {
	t.Parallel()
	src, dst := newRoot(t), newRoot(t)
	dir := t.TempDir()

	moatHere(t, src, "block", "192.0.2.0/24", "2001:db8:f00::/48", "198.51.100.7")
	moatHere(t, src, "block", "--ttl", "1h", "--comment", "until the flood ends", "203.0.113.9")
	moatHere(t, src, "allow", "--comment", "office", "198.18.1.0/24", "2001:db8:1::2")
	moatHere(t, src, "port", "drop", "udp/19", "tcp/6000-6063", "icmp/echo-request")
	moatHere(t, src, "port", "allow", "icmpv6/128")
	moatHere(t, src, "policy", "fragments", "drop", "malformed", "pass")

	// The destination holds rules that the import must replace.
	moatHere(t, dst, "block", "100.64.0.0/10", "192.0.2.0/24")
	moatHere(t, dst, "allow", "198.18.9.9")
	moatHere(t, dst, "port", "drop", "udp/53", "tcp/6010")

	exported := moatHere(t, src, "export").stdout
	file := filepath.Join(dir, "rules.json")
	if err := os.WriteFile(file, []byte(exported), 0o600); err != nil {
		t.Fatal(err)
	}
	moatHere(t, dst, "import", "--replace", file)

	want, got := listed(t, src), listed(t, dst)
	if !reflect.DeepEqual(want, got) {
		a, _ := json.MarshalIndent(want, "", " ")
		b, _ := json.MarshalIndent(got, "", " ")
		t.Fatalf("after import --replace:\n%s\nwant:\n%s", b, a)
	}
	if len(got.Deny) != 4 || len(got.Allow) != 2 || len(got.Ports) != 4 || got.Settings.Fragments != "drop" {
		t.Fatalf("round trip lost rules: %+v", got)
	}
	for _, e := range got.Deny {
		if e.Prefix.String() == "203.0.113.9/32" && (e.Expires == nil || e.Comment != "until the flood ends") {
			t.Fatalf("TTL entry lost its expiry or comment: %+v", e)
		}
	}

	// And into a root that does not exist yet.
	fresh := newRoot(t)
	moatHere(t, fresh, "import", "--replace", file)
	if got := listed(t, fresh); !reflect.DeepEqual(want, got) {
		t.Fatalf("import into a fresh root: %+v", got)
	}

	// Importing the same file again without --replace changes nothing.
	if r := moatHere(t, dst, "import", file); !strings.HasPrefix(r.stdout, "no change: 6 allow/deny entries already as imported, in ") {
		t.Errorf("second import output: %s", r.stdout)
	}
	if again := listed(t, dst); !reflect.DeepEqual(want, again) {
		t.Fatalf("second import changed the rules: %+v", again)
	}
}

func TestImportPlainNetset(t *testing.T) {
	t.Parallel()
	root := newRoot(t)
	dir := t.TempDir()
	netset := filepath.Join(dir, "firehol.netset")
	os.WriteFile(netset, []byte(`#
# firehol_level1 (excerpt, test addresses only)
#
192.0.2.0/24
198.51.100.7
; a comment in ipset style
2001:db8:f00::/48   # trailing comment
198.51.100.7
`), 0o600)

	moatHere(t, root, "allow", "198.18.1.2")
	moatHere(t, root, "block", "100.64.0.0/10")
	moatHere(t, root, "port", "drop", "udp/19")

	r := moatHere(t, root, "import", netset)
	if !strings.HasPrefix(r.stdout, "imported: 3 allow/deny entries added, 0 updated, 0 removed, 0 unchanged;") {
		t.Errorf("import output: %s", r.stdout)
	}
	rs := listed(t, root)
	if got := prefixes(rs.Deny); got != "100.64.0.0/10 192.0.2.0/24 198.51.100.7/32 2001:db8:f00::/48" {
		t.Fatalf("deny after merge import: %s", got)
	}

	// --replace makes the denylist equal to the file and leaves the
	// allowlist and the port rules alone: the file says nothing of them.
	moatHere(t, root, "import", "--replace", netset)
	rs = listed(t, root)
	if got := prefixes(rs.Deny); got != "192.0.2.0/24 198.51.100.7/32 2001:db8:f00::/48" {
		t.Fatalf("deny after import --replace: %s", got)
	}
	if got := prefixes(rs.Allow); got != "198.18.1.2/32" {
		t.Fatalf("allow after a plain deny import --replace: %q", got)
	}
	if len(rs.Ports) != 1 || rs.Ports[0].Spec.String() != "udp/19" {
		t.Fatalf("port rules after a plain deny import --replace: %+v", rs.Ports)
	}

	// The same file into the allowlist.
	moatHere(t, root, "import", "--list", "allow", "--replace", netset)
	rs = listed(t, root)
	if got := prefixes(rs.Allow); got != "192.0.2.0/24 198.51.100.7/32 2001:db8:f00::/48" {
		t.Fatalf("allow after import --list allow --replace: %s", got)
	}
	if len(rs.Deny) != 3 {
		t.Fatalf("deny changed by an allowlist import: %s", prefixes(rs.Deny))
	}

	// export --format plain reads back as the same list.
	plain := moatHere(t, root, "export", "--format", "plain").stdout
	parsed, err := rules.ReadRuleset("export", strings.NewReader(plain), "deny")
	if err != nil {
		t.Fatalf("plain export does not read back: %v\n%s", err, plain)
	}
	if prefixes(parsed.Deny) != prefixes(rs.Deny) {
		t.Fatalf("plain export %s, deny list %s", prefixes(parsed.Deny), prefixes(rs.Deny))
	}
}

// TestImportTooLarge: a file larger than rules.MaxFileSize is refused with
// one line before a byte of it is read, and nothing is pinned for it. (A
// stream, which has no size to look at, is cut off at the same size:
// rules' TestReadRulesetTooLarge.)
func TestImportTooLarge(t *testing.T) {
	t.Parallel()
	root := newRoot(t)
	file := filepath.Join(t.TempDir(), "huge.netset")
	f, err := os.Create(file)
	if err != nil {
		t.Fatal(err)
	}
	// Sparse: it takes no room on disk.
	err = f.Truncate(rules.MaxFileSize + 1)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	checkUsageError(t, runMain(root, "import", file), file+": too large")
	if st := pinnedState(t, root); st != "" {
		t.Fatalf("the refused import left state behind:\n%s", st)
	}
}

// TestImportLeavesOutExpired: entries whose time passed before the import
// (an old export restored late) are left out, and the import says so.
func TestImportLeavesOutExpired(t *testing.T) {
	t.Parallel()
	root := newRoot(t)
	file := filepath.Join(t.TempDir(), "rules.json")
	later := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	os.WriteFile(file, []byte(`{"allow": [], "ports": [], "deny": [
		{"prefix": "192.0.2.1/32", "expires": "2020-01-01T00:00:00Z"},
		{"prefix": "192.0.2.2/32", "expires": "`+later+`"},
		{"prefix": "192.0.2.3/32"}]}`), 0o600)
	r := moatHere(t, root, "import", file)
	if !strings.Contains(r.stderr, "note: 1 allow/deny entries expired before the import and are left out") ||
		!strings.HasPrefix(r.stdout, "imported: 2 allow/deny entries added") {
		t.Errorf("import said:\n%s%s", r.stdout, r.stderr)
	}
	if got := prefixes(listed(t, root).Deny); got != "192.0.2.2/32 192.0.2.3/32" {
		t.Errorf("deny after the import: %s", got)
	}
}

// TestExportPlainLeavesOutExpired: a plain list has no expiry, so an entry
// whose time is up (which the filter ignores) is left out rather than
// written as a rule that a re-import would make permanent; entries whose
// time is not up are written, and the note says they lost their expiry.
func TestExportPlainLeavesOutExpired(t *testing.T) {
	t.Parallel()
	root := newRoot(t)
	moatHere(t, root, "block", "--ttl", "1s", "192.0.2.7", "2001:db8:7::/48")
	moatHere(t, root, "block", "--ttl", "1h", "192.0.2.8")
	moatHere(t, root, "block", "--comment", "kept", "192.0.2.9")
	time.Sleep(1100 * time.Millisecond)
	r := moatHere(t, root, "export", "--format", "plain")
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "# moat denylist, 2 entries, exported ") ||
		lines[1] != "192.0.2.8/32" || lines[2] != "192.0.2.9/32 # kept" {
		t.Errorf("export --format plain:\n%s", r.stdout)
	}
	if r.stderr != "note: 2 expired entries left out\nnote: 1 entries written without their expiry (a plain list has none)\n" {
		t.Errorf("stderr %q", r.stderr)
	}
}

// TestExportPlainLeavesOutAutoBlocks: a plain list holds rules, and an
// auto-block is a rate limit's, lapsing at its expiry (or at the end of
// monitor mode's trial): written without that expiry, a re-import would
// block its source for good.
func TestExportPlainLeavesOutAutoBlocks(t *testing.T) {
	t.Parallel()
	root := newRoot(t)
	moatHere(t, root, "block", "192.0.2.9")
	s, err := shield.Open(root)
	if err != nil {
		t.Fatal(err)
	}
	for i, flags := range []uint32{2, 2 | 4} { // auto; auto in monitor mode
		v := datapath.MoatPrefixRule{Prefixlen: 32, Flags: flags, ExpiresNs: bootNanos(t) + 600e9}
		if err := s.Map(datapath.MoatMapDenyV4Hosts).Put(datapath.MoatHostV4{Addr: [4]byte{198, 51, 100, byte(i + 1)}}, v); err != nil {
			t.Fatal(err)
		}
	}
	s.Close()
	r := moatHere(t, root, "export", "--format", "plain")
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(lines) != 2 || lines[1] != "192.0.2.9/32" {
		t.Errorf("export --format plain:\n%s", r.stdout)
	}
	if r.stderr != "note: 2 auto-blocks left out\n" {
		t.Errorf("stderr %q", r.stderr)
	}
}
