package cli_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/moat-shield/moat/internal/cli"
)

// TestLimitCommands: add, list, replace, remove and the switches, and the
// refusals, which exit 2 and change nothing.
func TestLimitCommands(t *testing.T) {
	t.Parallel()
	root := newRoot(t)
	mustRun(t, root, "limit", "add", "source", "all", "--pps", "10k", "--block", "1m")
	mustRun(t, root, "limit", "add", "budget", "udp/53", "--pps", "50k")
	mustRun(t, root, "limit", "add", "budget", "tcp/443+syn", "--pps", "20k", "--burst", "1000")
	mustRun(t, root, "limit", "add", "source", "icmp/echo-request", "--pps", "10", "--bps", "100k", "--ipv6-prefix", "48")
	mustRun(t, root, "limit", "add", "source", "tcp/8443+tls-hello", "--pps", "20", "--burst", "40", "--block", "10m")

	list := func() cli.LimitList {
		t.Helper()
		var ll cli.LimitList
		r := mustRun(t, root, "limit", "list", "--json")
		if err := json.Unmarshal([]byte(r.stdout), &ll); err != nil {
			t.Fatalf("limit list --json: %v\n%s", err, r.stdout)
		}
		return ll
	}
	ll := list()
	var got []string
	for _, l := range ll.Limits {
		got = append(got, l.String())
	}
	want := []string{
		"source all 10000pps burst 1000 block 1m0s",
		"source tcp/8443+tls-hello 20pps burst 40 block 10m0s",
		"source icmp/echo-request 10pps burst 1 100000bit/s burst 1518B ipv6/48",
		"budget tcp/443+syn 20000pps burst 1000",
		"budget udp/53 50000pps burst 5000",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("limits:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if !ll.Config.Shape || !ll.Config.HeavyHitters || ll.Config.Sample != 64 {
		t.Errorf("default switches %+v", ll.Config)
	}

	before := pinnedState(t, root) + mustRun(t, root, "limit", "list", "--json").stdout
	for _, c := range []struct {
		name    string
		args    []string
		errPart string
	}{
		{"exists", []string{"limit", "add", "budget", "udp/53", "--pps", "1"}, "exists"},
		{"overlap", []string{"limit", "add", "budget", "udp/50-60", "--pps", "1"}, "overlaps"},
		{"no rate", []string{"limit", "add", "source", "udp"}, "give a rate"},
		{"bad kind", []string{"limit", "add", "sauce", "udp", "--pps", "1"}, "source or budget"},
		{"bad scope", []string{"limit", "add", "source", "sctp/9", "--pps", "1"}, "invalid scope"},
		{"syn on udp", []string{"limit", "add", "source", "udp+syn", "--pps", "1"}, "TCP scopes only"},
		{"tls-hello on udp", []string{"limit", "add", "source", "udp/443+tls-hello", "--pps", "1"}, "TCP scopes only"},
		{"two qualifiers", []string{"limit", "add", "source", "tcp/443+syn+tls-hello", "--pps", "1"}, "one qualifier at most"},
		{"hello limit over a port limit", []string{"limit", "add", "source", "tcp/8443", "--pps", "1"}, "overlaps"},
		{"bad rate", []string{"limit", "add", "source", "udp", "--pps", "lots"}, "invalid --pps"},
		{"rate below one", []string{"limit", "add", "source", "udp", "--pps", "0.4"}, `invalid --pps "0.4": at least 1`},
		{"burst that would wrap", []string{"limit", "add", "source", "all", "--pps", "1", "--burst", "18446744074"}, "more than an hour of the rate"},
		{"byte burst that would wrap", []string{"limit", "add", "source", "tcp", "--bps", "8k", "--burst-bytes", "1125899906842624"}, "more than an hour of the rate"},
		{"block on budget", []string{"limit", "add", "budget", "udp", "--pps", "1", "--block", "1m"}, "source limits"},
		{"prefix 0", []string{"limit", "add", "source", "udp", "--pps", "1", "--ipv6-prefix", "0"}, "1..128"},
		{"remove missing", []string{"limit", "remove", "source", "udp/53"}, "not found"},
		{"bad gate", []string{"limit", "config", "--gate", "magic"}, "invalid gate"},
		{"bad sample", []string{"limit", "config", "--sample", "3"}, "power of two"},
		{"bad switch", []string{"limit", "config", "--shape", "maybe"}, "on or off"},
	} {
		t.Run(c.name, func(t *testing.T) {
			checkUsageError(t, runMain(root, c.args...), c.errPart)
		})
	}
	if after := pinnedState(t, root) + mustRun(t, root, "limit", "list", "--json").stdout; after != before {
		t.Errorf("a refused command changed the state:\nbefore %s\nafter %s", before, after)
	}

	mustRun(t, root, "limit", "add", "budget", "udp/53", "--pps", "1k", "--replace")
	mustRun(t, root, "limit", "remove", "source", "all")
	mustRun(t, root, "limit", "config", "--shape", "off", "--sample", "1024", "--gate", "sketch")
	ll = list()
	if len(ll.Limits) != 4 || ll.Limits[3].PPS != 1000 {
		t.Errorf("after replace and remove: %+v", ll.Limits)
	}
	if ll.Config.Shape || ll.Config.Sample != 1024 || ll.Config.Gate.String() != "sketch" {
		t.Errorf("switches %+v", ll.Config)
	}
	r := mustRun(t, root, "stats", "--detail")
	if !strings.Contains(r.stdout, "attack shape counting is off") || !strings.Contains(r.stdout, "budget udp/53 1000pps") {
		t.Errorf("stats --detail:\n%s", r.stdout)
	}
}
