package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"os"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/moat-shield/moat/internal/datapath"
	"github.com/moat-shield/moat/internal/ratelimit"
	"github.com/moat-shield/moat/internal/shield"
)

// TopRow is one source in `moat top`.
type TopRow struct {
	Source     netip.Prefix `json:"source"`
	PPS        float64      `json:"pps"`
	Mbps       float64      `json:"mbps"`
	DroppedPPS float64      `json:"dropped_pps"` // by a limit, a budget, a port rule or the denylist
	// What one of those would have dropped and monitor mode passed, as
	// moat stats counts it as monitored.
	MonitoredPPS float64 `json:"monitored_pps"`
	// Verdict is pass, limited (some packets over a limit or budget),
	// blocked (in the denylist) or auto-blocked (by a limit). Where monitor
	// mode passed those packets it is would be limited, would be blocked
	// or would be auto-blocked: what enforcing would do.
	Verdict string    `json:"verdict"`
	History []float64 `json:"history"` // pps per interval, oldest first
}

// TopReport is one interval of `moat top --json` (one object per line).
type TopReport struct {
	Time     time.Time `json:"time"`
	Interval float64   `json:"interval_s"`
	Sample   uint32    `json:"sample"` // 1 packet in Sample was counted; rates are scaled
	// Monitor mode was on at the interval's end: what rules would drop
	// passed.
	Monitor bool     `json:"monitor"`
	Sources []TopRow `json:"sources"`
}

// topSample is one read of the heavy hitters and of their denylist state.
type topSample struct {
	at      time.Time
	sample  uint32
	monitor bool // monitor mode
	hh      map[netip.Prefix]ratelimit.HeavyHitter
	deny    map[netip.Prefix]denyState
	// An interface whose filter samples into a table this version
	// replaced (shield.HeavyHittersOlderFilter), or "".
	olderFilter string
}

type denyState struct {
	live, auto bool
	// monitor: an auto-block written in monitor mode, in force only while
	// moat monitors, whose hits are passed.
	monitor bool
	// own: the entry is the source's own (its host, or the row's prefix),
	// not a shorter prefix that covers it and others.
	own  bool
	hits uint64
}

// Flags of a list entry (struct prefix_rule, RULE_F_*).
const (
	ruleFAuto    = 2
	ruleFMonitor = 4
)

const historyLen = 30

func newTopCmd(g *globals) *cobra.Command {
	var (
		interval time.Duration
		count, n int
		by       string
		asJSON   bool
	)
	cmd := &cobra.Command{
		Use:   "top [--interval 1s] [-n 10] [--by packets|bytes] [--count N] [--json]",
		Short: "Live view of the heaviest sources: rates, verdicts and a sparkline each",
		Long: "Sources are sampled in the data path after the allow and deny lists (see moat limit config " +
			"--sample); a source blocked since it was sampled is shown with the rate its own denylist entry counts " +
			"(the address, or the /64 of an IPv6 row), or only as blocked when a shorter prefix covers it. " +
			"IPv6 sources are shown per /64. In monitor mode (moat policy monitor on) what a limit, port rule or " +
			"the denylist would drop passes: it counts under MONITORED PPS, not DROPPED PPS, and the verdict says " +
			"what enforcing would do (would be limited, would be blocked, would be auto-blocked).",
		Args: args(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if interval < 100*time.Millisecond {
				return usagef("invalid --interval %s: want at least 100ms", interval)
			}
			if by != "packets" && by != "bytes" {
				return usagef("invalid --by %q: want packets or bytes", by)
			}
			if n < 1 {
				return usagef("invalid -n %d: want at least 1 source", n)
			}
			if count < 0 {
				return usagef("invalid --count %d: want 0 (run until interrupted) or more intervals", count)
			}
			out := cmd.OutOrStdout()
			tty := !asJSON && writerIsTerminal(out)
			prev, err := readTop(g, true)
			if err != nil {
				return err
			}
			if prev.olderFilter != "" {
				fmt.Fprintf(cmd.ErrOrStderr(), "moat: warning: %s runs an older moat's filter, whose sources these rates miss; run `moat attach %s` to load this version's\n", prev.olderFilter, prev.olderFilter)
			}
			hist := map[netip.Prefix][]float64{}
			for i := 0; count == 0 || i < count; i++ {
				time.Sleep(interval)
				cur, err := readTop(g, false)
				if err != nil {
					return err
				}
				rep := topReport(prev, cur, hist, by, n)
				prev = cur
				if asJSON {
					if err := writeJSONLine(out, rep); err != nil {
						return err
					}
					continue
				}
				if tty {
					fmt.Fprint(out, "\x1b[H\x1b[2J")
				}
				if err := printTop(out, rep, by); err != nil {
					return err
				}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.DurationVar(&interval, "interval", time.Second, "time between reads")
	f.IntVarP(&n, "n", "n", 10, "sources to show")
	f.IntVarP(&count, "count", "c", 0, "stop after this many intervals (0: run until interrupted)")
	f.StringVar(&by, "by", "packets", "order by packets or bytes")
	f.BoolVar(&asJSON, "json", false, "print one JSON object per interval")
	return cmd
}

func writerIsTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// writeJSONLine writes v as one line of compact JSON.
func writeJSONLine(w io.Writer, v any) error {
	return json.NewEncoder(w).Encode(v)
}

// readTop opens the state only for the read, so the lock is not held
// between intervals. The first read also looks for a filter that samples
// into a table this version replaced.
func readTop(g *globals, first bool) (topSample, error) {
	s, m, err := openLimits(g.openExistingAsIs)
	if err != nil {
		return topSample{}, err
	}
	defer s.Close()
	cfg, err := m.Config()
	if err != nil {
		return topSample{}, err
	}
	set, err := s.Settings()
	if err != nil {
		return topSample{}, err
	}
	hh, err := m.HeavyHitters()
	if err != nil {
		return topSample{}, err
	}
	ts := topSample{at: time.Now(), sample: cfg.Sample, monitor: set.Monitor, hh: map[netip.Prefix]ratelimit.HeavyHitter{}, deny: map[netip.Prefix]denyState{}}
	now := bootNanos()
	for _, h := range hh {
		ts.hh[h.Source] = h
		if d, ok := denyOf(s, h.Source, now); ok {
			// A monitor mode auto-block is in force only while moat
			// monitors (the data path ignores it otherwise).
			d.live = d.live && (!d.monitor || set.Monitor)
			ts.deny[h.Source] = d
		}
	}
	if first {
		ts.olderFilter, _ = s.HeavyHittersOlderFilter()
	}
	return ts, nil
}

func bootNanos() uint64 {
	var t unix.Timespec
	unix.ClockGettime(unix.CLOCK_BOOTTIME, &t)
	return uint64(t.Nano())
}

// denyOf finds the denylist entry that covers a source: its host entry or
// the longest prefix in the trie, which may be the source's own.
func denyOf(s *shield.Shield, p netip.Prefix, now uint64) (denyState, bool) {
	var v datapath.MoatPrefixRule
	found := false
	a := p.Addr()
	if a.Is4() {
		if s.Map(datapath.MoatMapDenyV4Hosts).Lookup(datapath.MoatHostV4{Addr: a.As4()}, &v) == nil {
			found = true
		} else if s.Map(datapath.MoatMapDenyV4Nets).Lookup(datapath.MoatNetV4{Prefixlen: 32, Addr: a.As4()}, &v) == nil {
			found = true
		}
	} else if s.Map(datapath.MoatMapDenyV6Nets).Lookup(datapath.MoatNetV6{Prefixlen: uint32(p.Bits()), Addr: a.As16()}, &v) == nil {
		found = true
	}
	if !found {
		return denyState{}, false
	}
	return denyState{live: v.ExpiresNs == 0 || v.ExpiresNs > now, auto: v.Flags&ruleFAuto != 0, monitor: v.Flags&ruleFMonitor != 0,
		own: int(v.Prefixlen) == p.Bits(), hits: v.Hits}, true
}

func topReport(prev, cur topSample, hist map[netip.Prefix][]float64, by string, n int) TopReport {
	dt := cur.at.Sub(prev.at).Seconds()
	rep := TopReport{Time: cur.at, Interval: dt, Sample: cur.sample, Monitor: cur.monitor}
	var rows []TopRow
	for src, h := range cur.hh {
		p := prev.hh[src] // zero for a source new in this interval
		if h.Packets < p.Packets || h.Bytes < p.Bytes || h.Dropped < p.Dropped || h.Monitored < p.Monitored {
			p = ratelimit.HeavyHitter{} // evicted and back: counts restarted
		}
		r := TopRow{
			Source:       src,
			PPS:          float64(h.Packets-p.Packets) / dt,
			Mbps:         float64(h.Bytes-p.Bytes) * 8 / dt / 1e6,
			DroppedPPS:   float64(h.Dropped-p.Dropped) / dt,
			MonitoredPPS: float64(h.Monitored-p.Monitored) / dt,
			Verdict:      "pass",
		}
		switch {
		case r.DroppedPPS > 0:
			r.Verdict = "limited"
		case r.MonitoredPPS > 0:
			r.Verdict = "would be limited"
		}
		if d, ok := cur.deny[src]; ok && d.live {
			// In monitor mode the entry's hits pass, and a monitor mode
			// auto-block only ever has such hits. The mode at the end of
			// the interval stands for the whole of it.
			passed := d.monitor || cur.monitor
			// Blocked packets never reach the sampler: their rate is what
			// the denylist entry counted (exactly, not sampled). Only the
			// source's own entry: a covering prefix counts every source
			// it covers, and would add their sum to each.
			if pd, ok := prev.deny[src]; ok && d.own && pd.own && d.hits >= pd.hits {
				blocked := float64(d.hits-pd.hits) / dt
				r.PPS += blocked
				if passed {
					r.MonitoredPPS += blocked
				} else {
					r.DroppedPPS += blocked
				}
			}
			r.Verdict = "blocked"
			if d.auto {
				r.Verdict = "auto-blocked"
			}
			if passed {
				r.Verdict = "would be " + r.Verdict
			}
		}
		hs := append(hist[src], r.PPS)
		if len(hs) > historyLen {
			hs = hs[len(hs)-historyLen:]
		}
		hist[src] = hs
		r.History = append([]float64(nil), hs...)
		rows = append(rows, r)
	}
	for src := range hist {
		if _, ok := cur.hh[src]; !ok {
			delete(hist, src)
		}
	}
	sort.Slice(rows, func(i, j int) bool {
		if by == "bytes" && rows[i].Mbps != rows[j].Mbps {
			return rows[i].Mbps > rows[j].Mbps
		}
		if rows[i].PPS != rows[j].PPS {
			return rows[i].PPS > rows[j].PPS
		}
		return rows[i].Source.Addr().Less(rows[j].Source.Addr())
	})
	if len(rows) > n {
		rows = rows[:n]
	}
	if rows == nil {
		rows = []TopRow{}
	}
	rep.Sources = rows
	return rep
}

var sparks = []rune("▁▂▃▄▅▆▇█")

// sparkline draws values scaled to their maximum.
func sparkline(vs []float64) string {
	var mx float64
	for _, v := range vs {
		mx = max(mx, v)
	}
	var b strings.Builder
	for _, v := range vs {
		i := 0
		if mx > 0 {
			i = int(v / mx * float64(len(sparks)-1))
		}
		b.WriteRune(sparks[i])
	}
	return b.String()
}

func printTop(w io.Writer, rep TopReport, by string) error {
	mode := ""
	if rep.Monitor {
		mode = "  MONITOR MODE"
	}
	fmt.Fprintf(w, "moat top  %s  interval %.1fs  sampling 1/%d  by %s%s\n\n", rep.Time.Format("15:04:05"), rep.Interval, rep.Sample, by, mode)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SOURCE\tPPS\tMBIT/S\tDROPPED PPS\tMONITORED PPS\tVERDICT\tHISTORY")
	for _, r := range rep.Sources {
		fmt.Fprintf(tw, "%s\t%.0f\t%.2f\t%.0f\t%.0f\t%s\t%s\n", r.Source, r.PPS, r.Mbps, r.DroppedPPS, r.MonitoredPPS, r.Verdict, sparkline(r.History))
	}
	return tw.Flush()
}
