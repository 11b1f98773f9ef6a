package bench

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// Results is everything one run measured; results.json is this, and
// results.md is written from it.
type Results struct {
	Started   time.Time       `json:"started"`
	Finished  time.Time       `json:"finished"`
	Quick     bool            `json:"quick"`
	Machine   Machine         `json:"machine"`
	Config    ConfigDesc      `json:"config"`
	Setup     SetupTimes      `json:"setup"`
	Drop      *DropResult     `json:"drop_path,omitempty"`
	Syn       *SynResult      `json:"syn_flood,omitempty"`
	SynLegit  *SynLegitResult `json:"legit_under_syn_flood,omitempty"`
	Legit     *LegitResult    `json:"legit_under_attack,omitempty"`
	PathCost  *PathCostResult `json:"path_cost,omitempty"`
	Durations []PhaseTime     `json:"phase_durations"`
	Errors    []string        `json:"errors,omitempty"`
}

// SetupTimes are how long each contender took to take the denylist.
type SetupTimes struct {
	MoatLoad      string `json:"moat_denylist_load,omitempty"`
	NftLoad       string `json:"nft_sets_load,omitempty"`
	XDPFilterLoad string `json:"xdp_filter_addresses_load,omitempty"`
}

// PhaseTime is how long one comparison took.
type PhaseTime struct {
	Phase    string `json:"phase"`
	Duration string `json:"duration"`
}

// ConfigDesc is the run's configuration as recorded.
type ConfigDesc struct {
	Command       string    `json:"command"`
	Rounds        int       `json:"rounds"`
	DropFrames    uint64    `json:"drop_frames"`
	DenySize      int       `json:"deny_size"`
	FloodSources  string    `json:"flood_sources"`
	SynDuration   string    `json:"syn_duration"`
	LegitRounds   int       `json:"legit_rounds"`
	LegitWindow   string    `json:"legit_window"`
	LegitRates    []float64 `json:"legit_rates"`
	LegitRate     int       `json:"legit_requests_per_second"`
	LegitWorkers  int       `json:"legit_max_in_flight"`
	PathBenchtime string    `json:"path_benchtime"`
	Phases        []string  `json:"phases"`
}

func describeConfig(c Config) ConfigDesc {
	return ConfigDesc{
		Command: strings.Join(os.Args, " "), Rounds: c.Rounds, DropFrames: c.DropFrames, DenySize: c.DenySize,
		FloodSources: c.FloodSources.String(), SynDuration: c.SynDuration.String(),
		LegitRounds: c.LegitRounds, LegitWindow: c.LegitWindow.String(), LegitRates: c.LegitRates,
		LegitRate: c.LegitRate, LegitWorkers: c.LegitWorkers, PathBenchtime: c.PathBenchtime, Phases: c.Phases,
	}
}

// write puts results.json, the plots and results.md in the output directory.
func (b *Bench) write() error {
	if err := os.MkdirAll(b.cfg.Out, 0o755); err != nil {
		return err
	}
	if b.res.Legit != nil && len(b.res.Legit.Points) > 0 {
		name := "legit-under-attack.png"
		if err := plotLegit(b.res.Legit, filepath.Join(b.cfg.Out, name)); err != nil {
			b.res.Errors = append(b.res.Errors, "plot: "+err.Error())
		} else {
			b.res.Legit.Plot = name
		}
	}
	js, err := json.MarshalIndent(b.res, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(b.cfg.Out, "results.json"), append(js, '\n'), 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(b.cfg.Out, "results.md"), []byte(b.res.Markdown()), 0o644)
}

// jsonFloat turns NaN and infinities, which encoding/json refuses, into
// null: a measurement that has no value.
func jsonFloat(v float64) any {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return nil
	}
	return v
}

func (s Summary) MarshalJSON() ([]byte, error) {
	vals := make([]any, len(s.Values))
	for i, v := range s.Values {
		vals[i] = jsonFloat(v)
	}
	return json.Marshal(struct {
		Median any   `json:"median"`
		Min    any   `json:"min"`
		Max    any   `json:"max"`
		Values []any `json:"values"`
	}{jsonFloat(s.Median), jsonFloat(s.Min), jsonFloat(s.Max), vals})
}

func (r LegitRound) MarshalJSON() ([]byte, error) {
	type plain LegitRound // without this method
	return json.Marshal(struct {
		plain
		P50ms any `json:"p50_ms"`
		P99ms any `json:"p99_ms"`
	}{plain(r), jsonFloat(r.P50ms), jsonFloat(r.P99ms)})
}

func mpps(v float64) string {
	if math.IsNaN(v) {
		return "n/a"
	}
	return fmt.Sprintf("%.3f", v/1e6)
}

// pct2 shows a share with the precision a 99.9% goal needs.
func pct2(v float64) string {
	if math.IsNaN(v) {
		return "n/a"
	}
	return fmt.Sprintf("%.2f%%", 100*v)
}

func ratio(v float64) string {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return "n/a"
	}
	return fmt.Sprintf("%.2f", v)
}

func pct(v float64) string {
	if math.IsNaN(v) {
		return "n/a"
	}
	return fmt.Sprintf("%.1f%%", 100*v)
}

func ms(v float64) string {
	if math.IsNaN(v) {
		return "n/a"
	}
	if v >= 100 {
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.2f", v)
}

func spread(s Summary, f func(float64) string) string {
	return fmt.Sprintf("%s (%s – %s)", f(s.Median), f(s.Min), f(s.Max))
}

// goals gathers every comparison's goals, in the order of the sections.
func (r *Results) goals() []Goal {
	var out []Goal
	if r.Drop != nil {
		out = append(out, r.Drop.Goals...)
	}
	if r.Syn != nil {
		out = append(out, r.Syn.Goals...)
	}
	if r.SynLegit != nil {
		out = append(out, r.SynLegit.Goals...)
	}
	return out
}

// Markdown renders the results for a reader who runs nothing.
func (r *Results) Markdown() string {
	var w strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&w, format, args...) }
	m := r.Machine

	p("# moat benchmarks\n\n")
	p("Written by `make bench` (this run: `%s`), started %s UTC, finished %s UTC.\n\n",
		commandLine(r.Config.Command), r.Started.Format("2006-01-02 15:04:05"), r.Finished.Format("2006-01-02 15:04:05"))
	if r.Quick {
		p("**This is a quick smoke run (`-quick`): small counts and a small denylist. Do not quote these figures.**\n\n")
	}
	p("## Machine\n\n| | |\n|---|---|\n")
	p("| CPU | %s |\n| vCPUs | %d |\n| hypervisor | %s |\n| memory | %d MiB |\n| kernel | %s |\n| scheduler | %s |\n| Go | %s |\n| moat commit | %s |\n",
		m.CPU, m.VCPUs, orNone(m.Hypervisor), m.MemoryMB, m.Kernel, orNone(m.Scheduler), m.Go, orNone(m.Commit))
	for _, k := range []string{"nftables", "xdp-tools"} {
		p("| %s | %s |\n", k, orNone(m.Tools[k]))
	}
	p("| load average (1, 5, 15 min) before / after | %s / %s |\n\n", m.LoadBefore, m.LoadAfter)
	p("Everything runs in network namespaces on this one machine: an attacker, a client and a server joined by veth pairs (internal/lab). " +
		"Frames are generated in the kernel by `moat flood` (BPF_PROG_TEST_RUN with live frames) on one thread pinned to CPU 0. " +
		"On veth, the receiver of a frame runs on the sender's CPU, inside the generator's batches, so the generator's rate is the rate at which the receiver keeps up, unless a comparison says it gives the server a threaded NAPI thread on the other CPU; " +
		"absolute numbers are for this machine only, the ratios are what carries over. " +
		"Each comparison alternates its contenders within every repetition, so drift of the machine spreads over all of them. " +
		"Figures are median (min – max) over the repetitions.\n\n")
	if busy(m.LoadBefore, m.VCPUs) || busy(m.LoadAfter, m.VCPUs) {
		p("**The machine was busy with other work during this run** (load average above, on %d vCPUs): every contender ran with less CPU than it would alone and the spreads are wide. Compare contenders within this run, not with runs elsewhere.\n\n", m.VCPUs)
	}

	if goals := r.goals(); len(goals) > 0 {
		p("## Goals\n\n| goal | measured | met |\n|---|---|---|\n")
		for _, g := range goals {
			p("| %s | %s | %s |\n", g.Goal, g.Actual, yesNo(g.Met))
		}
		p("\n")
	}
	if d := r.Drop; d != nil {
		r.dropMarkdown(&w, d)
	}
	if s := r.Syn; s != nil {
		synMarkdown(&w, s)
	}
	if l := r.SynLegit; l != nil {
		synLegitMarkdown(&w, l)
	}
	if l := r.Legit; l != nil {
		legitMarkdown(&w, l)
	}
	if pc := r.PathCost; pc != nil {
		pathCostMarkdown(&w, pc)
	}

	p("## Run\n\n")
	p("Configuration: %d repetitions (drop path, SYN flood), %d frames per drop-path run, denylist of %d prefixes, flood sources %s, SYN floods of %s, %d rounds of %s per point for the legitimate clients.\n\n",
		r.Config.Rounds, r.Config.DropFrames, r.Config.DenySize, r.Config.FloodSources, r.Config.SynDuration, r.Config.LegitRounds, r.Config.LegitWindow)
	if r.Setup != (SetupTimes{}) {
		p("Loading the denylist: moat %s (batched map updates through internal/shield), nftables %s (`nft -f` of the interval sets), xdp-filter %s (one `xdp-filter ip` per address).\n\n",
			orNone(r.Setup.MoatLoad), orNone(r.Setup.NftLoad), orNone(r.Setup.XDPFilterLoad))
	}
	if len(r.Durations) > 0 {
		p("| phase | time |\n|---|---|\n")
		for _, d := range r.Durations {
			p("| %s | %s |\n", d.Phase, d.Duration)
		}
		p("\n")
	}
	if len(r.Errors) > 0 {
		p("**Errors:**\n\n")
		for _, e := range r.Errors {
			p("- %s\n", strings.ReplaceAll(e, "\n", " "))
		}
		p("\n")
	}
	return w.String()
}

func (r *Results) dropMarkdown(w *strings.Builder, d *DropResult) {
	p := func(format string, args ...any) { fmt.Fprintf(w, format, args...) }
	p("## 1. Drop path\n\n")
	p("Flood: %s; %d frames per run, %d repetitions; %s.\n\n", d.Flood, d.Frames, d.Rounds, d.Order)
	p("| receiver | Mpps | ratio to XDP_DROP floor | frames dropped by the receiver's own counter |\n|---|---|---|---|\n")
	for _, rx := range d.Receivers {
		var sent, dropped uint64
		verified := 0
		for _, run := range rx.Runs {
			sent += run.Sent
			dropped += run.Dropped
			if run.Verified {
				verified++
			}
		}
		check := fmt.Sprintf("%d of %d sent (%d/%d runs verified)", dropped, sent, verified, len(rx.Runs))
		p("| %s | %s | %s | %s |\n", rx.Name, spread(rx.PPS, mpps), spread(rx.RatioToFloor, pct), check)
	}
	p("\nWhat ran:\n\n")
	for _, rx := range d.Receivers {
		p("- **%s**: %s.\n", rx.Name, rx.What)
	}
	p("\n")
}

func synMarkdown(w *strings.Builder, s *SynResult) {
	p := func(format string, args ...any) { fmt.Fprintf(w, format, args...) }
	p("## 2. SYN flood: SYN-ACKs per second\n\n")
	p("Flood: %s; %d repetitions, receive modes and contenders alternating. SYN-ACKs are counted where they arrive, by an XDP program on the attacker's interface (the spoofed range is routed there), and divided by the flood's duration; "+
		"\"taken\" is what went into the server's veth ring, \"answered\" is SYN-ACKs counted per SYN taken. "+
		"Ratios are per round (each contender against the kernel's, or the reflector's, run of the same round and mode), median (min – max).\n\n", s.Flood, s.Rounds)
	for _, m := range s.Modes {
		p("### %s\n\n%s.\n\n", capitalize(m.Name), capitalize(m.Receive))
		if m.NAPI != "" {
			p("NAPI thread: %s. The last columns say how the flood's time went on the server's CPU: the share the NAPI thread ran, the share the CPU was idle "+
				"(whenever the server's ring runs dry: a server faster than the generator waits for frames), "+
				"and the SYN-ACKs per second of the time the CPU was not idle: the server CPU's capacity.\n\n", m.NAPI)
		}
		head, cols := "", ""
		if m.NAPI != "" {
			head, cols = " NAPI thread ran / its CPU idle | SYN-ACKs per second the CPU was busy (M) |", "---|---|"
		}
		p("| contender | SYN-ACKs sent per second (M) | SYNs sent (M/s) | SYNs taken (M/s) | answered | SYN-ACKs counted / own count | x kernel | of the reflector |%s\n|---|---|---|---|---|---|---|---|%s\n", head, cols)
		for _, c := range m.Contenders {
			var counted, own, taken uint64
			name := ""
			for _, r := range c.Runs {
				counted += r.SynAcks
				own += r.OwnCount
				taken += r.SynsTaken
				name = r.OwnCounter
			}
			napi := ""
			if m.NAPI != "" {
				napi = fmt.Sprintf(" %s / %s | %s |", pct(c.NAPIRan.Median), pct(c.ServerCPUIdle.Median), spread(c.SynAckPerCPU, mpps))
			}
			p("| %s | %s | %s | %s | %s | %d / %d (%s) | %s | %s |%s\n", c.Name, spread(c.SynAckPPS, mpps), spread(c.SynPPS, mpps), spread(c.TakenPPS, mpps),
				pct(float64(counted)/float64(max(taken, 1))), counted, own, name, spread(c.RatioToKernel, ratio), spread(c.RatioToReflector, pct), napi)
		}
		if s.MoatNote != "" {
			p("| moat | pending | | | | | | |\n")
		}
		p("\n")
	}
	p("What ran:\n\n")
	if len(s.Modes) > 0 {
		for _, c := range s.Modes[0].Contenders {
			p("- **%s**: %s.\n", c.Name, c.What)
		}
	}
	if s.MoatNote != "" {
		p("- **moat SYN cookies: pending.** %s\n", s.MoatNote)
	}
	p("\n")
	for _, n := range s.Notes {
		p("**Note:** %s.\n\n", n)
	}
}

func synLegitMarkdown(w *strings.Builder, l *SynLegitResult) {
	p := func(format string, args ...any) { fmt.Fprintf(w, format, args...) }
	p("## 3. Legitimate connections under a SYN flood\n\n")
	p("Flood: %s.\n\n", l.Flood)
	p("Receiving: %s.\n\n", l.Receive)
	p("Clients: %s.\n\n", l.Client)
	if l.CPUs != "" {
		p("Service CPUs: %s.\n\n", l.CPUs)
	}
	for _, wt := range l.What {
		p("- %s.\n", wt)
	}
	p("\nRounds: %d; in each, every contender gets an idle point and a flooded point per client placement and service CPUs, the contenders alternating. "+
		"\"answered\" and the percentiles pool every request of every round (per-round medians in results.json); latency is the whole request (connect, GET, reply), \"connect\" the TCP connect alone; a p99 ratio is, in each round, the flooded p99 over the same contender's idle p99 of that round with the same clients and service CPUs, and the table and the goals give the median of the rounds' ratios (min – max), so that one round disturbed by other work on the machine does not decide it; "+
		"\"taken\" is the flood that went into the server's ring, \"SYN-ACKs\" what came back to the attacker per second, \"NAPI thread ran / its CPU idle\" the shares of the point's time the server's NAPI thread was on its CPU and that CPU had nothing to run (results.json also has the share the thread waited behind other tasks). "+
		"Clients on the attacked link send their SYNs into the same 256-frame veth ring as the flood: whatever finds it full is dropped before any defence sees it, and a lost SYN is retransmitted only after the 1 s the request may take, "+
		"so their figures measure how fast the server empties the ring, not how well a defence tells users from the flood.\n\n", l.Rounds)
	p("| service CPUs | clients | defence | flood | offered (Mpps) | taken (Mpps) | SYN-ACKs (Mpps) | NAPI thread ran / its CPU idle | answered | p50 (ms) | p99 (ms) | p99 / idle | connect p50 (ms) | connect p99 (ms) | connect p99 / idle |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, pt := range l.Points {
		fl, off, tk, sa, r, cr := "none", "", "", "", "", ""
		if pt.Flood {
			fl = "full"
			off, tk, sa = spread(pt.FloodPPS, mpps), spread(pt.Taken, mpps), spread(pt.SynAckPPS, mpps)
			r, cr = spread(pt.P99RatioRounds, ratio), spread(pt.ConnectP99RatioRounds, ratio)
		}
		p("| %s | %s | %s | %s | %s | %s | %s | %s / %s | %s (%d/%d) | %s | %s | %s | %s | %s | %s |\n", pt.ServiceCPUs, pt.Placement, pt.Defence, fl, off, tk, sa, pct(pt.NAPIRan.Median), pct(pt.ServerCPUIdle.Median),
			pct2(float64(pt.Success)), pt.OK, pt.Attempts, ms(float64(pt.P50ms)), ms(float64(pt.P99ms)), r, ms(float64(pt.ConnectP50ms)), ms(float64(pt.ConnectP99ms)), cr)
	}
	p("\nThe defences' own counters, and why requests failed, summed over the rounds (a request fails when no complete reply comes within %s: a SYN lost at the server's full ring is sent again only after a second):\n\n"+
		"| service CPUs | clients | defence | flood | counters | failed requests |\n|---|---|---|---|---|---|\n", legitTimeout)
	for _, pt := range l.Points {
		p("| %s | %s | %s | %s | %s | %s |\n", pt.ServiceCPUs, pt.Placement, pt.Defence, floodWord(pt.Flood), countersText(pt.Counters), failuresText(pt.Failures))
	}
	p("\n")
	if len(l.Checks) > 0 {
		p("Checks, from those counters:\n\n| check | counted | holds |\n|---|---|---|\n")
		for _, c := range l.Checks {
			p("| %s | %s | %s |\n", c.Goal, c.Actual, yesNo(c.Met))
		}
		p("\n")
	}
	for _, n := range l.Notes {
		p("**Note:** %s.\n\n", n)
	}
}

// countersText lists the non-zero counters by name.
func countersText(c map[string]uint64) string {
	keys := make([]string, 0, len(c))
	for k, v := range c {
		if v != 0 {
			keys = append(keys, k)
		}
	}
	if len(keys) == 0 {
		return "all zero"
	}
	slices.Sort(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %d", k, c[k])
	}
	return strings.Join(parts, ", ")
}

// failuresText lists failed requests by kind, most first, or says none.
func failuresText(f map[string]int) string {
	if len(f) == 0 {
		return "none"
	}
	kinds := make([]string, 0, len(f))
	for k := range f {
		kinds = append(kinds, k)
	}
	slices.SortFunc(kinds, func(a, b string) int {
		if c := f[b] - f[a]; c != 0 {
			return c
		}
		return strings.Compare(a, b)
	})
	parts := make([]string, len(kinds))
	for i, k := range kinds {
		parts[i] = fmt.Sprintf("%s %d", k, f[k])
	}
	return strings.Join(parts, ", ")
}

func capitalize(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}

func legitMarkdown(w *strings.Builder, l *LegitResult) {
	p := func(format string, args ...any) { fmt.Fprintf(w, format, args...) }
	p("## 4. Legitimate service under a denied flood\n\n")
	p("Flood: %s. Generator maximum: %s Mpps (the same SYN flood, uncapped, into the XDP_DROP floor; median of 3).\n\n", l.Flood, spread(l.GeneratorMax, mpps))
	p("Receiving: %s.\n\n", l.Receive)
	p("Clients: %s.\n\n", l.Client)
	for _, wt := range l.What {
		p("- %s.\n", wt)
	}
	p("\n")
	if l.Plot != "" {
		p("![legitimate requests under a SYN flood](%s)\n\n", l.Plot)
	}
	p("\"offered\" is what the generator sent, \"taken\" what fitted in the server's receive ring; the rest was dropped at the full ring before any filter saw it. " +
		"How to read it: the flood is taken in by a kernel thread that the scheduler shares fairly with the service, so the flood cannot starve the service of CPU the way softirq processing on a real NIC can; " +
		"what a defence changes here is how much of the flood the server gets through (\"taken\"), and, for clients on the attacked link, how often their own frames find the ring full.\n\n")
	p("| clients | flood | defence | offered (Mpps) | taken (Mpps) | requests answered | p50 (ms) | p99 (ms) | failed requests, all rounds |\n|---|---|---|---|---|---|---|---|---|\n")
	for _, pt := range l.Points {
		rate := "none"
		switch {
		case pt.Fraction >= 1:
			rate = "100% (uncapped)"
		case pt.Fraction > 0:
			rate = fmt.Sprintf("%.0f%% (%s Mpps)", 100*pt.Fraction, mpps(pt.TargetPPS))
		}
		p("| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", pt.Placement, rate, pt.Defence, spread(pt.FloodPPS, mpps), spread(pt.Delivered, mpps),
			spread(pt.Success, pct), spread(pt.P50ms, ms), spread(pt.P99ms, ms), failuresText(pt.Failures))
	}
	p("\n")
}

func pathCostMarkdown(w *strings.Builder, pc *PathCostResult) {
	p := func(format string, args ...any) { fmt.Fprintf(w, format, args...) }
	p("## 5. Per-path cost\n\n`%s` (internal/datapath's BenchmarkVerdictPaths: BPF_PROG_TEST_RUN of moat_filter over one TCP SYN frame per path, a million runs per iteration; ns/op is nanoseconds per packet).\n\n", pc.Command)
	if pc.Note != "" {
		p("%s.\n\n", pc.Note)
	}
	if len(pc.Benchmarks) > 0 {
		p("| benchmark | figures |\n|---|---|\n")
		for _, b := range pc.Benchmarks {
			var fs []string
			for _, u := range b.Units {
				fs = append(fs, fmt.Sprintf("%g %s", b.Metrics[u], u))
			}
			p("| %s | %s |\n", b.Name, strings.Join(fs, ", "))
		}
		p("\n")
	}
	if pc.Printed != "" {
		p("What the benchmark prints:\n\n```\n%s\n```\n\n", pc.Printed)
	}
	if pc.Output != "" {
		p("```\n%s\n```\n\n", pc.Output)
	}
	if pc.EstablishedCommand == "" {
		return
	}
	p("### The SYN defence on established traffic\n\n`%s` (internal/syncookie's BenchmarkPerPacket: BPF_PROG_TEST_RUN of moat_filter in a scratch namespace that holds one established loopback connection, so that socket lookups are real; ns/pkt is nanoseconds per packet).\n\n", pc.EstablishedCommand)
	if ns, ratio, ok := pc.EstablishedExtra(); ok {
		p("An established connection's ACK to a port in `auto` mode with no flood takes **%+.1f ns** per packet more than with the same port unprotected (ratio %.3f; median of 9 rounds, each measuring the two side by side, in alternating order; a figure within a few nanoseconds of zero is the noise of the measurement).\n\n", ns, ratio)
	}
	if len(pc.Established) > 0 {
		p("| benchmark | figures |\n|---|---|\n")
		for _, b := range pc.Established {
			var fs []string
			for _, u := range b.Units {
				if u == "ns/op" {
					continue // the whole iteration's time, not a packet's
				}
				fs = append(fs, fmt.Sprintf("%g %s", b.Metrics[u], u))
			}
			p("| %s | %s |\n", b.Name, strings.Join(fs, ", "))
		}
		p("\n")
	}
	if pc.EstablishedOutput != "" {
		p("```\n%s\n```\n\n", pc.EstablishedOutput)
	}
}

func orNone(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "**no**"
}

// busy tells whether a load average (first field of /proc/loadavg) shows
// more runnable work than half the CPUs: other work shared the machine.
func busy(loadavg string, cpus int) bool {
	f := strings.Fields(loadavg)
	if len(f) == 0 || cpus == 0 {
		return false
	}
	var l float64
	if _, err := fmt.Sscanf(f[0], "%g", &l); err != nil {
		return false
	}
	return l > float64(cpus)/2
}

// commandLine shows how the run was started, with go run's temporary
// binary named as the command it was built from.
func commandLine(cmd string) string {
	f := strings.Fields(cmd)
	if len(f) == 0 {
		return "moat-bench"
	}
	if strings.Contains(f[0], "go-build") {
		f[0] = "go run ./cmd/moat-bench"
	}
	return strings.Join(f, " ")
}
