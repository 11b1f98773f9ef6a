package cli

import (
	"strings"
	"testing"

	"github.com/moat-shield/moat/internal/syncookie"
)

// TestSynPortsTable: `moat syn status` prints each port's counters under
// its column, and a hint for the ports whose accept errors, full accept
// queue, MPTCP listener or NAT call for a look; none for a port with none.
func TestSynPortsTable(t *testing.T) {
	var out strings.Builder
	err := writeSynPorts(&out, []syncookie.PortStatus{
		{Port: 443, Mode: "always", SYNs: 40, CookiesIssued: 40, CookiesAccepted: 30, ACKsDropped: 12, ResetsSent: 5, AcceptErrors: 2, AcceptQueueFull: 7},
		{Port: 80, Mode: "auto", SYNs: 5},
		{Port: 8080, Mode: "always", SYNs: 9, SYNsPassed: 9, MPTCPSYNs: 9},
		{Port: 25, Mode: "always", SYNs: 6, SYNsPassed: 6, NATSYNs: 6},
	})
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 9 {
		t.Fatalf("%d lines, want a header, four ports and four hints:\n%s", len(lines), out.String())
	}
	col := func(row, name string) string {
		t.Helper()
		names := strings.Fields(strings.NewReplacer("ACKS DROPPED", "ACKS_DROPPED", "SYNS DROPPED", "SYNS_DROPPED",
			"SYNS PASSED", "SYNS_PASSED", "ACCEPT ERRORS", "ACCEPT_ERRORS", "QUEUE FULL", "QUEUE_FULL").Replace(lines[0]))
		vals := strings.Fields(row)
		for i, n := range names {
			if n == name && i < len(vals) {
				return vals[i]
			}
		}
		t.Fatalf("no column %s in %q", name, lines[0])
		return ""
	}
	for _, c := range []struct {
		line      int
		col, want string
	}{
		{1, "QUEUE_FULL", "7"}, {1, "RESETS", "5"}, {1, "ACKS_DROPPED", "12"}, {1, "ACCEPTED", "30"},
		{2, "QUEUE_FULL", "0"}, {3, "SYNS_PASSED", "9"}, {4, "SYNS_PASSED", "6"},
	} {
		if got := col(lines[c.line], c.col); got != c.want {
			t.Errorf("%s of %q: %q, want %s", c.col, strings.Fields(lines[c.line])[0], got, c.want)
		}
	}
	for i, hint := range []string{
		"tcp/443: 2 valid cookies the kernel refused",
		"tcp/443: 7 valid cookies came while the listener's accept queue was full",
		"tcp/8080: 9 SYNs went to the kernel because the listener is MPTCP",
		"tcp/25: 6 SYNs went to the kernel while NAT ran in the listener's namespace",
	} {
		if !strings.HasPrefix(lines[5+i], hint) {
			t.Errorf("hint %q, want one that starts %q", lines[5+i], hint)
		}
	}
}
