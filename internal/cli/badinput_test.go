package cli_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/moat-shield/moat/internal/cli"
)

// seedRules fills root with one rule of every kind, so that a refused
// command has something it could wrongly change.
func seedRules(t testing.TB, root string) {
	t.Helper()
	mustRun(t, root, "block", "192.0.2.0/24", "198.51.100.7", "2001:db8:f00::/48")
	mustRun(t, root, "block", "--comment", "seeded with a comment", "--ttl", "1h", "203.0.113.9")
	mustRun(t, root, "allow", "198.18.1.0/24", "2001:db8:1::2")
	mustRun(t, root, "port", "drop", "udp/19", "tcp/6000-6063", "icmp/echo-request")
	mustRun(t, root, "port", "allow", "icmpv6/128")
	mustRun(t, root, "policy", "fragments", "drop")
}

// TestBadInput runs refused commands against a root holding rules and
// checks that each exits 2 with one line of error and changes nothing; in
// commands with several arguments the bad one is last, so a command that
// applied arguments one by one would be caught.
func TestBadInput(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	badPlain := write("bad.netset", "# list\n203.0.113.0/24\n100.64.0.0/10\n\n100.64.1.300\n172.16.0.0/12\n")
	badJSON := write("bad.json", "{\n  \"deny\": [\n    {\"prefix\": \"100.64.0.0/10\"}\n  ],\n  \"portz\": []\n}\n")
	overlapJSON := write("overlap.json", `{"ports": [{"rule": "tcp/6010-6020", "action": "allow"}]}`)
	twiceJSON := write("twice.json", "{\n  \"deny\": [{\"prefix\": \"100.64.0.0/10\"}],\n  \"deny\": [{\"prefix\": \"100.65.0.0/16\"}]\n}\n")
	badAddrJSON := write("badaddr.json", "{\"deny\": [\n  {\"prefix\": \"100.64.0.1\"},\n  {\"prefix\": \"10.5.0.300/32\"}\n]}\n")
	longComment := strings.Repeat("c", 64)
	goodJSON := write("good.json", `{"deny": [{"prefix": "100.64.0.0/10"}]}`)
	// More port rules than the map holds with the seeded ones: 1023 is
	// the limit.
	pastTheLimit := []string{"port", "drop"}
	for p := 30000; p <= 31030; p++ {
		pastTheLimit = append(pastTheLimit, "tcp/"+strconv.Itoa(p))
	}

	tests := []struct {
		name    string
		args    []string
		errPart string
	}{
		{"invalid CIDR", []string{"block", "100.64.0.0/33"}, "invalid CIDR"},
		{"host bits set", []string{"block", "100.64.1.2/10"}, "host bits set"},
		{"second prefix bad", []string{"block", "100.64.0.0/10", "100.64.1.2/10"}, "host bits set"},
		{"garbage prefix", []string{"allow", "100.64.0.0/10", "not-an-address"}, "invalid address"},
		{"zone", []string{"block", "fe80::1%lo"}, "zones"},
		{"mapped address", []string{"unblock", "::ffff:192.0.2.1"}, "IPv4-mapped"},
		{"prefix twice", []string{"block", "100.64.0.0/10", "100.64.0.0/10"}, "given twice"},
		{"comment too long", []string{"block", "--comment", longComment, "100.64.0.0/10"}, "at most 63"},
		{"port above 65535", []string{"port", "drop", "udp/65536"}, "above 65535"},
		{"second port above 65535", []string{"port", "drop", "tcp/25", "udp/70000"}, "above 65535"},
		{"port 0", []string{"port", "drop", "tcp/0"}, "port 0"},
		{"reversed range", []string{"port", "drop", "tcp/30-20"}, "ends before it starts"},
		{"unknown protocol", []string{"port", "drop", "sctp/9"}, "unknown protocol"},
		{"unknown port verb", []string{"port", "reject", "udp/9"}, "invalid port command"},
		{"bad ttl", []string{"block", "--ttl", "banana", "100.64.0.0/10"}, "banana"},
		{"negative ttl", []string{"block", "--ttl", "-5m", "100.64.0.0/10"}, "--ttl"},
		{"zero ttl", []string{"allow", "--ttl", "0s", "100.64.0.0/10"}, "--ttl"},
		{"bad mode", []string{"attach", "--mode", "turbo", "moat-nx0"}, "invalid mode"},
		{"missing interface", []string{"attach", "moat-nx0"}, "no interface"},
		{"block twice", []string{"block", "192.0.2.0/24"}, "already in the denylist"},
		{"block twice, second argument", []string{"block", "100.64.0.0/10", "198.51.100.7"}, "already in the denylist"},
		{"block twice as /32", []string{"block", "198.51.100.7/32"}, "already in the denylist"},
		{"allow twice", []string{"allow", "100.64.0.0/10", "198.18.1.0/24"}, "already in the allowlist"},
		{"port rule twice", []string{"port", "drop", "udp/19"}, "exists already"},
		{"port rule twice, other action", []string{"port", "allow", "tcp/25", "udp/19"}, "exists already"},
		{"ICMP rule twice by number", []string{"port", "drop", "icmp/8"}, "exists already"},
		{"overlapping range", []string{"port", "drop", "tcp/25", "tcp/5990-6000"}, "overlaps the existing rule tcp/6000-6063"},
		{"port inside a range", []string{"port", "allow", "tcp/6010"}, "overlaps"},
		{"ports overlapping each other", []string{"port", "drop", "tcp/20-30", "tcp/25"}, "overlap"},
		{"unblock absent", []string{"unblock", "100.64.0.0/10"}, "not in the denylist"},
		{"unblock second absent", []string{"unblock", "192.0.2.0/24", "100.64.0.0/10"}, "not in the denylist"},
		{"unblock a network only covered by one listed", []string{"unblock", "192.0.2.128/25"}, "not in the denylist"},
		{"unblock from the wrong list", []string{"unblock", "198.18.1.0/24"}, "not in the denylist"},
		{"disallow absent", []string{"disallow", "198.18.1.0/24", "192.0.2.0/24"}, "not in the allowlist"},
		{"port remove absent", []string{"port", "remove", "udp/53"}, "no port rule udp/53"},
		{"port remove second absent", []string{"port", "remove", "udp/19", "udp/53"}, "no port rule udp/53"},
		{"port remove part of a range", []string{"port", "remove", "tcp/6010"}, "no port rule tcp/6010"},
		{"attach an interface twice", []string{"attach", "moat-nx0", "moat-nx0"}, "given twice"},
		{"detach an interface twice", []string{"detach", "moat-nx0", "moat-nx0"}, "given twice"},
		{"detach not attached", []string{"detach", "moat-nx0"}, "not attached"},
		{"detach neither names nor --all", []string{"detach"}, "--all"},
		{"detach names and --all", []string{"detach", "--all", "moat-nx0"}, "--all"},
		{"unknown flag", []string{"block", "--frobnicate", "100.64.0.0/10"}, "unknown flag"},
		{"unknown global flag", []string{"--frobnicate", "list"}, "unknown flag"},
		{"unknown command", []string{"blok", "100.64.0.0/10"}, "unknown command"},
		{"block without args", []string{"block"}, "at least 1"},
		{"port without spec", []string{"port", "drop"}, "at least 2"},
		{"import without file", []string{"import"}, "1 arg"},
		{"list with an argument", []string{"list", "deny"}, "unknown command"},
		{"import with a bad line", []string{"import", badPlain}, "bad.netset:5:"},
		{"import replace with a bad line", []string{"import", "--replace", badPlain}, "bad.netset:5:"},
		{"import JSON with an unknown key", []string{"import", badJSON}, `bad.json:5: unknown field "portz"`},
		{"import missing file", []string{"import", filepath.Join(dir, "absent")}, "no such file"},
		{"import bad list", []string{"import", "--list", "grey", badPlain}, `invalid --list "grey": want deny or allow`},
		{"import bad list with JSON", []string{"import", "--list", "bogus", goodJSON}, `invalid --list "bogus": want deny or allow`},
		{"import --list of JSON", []string{"import", "--list", "allow", goodJSON}, "--list picks the list of a plain file; JSON holds every list"},
		{"port rules past the limit", pastTheLimit, "no room for 1031 more port rules: 1023 rules is the limit and 4 are held"},
		{"import overlapping port rule", []string{"import", overlapJSON}, "overlaps"},
		{"import JSON with a list twice", []string{"import", twiceJSON}, `twice.json:3: key "deny" given twice in one object`},
		{"import JSON with a bad address", []string{"import", badAddrJSON}, `badaddr.json:3: invalid CIDR "10.5.0.300/32"`},
		{"comment with a control character", []string{"block", "--comment", "\x1b[31mred", "100.64.0.0/10"}, "control character U+001B"},
		{"policy given twice", []string{"policy", "fragments", "drop", "fragments", "pass"}, "policy fragments given twice"},
		{"syn protect a port twice", []string{"syn", "protect", "tcp/443", "tcp/80", "tcp/443"}, "tcp/443 given twice"},
		{"top -n 0", []string{"top", "-n", "0"}, "invalid -n 0: want at least 1 source"},
		{"top negative count", []string{"top", "--count", "-1"}, "invalid --count -1"},
		{"syn rotate period too long", []string{"syn", "rotate", "--every", "1500000h"}, "out of range"},
		{"syn rotate period too short", []string{"syn", "rotate", "--every", "500ms"}, "out of range"},
		{"detach --all with nothing attached", []string{"detach", "--all"}, "--remove-rules removes them"},
		{"detach --remove-rules without --all", []string{"detach", "--remove-rules", "eth0"}, "--remove-rules goes with --all"},
		{"detach --remove-rules with --keep-rules", []string{"detach", "--all", "--remove-rules", "--keep-rules"}, "not with --keep-rules"},
		{"policy bad value", []string{"policy", "fragments", "maybe"}, "fragments"},
		{"policy second value bad", []string{"policy", "fragments", "pass", "malformed", "maybe"}, "malformed"},
		{"policy unknown name", []string{"policy", "ttl", "drop"}, "unknown policy"},
		{"policy without value", []string{"policy", "malformed"}, "values"},
		{"policy monitor bad value", []string{"policy", "fragments", "drop", "monitor", "yes"}, `invalid monitor mode "yes": want on or off`},
		{"stats of an interface not attached", []string{"stats", "--interface", "moat-nx0"}, "not attached"},
		{"stats of an interface not attached, old flag name", []string{"stats", "--iface", "moat-nx0"}, "not attached"},
		{"export --list of JSON", []string{"export", "--list", "allow"}, "--list picks the list of --format plain"},
		{"stats watch too fast", []string{"stats", "--watch", "1ms"}, "--watch"},
		{"export bad format", []string{"export", "--format", "xml"}, "--format"},
		{"flood quic-initial without a port", []string{"flood", "--kind", "quic-initial", "--iface", "lo", "--dst-mac", "02:00:00:00:00:01", "--dst", "198.18.2.1", "--src", "198.19.0.0/16", "--count", "1"}, "needs a destination port"},
		{"flood unknown kind", []string{"flood", "--kind", "smurf", "--iface", "lo", "--dst-mac", "02:00:00:00:00:01", "--dst", "198.18.2.1", "--dst-port", "9", "--src", "198.19.0.0/16", "--count", "1"}, "kind"},
		{"flood bad source", []string{"flood", "--kind", "udp", "--iface", "lo", "--dst-mac", "02:00:00:00:00:01", "--dst", "198.18.2.1", "--dst-port", "9", "--src", "198.19.0.0/33", "--count", "1"}, "src"},
		{"flood out of loopback", []string{"flood", "--kind", "udp", "--iface", "lo", "--dst-mac", "02:00:00:00:00:01", "--dst", "198.18.2.1", "--dst-port", "9", "--src", "198.19.0.0/16", "--count", "1"}, "lab tool"},
		{"syn protect udp", []string{"syn", "protect", "udp/53"}, "tcp/PORT"},
		{"syn protect bad mode", []string{"syn", "protect", "tcp/443", "--mode", "sometimes"}, "mode"},
		{"syn threshold outside auto mode", []string{"syn", "protect", "tcp/443", "--mode", "always", "--threshold", "100"}, "auto mode"},
		{"syn threshold 0", []string{"syn", "protect", "tcp/443", "--threshold", "0"}, "at least 1"},
		{"limit without rate", []string{"limit", "add", "source", "udp/53"}, ""},
		{"limit bad scope", []string{"limit", "add", "source", "sctp/9", "--pps", "10"}, ""},
		{"dump bad verdict", []string{"dump", "--verdict", "maybe", "-w", filepath.Join(dir, "x.pcapng")}, "verdict"},
		{"dump bad snaplen", []string{"dump", "-s", "0", "-w", filepath.Join(dir, "x.pcapng")}, "snaplen"},
		{"dump port above 65535", []string{"dump", "--port", "70000", "-w", filepath.Join(dir, "x.pcapng")}, `invalid --port "70000": want 1-65535`},
		{"dump port 0", []string{"dump", "--port", "0", "-w", filepath.Join(dir, "x.pcapng")}, `invalid --port "0": want 1-65535`},
		{"dump port not a number", []string{"dump", "--port", "https", "-w", filepath.Join(dir, "x.pcapng")}, `invalid --port "https": want 1-65535`},
		{"dump net with host bits", []string{"dump", "--net", "10.0.0.1/8", "-w", filepath.Join(dir, "x.pcapng")}, `--net "10.0.0.1/8": host bits set (did you mean 10.0.0.0/8?)`},
		{"dump IPv4-mapped net with host bits", []string{"dump", "--net", "::ffff:10.0.0.1/104", "-w", filepath.Join(dir, "x.pcapng")}, "host bits set"},
		{"dump IPv4-mapped net shorter than /96", []string{"dump", "--net", "::ffff:0:0/90", "-w", filepath.Join(dir, "x.pcapng")}, "/96 or longer"},
	}

	root := newRoot(t)
	seedRules(t, root)
	before := pinnedState(t, root)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := runMain(root, tc.args...)
			checkUsageError(t, r, tc.errPart)
			if after := pinnedState(t, root); after != before {
				t.Fatalf("state changed:\nbefore %s\nafter %s", before, after)
			}
		})
	}
}

// TestBadInputFreshRoot checks that a refused command leaves nothing pinned
// behind when moat was not set up.
func TestBadInputFreshRoot(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"unblock", "192.0.2.1"},
		{"disallow", "192.0.2.1"},
		{"port", "remove", "udp/19"},
		{"detach", "moat-nx0"},
		{"attach", "moat-nx0"},
		{"stats", "--iface", "moat-nx0"},
		{"policy", "fragments", "maybe"},
		{"policy", "fragments", "drop", "fragments", "pass"},
		{"policy", "monitor", "1"},
		{"syn", "protect", "tcp/443", "--mode", "off"},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			root := newRoot(t)
			checkUsageError(t, runMain(root, args...), "")
			if st := pinnedState(t, root); st != "" {
				t.Fatalf("a refused command left state behind:\n%s", st)
			}
		})
	}
}

// TestEmptyRoot: an empty --root is refused, not taken for the working
// directory, and nothing is created there.
func TestEmptyRoot(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	checkUsageError(t, runMain("", "block", "192.0.2.1"), "--root is empty")
	if entries, err := os.ReadDir(dir); err != nil || len(entries) != 0 {
		t.Fatalf("the working directory after the refused command: %v %v", entries, err)
	}
}

// TestReadOnlyCommandsNeedState checks that commands that only read the
// state refuse where nothing is pinned, instead of creating the maps; so
// does syn rotate, which would install keys that no filter reads.
func TestReadOnlyCommandsNeedState(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"list"}, {"list", "--json"}, {"export"}, {"stats"}, {"expire"}, {"syn", "status"}, {"rebuild-summary"},
		{"policy"}, {"syn", "rotate"}} {
		root := newRoot(t)
		checkUsageError(t, runMain(root, args...), "not set up")
		if st := pinnedState(t, root); st != "" {
			t.Fatalf("moat %v created state:\n%s", args, st)
		}
	}
}

// TestRebuildSummary checks the deny summary's repair command and what
// status says of the summary.
func TestRebuildSummary(t *testing.T) {
	t.Parallel()
	root := newRoot(t)
	mustRun(t, root, "block", "198.51.100.0/24")
	r := mustRun(t, root, "rebuild-summary")
	if !strings.Contains(r.stdout, "deny summary rebuilt (families in use: ipv4, ipv6)") {
		t.Fatalf("rebuild-summary said %q", r.stdout)
	}
	r = mustRun(t, root, "status")
	if !strings.Contains(r.stdout, "deny summary: ipv4 on, ipv6 on (host summary: ipv4 on, ipv6 on), 0 entries removed since the last rebuild") {
		t.Fatalf("status said %q", r.stdout)
	}
	mustRun(t, root, "unblock", "198.51.100.0/24")
	r = mustRun(t, root, "status", "--json")
	var st cli.Status
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil {
		t.Fatal(err)
	}
	if want := (cli.DenySummary{IPv4: true, IPv6: true, HostIPv4: true, HostIPv6: true, Removed: 1}); st.Summary != want {
		t.Fatalf("status --json: deny summary %+v, want %+v", st.Summary, want)
	}
}

// TestListEmptyRootJSON checks the JSON of a root with no rules: empty
// lists, not null, so that scripts can iterate.
func TestListEmptyRootJSON(t *testing.T) {
	t.Parallel()
	root := newRoot(t)
	mustRun(t, root, "policy", "malformed", "drop") // sets up an empty state
	r := mustRun(t, root, "list", "--json")
	for _, want := range []string{`"allow": []`, `"deny": []`, `"ports": []`, `"fragments": "pass"`, `"malformed": "drop"`} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("list --json lacks %s:\n%s", want, r.stdout)
		}
	}
}

// TestDetachRemoveRules: rules set up on a root that nothing is attached
// to are removed only when asked.
func TestDetachRemoveRules(t *testing.T) {
	t.Parallel()
	root := newRoot(t)
	seedRules(t, root)
	before := pinnedState(t, root)
	// Asked to keep the rules, with nothing to detach: nothing to do.
	if r := mustRun(t, root, "detach", "--all", "--keep-rules"); !strings.Contains(r.stdout, "rules kept") {
		t.Errorf("detach --all --keep-rules said:\n%s", r.stdout)
	}
	if after := pinnedState(t, root); after != before {
		t.Fatalf("detach --all --keep-rules changed the pins:\n%s\nwas\n%s", after, before)
	}
	r := mustRun(t, root, "detach", "--all", "--remove-rules")
	if !strings.Contains(r.stdout, "removed rules and pins") {
		t.Errorf("detach --all --remove-rules said:\n%s", r.stdout)
	}
	if st := pinnedState(t, root); st != "" {
		t.Fatalf("pins left:\n%s", st)
	}
}
