package cli

import (
	"strings"
	"testing"

	"github.com/moat-shield/moat/internal/syncookie"
)

// TestSynPortsTable: `moat syn status` prints each port's counters under
// its column, and a hint for the ports whose accept errors, full accept
// queue or MPTCP listener call for a look; none for a port with none.
func TestSynPortsTable(t *testing.T) {
	var out strings.Builder
	err := writeSynPorts(&out, []syncookie.PortStatus{
		{Port: 443, Mode: "always", SYNs: 40, CookiesIssued: 40, CookiesAccepted: 30, ACKsDropped: 12, ResetsSent: 5, AcceptErrors: 2, AcceptQueueFull: 7},
		{Port: 80, Mode: "auto", SYNs: 5},
		{Port: 8080, Mode: "always", SYNs: 9, SYNsPassed: 9, MPTCPSYNs: 9},
	})
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 7 {
		t.Fatalf("%d lines, want a header, three ports and three hints:\n%s", len(lines), out.String())
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
	if got := col(lines[1], "QUEUE_FULL"); got != "7" {
		t.Errorf("tcp/443 QUEUE FULL %q, want 7", got)
	}
	if got := col(lines[1], "RESETS"); got != "5" {
		t.Errorf("tcp/443 RESETS %q, want 5", got)
	}
	if got := col(lines[1], "ACKS_DROPPED"); got != "12" {
		t.Errorf("tcp/443 ACKS DROPPED %q, want 12", got)
	}
	if got := col(lines[1], "ACCEPTED"); got != "30" {
		t.Errorf("tcp/443 ACCEPTED %q, want 30", got)
	}
	if got := col(lines[2], "QUEUE_FULL"); got != "0" {
		t.Errorf("tcp/80 QUEUE FULL %q, want 0", got)
	}
	if got := col(lines[3], "SYNS_PASSED"); got != "9" {
		t.Errorf("tcp/8080 SYNS PASSED %q, want 9", got)
	}
	if !strings.HasPrefix(lines[4], "tcp/443: 2 valid cookies the kernel refused") {
		t.Errorf("hint %q, want tcp/443's accept errors", lines[4])
	}
	if !strings.HasPrefix(lines[5], "tcp/443: 7 valid cookies came while the listener's accept queue was full") {
		t.Errorf("hint %q, want tcp/443's full accept queue", lines[5])
	}
	if !strings.HasPrefix(lines[6], "tcp/8080: 9 SYNs went to the kernel because the listener is MPTCP") {
		t.Errorf("hint %q, want tcp/8080's MPTCP listener", lines[6])
	}
}
