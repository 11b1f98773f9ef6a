package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"

	"github.com/moat-shield/moat/internal/datapath"
	"github.com/moat-shield/moat/internal/flood"
	"github.com/moat-shield/moat/internal/lab"
	"github.com/moat-shield/moat/internal/shield"
	"github.com/moat-shield/moat/internal/syncookie"
)

// Goals the issue sets for legitimate connections under a SYN flood.
const (
	synLegitGoalSuccess = 0.999 // share of requests answered under the flood
	synLegitGoalP99     = 2     // p99 under the flood, at most this many times the idle p99
)

// Contenders of the comparison.
const (
	slKernel   = "kernel"
	slMoat     = "moat"
	slMoatAuto = "moat-auto"
	slFloor    = "xdp-drop"    // a control, not a defence: see floorControl
	slReflect  = "xdp-reflect" // a control, not a defence: see reflectControl
)

// Where the bench's own threads, the service's and the clients', may run
// during a point.
const (
	// cpusApart: on the generator's CPU only, never on the NAPI thread's, as
	// a server keeps its application off the CPUs that take its NIC's
	// queues; the generator there runs at SCHED_IDLE and yields to them.
	cpusApart = "apart"
	// cpusShared: on both CPUs, the NAPI thread's included, wherever the
	// scheduler puts them.
	cpusShared = "shared"
)

// isControl says whether a contender is one of the lab's controls, which
// defend nothing and have no goals.
func isControl(name string) bool { return name == slFloor || name == slReflect }

// jsonNum is a measurement that may have no value (NaN), written as null.
type jsonNum float64

func (v jsonNum) MarshalJSON() ([]byte, error) { return json.Marshal(jsonFloat(float64(v))) }

// SynLegitRound is one contender, one placement, idle or flooded, once.
type SynLegitRound struct {
	Round     int     `json:"round"`
	FloodSent uint64  `json:"flood_sent"`
	FloodPPS  float64 `json:"flood_pps"`
	Taken     float64 `json:"flood_taken_pps"`     // into the server's veth ring
	SynAckPPS float64 `json:"synacks_at_attacker"` // TCP frames other than SYNs counted at the attacker, per second of flood
	Attempts  int     `json:"attempts"`
	OK        int     `json:"ok"`
	P50ms     jsonNum `json:"p50_ms"`
	P99ms     jsonNum `json:"p99_ms"`
	// The TCP connect alone, of the requests answered.
	ConnectP50ms jsonNum `json:"connect_p50_ms"`
	ConnectP99ms jsonNum `json:"connect_p99_ms"`
	// The requests that failed, by why (failureKind).
	Failures map[string]int `json:"failures,omitempty"`
	// The defence's own counters over the point (differences).
	Counters map[string]uint64 `json:"counters"`
	// How the point's time went on the server's NAPI CPU.
	NAPI NAPIShares `json:"napi"`
}

// SynLegitPoint is one contender and placement, idle or flooded, over all
// rounds. The pooled figures take every request of every round together.
type SynLegitPoint struct {
	Defence     string          `json:"defence"`
	Placement   string          `json:"client_placement"`
	ServiceCPUs string          `json:"service_cpus"` // cpusApart or cpusShared
	Flood       bool            `json:"flood"`
	Rounds      []SynLegitRound `json:"rounds"`

	Attempts int     `json:"attempts"`
	OK       int     `json:"ok"`
	Success  jsonNum `json:"success"`
	P50ms    jsonNum `json:"p50_ms"`
	P99ms    jsonNum `json:"p99_ms"`
	// P99Ratio is this point's p99 over the same contender's and
	// placement's idle p99 (flooded points only).
	P99Ratio  jsonNum `json:"p99_over_idle,omitempty"`
	IdleP99ms jsonNum `json:"idle_p99_ms,omitempty"`
	// The same for the TCP connect alone.
	ConnectP50ms     jsonNum `json:"connect_p50_ms"`
	ConnectP99ms     jsonNum `json:"connect_p99_ms"`
	ConnectP99Ratio  jsonNum `json:"connect_p99_over_idle,omitempty"`
	IdleConnectP99ms jsonNum `json:"idle_connect_p99_ms,omitempty"`
	// Per round, this point's p99 over the idle point's of the same round
	// (flooded points only): a round that something else on the machine
	// disturbed moves the pooled ratio, not the median of these.
	P99RatioRounds        Summary `json:"p99_over_idle_per_round"`
	ConnectP99RatioRounds Summary `json:"connect_p99_over_idle_per_round"`

	SuccessRounds Summary           `json:"success_per_round"`
	P99Rounds     Summary           `json:"p99_ms_per_round"`
	FloodPPS      Summary           `json:"flood_pps"`
	Taken         Summary           `json:"flood_taken_pps"`
	SynAckPPS     Summary           `json:"synacks_at_attacker_pps"`
	NAPIRan       Summary           `json:"napi_thread_ran"`
	ServerCPUIdle Summary           `json:"server_cpu_idle"`
	Counters      map[string]uint64 `json:"counters"`           // summed over the rounds
	Failures      map[string]int    `json:"failures,omitempty"` // summed over the rounds

	lat latencies // every round's, for the pooled percentiles
}

// SynLegitResult is the comparison of legitimate connections under a SYN
// flood that no list denies: the defence must tell the flood from the users
// by the handshake alone.
type SynLegitResult struct {
	Flood      string           `json:"flood"`
	Receive    string           `json:"receive"`
	Client     string           `json:"client"`
	Placements []string         `json:"placements"`
	CPUs       string           `json:"service_cpus"` // what the layouts are
	Defences   []string         `json:"defences"`
	What       []string         `json:"what"`
	Rounds     int              `json:"rounds"`
	Points     []*SynLegitPoint `json:"points"`
	Goals      []Goal           `json:"goals,omitempty"`
	Checks     []Goal           `json:"checks,omitempty"` // that the defences did what they say
	Notes      []string         `json:"notes,omitempty"`
}

// synLegitDefence is a SYN defence for the service.
type synLegitDefence interface {
	receiver
	// Counters reads the defence's own counters; only differences between
	// two reads mean anything.
	Counters(ctx context.Context) (map[string]uint64, error)
}

// synLegit measures legitimate HTTP requests while a spoofed SYN flood from
// sources no list denies runs at the generator's full speed against the
// same service. The server takes the flood in a threaded NAPI thread pinned
// to the CPU the generator does not use. Each contender gets an idle point
// and a flooded point per client placement in every round, the contenders
// alternating.
func (b *Bench) synLegit(ctx context.Context) (res *SynLegitResult, err error) {
	res = &SynLegitResult{Rounds: b.cfg.LegitRounds}
	if _, err := b.ensureMoat(); err != nil {
		return res, err
	}
	// The kernel's default: cookies once a listener's SYN queue overflows.
	if err := sysctl(b.lab.Server, "net.ipv4.tcp_syncookies", "1"); err != nil {
		return res, err
	}
	if err := b.lab.Server.Do(func() error { _, err := syncookie.CheckSysctls(); return err }); err != nil {
		return res, fmt.Errorf("moat cannot issue cookies in the server namespace: %w", err)
	}
	if err := b.prepareClients(); err != nil {
		return res, err
	}
	gen, srv, err := generatorAndServerCPUs()
	if err != nil {
		return res, err
	}
	pin, err := b.pinNAPI(ctx)
	if err != nil {
		return res, err
	}
	defer func() { err = errors.Join(err, pin.release(context.WithoutCancel(ctx))) }()
	sink, err := b.attackerSink()
	if err != nil {
		return res, err
	}
	defer sink.Close()
	// moat answers the clients' SYNs with XDP_TX. A veth passes such frames
	// to its peer's ring but wakes the peer's NAPI only if the peer runs an
	// XDP program; with GRO alone they wait there until other traffic
	// wakes it. flood_count passing everything gives the client's veth one.
	var cc *flood.Counter
	err = b.lab.Client.Do(func() error {
		var err error
		cc, err = flood.AttachCounter(b.lab.Client.Ifaces[0].Index, true)
		return err
	})
	if err != nil {
		return res, fmt.Errorf("attach the client's pass-through counter: %w", err)
	}
	defer cc.Close()

	defences := []synLegitDefence{kernelCookies{b}, &moatCookies{b: b, mode: syncookie.ModeAlways}, &moatCookies{b: b, mode: syncookie.ModeAuto}}
	refl, err := b.reflector()
	if err != nil {
		return res, err
	}
	defer refl.Close()
	controls := []synLegitDefence{&floorControl{floorRx{b: b}}, reflectControl{refl}}
	places := b.placements()
	// The controls drop or reflect every frame on the attacked link, the
	// clients' there too, so they run with clients on their own link only.
	defencesAt := func(pl placement) []synLegitDefence {
		if pl.name == placeOwnLink {
			return append(slices.Clone(defences), controls...)
		}
		return defences
	}
	res.Flood = fmt.Sprintf("spoofed TCP SYN flood to the service (%s port %d) from %s (no list denies them: every defence must answer or queue them), moat flood on one thread pinned to CPU %d at SCHED_IDLE (it stands for attackers on other machines: it sends as fast as it can on the CPU time the lab's clients and service leave, rather than take a share from them), uncapped, running from %s before the clients start until %s after the last request is offered",
		b.serverIf().IPv4.Addr(), servicePort, synSources, gen, synLegitLead, legitTimeout)
	res.Receive = fmt.Sprintf("threaded NAPI on the server's %s: %s. The attacker's end of the link takes what comes back on the CPU that sent it, the NAPI thread's, so the server's CPU also pays for receiving its SYN-ACKs there (the SYN-ACK comparison moves that to the generator's CPU; here that would take the bench's threads' CPU: one run so placed gave 99.75%% on the attacked link, but put a scheduler tick under the p99 of every contender, the kernel's too, with the service CPUs shared). The attacker's interface runs flood_count, which counts what comes back and drops it unless it is for the attacker's own address %s (the attacked-link clients' replies), so SYN-ACKs to spoofed sources cost the attacker's side next to nothing. The client's interface runs flood_count passing everything: a veth wakes its peer's NAPI for frames sent back with XDP_TX only when the peer runs an XDP program, so without one moat's SYN-ACKs to the client would wait in the client's ring",
		b.serverIf().Name, pin.describe(), b.attackerIf().IPv4.Addr())
	res.Client = b.clientText(places)
	res.Placements = []string{placeOwnLink, placeSharedLink}
	res.CPUs = fmt.Sprintf("%q: every thread of the bench (the service's, the clients') runs on CPU %d, the generator's, where the generator yields to them (SCHED_IDLE), and never on CPU %d, the NAPI thread's: the layout of a server that keeps its application off the CPUs that take its NIC's queues. "+
		"%q: the same threads run on both CPUs, wherever the scheduler puts them, NAPI thread's CPU included, with clients on their own link only. "+
		"There a thread woken on the NAPI thread's CPU while the thread runs waits for the scheduler to switch: up to a tick (%s on this kernel) without preemption of kernel code. "+
		"The lab's generator pauses whenever the bench's threads want CPU %d; a defence that empties the server's ring within the pause lets the NAPI thread sleep, and the idle CPU draws the bench's threads there until the flood resumes, which a real flood does not do",
		cpusApart, gen, srv, cpusShared, tickText(), gen)
	for _, d := range defencesAt(places[0]) {
		res.Defences = append(res.Defences, d.Name())
		res.What = append(res.What, d.Name()+": "+d.What())
	}

	// The shared layout shows the scheduler's part; the clients of the
	// attacked link lose SYNs to the full ring in either, so they run in
	// the apart layout alone.
	layouts := []string{cpusApart, cpusShared}
	placesIn := func(layout string) []placement {
		if layout == cpusShared {
			return places[:1]
		}
		return places
	}
	points := map[string]*SynLegitPoint{}
	key := func(cpus, pl, d string, fl bool) string { return fmt.Sprintf("%s/%s/%s/%t", cpus, pl, d, fl) }
	for _, cpus := range layouts {
		for _, pl := range placesIn(cpus) {
			for _, fl := range []bool{false, true} {
				for _, d := range defencesAt(pl) {
					p := &SynLegitPoint{Defence: d.Name(), Placement: pl.name, ServiceCPUs: cpus, Flood: fl}
					points[key(cpus, pl.name, d.Name(), fl)] = p
					res.Points = append(res.Points, p)
				}
			}
		}
	}
	// Whatever ends the rounds, what was measured is summarised.
	defer func() {
		summarizeSynLegit(res)
		res.Goals = synLegitGoals(res)
		res.Checks, res.Notes = synLegitChecks(res)
		for _, cpus := range []string{cpusShared, cpusApart} {
			if n := synLegitFloorNote(res, cpus); n != "" {
				res.Notes = append([]string{n}, res.Notes...)
			}
		}
	}()
	for round := range b.cfg.LegitRounds {
		for _, cpus := range rotate(layouts, round) {
			err := withServiceCPUs(cpus, gen, func() error {
				for j, pl := range placesIn(cpus) {
					for i, fl := range []bool{false, true} {
						for _, d := range rotate(defencesAt(pl), round+i+j) {
							p := points[key(cpus, pl.name, d.Name(), fl)]
							r, lat, err := b.synLegitPoint(ctx, d, pl, fl, sink, pin)
							if err != nil {
								return fmt.Errorf("service CPUs %s, %s, %s, flood %t: %w", cpus, pl.name, d.Name(), fl, err)
							}
							r.Round = round + 1
							p.Rounds = append(p.Rounds, r)
							p.lat.add(lat)
							b.logf("synlegit round %d %-6s %-13s %-11s flood %-5t %6.3f Mpps sent %6.3f Mpps taken %6.3f Mpps SYN-ACK (NAPI thread ran %3.0f%% waited %3.0f%%, its CPU idle %3.0f%%)  ok %4d/%4d%s  p50 %7.2f ms  p99 %7.2f ms  connect p99 %7.2f ms  %s",
								round+1, cpus, pl.name, d.Name(), fl, r.FloodPPS/1e6, r.Taken/1e6, r.SynAckPPS/1e6, 100*r.NAPI.Ran, 100*r.NAPI.Waited, 100*r.NAPI.CPUIdle, r.OK, r.Attempts, failedNote(r.Failures), float64(r.P50ms), float64(r.P99ms), float64(r.ConnectP99ms), countersText(r.Counters))
						}
					}
				}
				return nil
			})
			if err != nil {
				return res, err
			}
		}
	}
	return res, nil
}

// failedNote is " (failed: ...)" for a point with failed requests, else "".
func failedNote(f map[string]int) string {
	if len(f) == 0 {
		return ""
	}
	return " (failed: " + failuresText(f) + ")"
}

// withServiceCPUs runs fn with the bench's threads in the layout cpus:
// confined to the generator's CPU (cpusApart) or free (cpusShared).
func withServiceCPUs(cpus string, gen int, fn func() error) error {
	if cpus != cpusApart {
		return fn()
	}
	restore, err := confineThreads(gen)
	if err != nil {
		return err
	}
	return errors.Join(fn(), restore())
}

// synLegitLead is how long the flood runs before the clients start.
const synLegitLead = 300 * time.Millisecond

// clientsReady is more than the clients' workers take to get ready before
// the first request (a few milliseconds), so that a flood timed from its
// own start still outlasts the last request.
const clientsReady = 100 * time.Millisecond

// synLegitPoint measures the clients once, with or without the flood.
func (b *Bench) synLegitPoint(ctx context.Context, d synLegitDefence, pl placement, flooding bool, sink *attackerSink, pin *pinnedNAPI) (SynLegitRound, latencies, error) {
	var (
		r   SynLegitRound
		lat latencies
	)
	if err := b.freshService(); err != nil {
		return r, lat, err
	}
	err := withReceiver(ctx, d, func() error {
		if err := pin.check(); err != nil {
			return err
		}
		c0, err := d.Counters(ctx)
		if err != nil {
			return err
		}
		s0, err := sink.answers()
		if err != nil {
			return err
		}
		x0, err := b.floodDelivered(ctx)
		if err != nil {
			return err
		}
		use, err := pin.startUse()
		if err != nil {
			return err
		}
		var (
			wg   sync.WaitGroup
			fr   flood.Result
			ferr error
		)
		if flooding {
			// The flood outlasts the last request's timeout: every request
			// meets it from its first SYN to its last byte.
			// The generator stands for attackers elsewhere: it sends at
			// full speed on the CPU time the lab's clients and service
			// leave, not on a share taken from them.
			fc := flood.Config{Kind: flood.KindSYN, Sources: synSources, DstPort: servicePort,
				Duration: synLegitLead + clientsReady + b.cfg.LegitWindow + legitTimeout, Background: true}
			wg.Add(1)
			go func() {
				defer wg.Done()
				fr, ferr = b.flood(ctx, fc)
			}()
			select {
			case <-time.After(synLegitLead):
			case <-ctx.Done():
			}
		}
		var attempts int
		var cerr error
		lat, attempts, cerr = b.clients(ctx, pl)
		wg.Wait()
		if err := errors.Join(ferr, cerr); err != nil {
			return err
		}
		if r.NAPI, err = use.shares(); err != nil {
			return err
		}
		c1, err := d.Counters(ctx)
		if err != nil {
			return err
		}
		s1, err := sink.answers()
		if err != nil {
			return err
		}
		x1, err := b.floodDelivered(ctx)
		if err != nil {
			return err
		}
		r.Counters = counterDiff(c0, c1)
		r.FloodSent, r.FloodPPS = fr.Sent, fr.PPS
		if secs := fr.Elapsed.Seconds(); secs > 0 {
			r.Taken = float64(x1-x0) / secs
			r.SynAckPPS = float64(s1-s0) / secs
		}
		r.Attempts, r.OK, r.Failures = attempts, len(lat.request), lat.failed
		r.P50ms, r.P99ms = jsonNum(Percentile(lat.request, 50)), jsonNum(Percentile(lat.request, 99))
		r.ConnectP50ms, r.ConnectP99ms = jsonNum(Percentile(lat.connect, 50)), jsonNum(Percentile(lat.connect, 99))
		return nil
	})
	return r, lat, err
}

// counterDiff is after minus before, per counter.
func counterDiff(before, after map[string]uint64) map[string]uint64 {
	out := make(map[string]uint64, len(after))
	for k, v := range after {
		out[k] = v - before[k]
	}
	return out
}

// summarizeSynLegit fills every point's summaries from its rounds, and the
// flooded points' p99 ratio to their idle point.
func summarizeSynLegit(res *SynLegitResult) {
	idleOf := map[string]*SynLegitPoint{}
	for _, p := range res.Points {
		var ok, p99, fl, tk, sa, ran, idle []float64
		p.Attempts, p.OK = 0, 0
		p.Counters = map[string]uint64{}
		p.Failures = nil
		for _, r := range p.Rounds {
			p.Attempts += r.Attempts
			p.OK += r.OK
			ok = append(ok, float64(r.OK)/float64(max(r.Attempts, 1)))
			p99 = append(p99, float64(r.P99ms))
			fl, tk, sa = append(fl, r.FloodPPS), append(tk, r.Taken), append(sa, r.SynAckPPS)
			ran, idle = append(ran, r.NAPI.Ran), append(idle, r.NAPI.CPUIdle)
			for k, v := range r.Counters {
				p.Counters[k] += v
			}
			p.Failures = addFailures(p.Failures, r.Failures)
		}
		p.Success = jsonNum(math.NaN())
		if p.Attempts > 0 {
			p.Success = jsonNum(float64(p.OK) / float64(p.Attempts))
		}
		p.P50ms, p.P99ms = jsonNum(Percentile(p.lat.request, 50)), jsonNum(Percentile(p.lat.request, 99))
		p.ConnectP50ms, p.ConnectP99ms = jsonNum(Percentile(p.lat.connect, 50)), jsonNum(Percentile(p.lat.connect, 99))
		p.SuccessRounds, p.P99Rounds = Summarize(ok), Summarize(p99)
		p.FloodPPS, p.Taken, p.SynAckPPS = Summarize(fl), Summarize(tk), Summarize(sa)
		p.NAPIRan, p.ServerCPUIdle = Summarize(ran), Summarize(idle)
		if !p.Flood {
			idleOf[p.ServiceCPUs+"/"+p.Placement+"/"+p.Defence] = p
		}
	}
	for _, p := range res.Points {
		p.P99Ratio, p.IdleP99ms, p.ConnectP99Ratio, p.IdleConnectP99ms = 0, 0, 0, 0
		p.P99RatioRounds, p.ConnectP99RatioRounds = Summary{}, Summary{}
		i := idleOf[p.ServiceCPUs+"/"+p.Placement+"/"+p.Defence]
		if !p.Flood || i == nil {
			continue
		}
		p.IdleP99ms, p.IdleConnectP99ms = i.P99ms, i.ConnectP99ms
		p.P99Ratio = jsonNum(float64(p.P99ms) / float64(i.P99ms))
		p.ConnectP99Ratio = jsonNum(float64(p.ConnectP99ms) / float64(i.ConnectP99ms))
		var req, conn []float64
		for _, r := range p.Rounds {
			for _, ir := range i.Rounds {
				if ir.Round == r.Round {
					req = append(req, float64(r.P99ms)/float64(ir.P99ms))
					conn = append(conn, float64(r.ConnectP99ms)/float64(ir.ConnectP99ms))
				}
			}
		}
		p.P99RatioRounds, p.ConnectP99RatioRounds = Summarize(req), Summarize(conn)
	}
}

// synLegitGoals checks every contender's flooded points against the goals.
func synLegitGoals(res *SynLegitResult) []Goal {
	var goals []Goal
	for _, p := range res.Points {
		if !p.Flood || len(p.Rounds) == 0 || isControl(p.Defence) {
			continue
		}
		s, r, c := float64(p.Success), p.P99RatioRounds.Median, p.ConnectP99RatioRounds.Median
		who := fmt.Sprintf("%s, clients on the %s, %s", p.Defence, p.Placement, serviceCPUsText(p.ServiceCPUs))
		goals = append(goals,
			Goal{
				Goal:   fmt.Sprintf("%s: at least %.1f%% of requests answered under the SYN flood", who, 100*synLegitGoalSuccess),
				Actual: fmt.Sprintf("%s (%d of %d)", pct2(s), p.OK, p.Attempts),
				Met:    s >= synLegitGoalSuccess,
			},
			Goal{
				Goal:   fmt.Sprintf("%s: p99 of the TCP connect under the SYN flood at most %dx idle", who, synLegitGoalP99),
				Actual: fmt.Sprintf("%sx (median of per-round ratios; min %sx, max %sx); pooled %s ms flooded, %s ms idle", ratio(c), ratio(p.ConnectP99RatioRounds.Min), ratio(p.ConnectP99RatioRounds.Max), ms(float64(p.ConnectP99ms)), ms(float64(p.IdleConnectP99ms))),
				Met:    c <= synLegitGoalP99,
			},
			Goal{
				Goal:   fmt.Sprintf("%s: p99 of the whole request under the SYN flood at most %dx idle", who, synLegitGoalP99),
				Actual: fmt.Sprintf("%sx (median of per-round ratios; min %sx, max %sx); pooled %s ms flooded, %s ms idle", ratio(r), ratio(p.P99RatioRounds.Min), ratio(p.P99RatioRounds.Max), ms(float64(p.P99ms)), ms(float64(p.IdleP99ms))),
				Met:    r <= synLegitGoalP99,
			})
	}
	return goals
}

// synLegitChecks verifies from the defences' own counters that each did
// what it is there for: moat answered the flood with cookies, and in
// "always" mode the clients' connections were accepted through moat's
// cookies; the kernel went to cookies under the flood.
func synLegitChecks(res *SynLegitResult) (checks []Goal, notes []string) {
	for _, p := range res.Points {
		if len(p.Rounds) == 0 || isControl(p.Defence) {
			continue
		}
		c := p.Counters
		moatCookiesOn := p.Defence == slMoat || (p.Defence != slKernel && p.Flood)
		if p.Defence != slKernel && p.Flood {
			checks = append(checks, Goal{
				Goal:   fmt.Sprintf("%s answered the flood with its cookies (clients on the %s, %s)", p.Defence, p.Placement, serviceCPUsText(p.ServiceCPUs)),
				Actual: fmt.Sprintf("%d cookies issued, %d SYNs seen", c["cookies_issued"], c["syns"]),
				Met:    c["cookies_issued"] > uint64(p.Attempts),
			})
		}
		if moatCookiesOn {
			// Every answered request was a connection that moat's tc
			// program accepted on a cookie it issued, except those whose
			// SYN moat left to the kernel because a socket still owned
			// the tuple (the server's time-wait socket of an earlier
			// connection from the same client port): SYNs seen that
			// were neither answered nor dropped.
			toKernel := c["syns"] - min(c["syns"], c["cookies_issued"]+c["syns_dropped"])
			checks = append(checks, Goal{
				Goal:   fmt.Sprintf("%s: the clients' connections completed on moat's cookies (%s, clients on the %s, %s)", p.Defence, floodWord(p.Flood), p.Placement, serviceCPUsText(p.ServiceCPUs)),
				Actual: fmt.Sprintf("%d cookies accepted, %d SYNs left to the kernel, %d requests answered, %d accept errors", c["cookies_accepted"], toKernel, p.OK, c["accept_errors"]),
				Met:    c["cookies_accepted"]+toKernel >= uint64(p.OK) && p.OK > 0,
			})
		}
		if p.Defence == slKernel && p.Flood {
			checks = append(checks, Goal{
				Goal:   fmt.Sprintf("the kernel answered the flood with its cookies (clients on the %s, %s)", p.Placement, serviceCPUsText(p.ServiceCPUs)),
				Actual: fmt.Sprintf("%d SyncookiesSent, %d SyncookiesRecv, %d SyncookiesFailed, %d ListenDrops", c["SyncookiesSent"], c["SyncookiesRecv"], c["SyncookiesFailed"], c["ListenDrops"]),
				Met:    c["SyncookiesSent"] > 0,
			})
		}
		if p.Flood && p.Defence != slKernel && c["accept_errors"] > 0 {
			notes = append(notes, fmt.Sprintf("%s, clients on the %s, %s: %d accept errors: the kernel refused handshakes that moat's cookie had validated (tcp_syncookies 0 while handshakes were under way would do that)", p.Defence, p.Placement, serviceCPUsText(p.ServiceCPUs), c["accept_errors"]))
		}
	}
	return checks, notes
}

// synLegitFloorNote compares the own-link p99 under the flood of every
// contender with the controls', in one layout of the service's threads.
func synLegitFloorNote(res *SynLegitResult, cpus string) string {
	var floor, refl *SynLegitPoint
	var others []string
	for _, p := range res.Points {
		if !p.Flood || p.Placement != placeOwnLink || p.ServiceCPUs != cpus || len(p.Rounds) == 0 {
			continue
		}
		switch p.Defence {
		case slFloor:
			floor = p
		case slReflect:
			refl = p
		default:
			others = append(others, fmt.Sprintf("%s %s ms", p.Defence, ms(float64(p.P99ms))))
		}
	}
	if floor == nil {
		return ""
	}
	note := fmt.Sprintf("controls, %s: with the flood dropped at once (%s), the own-link clients' p99 is %s ms under the flood and %s ms idle (pooled; %sx, the median of per-round ratios): "+
		"what the lab itself does to them while the generator and the NAPI thread keep both CPUs busy, whatever the defence. ",
		serviceCPUsText(cpus), slFloor, ms(float64(floor.P99ms)), ms(float64(floor.IdleP99ms)), ratio(floor.P99RatioRounds.Median))
	if refl != nil {
		note += fmt.Sprintf("With every flood SYN sent straight back by XDP_TX and nothing computed (%s, the clients served by the kernel), it is %s ms under the flood and %s ms idle (%sx): "+
			"what answering the flood at that rate costs the clients here, where the answers land in the attacker's namespace on the server's CPU. ",
			slReflect, ms(float64(refl.P99ms)), ms(float64(refl.IdleP99ms)), ratio(refl.P99RatioRounds.Median))
	}
	return note + "Against them, the defences' own-link p99 under the flood: " + strings.Join(others, ", ")
}

// serviceCPUsText names a layout of the service's threads in a sentence.
func serviceCPUsText(cpus string) string {
	switch cpus {
	case cpusApart:
		return "service apart from the NAPI thread"
	case cpusShared:
		return "service sharing the NAPI thread's CPU"
	}
	return "service CPUs " + cpus
}

func floodWord(flood bool) string {
	if flood {
		return "under the flood"
	}
	return "idle"
}

// kernelCookies is the kernel alone: no XDP program, the listener's SYN
// queue, and cookies once it overflows (net.ipv4.tcp_syncookies=1).
type kernelCookies struct{ b *Bench }

func (kernelCookies) Name() string { return slKernel }
func (kernelCookies) What() string {
	return "no XDP program on the server; net.ipv4.tcp_syncookies=1 (the kernel's default: SYN cookies once the listener's SYN queue overflows), Go HTTP listener with the default backlog; counters: TcpExt of the server namespace"
}
func (kernelCookies) Attach(context.Context) error            { return nil }
func (kernelCookies) Detach(context.Context) error            { return nil }
func (kernelCookies) Dropped(context.Context) (uint64, error) { return 0, nil }
func (k kernelCookies) Counters(context.Context) (map[string]uint64, error) {
	return k.b.kernelSynCounters()
}

// kernelSynCounters are the server namespace's TcpExt counters of SYN
// cookies and listen queues.
func (b *Bench) kernelSynCounters() (map[string]uint64, error) {
	out := map[string]uint64{}
	err := b.lab.Server.Do(func() error {
		for _, name := range []string{"SyncookiesSent", "SyncookiesRecv", "SyncookiesFailed", "ListenOverflows", "ListenDrops", "TCPReqQFullDoCookies", "TCPReqQFullDrop"} {
			n, err := netstat("TcpExt", name)
			if err != nil {
				return err
			}
			out[name] = n
		}
		return nil
	})
	return out, err
}

// floorControl is flood_drop on the attacked interface: every frame
// dropped at once, the cheapest a server can take a flood. It defends
// nothing; with clients on their own link it shows what the flood costs
// them when the server spends nothing on it beyond taking it off the ring
// (both CPUs busy, one with the generator, one with the NAPI thread): the
// lab's floor of latency under the flood.
type floorControl struct{ floorRx }

func (f *floorControl) What() string {
	return "a control, not a defence: flood_drop (XDP_DROP for every frame) on the attacked interface, clients on their own link only; what the flood costs the clients when the server spends nothing on it but taking it off the ring; counter: the veth's rx_queue_*_xdp_drops"
}

func (f *floorControl) Counters(ctx context.Context) (map[string]uint64, error) {
	n, err := f.b.vethXDPDrops(ctx)
	return map[string]uint64{"xdp_drops": n}, err
}

// reflectControl is the SYN bench's reflector on the attacked interface:
// every flood SYN goes back as a SYN-ACK by XDP_TX, with nothing looked up
// or computed. It defends nothing (the clients, on their own link, are
// the kernel's); it shows what answering the whole flood costs the clients
// in this lab, whoever answers: the answers go to the attacker's namespace,
// whose veth takes them on the server's CPU.
type reflectControl struct{ *reflectDefence }

func (r reflectControl) Name() string { return slReflect }

func (r reflectControl) What() string {
	return "a control, not a defence: flood_reflect (the SYN bench's reflector: every IPv4 TCP SYN back as a SYN-ACK by XDP_TX, no lookup, no cookie) on the attacked interface, nothing on the client's, clients on their own link only; what answering the flood at the reflector's rate costs the clients; counter: the veth's rx_queue_*_xdp_tx"
}

func (r reflectControl) Counters(ctx context.Context) (map[string]uint64, error) {
	n, _, err := r.Issued(ctx)
	return map[string]uint64{"xdp_tx": n}, err
}

// moatCookies is moat as `moat attach` and `moat syn protect` set it up:
// the XDP filter and the tcx acceptor on both server interfaces through the
// shield, a fresh key, and the service port protected in one mode.
type moatCookies struct {
	b      *Bench
	mode   syncookie.Mode
	census *censusRunner
}

func (m *moatCookies) Name() string {
	if m.mode == syncookie.ModeAlways {
		return slMoat
	}
	return slMoat + "-" + m.mode.String()
}

func (m *moatCookies) What() string {
	s := fmt.Sprintf("moat_filter (XDP, native) and moat_syn_accept (tcx ingress) attached through internal/shield on both server interfaces (%s, %s) as `moat attach` does, with the shield's denylist (%d prefixes, none matching the flood or the clients); SYN protection %q on port %d (internal/syncookie: Rotate at every attach, Configure, Protect), the socket census taken every %s in the server's namespace as the daemon does",
		m.b.lab.Server.Ifaces[0].Name, m.b.lab.Server.Ifaces[1].Name, len(m.b.deny), m.mode, servicePort, syncookie.DefaultCensusEvery)
	switch m.mode {
	case syncookie.ModeAlways:
		s += ": every SYN is answered by a moat cookie from XDP, the clients' included"
	case syncookie.ModeAuto:
		s += fmt.Sprintf(": cookies only while more than %d SYNs per second come to the port, SYNs left to the kernel otherwise", syncookie.StoredThreshold(0))
	}
	return s + "; counters: the port's syn_counters (syncookie.Status) and the kernel's TcpExt"
}

func (m *moatCookies) Attach(context.Context) error {
	s := m.b.shield
	c, err := s.NewCensus()
	if err != nil {
		return err
	}
	if m.census, err = startCensus(m.b.lab.Server, c); err != nil {
		return err
	}
	return m.b.lab.Server.Do(func() error {
		for _, ifc := range m.b.lab.Server.Ifaces {
			if _, err := s.Attach(ifc.Name, shield.ModeNative); err != nil {
				return err
			}
		}
		if _, err := syncookie.Rotate(s.Map(datapath.MoatMapSynKeys), s.Map(datapath.MoatMapSynRotation)); err != nil {
			return err
		}
		if err := syncookie.Configure(s.Map(datapath.MoatMapSynSettings), syncookie.Config{}); err != nil {
			return err
		}
		return syncookie.Protect(s.Map(datapath.MoatMapSynPorts), s.Map(datapath.MoatMapSynCounters), s.Map(datapath.MoatMapSynCensus), servicePort, m.mode, 0)
	})
}

// Detach leaves the shield as the other comparisons expect it: no SYN
// protection, attached nowhere. It returns once the programs are off the
// interfaces, so that the next contender can attach its own.
func (m *moatCookies) Detach(context.Context) error {
	s := m.b.shield
	var errs []error
	if m.census != nil {
		errs = append(errs, m.census.stop())
		m.census = nil
	}
	return m.b.lab.Server.Do(func() error {
		errs := append(errs, syncookie.Protect(s.Map(datapath.MoatMapSynPorts), s.Map(datapath.MoatMapSynCounters), s.Map(datapath.MoatMapSynCensus), servicePort, syncookie.ModeOff, 0))
		for _, ifc := range m.b.lab.Server.Ifaces {
			errs = append(errs, s.Detach(ifc.Name))
		}
		for _, ifc := range m.b.lab.Server.Ifaces {
			errs = append(errs, waitDetached(ifc, 5*time.Second))
		}
		return errors.Join(errs...)
	})
}

// waitDetached waits until an interface (in the calling thread's network
// namespace) has neither an XDP program nor a tcx ingress program: the
// kernel releases a link whose last reference was a removed pin from a
// work queue, a moment later, and until then the interface is taken.
func waitDetached(ifc lab.Iface, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		l, err := netlink.LinkByIndex(ifc.Index)
		if err != nil {
			return err
		}
		q, err := link.QueryPrograms(link.QueryOptions{Target: ifc.Index, Attach: ebpf.AttachTCXIngress})
		if err != nil {
			return fmt.Errorf("tcx programs of %s: %w", ifc.Name, err)
		}
		xdp := l.Attrs().Xdp != nil && l.Attrs().Xdp.Attached
		if !xdp && len(q.Programs) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s still has programs %s after detaching (XDP %t, %d tcx)", ifc.Name, timeout, xdp, len(q.Programs))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (m *moatCookies) Dropped(context.Context) (uint64, error) { return 0, nil }

func (m *moatCookies) Counters(context.Context) (map[string]uint64, error) {
	out, err := m.b.kernelSynCounters()
	if err != nil {
		return nil, err
	}
	s := m.b.shield
	st, err := syncookie.Status(s.Map(datapath.MoatMapSynPorts), s.Map(datapath.MoatMapSynCounters))
	if err != nil {
		return nil, err
	}
	for _, p := range st {
		if p.Port != servicePort {
			continue
		}
		for k, v := range map[string]uint64{
			"syns": p.SYNs, "cookies_issued": p.CookiesIssued, "cookies_accepted": p.CookiesAccepted,
			"cookies_rejected": p.CookiesRejected, "acks_dropped": p.ACKsDropped, "accept_errors": p.AcceptErrors,
			"syns_dropped": p.SYNsDropped, "stale_key_syns": p.StaleKeySYNs, "accept_queue_full": p.AcceptQueueFull,
		} {
			out[k] = v
		}
		return out, nil
	}
	return nil, fmt.Errorf("port %d is not protected", servicePort)
}

// attackerSink is flood_count on the attacker's interface: it counts what
// the server sends back and drops it, except frames for the attacker's own
// address, which go on to its stack (the attacked-link clients' replies).
type attackerSink struct {
	prog   *ebpf.Program
	counts *ebpf.Map
	link   link.Link
}

func (b *Bench) attackerSink() (*attackerSink, error) {
	spec, err := flood.LoadFlood()
	if err != nil {
		return nil, err
	}
	keep := b.attackerIf().IPv4.Addr().As4() // network order, as the program compares it
	if err := spec.Variables[flood.FloodVarCfgCountKeepV4].Set(keep); err != nil {
		return nil, err
	}
	var objs struct {
		Prog   *ebpf.Program `ebpf:"flood_count"`
		Counts *ebpf.Map     `ebpf:"flood_counts"`
	}
	if err := spec.LoadAndAssign(&objs, nil); err != nil {
		return nil, fmt.Errorf("load the attacker's counter: %w", err)
	}
	s := &attackerSink{prog: objs.Prog, counts: objs.Counts}
	err = b.lab.Attacker.Do(func() error {
		var err error
		s.link, err = link.AttachXDP(link.XDPOptions{Program: objs.Prog, Interface: b.attackerIf().Index, Flags: link.XDPDriverMode})
		return err
	})
	if err != nil {
		s.Close()
		return nil, fmt.Errorf("attach the attacker's counter: %w", err)
	}
	return s, nil
}

// answers is the number of TCP frames other than plain SYNs counted so far:
// the SYN-ACKs to the flood, and the few frames of attacked-link clients.
func (s *attackerSink) answers() (uint64, error) {
	var perCPU []uint64
	if err := s.counts.Lookup(uint32(flood.FloodCountSlotFLOOD_COUNT_TCP_OTHER), &perCPU); err != nil {
		return 0, fmt.Errorf("read the attacker's counter: %w", err)
	}
	var n uint64
	for _, v := range perCPU {
		n += v
	}
	return n, nil
}

func (s *attackerSink) Close() error {
	var errs []error
	if s.link != nil {
		errs = append(errs, s.link.Close())
	}
	return errors.Join(append(errs, s.prog.Close(), s.counts.Close())...)
}
