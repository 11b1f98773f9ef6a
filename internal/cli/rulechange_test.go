package cli_test

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/moat-shield/moat/internal/rules"
)

// TestLabImportKeepsHits drops real traffic so that the rules have hits,
// then imports what export wrote: rules the file holds as they are keep
// their hits, and the command says what changed.
func TestLabImportKeepsHits(t *testing.T) {
	t.Parallel()
	sl := newShieldLab(t)
	toClient, toAttacker := sl.ifaces()
	c, a := sl.lab.Client, sl.lab.Attacker
	udp, udp2 := sl.udp[0], sl.udp[1]
	sl.mustMoat("attach", toClient, toAttacker)
	sl.mustMoat("block", "10.10.0.0/16")
	sl.mustMoat("block", "--comment", "hx7 attacker", sl.attackerV4().String(), sl.attackerV6().String())
	sl.mustMoat("block", "--ttl", "1h", "203.0.113.0/24")
	sl.mustMoat("allow", sl.clientV4().String())
	sl.mustMoat("port", "drop", fmt.Sprintf("udp/%d", udp2.port))
	sl.expectNoUDP(a, false, udp)
	sl.expectNoUDP(a, true, udp)
	sl.expectUDP(c, false, udp2) // the allowlist comes first
	sl.expectNoUDP(c, true, udp2)

	hits := func() map[string]uint64 {
		rs := sl.list()
		out := map[string]uint64{}
		for _, e := range rs.Allow {
			out["allow "+e.Prefix.String()] = e.Hits
		}
		for _, e := range rs.Deny {
			out["deny "+e.Prefix.String()] = e.Hits
		}
		for _, p := range rs.Ports {
			out["port "+p.Spec.String()] = p.Hits
		}
		return out
	}
	before := hits()
	attacker4 := "deny " + sl.attackerV4().String() + "/32"
	for _, k := range []string{attacker4, "deny " + sl.attackerV6().String() + "/128",
		"allow " + sl.clientV4().String() + "/32", fmt.Sprintf("port udp/%d", udp2.port)} {
		if before[k] == 0 {
			t.Fatalf("%s has no hits after the traffic: %v", k, before)
		}
	}

	dir := t.TempDir()
	file := filepath.Join(dir, "r.json")
	if err := os.WriteFile(file, []byte(sl.mustMoat("export").stdout), 0o600); err != nil {
		t.Fatal(err)
	}
	// The same file, replacing and merging.
	for _, args := range [][]string{{"import", "--replace", file}, {"import", file}} {
		r := sl.mustMoat(args...)
		if !strings.HasPrefix(r.stdout, "no change: ") {
			t.Errorf("moat %s: %q, want no change", strings.Join(args, " "), r.stdout)
		}
		if after := hits(); fmt.Sprint(after) != fmt.Sprint(before) {
			t.Fatalf("moat %s changed the hits:\n%v\nwant\n%v", strings.Join(args, " "), after, before)
		}
	}

	// A file with one entry more, one less and one changed.
	rs, err := rules.ReadRuleset(file, strings.NewReader(sl.mustMoat("export").stdout), "deny")
	if err != nil {
		t.Fatal(err)
	}
	var deny []rules.PrefixEntry
	for _, e := range rs.Deny {
		switch e.Prefix.String() {
		case "10.10.0.0/16": // dropped from the file
		case "203.0.113.0/24":
			e.Comment = "hx7 changed"
			deny = append(deny, e)
		default:
			deny = append(deny, e)
		}
	}
	rs.Deny = append(deny, rules.PrefixEntry{Prefix: netip.MustParsePrefix("100.64.0.0/10")})
	data, err := json.Marshal(rs)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, data, 0o600); err != nil {
		t.Fatal(err)
	}
	r := sl.mustMoat("import", "--replace", file)
	if !strings.HasPrefix(r.stdout, "imported: 1 allow/deny entries added, 1 updated, 1 removed, 3 unchanged; 0 port rule changes; in ") {
		t.Errorf("import of a changed file: %q", r.stdout)
	}
	after := hits()
	for k, n := range before {
		switch k {
		case "deny 10.10.0.0/16":
			if _, ok := after[k]; ok {
				t.Errorf("%s is still listed", k)
			}
		case "deny 203.0.113.0/24": // changed; it had no traffic
		default:
			if after[k] != n {
				t.Errorf("%s has %d hits after the import, want the %d it had", k, after[k], n)
			}
		}
	}
	if _, ok := after["deny 100.64.0.0/10"]; !ok {
		t.Errorf("the new entry is missing: %v", after)
	}
	sl.expectNoUDP(a, false, udp)
	if got := hits()[attacker4]; got <= before[attacker4] {
		t.Errorf("%s counts no more hits after the import: %d", attacker4, got)
	}
}

// TestBlockOverExpiredEntry checks that block and allow take an entry past
// its expiry for absent (the filter ignores it) and replace it, while a
// live entry still refuses the whole command.
func TestBlockOverExpiredEntry(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name    string
		setup   [][]string // run before; "--ttl 1s" entries then expire
		run     []string
		code    int
		out     string // part of stdout (code 0) or stderr (code 2)
		listed  string // the list afterwards, as prefix=comment/expiry
		listArg string
	}{
		{name: "deny entry expired",
			setup:  [][]string{{"block", "--ttl", "1s", "--comment", "hx7 old", "10.77.0.2"}},
			run:    []string{"block", "--ttl", "1h", "10.77.0.2"},
			out:    "added 1 to the denylist (replaced an expired entry: 10.77.0.2/32)\n",
			listed: "10.77.0.2/32=/1h"},
		{name: "allow entry expired",
			setup:  [][]string{{"allow", "--ttl", "1s", "2001:db8:77::/48"}},
			run:    []string{"allow", "--comment", "hx7 new", "2001:db8:77::/48"},
			out:    "added 1 to the allowlist (replaced an expired entry: 2001:db8:77::/48)\n",
			listed: "2001:db8:77::/48=hx7 new/never", listArg: "allow"},
		{name: "two expired, one new",
			setup:  [][]string{{"block", "--ttl", "1s", "10.77.0.2", "10.77.1.0/24"}},
			run:    []string{"block", "10.77.0.2", "10.77.1.0/24", "10.77.2.0/24"},
			out:    "added 3 to the denylist (replaced 2 expired entries)\n",
			listed: "10.77.0.2/32=/never 10.77.1.0/24=/never 10.77.2.0/24=/never"},
		{name: "deny entry live",
			setup:  [][]string{{"block", "--ttl", "1h", "10.77.0.2"}},
			run:    []string{"block", "--ttl", "2h", "10.77.0.2"},
			code:   2,
			out:    "10.77.0.2/32 is already in the denylist",
			listed: "10.77.0.2/32=/1h"},
		{name: "expired and live together",
			setup:  [][]string{{"block", "--ttl", "1s", "10.77.0.2"}, {"block", "10.77.1.0/24"}},
			run:    []string{"block", "10.77.0.2", "10.77.1.0/24"},
			code:   2,
			out:    "10.77.1.0/24 is already in the denylist",
			listed: "10.77.0.2/32=/expired 10.77.1.0/24=/never"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			root := newRoot(t)
			for _, args := range tc.setup {
				mustRun(t, root, args...)
			}
			time.Sleep(1100 * time.Millisecond) // the 1s entries expire
			r := runMain(root, tc.run...)
			if tc.code == 2 {
				checkUsageError(t, r, tc.out)
			} else if r.code != 0 || r.stdout != tc.out {
				t.Errorf("moat %s: %v\nwant stdout %q", strings.Join(tc.run, " "), r, tc.out)
			}
			list := "deny"
			if tc.listArg != "" {
				list = tc.listArg
			}
			if got := describeList(t, root, list); got != tc.listed {
				t.Errorf("%slist afterwards: %s, want %s", list, got, tc.listed)
			}
		})
	}
}

// describeList renders a list as prefix=comment/expiry, the expiry as
// never, expired (within the second that listings round to), or the hours
// left rounded.
func describeList(t *testing.T, root, list string) string {
	t.Helper()
	rs := listed(t, root)
	es := rs.Deny
	if list == "allow" {
		es = rs.Allow
	}
	var out []string
	for _, e := range es {
		exp := "never"
		if e.Expires != nil {
			// Listed times are rounded to the second.
			if left := time.Until(*e.Expires); left < time.Second {
				exp = "expired"
			} else {
				exp = fmt.Sprintf("%dh", int(left.Round(time.Hour).Hours()))
			}
		}
		out = append(out, fmt.Sprintf("%s=%s/%s", e.Prefix, e.Comment, exp))
	}
	return strings.Join(out, " ")
}
