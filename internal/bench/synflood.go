package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/moat-shield/moat/internal/datapath"
	"github.com/moat-shield/moat/internal/flood"
	"github.com/moat-shield/moat/internal/lab"
	"github.com/moat-shield/moat/internal/shield"
	"github.com/moat-shield/moat/internal/syncookie"
)

// SynRun is one SYN flood against one defence.
type SynRun struct {
	Round      int     `json:"round"`
	SynsSent   uint64  `json:"syns_sent"` // by the generator
	Seconds    float64 `json:"seconds"`
	SynPPS     float64 `json:"syn_pps"`
	SynsTaken  uint64  `json:"syns_taken"` // into the server's veth ring (attacker's tx_queue_*_xdp_xmit)
	TakenPPS   float64 `json:"syns_taken_pps"`
	SynAcks    uint64  `json:"synacks_counted"` // by the attacker's XDP counter
	SynAckPPS  float64 `json:"synack_pps"`
	OwnCount   uint64  `json:"own_count"` // the defence's own count of SYN-ACKs it sent
	OwnCounter string  `json:"own_counter"`
	Answered   float64 `json:"answered"` // SYN-ACKs counted per SYN taken
	Valid      bool    `json:"valid"`
	// With a pinned NAPI thread: how the flood's time went on its CPU, and
	// the SYN-ACKs per second that CPU was not idle.
	NAPI         *NAPIShares `json:"napi,omitempty"`
	SynAckPerCPU float64     `json:"synacks_per_busy_cpu_second,omitempty"`
}

// minAnswered is the share of the SYNs it took in that a defence answering
// every SYN must answer for its SYN-ACK rate to mean anything.
const minAnswered = 0.95

// generatorBatch is the live-frames batch of internal/flood (liveBatch).
const generatorBatch = 64

// synSettle is how long the counters are left to settle after a flood:
// frames still in the server's ring are answered after the generator stops.
const synSettle = 100 * time.Millisecond

// SynContender is one SYN-ACK source in one receive mode.
type SynContender struct {
	Name      string   `json:"name"`
	What      string   `json:"what"`
	Runs      []SynRun `json:"runs"`
	SynAckPPS Summary  `json:"synack_pps"`
	SynPPS    Summary  `json:"syn_pps"`
	TakenPPS  Summary  `json:"syns_taken_pps"`
	// Per round, against the kernel's (or the reflector's) run of the same
	// round and mode; NaN where either run gave no rate.
	RatioToKernel    Summary `json:"synack_ratio_to_kernel"`
	RatioToReflector Summary `json:"synack_ratio_to_reflector"`
	// With a pinned NAPI thread: the shares of the flood's time the thread
	// ran, and its CPU was idle (the server did not take all it could).
	NAPIRan       Summary `json:"napi_thread_ran"`
	ServerCPUIdle Summary `json:"server_cpu_idle"`
	SynAckPerCPU  Summary `json:"synacks_per_busy_cpu_second"`
}

// SynMode is how the server takes the flood in, with every contender's
// runs in that mode.
type SynMode struct {
	Name       string          `json:"name"`
	Receive    string          `json:"receive"`
	NAPI       string          `json:"napi_threads,omitempty"` // the pinned threads of the last round
	Contenders []*SynContender `json:"contenders"`
}

// SynResult is the SYN-flood comparison.
type SynResult struct {
	Flood    string     `json:"flood"`
	Rounds   int        `json:"rounds"`
	Modes    []*SynMode `json:"modes"`
	Goals    []Goal     `json:"goals,omitempty"`
	MoatNote string     `json:"moat_note,omitempty"` // why moat's cookies were not measured
	Notes    []string   `json:"notes,omitempty"`
}

// Names of the SYN comparison's receive modes and contenders.
const (
	synSameCPU     = "same CPU"
	synSeparateCPU = "separate CPUs"
	synKernel      = "kernel"
	synMoat        = "moat"
	synReflector   = "reflector"
)

// synGoalRatio is what the issue asks of moat's SYN-ACK rate: this many
// times the kernel's own cookies.
const synGoalRatio = 8

// synDefence is a SYN-cookie implementation on the server.
type synDefence interface {
	receiver
	// Issued is the defence's own count of SYN-ACKs it produced.
	Issued(ctx context.Context) (uint64, string, error)
}

// synMode is one way for the server to take the flood in.
type synMode struct {
	name     string
	threaded bool // threaded NAPI pinned to a CPU apart from the generator's
	res      *SynMode
	by       map[string]*SynContender
}

// synFlood measures SYN-ACKs per second actually sent under a spoofed SYN
// flood, in two receive modes: inside the generator's batches on its CPU
// (generator and server share one CPU), and in a threaded NAPI kernel
// thread pinned to the other CPU (the figure is the server CPU's capacity;
// what the server cannot take in is dropped at its full ring). SYN-ACKs
// are counted where they arrive: an XDP counter on the attacker's
// interface, which the spoofed range is routed to; it drops them, as a
// spoofed source that does not exist would.
func (b *Bench) synFlood(ctx context.Context) (*SynResult, error) {
	gen, srv, cpuErr := generatorAndServerCPUs()
	res := &SynResult{
		Flood: fmt.Sprintf("TCP SYN with the options a Linux client sends, to %s port %d (HTTP listener present), sources drawn at random from %s, moat flood on one thread pinned to CPU %d, %s per run",
			b.serverIf().IPv4.Addr(), servicePort, synSources, gen, b.cfg.SynDuration),
		Rounds: b.cfg.Rounds,
	}
	counter, err := b.attackerCounter()
	if err != nil {
		return res, err
	}
	defer counter.Close()

	defences := []synDefence{kernelSyn{b}}
	if m, note := b.moatSyn(); m != nil {
		defer m.Close()
		defences = append(defences, m)
	} else {
		res.MoatNote = note
		b.logf("moat SYN cookies not measured: %s", note)
	}
	refl, err := b.reflector()
	if err != nil {
		return res, err
	}
	defer refl.Close()
	defences = append(defences, refl)

	modes := []*synMode{{name: synSameCPU}, {name: synSeparateCPU, threaded: true}}
	if cpuErr != nil {
		modes = modes[:1]
		res.Notes = append(res.Notes, "the separate-CPU mode did not run: "+cpuErr.Error())
	}
	for _, m := range modes {
		m.res = &SynMode{Name: m.name}
		if m.threaded {
			m.res.Receive = fmt.Sprintf("threaded NAPI on the server's %s, its kernel thread pinned to CPU %d, the generator on CPU %d: the server takes frames off the veth's ring (256 frames) on a CPU of its own, so the SYN-ACK rate is what one server CPU answers; SYNs that find the ring full are dropped at the attacker's end before the server sees them (\"taken\" counts the others: attacker's tx_queue_*_xdp_xmit). The attacker's %s takes the SYN-ACKs in on a threaded NAPI thread of its own, pinned to the generator's CPU %d at real-time priority, so that it keeps up with any server: a veth otherwise runs its peer's NAPI on the sending CPU, and the server's CPU would also pay for receiving its own SYN-ACKs at the attacker's end, and for handing their pages back across CPUs to the generator's page pool (measured on an Intel Xeon: moat's rate fell from about 3.5 to 2 Mpps, the reflector's capacity from 8.5 to 5.3)",
				b.serverIf().Name, srv, gen, b.attackerIf().Name, gen)
		} else {
			m.res.Receive = fmt.Sprintf("the server takes the flood inside the generator's batches on CPU %d (veth runs the receiver on the sender's CPU): generator and server share one CPU, and every SYN sent is taken", gen)
		}
		m.by = map[string]*SynContender{}
		for _, d := range defences {
			c := &SynContender{Name: d.Name()}
			m.by[d.Name()] = c
			m.res.Contenders = append(m.res.Contenders, c)
		}
		res.Modes = append(res.Modes, m.res)
	}

	// Whatever ends the rounds, what was measured is summarised.
	defer func() {
		for _, m := range modes {
			for _, d := range defences {
				c := m.by[d.Name()]
				c.What = d.What()
				if note := summarizeSyn(c, m.by[synKernel], m.by[synReflector]); note != "" {
					res.Notes = append(res.Notes, m.name+": "+note)
				}
			}
			if note := slowReflectorNote(m.by[synKernel], m.by[synReflector]); note != "" {
				res.Notes = append(res.Notes, m.name+": "+note)
			}
			if note := waitingReflectorNote(m.by[synMoat], m.by[synReflector]); note != "" {
				res.Notes = append(res.Notes, m.name+": "+note)
			}
		}
		res.Goals = synGoals(res)
	}()
	fc := flood.Config{Kind: flood.KindSYN, Sources: synSources, DstPort: servicePort, Duration: b.cfg.SynDuration}
	for round := range b.cfg.Rounds {
		for _, m := range rotate(modes, round) {
			if err := b.synModeRound(ctx, m, round, defences, counter, fc); err != nil {
				return res, err
			}
		}
	}
	return res, nil
}

// synModeRound runs every defence once in one receive mode.
func (b *Bench) synModeRound(ctx context.Context, m *synMode, round int, defences []synDefence, counter *flood.Counter, fc flood.Config) (err error) {
	var pin, back *pinnedNAPI
	if m.threaded {
		if pin, err = b.pinNAPI(ctx); err != nil {
			return err
		}
		defer func() { err = errors.Join(err, pin.release(context.WithoutCancel(ctx))) }()
		if back, err = b.pinReturnNAPI(ctx); err != nil {
			return err
		}
		defer func() { err = errors.Join(err, back.release(context.WithoutCancel(ctx))) }()
		m.res.NAPI = pin.describe() + "; the attacker's end: " + back.describe()
	}
	for _, d := range rotate(defences, round) {
		if err := back.check(); err != nil {
			return err
		}
		run, err := b.synRun(ctx, d, counter, fc, pin)
		if err != nil {
			return fmt.Errorf("%s, %s: %w", m.name, d.Name(), err)
		}
		run.Round = round + 1
		c := m.by[d.Name()]
		c.Runs = append(c.Runs, run)
		busy := ""
		if n := run.NAPI; n != nil {
			busy = fmt.Sprintf(", NAPI thread ran %.0f%% waited %.0f%%, CPU %d idle %.0f%%", 100*n.Ran, 100*n.Waited, pin.cpu, 100*n.CPUIdle)
		}
		b.logf("syn round %d %-13s %-9s %6.3f Mpps SYN sent, %6.3f Mpps taken, %6.3f Mpps SYN-ACK out (own count %d, counted %d%s)",
			round+1, m.name, d.Name(), run.SynPPS/1e6, run.TakenPPS/1e6, run.SynAckPPS/1e6, run.OwnCount, run.SynAcks, busy)
	}
	return nil
}

// synRun floods one defence once.
func (b *Bench) synRun(ctx context.Context, d synDefence, counter *flood.Counter, fc flood.Config, pin *pinnedNAPI) (SynRun, error) {
	var run SynRun
	if err := b.freshService(); err != nil {
		return run, err
	}
	err := withReceiver(ctx, d, func() error {
		if err := pin.check(); err != nil {
			return err
		}
		before, err := counter.Counts()
		if err != nil {
			return err
		}
		own0, _, err := d.Issued(ctx)
		if err != nil {
			return err
		}
		taken0, err := b.floodDelivered(ctx)
		if err != nil {
			return err
		}
		use, err := pin.startUse()
		if err != nil {
			return err
		}
		fr, err := b.flood(ctx, fc)
		if err != nil {
			return err
		}
		if pin != nil {
			sh, err := use.shares()
			if err != nil {
				return err
			}
			run.NAPI = &sh
		}
		select {
		case <-time.After(synSettle):
		case <-ctx.Done():
			return ctx.Err()
		}
		after, err := counter.Counts()
		if err != nil {
			return err
		}
		own1, name, err := d.Issued(ctx)
		if err != nil {
			return err
		}
		taken1, err := b.floodDelivered(ctx)
		if err != nil {
			return err
		}
		secs := fr.Elapsed.Seconds()
		run.SynsSent, run.Seconds, run.SynPPS = fr.Sent, secs, fr.PPS
		run.SynsTaken = taken1 - taken0
		run.TakenPPS = float64(run.SynsTaken) / secs
		// SYN-ACKs are the only TCP frames without a plain SYN that
		// reach the attacker during the run.
		run.SynAcks = after.TCPOther - before.TCPOther
		run.SynAckPPS = float64(run.SynAcks) / secs
		if n := run.NAPI; n != nil && n.CPUIdle < 1 {
			run.SynAckPerCPU = float64(run.SynAcks) / (n.Seconds * (1 - n.CPUIdle))
		}
		run.OwnCount, run.OwnCounter = own1-own0, name
		run.Answered = float64(run.SynAcks) / float64(max(run.SynsTaken, 1))
		run.Valid = run.Answered >= minAnswered && run.SynAcks <= run.OwnCount
		return nil
	})
	return run, err
}

// summarizeSyn fills c's summaries from its runs, with its ratios to the
// kernel's and the reflector's runs of the same rounds (either may be nil),
// and returns a note when some runs gave no rate.
func summarizeSyn(c, kernel, refl *SynContender) string {
	var acks, syns, taken, toKernel, toRefl, ran, idle, perCPU []float64
	invalid, batchShaped := 0, true
	for _, r := range c.Runs {
		ack := r.SynAckPPS
		if !r.Valid {
			ack = math.NaN()
			invalid++
			batchShaped = batchShaped && r.Answered < 0.05 && r.SynAcks%generatorBatch == 0
		}
		acks, syns, taken = append(acks, ack), append(syns, r.SynPPS), append(taken, r.TakenPPS)
		if r.NAPI != nil {
			ran, idle = append(ran, r.NAPI.Ran), append(idle, r.NAPI.CPUIdle)
			pc := r.SynAckPerCPU
			if !r.Valid {
				pc = math.NaN()
			}
			perCPU = append(perCPU, pc)
		}
		toKernel = append(toKernel, ack/runRate(kernel, r.Round))
		toRefl = append(toRefl, ack/runRate(refl, r.Round))
	}
	c.SynAckPPS, c.SynPPS, c.TakenPPS = Summarize(acks), Summarize(syns), Summarize(taken)
	c.RatioToKernel, c.RatioToReflector = Summarize(toKernel), Summarize(toRefl)
	c.NAPIRan, c.ServerCPUIdle, c.SynAckPerCPU = Summarize(ran), Summarize(idle), Summarize(perCPU)
	if invalid == 0 {
		return ""
	}
	note := fmt.Sprintf("%s: %d of %d runs answered fewer than %.0f%% of the SYNs taken (or counted more SYN-ACKs than the defence says it sent), so they give no SYN-ACK rate", c.Name, invalid, len(c.Runs), 100*minAnswered)
	if c.Name != synKernel && batchShaped {
		note += fmt.Sprintf(". Every such run answered a whole number of %d-frame batches: ", generatorBatch) +
			"the answer is written into the page the SYN came in (XDP_TX), and BPF_PROG_TEST_RUN live frames recycle pages without restoring their data, so a generator that does not restore its template before every frame sends the answers on instead of SYNs"
	}
	return note
}

// slowReflectorNote says which rounds the reflector ran below two thirds
// of its fastest round, if any, and whether the kernel ran slower in them
// too. The reflector is the ceiling of every XDP_TX answerer, so in such
// rounds the lab's XDP_TX path itself was slow: an XDP_TX answerer's ratio
// to the kernel falls with it, its ratio to the reflector of the same
// round does not.
func slowReflectorNote(kernel, refl *SynContender) string {
	if kernel == nil || refl == nil || !(refl.SynAckPPS.Max > 0) {
		return ""
	}
	var slow []string
	var kSlow, kOther []float64
	for _, r := range refl.Runs {
		if !r.Valid {
			continue
		}
		k := runRate(kernel, r.Round)
		if r.SynAckPPS < refl.SynAckPPS.Max*2/3 {
			slow = append(slow, fmt.Sprint(r.Round))
			kSlow = append(kSlow, k)
		} else {
			kOther = append(kOther, k)
		}
	}
	if len(slow) == 0 {
		return ""
	}
	rounds := "round "
	if len(slow) > 1 {
		rounds = "rounds "
	}
	note := fmt.Sprintf("the reflector answered %s to %s M/s across rounds, below two thirds of its fastest in %s%s",
		mpps(refl.SynAckPPS.Min), mpps(refl.SynAckPPS.Max), rounds, strings.Join(slow, ", "))
	ks, ko := Summarize(kSlow).Median, Summarize(kOther).Median
	if ks >= ko*0.9 {
		note += fmt.Sprintf(", while the kernel, whose SYN-ACKs leave through the stack, kept its rate (%s M/s there, %s M/s in the other rounds)", mpps(ks), mpps(ko))
	} else if !math.IsNaN(ks) && !math.IsNaN(ko) {
		note += fmt.Sprintf(", and the kernel ran slower there too (%s M/s, %s M/s in the other rounds)", mpps(ks), mpps(ko))
	}
	return note + ". The lab's XDP_TX path itself was slow in those rounds, so every XDP_TX answerer's ratio to the kernel falls in them; its ratio to the reflector of the same round is the steadier figure"
}

// reflectorWaited is the share of the flood the reflector's CPU may idle,
// waiting for the generator, before its rate stops being that CPU's.
const reflectorWaited = 0.2

// waitingReflectorNote says when the reflector's server CPU idled for a
// good part of the flood: it answered all the generator could send, so its
// rate, and every ratio to it, is the generator's; the rates per busy
// second of the server's CPU compare the two answerers.
func waitingReflectorNote(moat, refl *SynContender) string {
	if refl == nil || !(refl.ServerCPUIdle.Median > reflectorWaited) {
		return ""
	}
	note := fmt.Sprintf("the reflector's CPU was idle %.0f%% of the flood (median): it answered all the generator could send, so its rate, and the column of ratios to it, are the generator's, not the server CPU's",
		100*refl.ServerCPUIdle.Median)
	if moat != nil && moat.SynAckPerCPU.Median > 0 && refl.SynAckPerCPU.Median > 0 {
		note += fmt.Sprintf("; per second of the server's CPU busy, the reflector answered %s M/s and moat %s M/s (%.0f%%)",
			mpps(refl.SynAckPerCPU.Median), mpps(moat.SynAckPerCPU.Median), 100*moat.SynAckPerCPU.Median/refl.SynAckPerCPU.Median)
	}
	return note
}

// runRate is the valid SYN-ACK rate of c's run in a round, NaN when c is
// missing or that run gave no rate.
func runRate(c *SynContender, round int) float64 {
	if c == nil {
		return math.NaN()
	}
	for _, r := range c.Runs {
		if r.Round == round && r.Valid {
			return r.SynAckPPS
		}
	}
	return math.NaN()
}

// synGoals checks moat's SYN-ACK rate against the kernel's, per mode.
func synGoals(res *SynResult) []Goal {
	var goals []Goal
	for _, m := range res.Modes {
		var moat, kernel *SynContender
		for _, c := range m.Contenders {
			switch c.Name {
			case synMoat:
				moat = c
			case synKernel:
				kernel = c
			}
		}
		if moat == nil || kernel == nil {
			continue
		}
		r := moat.RatioToKernel.Median
		goals = append(goals, Goal{
			Goal:   fmt.Sprintf("moat issues at least %dx the kernel's SYN-ACKs per second (%s)", synGoalRatio, m.Name),
			Actual: fmt.Sprintf("%sx (moat %s Mpps, kernel %s Mpps; median of per-round ratios)", ratio(r), mpps(moat.SynAckPPS.Median), mpps(kernel.SynAckPPS.Median)),
			Met:    r >= synGoalRatio,
		})
	}
	return goals
}

// reflectDefence is flood_reflect (bpf/flood.bpf.c): every SYN back to its
// sender as a SYN-ACK from XDP, with nothing looked up or computed. No SYN
// cookie answerer can be faster on this device: the ceiling.
type reflectDefence struct {
	b    *Bench
	prog *ebpf.Program
	link link.Link
}

func (b *Bench) reflector() (*reflectDefence, error) {
	spec, err := flood.LoadFlood()
	if err != nil {
		return nil, err
	}
	var objs struct {
		Prog *ebpf.Program `ebpf:"flood_reflect"`
	}
	if err := spec.LoadAndAssign(&objs, nil); err != nil {
		return nil, fmt.Errorf("load the reflector: %w", err)
	}
	return &reflectDefence{b: b, prog: objs.Prog}, nil
}

func (r *reflectDefence) Name() string { return synReflector }
func (r *reflectDefence) What() string {
	return "flood_reflect (bpf/flood.bpf.c) in native XDP on the server's interface: every IPv4 TCP SYN goes back as a SYN-ACK with XDP_TX (MACs, addresses and ports swapped, flags SYN+ACK, ack = seq + 1, options as they came, checksums updated), no lookup and no cookie: the ceiling the veth's XDP_TX path sets for any XDP SYN-cookie answerer; own count: the veth's rx_queue_*_xdp_tx"
}

func (r *reflectDefence) Attach(context.Context) error {
	return r.b.lab.Server.Do(func() error {
		var err error
		r.link, err = link.AttachXDP(link.XDPOptions{Program: r.prog, Interface: r.b.serverIf().Index, Flags: link.XDPDriverMode})
		return err
	})
}

func (r *reflectDefence) Detach(context.Context) error {
	if r.link == nil {
		return nil
	}
	err := r.link.Close()
	r.link = nil
	return err
}

func (r *reflectDefence) Dropped(context.Context) (uint64, error) { return 0, nil }

func (r *reflectDefence) Issued(ctx context.Context) (uint64, string, error) {
	n, err := vethStat(ctx, r.b.lab.Server, r.b.serverIf().Name, "rx_queue_", "_xdp_tx")
	return n, "veth rx_queue_*_xdp_tx", err
}

func (r *reflectDefence) Close() error {
	return errors.Join(r.Detach(context.Background()), r.prog.Close())
}

// attackerCounter attaches the counting, dropping XDP program to the
// attacker's interface.
func (b *Bench) attackerCounter() (*flood.Counter, error) {
	var c *flood.Counter
	err := b.lab.Attacker.Do(func() error {
		var err error
		c, err = flood.AttachCounter(b.attackerIf().Index, false)
		return err
	})
	return c, err
}

// kernelSyn is the kernel's own SYN cookies, always on
// (net.ipv4.tcp_syncookies=2), answering for the HTTP listener.
type kernelSyn struct{ b *Bench }

func (kernelSyn) Name() string { return "kernel" }
func (kernelSyn) What() string {
	return "Linux SYN cookies with net.ipv4.tcp_syncookies=2 (a cookie for every SYN) in the server namespace, Go HTTP listener on the port, no XDP program on the server's interface; own count: TcpExt SyncookiesSent"
}
func (k kernelSyn) Attach(context.Context) error {
	return sysctl(k.b.lab.Server, "net.ipv4.tcp_syncookies", "2")
}
func (k kernelSyn) Detach(context.Context) error {
	return sysctl(k.b.lab.Server, "net.ipv4.tcp_syncookies", "1")
}
func (kernelSyn) Dropped(context.Context) (uint64, error) { return 0, nil }
func (k kernelSyn) Issued(context.Context) (uint64, string, error) {
	var n uint64
	err := k.b.lab.Server.Do(func() error {
		var err error
		n, err = netstat("TcpExt", "SyncookiesSent")
		return err
	})
	return n, "TcpExt SyncookiesSent", err
}

// netstat reads one counter of /proc/net/netstat for the calling thread's
// network namespace.
func netstat(group, name string) (uint64, error) {
	c, err := lab.NetCounters()
	if err != nil {
		return 0, err
	}
	n, ok := c[group+"."+name]
	if !ok {
		return 0, fmt.Errorf("no %s %s in /proc/net/netstat", group, name)
	}
	return n, nil
}

// moatSynDefence is moat's XDP SYN cookies (bpf/include/syncookie.h) in
// "always" mode on the service port. The filter is loaded against the
// shield's pinned rule maps, so the million-entry denylist is in effect as
// in deployment; the SYN maps are its own, set up with internal/syncookie.
// The tc program that accepts the handshake's last ACK plays no part in the
// SYN-ACK rate and is not attached.
type moatSynDefence struct {
	b      *Bench
	objs   moatSynObjects
	link   link.Link
	census *censusRunner
}

// moatSynObjects is the part of moat's object the SYN-ACK rate depends on:
// the XDP filter, the socket census that spares it socket lookups, and
// their maps. The tc program that accepts the handshake's last ACK plays
// no part in answering SYNs, so it is not loaded.
type moatSynObjects struct {
	Filter      *ebpf.Program `ebpf:"moat_filter"`
	CensusProg  *ebpf.Program `ebpf:"moat_syn_census"`
	SynCensus   *ebpf.Map     `ebpf:"syn_census"`
	Counters    *ebpf.Map     `ebpf:"counters"`
	SynKeys     *ebpf.Map     `ebpf:"syn_keys"`
	SynPorts    *ebpf.Map     `ebpf:"syn_ports"`
	SynRotation *ebpf.Map     `ebpf:"syn_rotation"`
	SynSettings *ebpf.Map     `ebpf:"syn_settings"`
	SynCounters *ebpf.Map     `ebpf:"syn_counters"`
}

func (o *moatSynObjects) Close() error {
	var errs []error
	for _, c := range []interface{ Close() error }{o.Filter, o.CensusProg, o.SynCensus, o.Counters, o.SynKeys, o.SynPorts, o.SynRotation, o.SynSettings, o.SynCounters} {
		if c != nil {
			errs = append(errs, c.Close())
		}
	}
	return errors.Join(errs...)
}

// moatSyn prepares moat's SYN cookies, or says why it cannot.
func (b *Bench) moatSyn() (*moatSynDefence, string) {
	if _, err := b.ensureMoat(); err != nil {
		return nil, "moat could not be set up: " + err.Error()
	}
	spec, err := datapath.LoadMoat()
	if err != nil {
		return nil, "load moat's BPF object: " + err.Error()
	}
	// The rule maps are the shield's, so the million-entry denylist is in
	// the path; the SYN maps are this program's own, so that protecting
	// the port here leaves the shield's SYN state (which the other
	// comparisons run with) untouched.
	repl := map[string]*ebpf.Map{}
	for name := range spec.Maps {
		if m := b.shield.Map(name); m != nil && !strings.HasPrefix(name, "syn_") {
			repl[name] = m
		}
	}
	if err := shield.PrepareFilter(spec); err != nil {
		return nil, err.Error()
	}
	m := &moatSynDefence{b: b}
	if err := spec.LoadAndAssign(&m.objs, &ebpf.CollectionOptions{MapReplacements: repl}); err != nil {
		return nil, "load moat's filter with SYN cookies: " + err.Error()
	}
	setup := []error{}
	_, err = syncookie.Rotate(m.objs.SynKeys, m.objs.SynRotation)
	setup = append(setup, err,
		syncookie.Configure(m.objs.SynSettings, syncookie.Config{}),
		syncookie.Protect(m.objs.SynPorts, m.objs.SynCounters, m.objs.SynCensus, servicePort, syncookie.ModeAlways, 0))
	if err := errors.Join(setup...); err != nil {
		m.objs.Close()
		return nil, "configure moat's SYN cookies: " + err.Error()
	}
	return m, ""
}

func (m *moatSynDefence) Name() string { return "moat" }
func (m *moatSynDefence) What() string {
	return fmt.Sprintf("moat_filter in native XDP on the server's interface with SYN protection mode \"always\" on port %d (cookies answered from XDP with XDP_TX; internal/syncookie: Rotate, Configure, Protect), the socket census taken every %s in the server's namespace as the daemon does (syncookie.Census), rule maps shared with the shield (denylist of %d prefixes, none matching the SYN sources), SYN maps of its own; own count: cookies_issued of syn_counters", servicePort, syncookie.DefaultCensusEvery, len(m.b.deny))
}

func (m *moatSynDefence) Attach(context.Context) error {
	c, err := syncookie.NewCensus(m.objs.CensusProg, m.objs.SynCensus)
	if err != nil {
		return err
	}
	if m.census, err = startCensus(m.b.lab.Server, c); err != nil {
		return err
	}
	return m.b.lab.Server.Do(func() error {
		var err error
		m.link, err = link.AttachXDP(link.XDPOptions{Program: m.objs.Filter, Interface: m.b.serverIf().Index, Flags: link.XDPDriverMode})
		return err
	})
}

func (m *moatSynDefence) Detach(context.Context) error {
	var errs []error
	if m.census != nil {
		errs = append(errs, m.census.stop())
		m.census = nil
	}
	if m.link != nil {
		errs = append(errs, m.link.Close())
		m.link = nil
	}
	return errors.Join(errs...)
}

func (m *moatSynDefence) Dropped(context.Context) (uint64, error) { return 0, nil }

func (m *moatSynDefence) Issued(context.Context) (uint64, string, error) {
	st, err := syncookie.Status(m.objs.SynPorts, m.objs.SynCounters)
	if err != nil {
		return 0, "", err
	}
	for _, p := range st {
		if p.Port == servicePort {
			return p.CookiesIssued, "syn_counters cookies_issued", nil
		}
	}
	return 0, "", fmt.Errorf("port %d is not protected", servicePort)
}

func (m *moatSynDefence) Close() error {
	return errors.Join(m.Detach(context.Background()), m.objs.Close())
}
