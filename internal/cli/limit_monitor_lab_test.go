package cli_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

// limitCounters reads the counters of the limit "KIND SCOPE" from `moat
// limit list --json` as the JSON has them, by name.
func (sl *shieldLab) limitCounters(key string) map[string]uint64 {
	sl.t.Helper()
	var ll struct {
		Limits []struct {
			Kind  string            `json:"kind"`
			Scope string            `json:"scope"`
			Stats map[string]uint64 `json:"stats"`
		} `json:"limits"`
	}
	r := sl.mustMoat("limit", "list", "--json")
	if err := json.Unmarshal([]byte(r.stdout), &ll); err != nil {
		sl.t.Fatalf("limit list --json: %v\n%s", err, r.stdout)
	}
	for _, l := range ll.Limits {
		if l.Kind+" "+l.Scope == key {
			return l.Stats
		}
	}
	sl.t.Fatalf("no limit %q in\n%s", key, r.stdout)
	return nil
}

// limitColumn reads column col of the limit "KIND SCOPE" from the table of
// `moat limit list`: the value that starts where its heading does.
func (sl *shieldLab) limitColumn(key, col string) string {
	sl.t.Helper()
	out := sl.mustMoat("limit", "list").stdout
	lines := strings.Split(out, "\n")
	at := strings.Index(lines[0], col)
	if at < 0 {
		sl.t.Fatalf("no column %s in\n%s", col, out)
	}
	for _, l := range lines[1:] {
		if f := strings.Fields(l); len(f) >= 2 && f[0]+" "+f[1] == key && len(l) > at {
			return strings.Fields(l[at:])[0]
		}
	}
	sl.t.Fatalf("no limit %q in\n%s", key, out)
	return ""
}

// TestLabLimitMonitored: in monitor mode the datagrams over a budget reach
// the server, and `moat limit list` (table and JSON) counts them as
// monitored, not dropped, as `moat stats` does; enforcing again, the
// budget's drops count as drops.
func TestLabLimitMonitored(t *testing.T) {
	t.Parallel()
	sl := newShieldLab(t)
	toClient, toAttacker := sl.ifaces()
	sl.mustMoat("attach", toClient, toAttacker)
	udp := sl.udp[0]
	key := fmt.Sprintf("budget udp/%d", udp.port)
	// 1 pps: at most a token or two come back while the test sends.
	const burst, sent = 4, 20
	sl.mustMoat("limit", "add", "budget", fmt.Sprintf("udp/%d", udp.port), "--pps", "1", "--burst", fmt.Sprint(burst))
	sl.mustMoat("policy", "monitor", "on")

	before := sl.stats()[toClient].ByReason["budget"]
	var payloads []string
	for range sent {
		payloads = append(payloads, sl.sendUDP(sl.lab.Client, false, udp))
	}
	for i, p := range payloads {
		if !udp.waitFor(p, passWait) {
			t.Errorf("datagram %d of %d was lost in monitor mode", i+1, sent)
		}
	}
	st := sl.limitCounters(key)
	t.Logf("monitor mode: %s %v", key, st)
	if st["passed"]+st["monitored"] != sent {
		t.Errorf("limit list --json: passed %d and monitored %d of %d datagrams", st["passed"], st["monitored"], sent)
	}
	if st["dropped"] != 0 || st["dropped_bytes"] != 0 {
		t.Errorf("limit list --json: dropped %d (%d bytes) in monitor mode, want none", st["dropped"], st["dropped_bytes"])
	}
	if st["monitored"] < sent-burst-2 || st["monitored_bytes"] == 0 {
		t.Errorf("limit list --json: monitored %d (%d bytes), want about %d", st["monitored"], st["monitored_bytes"], sent-burst)
	}
	// The interface's counters tell the same.
	after := sl.stats()[toClient].ByReason["budget"]
	if m := after.Monitored.Packets - before.Monitored.Packets; m != st["monitored"] {
		t.Errorf("moat stats counted %d budget packets as monitored, the limit %d", m, st["monitored"])
	}
	if got, want := sl.limitColumn(key, "MONITORED"), fmt.Sprint(st["monitored"]); got != want {
		t.Errorf("limit list: MONITORED %s, want %s", got, want)
	}
	if got := sl.limitColumn(key, "DROPPED"); got != "0" {
		t.Errorf("limit list: DROPPED %s in monitor mode, want 0", got)
	}

	// Enforcing: the budget, spent, drops, and its drops count as drops.
	sl.mustMoat("policy", "monitor", "off")
	monitored := st["monitored"]
	lost := 0
	payloads = payloads[:0]
	for range sent {
		payloads = append(payloads, sl.sendUDP(sl.lab.Client, false, udp))
	}
	for _, p := range payloads {
		if !udp.waitFor(p, blockedWait) {
			lost++
		}
	}
	st = sl.limitCounters(key)
	t.Logf("enforcing: %s %v", key, st)
	if st["dropped"] != uint64(lost) || lost < sent-burst-2 {
		t.Errorf("limit list --json: dropped %d, the server missed %d of %d", st["dropped"], lost, sent)
	}
	if st["monitored"] != monitored {
		t.Errorf("limit list --json: monitored went from %d to %d while enforcing", monitored, st["monitored"])
	}
	if got, want := sl.limitColumn(key, "DROPPED"), fmt.Sprint(st["dropped"]); got != want {
		t.Errorf("limit list: DROPPED %s, want %s", got, want)
	}
}
