package bench

import (
	"encoding/json"
	"math"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/google/gopacket/layers"

	"github.com/moat-shield/moat/internal/flood"
	"github.com/moat-shield/moat/internal/testpkt"
)

func TestNAPICommPrefix(t *testing.T) {
	for dev, want := range map[string]string{
		"eth0":         "napi/eth0-",
		"to-attacker":  "napi/to-attacke", // 15 bytes: the kernel keeps no more
		"veth12345678": "napi/veth123456",
		"to-client":    "napi/to-client-",
	} {
		if got := napiCommPrefix(dev); got != want {
			t.Errorf("napiCommPrefix(%q) = %q, want %q", dev, got, want)
		}
	}
}

func TestNewNAPIThreads(t *testing.T) {
	before := map[int]string{10: "napi/to-attacke", 11: "napi/eth0-8193"}
	after := map[int]string{
		10: "napi/to-attacke", // there before: another lab's device of the same name
		11: "napi/eth0-8193",
		20: "napi/to-attacke",
		21: "napi/to-client-",
		22: "napi/to-attacke",
	}
	if got, want := newNAPIThreads(before, after, "to-attacker"), []int{20, 22}; !slices.Equal(got, want) {
		t.Errorf("new threads of to-attacker: %v, want %v", got, want)
	}
	if got := newNAPIThreads(after, after, "to-attacker"); len(got) != 0 {
		t.Errorf("nothing new, got %v", got)
	}
}

func TestStatFlags(t *testing.T) {
	// A kernel thread's stat line; the name holds a space and a parenthesis.
	line := "4242 (napi/a b) c) S 2 0 0 0 -1 2129984 0 0 0 0 0 12 0 0 20 0 1 0 100 0 0"
	flags, ok := statFlags(line)
	if !ok || flags != 2129984 || flags&pfKthread == 0 {
		t.Errorf("statFlags = %d, %t; want 2129984 with PF_KTHREAD", flags, ok)
	}
	if _, ok := statFlags("4242 (cut"); ok {
		t.Error("a line without the name's end parsed")
	}
}

func TestParseSchedstat(t *testing.T) {
	ran, waited, ok := parseSchedstat("1500000000 250000 17\n")
	if !ok || ran.Seconds() != 1.5 || waited.Microseconds() != 250 {
		t.Errorf("parseSchedstat = %v, %v, %t", ran, waited, ok)
	}
	if _, _, ok := parseSchedstat("12"); ok {
		t.Error("one field parsed")
	}
}

func TestCPUTicks(t *testing.T) {
	stat := "cpu  300 0 600 900 10 0 20 0 0 0\ncpu0 100 0 200 300 5 0 10 0 0 0\ncpu1 200 0 400 600 5 0 10 0 0 0\nintr 1 2 3\n"
	t0, err := parseCPUTicks(stat, 1)
	if err != nil || t0 != (cpuTicks{idle: 605, total: 1215}) {
		t.Fatalf("cpu1: %+v, %v", t0, err)
	}
	if _, err := parseCPUTicks(stat, 2); err == nil {
		t.Error("a CPU that /proc/stat lacks parsed")
	}
	// 100 ticks later, 25 of them idle or waiting for I/O.
	t1 := cpuTicks{idle: t0.idle + 25, total: t0.total + 100}
	if got := t1.idleShareSince(t0); got != 0.25 {
		t.Errorf("idle share %v, want 0.25", got)
	}
	if got := t0.idleShareSince(t0); got != 0 {
		t.Errorf("no ticks: idle share %v", got)
	}
}

// synContender makes a contender whose run in round i+1 has SYN-ACK rate
// rates[i]; NaN makes that run invalid.
func synContender(name string, rates ...float64) *SynContender {
	c := &SynContender{Name: name}
	for i, r := range rates {
		run := SynRun{Round: i + 1, SynPPS: 1e6, TakenPPS: 1e6, SynAckPPS: r, Valid: !math.IsNaN(r), Answered: 1}
		if !run.Valid {
			run.SynAckPPS, run.Answered = 1000, 0.5
		}
		c.Runs = append(c.Runs, run)
	}
	return c
}

func TestSummarizeSynRatios(t *testing.T) {
	kernel := synContender(synKernel, 100e3, 120e3, 110e3)
	moat := synContender(synMoat, 500e3, math.NaN(), 990e3)
	refl := synContender(synReflector, 2e6, 2.4e6, 1.1e6)
	for _, c := range []*SynContender{kernel, refl} {
		if note := summarizeSyn(c, kernel, refl); note != "" {
			t.Errorf("%s: note %q for valid runs", c.Name, note)
		}
	}
	note := summarizeSyn(moat, kernel, refl)
	if !strings.Contains(note, "1 of 3 runs") {
		t.Errorf("moat's note: %q", note)
	}
	if got := moat.RatioToKernel.Values; got[0] != 5 || !math.IsNaN(got[1]) || got[2] != 9 {
		t.Errorf("ratios to the kernel per round: %v, want [5 NaN 9]", got)
	}
	if moat.RatioToKernel.Median != 7 || moat.SynAckPPS.Median != 745e3 {
		t.Errorf("medians: ratio %v, rate %v", moat.RatioToKernel.Median, moat.SynAckPPS.Median)
	}
	if got := moat.RatioToReflector.Values; got[0] != 0.25 || got[2] != 0.9 {
		t.Errorf("ratios to the reflector: %v", got)
	}
	if kernel.RatioToKernel.Median != 1 {
		t.Errorf("the kernel against itself: %v", kernel.RatioToKernel.Median)
	}

	res := &SynResult{Modes: []*SynMode{
		{Name: synSameCPU, Contenders: []*SynContender{kernel, moat, refl}},
	}}
	goals := synGoals(res)
	if len(goals) != 1 || goals[0].Met || !strings.Contains(goals[0].Actual, "7.00x") {
		t.Fatalf("goals with moat at 7x: %+v", goals)
	}
	fast := synContender(synMoat, 1e6, 1e6, 1e6)
	summarizeSyn(fast, kernel, refl)
	res.Modes = append(res.Modes, &SynMode{Name: synSeparateCPU, Contenders: []*SynContender{kernel, fast, refl}})
	goals = synGoals(res)
	if len(goals) != 2 || !goals[1].Met || !strings.Contains(goals[1].Goal, synSeparateCPU) {
		t.Errorf("goals with moat at 9x and more: %+v", goals)
	}
}

// TestSlowReflectorNote: rounds where the reflector fell below two thirds
// of its fastest are named, with whether the kernel slowed there too.
func TestSlowReflectorNote(t *testing.T) {
	for _, tc := range []struct {
		name         string
		kernel, refl []float64
		want         []string // in the note; none: no note
	}{
		{"steady", []float64{100e3, 120e3, 110e3}, []float64{4e6, 4.4e6, 3e6}, nil},
		{"one slow round, kernel steady", []float64{100e3, 120e3, 110e3}, []float64{4e6, 4.4e6, 2.5e6},
			[]string{"2.500 to 4.400 M/s", "in round 3,", "kept its rate (0.110 M/s there, 0.110 M/s in the other rounds)"}},
		{"two slow rounds, kernel slow too", []float64{50e3, 120e3, 60e3}, []float64{2e6, 4.4e6, 2.5e6},
			[]string{"in rounds 1, 3,", "the kernel ran slower there too (0.055 M/s, 0.120 M/s"}},
		{"a slow round that gave no rate is left out", []float64{100e3, 120e3, 110e3}, []float64{4e6, 4.4e6, math.NaN()}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			kernel, refl := synContender(synKernel, tc.kernel...), synContender(synReflector, tc.refl...)
			summarizeSyn(kernel, kernel, refl)
			summarizeSyn(refl, kernel, refl)
			checkNote(t, slowReflectorNote(kernel, refl), tc.want)
		})
	}
}

// checkNote: a note holds every string of want; none at all when want is
// nil.
func checkNote(t *testing.T, note string, want []string) {
	t.Helper()
	if want == nil && note != "" {
		t.Fatalf("note %q, want none", note)
	}
	for _, w := range want {
		if !strings.Contains(note, w) {
			t.Errorf("note %q lacks %q", note, w)
		}
	}
}

// TestWaitingReflectorNote: a reflector whose CPU idled for a fifth of the
// flood or more is named as the generator's rate, with the per-busy-second
// rates beside it.
func TestWaitingReflectorNote(t *testing.T) {
	withCPU := func(c *SynContender, idle, perCPU float64) *SynContender {
		for i := range c.Runs {
			c.Runs[i].NAPI = &NAPIShares{Seconds: 3, Ran: 1 - idle, CPUIdle: idle}
			c.Runs[i].SynAckPerCPU = perCPU
		}
		return c
	}
	for _, tc := range []struct {
		name string
		idle float64
		want []string // in the note; none: no note
	}{
		{"busy", 0.05, nil},
		{"waiting", 0.5, []string{"idle 50% of the flood", "reflector answered 8.000 M/s and moat 4.000 M/s (50%)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			moat := withCPU(synContender(synMoat, 3.5e6, 3.6e6), 0.1, 4e6)
			refl := withCPU(synContender(synReflector, 4e6, 4.1e6), tc.idle, 8e6)
			summarizeSyn(moat, nil, refl)
			summarizeSyn(refl, nil, refl)
			checkNote(t, waitingReflectorNote(moat, refl), tc.want)
		})
	}
}

// synLegitFixture is the kernel and moat, idle and flooded, clients on their
// own link and the service apart from the NAPI thread, over two rounds; and
// the kernel with the service sharing the NAPI thread's CPU.
func synLegitFixture() *SynLegitResult {
	lat := func(n int, v float64) []float64 { return slices.Repeat([]float64{v}, n) }
	point := func(d string, flood bool, rounds ...SynLegitRound) *SynLegitPoint {
		p := &SynLegitPoint{Defence: d, Placement: placeOwnLink, ServiceCPUs: cpusApart, Flood: flood, Rounds: rounds}
		for i, r := range p.Rounds {
			// Every answered request took 1 ms, but one in a hundred 3 ms
			// idle and two in a hundred 5 ms flooded; their connects 0.5
			// ms, the slow ones' 1.5 ms idle and 0.9 ms flooded.
			slow, slowConn, n := 3.0, 1.5, r.OK/100
			if flood {
				slow, slowConn, n = 5, 0.9, 2*r.OK/100
			}
			rl := latencies{
				request: append(lat(r.OK-n, 1), lat(n, slow)...),
				connect: append(lat(r.OK-n, 0.5), lat(n, slowConn)...),
			}
			p.Rounds[i].P99ms, p.Rounds[i].ConnectP99ms = jsonNum(Percentile(rl.request, 99)), jsonNum(Percentile(rl.connect, 99))
			p.lat.add(rl)
		}
		return p
	}
	// With the service on the NAPI thread's CPU every request took 2 ms
	// idle and 8 ms flooded.
	shared := func(flood bool, rounds ...SynLegitRound) *SynLegitPoint {
		p := &SynLegitPoint{Defence: slKernel, Placement: placeOwnLink, ServiceCPUs: cpusShared, Flood: flood, Rounds: rounds}
		v := 2.0
		if flood {
			v = 8
		}
		for i, r := range p.Rounds {
			p.Rounds[i].P99ms, p.Rounds[i].ConnectP99ms = jsonNum(v), jsonNum(v/2)
			p.lat.add(latencies{request: lat(r.OK, v), connect: lat(r.OK, v/2)})
		}
		return p
	}
	round := func(n, attempts, ok int, counters map[string]uint64) SynLegitRound {
		return SynLegitRound{Round: n, Attempts: attempts, OK: ok, P50ms: 1, FloodPPS: 4e6, Taken: 5e5, SynAckPPS: 5e5, Counters: counters}
	}
	withFailures := func(r SynLegitRound, f map[string]int) SynLegitRound {
		r.Failures = f
		return r
	}
	return &SynLegitResult{Rounds: 2, Points: []*SynLegitPoint{
		point(slFloor, false, round(1, 400, 400, nil), round(2, 400, 400, nil)),
		point(slFloor, true, round(1, 400, 400, map[string]uint64{"xdp_drops": 9000000}), round(2, 400, 400, nil)),
		point(slKernel, false, round(1, 400, 400, nil), round(2, 400, 400, nil)),
		point(slMoat, false,
			round(1, 400, 400, map[string]uint64{"cookies_issued": 400, "cookies_accepted": 400}),
			round(2, 400, 400, map[string]uint64{"cookies_issued": 400, "cookies_accepted": 400})),
		point(slKernel, true,
			withFailures(round(1, 400, 398, map[string]uint64{"SyncookiesSent": 300000, "SyncookiesRecv": 398}), map[string]int{"reply reset": 1, "connect timed out": 1}),
			round(2, 400, 400, map[string]uint64{"SyncookiesSent": 310000, "SyncookiesRecv": 400})),
		point(slMoat, true,
			round(1, 400, 400, map[string]uint64{"cookies_issued": 900000, "cookies_accepted": 400, "syns": 900000}),
			round(2, 400, 400, map[string]uint64{"cookies_issued": 950000, "cookies_accepted": 399, "syns": 950000, "accept_errors": 1})),
		shared(false, round(1, 400, 400, nil)),
		shared(true, round(1, 400, 400, map[string]uint64{"SyncookiesSent": 300000, "SyncookiesRecv": 400})),
	}}
}

func TestSynLegitSummaries(t *testing.T) {
	res := synLegitFixture()
	summarizeSynLegit(res)
	kIdle, mIdle, kFlood, mFlood := res.Points[2], res.Points[3], res.Points[4], res.Points[5]
	if kFlood.Attempts != 800 || kFlood.OK != 798 || float64(kFlood.Success) != 798.0/800 {
		t.Errorf("kernel flooded pooled: %d/%d = %v", kFlood.OK, kFlood.Attempts, kFlood.Success)
	}
	if kFlood.SuccessRounds.Values[0] != 398.0/400 || kFlood.SuccessRounds.Values[1] != 1 {
		t.Errorf("kernel flooded per round: %v", kFlood.SuccessRounds.Values)
	}
	// Eight of the 800 latencies are slow: the 99th percentile (rank 792)
	// is still 1 ms, the 99.5th is not.
	if kIdle.P99ms != 1 || kIdle.P50ms != 1 {
		t.Errorf("kernel idle p50 %v p99 %v", kIdle.P50ms, kIdle.P99ms)
	}
	if mIdle.P99Ratio != 0 || mIdle.IdleP99ms != 0 {
		t.Errorf("an idle point has a ratio: %v", mIdle.P99Ratio)
	}
	// 16 of the 800 flooded latencies are slow: rank 792 is one of them.
	if mFlood.P99ms != 5 || mFlood.IdleP99ms != 1 || mFlood.P99Ratio != 5 {
		t.Errorf("moat flooded p99 %v, idle %v, ratio %v", mFlood.P99ms, mFlood.IdleP99ms, mFlood.P99Ratio)
	}
	if mFlood.ConnectP99ms != 0.9 || mFlood.IdleConnectP99ms != 0.5 || math.Abs(float64(mFlood.ConnectP99Ratio)-1.8) > 1e-9 {
		t.Errorf("moat flooded connect p99 %v, idle %v, ratio %v", mFlood.ConnectP99ms, mFlood.IdleConnectP99ms, mFlood.ConnectP99Ratio)
	}
	// Each flooded point is set against the idle point of its own layout.
	if kFlood.IdleP99ms != 1 {
		t.Errorf("kernel flooded, service apart: idle p99 %v, want the apart idle point's 1 ms", kFlood.IdleP99ms)
	}
	if sFlood := res.Points[7]; sFlood.P99ms != 8 || sFlood.IdleP99ms != 2 || sFlood.P99Ratio != 4 || sFlood.ConnectP99Ratio != 4 {
		t.Errorf("kernel flooded, service shared: p99 %v, idle %v, ratio %v, connect ratio %v", sFlood.P99ms, sFlood.IdleP99ms, sFlood.P99Ratio, sFlood.ConnectP99Ratio)
	}
	if mFlood.Counters["cookies_accepted"] != 799 || mFlood.Counters["cookies_issued"] != 1850000 {
		t.Errorf("moat flooded counters: %v", mFlood.Counters)
	}

	goals := synLegitGoals(res)
	if len(goals) != 9 {
		t.Fatalf("%d goals, want 9 (3 per flooded point but the control's): %+v", len(goals), goals)
	}
	byGoal := map[string]Goal{}
	for _, g := range goals {
		byGoal[g.Goal] = g
	}
	kSucc := byGoal["kernel, clients on the own link, service apart from the NAPI thread: at least 99.9% of requests answered under the SYN flood"]
	mSucc := byGoal["moat, clients on the own link, service apart from the NAPI thread: at least 99.9% of requests answered under the SYN flood"]
	if kSucc.Met || !strings.Contains(kSucc.Actual, "99.75% (798 of 800)") {
		t.Errorf("kernel success goal: %+v", kSucc)
	}
	if !mSucc.Met || !strings.Contains(mSucc.Actual, "100.00%") {
		t.Errorf("moat success goal: %+v", mSucc)
	}
	if p := byGoal["moat, clients on the own link, service apart from the NAPI thread: p99 of the whole request under the SYN flood at most 2x idle"]; p.Met || p.Actual != "5.00x (median of per-round ratios; min 5.00x, max 5.00x); pooled 5.00 ms flooded, 1.00 ms idle" {
		t.Errorf("moat p99 goal: %+v", p)
	}
	if p := byGoal["moat, clients on the own link, service apart from the NAPI thread: p99 of the TCP connect under the SYN flood at most 2x idle"]; !p.Met || p.Actual != "1.80x (median of per-round ratios; min 1.80x, max 1.80x); pooled 0.90 ms flooded, 0.50 ms idle" {
		t.Errorf("moat connect p99 goal: %+v", p)
	}
	if p := byGoal["kernel, clients on the own link, service sharing the NAPI thread's CPU: p99 of the whole request under the SYN flood at most 2x idle"]; p.Met || p.Actual != "4.00x (median of per-round ratios; min 4.00x, max 4.00x); pooled 8.00 ms flooded, 2.00 ms idle" {
		t.Errorf("kernel p99 goal, service shared: %+v", p)
	}

	checks, notes := synLegitChecks(res)
	var failed []string
	for _, c := range checks {
		if !c.Met {
			failed = append(failed, c.Goal)
		}
	}
	// moat accepted 799 cookies for 800 answered requests when flooded.
	if len(failed) != 1 || !strings.Contains(failed[0], "moat: the clients' connections completed on moat's cookies (under the flood") {
		t.Errorf("failed checks: %q", failed)
	}
	if len(checks) != 5 {
		t.Errorf("%d checks, want 5 (moat idle accepts; moat flooded issues and accepts; kernel cookies in both layouts): %+v", len(checks), checks)
	}
	if len(notes) != 1 || !strings.Contains(notes[0], "1 accept errors") {
		t.Errorf("notes: %q", notes)
	}
	floor := synLegitFloorNote(res, cpusApart)
	if !strings.Contains(floor, "p99 is 5.00 ms under the flood and 1.00 ms idle (pooled; 5.00x, the median of per-round ratios)") || !strings.Contains(floor, "kernel 5.00 ms, moat 5.00 ms") {
		t.Errorf("control note: %q", floor)
	}
	if n := synLegitFloorNote(res, cpusShared); n != "" {
		t.Errorf("a control note for a layout without controls: %q", n)
	}
}

// A round that other work on the machine slowed, idle, makes the pooled
// ratio look good; the median of the rounds' ratios is not moved by it.
func TestSynLegitRatioPerRound(t *testing.T) {
	point := func(flood bool, p99s ...float64) *SynLegitPoint {
		p := &SynLegitPoint{Defence: slMoat, Placement: placeOwnLink, ServiceCPUs: cpusApart, Flood: flood}
		for i, v := range p99s {
			p.Rounds = append(p.Rounds, SynLegitRound{Round: i + 1, Attempts: 100, OK: 100, P99ms: jsonNum(v), ConnectP99ms: jsonNum(v / 2)})
			p.lat.add(latencies{request: slices.Repeat([]float64{v}, 100), connect: slices.Repeat([]float64{v / 2}, 100)})
		}
		return p
	}
	res := &SynLegitResult{Rounds: 3, Points: []*SynLegitPoint{point(false, 1, 20, 1), point(true, 3, 3, 3)}}
	summarizeSynLegit(res)
	f := res.Points[1]
	if f.P99Ratio >= 1 {
		t.Errorf("pooled ratio %v: the disturbed idle round should dominate it", f.P99Ratio)
	}
	if f.P99RatioRounds.Median != 3 || f.P99RatioRounds.Min != 0.15 || f.P99RatioRounds.Max != 3 {
		t.Errorf("per-round ratios %+v, want median 3, min 0.15, max 3", f.P99RatioRounds)
	}
	if f.ConnectP99RatioRounds.Median != 3 {
		t.Errorf("connect per-round ratios %+v, want median 3", f.ConnectP99RatioRounds)
	}
	var p99Goal Goal
	for _, g := range synLegitGoals(res) {
		if strings.Contains(g.Goal, "p99 of the whole request") {
			p99Goal = g
		}
	}
	if p99Goal.Met || !strings.HasPrefix(p99Goal.Actual, "3.00x (median of per-round ratios; min 0.15x, max 3.00x)") {
		t.Errorf("p99 goal: %+v", p99Goal)
	}
}

func TestSynReportRendersAndEncodes(t *testing.T) {
	kernel := synContender(synKernel, 100e3, 120e3)
	moat := synContender(synMoat, 500e3, math.NaN())
	refl := synContender(synReflector, 2e6, 2.4e6)
	for _, c := range []*SynContender{kernel, moat, refl} {
		c.What = c.Name + " ran"
		summarizeSyn(c, kernel, refl)
	}
	syn := &SynResult{Flood: "a flood", Rounds: 2, Modes: []*SynMode{
		{Name: synSameCPU, Receive: "inside the batches", Contenders: []*SynContender{kernel, moat, refl}},
		{Name: synSeparateCPU, Receive: "threaded", NAPI: "napi/x (pid 1) pinned to CPU 1", Contenders: []*SynContender{kernel, moat, refl}},
	}}
	syn.Goals = synGoals(syn)
	legit := synLegitFixture()
	summarizeSynLegit(legit)
	legit.Goals = synLegitGoals(legit)
	legit.Checks, legit.Notes = synLegitChecks(legit)
	r := &Results{Syn: syn, SynLegit: legit}

	md := r.Markdown()
	for _, want := range []string{
		"## 2. SYN flood: SYN-ACKs per second",
		"### Same CPU", "### Separate CPUs", "NAPI thread: napi/x (pid 1) pinned to CPU 1.",
		"| moat | 0.500 (0.500 – 0.500) |",
		"| 5.00 (5.00 – 5.00) | 25.0% (25.0% – 25.0%) |",
		"moat issues at least 8x the kernel's SYN-ACKs per second (separate CPUs) | 5.00x",
		"## 3. Legitimate connections under a SYN flood",
		"| apart | own link | kernel | full |", "| 99.75% (798/800) |",
		"| shared | own link | kernel | full |", "| 8.00 | 8.00 | 4.00 (4.00 – 4.00) | 4.00 | 4.00 | 4.00 (4.00 – 4.00) |",
		"| apart | own link | moat | under the flood | accept_errors 1, cookies_accepted 799, cookies_issued 1850000, syns 1850000 | none |",
		"| apart | own link | kernel | under the flood | SyncookiesRecv 798, SyncookiesSent 610000 | connect timed out 1, reply reset 1 |",
		"| kernel, clients on the own link, service apart from the NAPI thread: at least 99.9% of requests answered under the SYN flood | 99.75% (798 of 800) | **no** |",
		"**Note:** moat, clients on the own link, service apart from the NAPI thread: 1 accept errors",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("results.md lacks %q", want)
		}
	}
	if t.Failed() {
		t.Log(md)
	}
	js, err := json.Marshal(r)
	if err != nil {
		t.Fatalf("results.json: %v", err)
	}
	if !strings.Contains(string(js), `"failures":{"connect timed out":1,"reply reset":1}`) {
		t.Errorf("the kernel's failed requests in JSON: %s", js)
	}
	// An invalid run's ratio is NaN, written as null.
	if !strings.Contains(string(js), `"synack_ratio_to_kernel":{"median":5,"min":5,"max":5,"values":[5,null]}`) {
		t.Errorf("moat's ratio to the kernel in JSON: %s", js)
	}
}

// loadFloodProgram loads one program of bpf/flood.bpf.c with the given
// variables set, or skips the test where BPF programs cannot be loaded.
func loadFloodProgram(t *testing.T, name string, vars map[string]any) (*ebpf.Program, *ebpf.Map) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("loading BPF programs needs root")
	}
	spec, err := flood.LoadFlood()
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range vars {
		if err := spec.Variables[k].Set(v); err != nil {
			t.Fatal(err)
		}
	}
	coll, err := ebpf.NewCollection(spec)
	if err != nil {
		t.Fatalf("load %s: %v", name, err)
	}
	t.Cleanup(func() { coll.Close() })
	return coll.Programs[name], coll.Maps["flood_counts"]
}

var (
	synClientMAC = net.HardwareAddr{0x02, 0, 0, 0, 0, 0x01}
	synServerMAC = net.HardwareAddr{0x02, 0, 0, 0, 0, 0x02}
	synClient    = netip.MustParseAddr("198.19.200.7")
	synServer    = netip.MustParseAddr("198.18.2.1")
)

func synFrame(t *testing.T, l4 testpkt.TCP) []byte {
	t.Helper()
	b, err := testpkt.Frame{SrcMAC: synClientMAC, DstMAC: synServerMAC,
		Net: testpkt.IPv4{Src: synClient, Dst: synServer, ID: 77}, L4: l4}.Build()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestReflectorAnswersSYN(t *testing.T) {
	prog, _ := loadFloodProgram(t, "flood_reflect", nil)
	count, counts := loadFloodProgram(t, "flood_count", nil)
	in := synFrame(t, testpkt.TCP{SrcPort: 40001, DstPort: servicePort, Seq: 0xfffffffe, SYN: true, Window: 64240,
		Options: []testpkt.TCPOption{testpkt.MSS(1460), testpkt.SACKPermitted(), testpkt.Timestamps(5, 0), testpkt.TCPNOP(), testpkt.WindowScale(7)}})
	out := make([]byte, len(in)+64)
	ret, err := prog.Run(&ebpf.RunOptions{Data: in, DataOut: out})
	if err != nil {
		t.Fatal(err)
	}
	if ret != 3 { // XDP_TX
		t.Fatalf("verdict %d, want XDP_TX", ret)
	}
	out = out[:len(in)]
	pkt := testpkt.Decode(out)
	eth, _ := pkt.Layer(layers.LayerTypeEthernet).(*layers.Ethernet)
	ip, _ := pkt.Layer(layers.LayerTypeIPv4).(*layers.IPv4)
	tcp, _ := pkt.Layer(layers.LayerTypeTCP).(*layers.TCP)
	if eth == nil || ip == nil || tcp == nil {
		t.Fatalf("reply does not decode: %v", pkt)
	}
	if eth.SrcMAC.String() != synServerMAC.String() || eth.DstMAC.String() != synClientMAC.String() {
		t.Errorf("MACs %s > %s, want swapped", eth.SrcMAC, eth.DstMAC)
	}
	if ip.SrcIP.String() != synServer.String() || ip.DstIP.String() != synClient.String() {
		t.Errorf("addresses %s > %s, want swapped", ip.SrcIP, ip.DstIP)
	}
	if tcp.SrcPort != servicePort || tcp.DstPort != 40001 {
		t.Errorf("ports %d > %d, want swapped", tcp.SrcPort, tcp.DstPort)
	}
	if !tcp.SYN || !tcp.ACK || tcp.FIN || tcp.RST || tcp.PSH {
		t.Errorf("flags %+v, want SYN and ACK only", tcp)
	}
	if tcp.Seq != 0xfffffffe || tcp.Ack != 0xffffffff {
		t.Errorf("seq %#x ack %#x, want the SYN's seq acknowledged", tcp.Seq, tcp.Ack)
	}
	if c := testpkt.IPv4HeaderChecksum(out[14:34]); c != 0 {
		t.Errorf("IPv4 header checksum off by %#x", c)
	}
	if c := testpkt.TransportChecksum(synServer, synClient, 6, out[34:]); c != 0 {
		t.Errorf("TCP checksum off by %#x", c)
	}

	// The attacker's counter takes the reply for a SYN-ACK, as it takes
	// moat's: a TCP frame that is not a plain SYN.
	if _, err := count.Run(&ebpf.RunOptions{Data: out}); err != nil {
		t.Fatal(err)
	}
	if n := tcpOtherCount(t, counts); n != 1 {
		t.Errorf("counter's TCP-other slot holds %d, want 1", n)
	}

	// Anything but a plain SYN goes on to the stack untouched.
	for name, f := range map[string][]byte{
		"SYN-ACK": synFrame(t, testpkt.TCP{SrcPort: 1, DstPort: 2, SYN: true, ACK: true}),
		"ACK":     synFrame(t, testpkt.TCP{SrcPort: 1, DstPort: 2, ACK: true}),
		"UDP": testpkt.Frame{SrcMAC: synClientMAC, DstMAC: synServerMAC,
			Net: testpkt.IPv4{Src: synClient, Dst: synServer}, L4: testpkt.UDP{SrcPort: 1, DstPort: 2}}.Bytes(),
	} {
		o := make([]byte, len(f)+64)
		ret, err := prog.Run(&ebpf.RunOptions{Data: f, DataOut: o})
		if err != nil {
			t.Fatal(err)
		}
		if ret != 2 || string(o[:len(f)]) != string(f) { // XDP_PASS
			t.Errorf("%s: verdict %d, frame changed %t; want XDP_PASS, unchanged", name, ret, string(o[:len(f)]) != string(f))
		}
	}
}

func TestCounterKeepsOwnAddress(t *testing.T) {
	own := netip.MustParseAddr("198.18.2.2")
	prog, counts := loadFloodProgram(t, "flood_count", map[string]any{flood.FloodVarCfgCountKeepV4: own.As4()})
	for _, c := range []struct {
		dst  netip.Addr
		want uint32
	}{
		{own, 2},                                     // XDP_PASS: the attacker's own traffic
		{netip.MustParseAddr("198.19.130.9"), 1},     // XDP_DROP: a SYN-ACK to a spoofed source
		{netip.MustParseAddr("198.18.2.3"), 1},       // a neighbour of the kept address
		{netip.AddrFrom4([4]byte{2, 2, 18, 198}), 1}, // the kept address in the other byte order
	} {
		frame := testpkt.TCPv4(synServer, c.dst, testpkt.TCP{SrcPort: servicePort, DstPort: 40000, SYN: true, ACK: true})
		ret, err := prog.Run(&ebpf.RunOptions{Data: frame})
		if err != nil {
			t.Fatal(err)
		}
		if ret != c.want {
			t.Errorf("to %s: verdict %d, want %d", c.dst, ret, c.want)
		}
	}
	if n := tcpOtherCount(t, counts); n != 4 {
		t.Errorf("counted %d SYN-ACKs, want all 4, kept or dropped", n)
	}
}

// tcpOtherCount is the counter's TCP-other slot (SYN-ACKs among them),
// summed over CPUs.
func tcpOtherCount(t *testing.T, counts *ebpf.Map) uint64 {
	t.Helper()
	var perCPU []uint64
	if err := counts.Lookup(uint32(flood.FloodCountSlotFLOOD_COUNT_TCP_OTHER), &perCPU); err != nil {
		t.Fatal(err)
	}
	var n uint64
	for _, v := range perCPU {
		n += v
	}
	return n
}

func TestSchedulerText(t *testing.T) {
	none := map[string]string{"CONFIG_HZ": "250", "CONFIG_PREEMPT_NONE": "y", "CONFIG_PREEMPT_DYNAMIC": "y"}
	for _, tc := range []struct {
		name    string
		cfg     map[string]string
		cmdline string
		want    string
	}{
		{"built none", none, "root=/dev/vda", "HZ=250 (a tick every 4ms), preemption none"},
		{"dynamic, full on the command line", none, "root=/dev/vda preempt=full quiet", "HZ=250 (a tick every 4ms), preemption full"},
		{"static full", map[string]string{"CONFIG_HZ": "1000", "CONFIG_PREEMPT": "y"}, "preempt=none", "HZ=1000 (a tick every 1ms), preemption full"},
		{"no config", nil, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := schedulerText(tc.cfg, tc.cmdline); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}
