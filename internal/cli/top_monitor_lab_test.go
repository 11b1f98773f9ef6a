package cli_test

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/moat-shield/moat/internal/flood"
)

// topRow is one source of `moat top --json`, read by the names the JSON
// has.
type topRow struct {
	Source       string  `json:"source"`
	PPS          float64 `json:"pps"`
	DroppedPPS   float64 `json:"dropped_pps"`
	MonitoredPPS float64 `json:"monitored_pps"`
	Verdict      string  `json:"verdict"`
}

// topDuringFlood floods the server's UDP port from src at pps for a few
// seconds and, once the flood runs, reads one interval of `moat top
// --json` and, after it, one of the table; it returns src's row and the
// table.
func (sl *shieldLab) topDuringFlood(src netip.Addr, port uint16, pps uint64) (topRow, bool, string) {
	sl.t.Helper()
	errs := make(chan error, 1)
	go func() {
		_, err := sl.floodRun(flood.Config{Kind: flood.KindUDP, Sources: netip.PrefixFrom(src, 32), DstPort: port,
			Rate: pps, Duration: 5 * time.Second})
		errs <- err
	}()
	time.Sleep(500 * time.Millisecond)
	r := sl.mustMoat("top", "--interval", "1500ms", "--count", "1", "--json", "-n", "5")
	table := sl.mustMoat("top", "--interval", "1s", "--count", "1", "-n", "5").stdout
	if err := <-errs; err != nil {
		sl.t.Fatalf("flood: %v", err)
	}
	sl.t.Logf("moat top --json: %s", r.stdout)
	sl.t.Logf("moat top:\n%s", table)
	var rep struct {
		Monitor bool     `json:"monitor"`
		Sources []topRow `json:"sources"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
		sl.t.Fatalf("moat top --json: %v\n%s", err, r.stdout)
	}
	for _, row := range rep.Sources {
		if row.Source == netip.PrefixFrom(src, 32).String() {
			return row, rep.Monitor, table
		}
	}
	sl.t.Fatalf("moat top --json has no row for %v:\n%s", src, r.stdout)
	return topRow{}, false, ""
}

// tableRow returns the fields of src's row in the table of `moat top`,
// from the column whose heading is col on.
func tableRow(t *testing.T, table string, src netip.Addr, col string) []string {
	t.Helper()
	lines := strings.Split(table, "\n")
	for i, l := range lines {
		at := strings.Index(l, col)
		if at < 0 {
			continue
		}
		for _, r := range lines[i+1:] {
			if f := strings.Fields(r); len(f) > 0 && f[0] == netip.PrefixFrom(src, 32).String() && len(r) > at {
				return strings.Fields(r[at:])
			}
		}
	}
	t.Fatalf("no column %s or no row for %v in\n%s", col, src, table)
	return nil
}

// TestLabTopMonitored: in monitor mode `moat top` counts a heavy hitter's
// packets over a limit, and the hits of the auto-block that the limit
// writes in monitor mode, as monitored, not dropped, and says what
// enforcing would do; enforcing, the same traffic counts as dropped, as
// before.
func TestLabTopMonitored(t *testing.T) {
	t.Parallel()
	sl := newShieldLab(t)
	toClient, toAttacker := sl.ifaces()
	sl.mustMoat("attach", toClient, toAttacker)
	udp := sl.udp[0]
	scope := fmt.Sprintf("udp/%d", udp.port)
	// Every packet sampled: the rates are counts, not estimates.
	sl.mustMoat("limit", "config", "--sample", "1")
	const pps, limit = 2000, 100
	near := func(got, want float64) bool { return within(got, want, 0.4) }

	sl.mustMoat("policy", "monitor", "on")
	for _, c := range []struct {
		name    string
		src     string
		monitor bool
		block   bool
		verdict string
		want    float64 // pps dropped, or in monitor mode monitored
	}{
		{"over a limit, monitor mode", "198.19.9.1", true, false, "would be limited", pps - limit},
		{"auto-blocked, monitor mode", "198.19.9.2", true, true, "would be auto-blocked", pps},
		{"over a limit, enforcing", "198.19.9.3", false, false, "limited", pps - limit},
		{"auto-blocked, enforcing", "198.19.9.4", false, true, "auto-blocked", pps},
	} {
		t.Run(c.name, func(t *testing.T) {
			sl.t = t
			if !c.monitor {
				sl.mustMoat("policy", "monitor", "off")
			}
			args := []string{"limit", "add", "source", scope, "--pps", fmt.Sprint(limit), "--burst", "10"}
			if c.block {
				args = append(args, "--block", "1m")
			}
			sl.mustMoat(args...)
			defer sl.mustMoat("limit", "remove", "source", scope)
			src := netip.MustParseAddr(c.src)
			row, monitor, table := sl.topDuringFlood(src, udp.port, pps)
			if monitor != c.monitor {
				t.Errorf("moat top --json: monitor %v, want %v", monitor, c.monitor)
			}
			if row.Verdict != c.verdict {
				t.Errorf("moat top --json: verdict %q, want %q", row.Verdict, c.verdict)
			}
			// What the rules judged counts in one column, the other stays 0.
			counted, other := "dropped", "monitored"
			got, rest := row.DroppedPPS, row.MonitoredPPS
			col, zeroCol := 0, 1 // in the table, from DROPPED PPS on
			if c.monitor {
				counted, other = other, counted
				got, rest = rest, got
				col, zeroCol = zeroCol, col
			}
			if !near(got, c.want) || rest != 0 {
				t.Errorf("moat top --json: %s %.0f pps, %s %.0f pps; want about %.0f and none", counted, got, other, rest, c.want)
			}
			f := tableRow(t, table, src, "DROPPED PPS")
			if len(f) < 3 || !strings.HasPrefix(strings.Join(f[2:], " "), c.verdict+" ") {
				t.Fatalf("moat top: row %q from DROPPED PPS on, want DROPPED PPS, MONITORED PPS and the verdict %q", f, c.verdict)
			}
			if f[zeroCol] != "0" || f[col] == "0" {
				t.Errorf("moat top: DROPPED PPS %s, MONITORED PPS %s; want %s 0", f[0], f[1], strings.ToUpper(other))
			}
		})
	}
}
