package bench

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/moat-shield/moat/internal/datapath"
	"github.com/moat-shield/moat/internal/flood"
	"github.com/moat-shield/moat/internal/syncookie"
)

// SynRun is one SYN flood against one defence.
type SynRun struct {
	Round      int     `json:"round"`
	SynsSent   uint64  `json:"syns_sent"`
	Seconds    float64 `json:"seconds"`
	SynPPS     float64 `json:"syn_pps"`
	SynAcks    uint64  `json:"synacks_counted"` // by the attacker's XDP counter
	SynAckPPS  float64 `json:"synack_pps"`
	OwnCount   uint64  `json:"own_count"` // the defence's own count of cookies it sent
	OwnCounter string  `json:"own_counter"`
	Answered   float64 `json:"answered"` // SYN-ACKs counted per SYN sent
	Valid      bool    `json:"valid"`
}

// minAnswered is the share of SYNs a cookie defence in "always" mode must
// answer for its SYN-ACK rate to mean anything: each SYN gets one cookie.
const minAnswered = 0.95

// generatorBatch is the live-frames batch of internal/flood (liveBatch).
const generatorBatch = 64

// SynContender is one SYN-cookie implementation.
type SynContender struct {
	Name      string   `json:"name"`
	What      string   `json:"what"`
	Runs      []SynRun `json:"runs"`
	SynAckPPS Summary  `json:"synack_pps"`
	SynPPS    Summary  `json:"syn_pps"`
}

// SynResult is the SYN-flood comparison.
type SynResult struct {
	Flood      string          `json:"flood"`
	Rounds     int             `json:"rounds"`
	Contenders []*SynContender `json:"contenders"`
	MoatNote   string          `json:"moat_note,omitempty"` // why moat's cookies were not measured
	Notes      []string        `json:"notes,omitempty"`
}

// synDefence is a SYN-cookie implementation on the server.
type synDefence interface {
	receiver
	// Issued is the defence's own count of SYN-ACKs it produced.
	Issued(ctx context.Context) (uint64, string, error)
}

// synFlood measures SYN-ACKs per second actually sent under a spoofed SYN
// flood. SYN-ACKs are counted where they arrive: an XDP counter on the
// attacker's interface, which the spoofed range is routed to; it drops
// them, as a spoofed source that does not exist would.
func (b *Bench) synFlood(ctx context.Context) (*SynResult, error) {
	res := &SynResult{
		Flood: fmt.Sprintf("TCP SYN with the options a Linux client sends, to %s port %d (HTTP listener present), sources drawn at random from %s, moat flood on one thread pinned to CPU 0, %s per run",
			b.serverIf().IPv4.Addr(), servicePort, synSources, b.cfg.SynDuration),
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
	by := map[string]*SynContender{}
	for _, d := range defences {
		c := &SynContender{Name: d.Name()}
		by[d.Name()] = c
		res.Contenders = append(res.Contenders, c)
	}

	// Whatever ends the rounds, what was measured is summarised.
	defer func() {
		for _, d := range defences {
			c := by[d.Name()]
			c.What = d.What()
			var acks, syns []float64
			invalid, batchShaped := 0, true
			for _, r := range c.Runs {
				ack := r.SynAckPPS
				if !r.Valid {
					ack = math.NaN()
					invalid++
					batchShaped = batchShaped && r.Answered < 0.05 && r.SynAcks%generatorBatch == 0
				}
				acks, syns = append(acks, ack), append(syns, r.SynPPS)
			}
			c.SynAckPPS, c.SynPPS = Summarize(acks), Summarize(syns)
			if invalid > 0 {
				note := fmt.Sprintf("%s: %d of %d runs answered fewer than %.0f%% of the SYNs sent (or counted more SYN-ACKs than the defence says it sent), so they give no SYN-ACK rate", c.Name, invalid, len(c.Runs), 100*minAnswered)
				if c.Name == "moat" && batchShaped {
					note += fmt.Sprintf(". Every such run answered a whole number of %d-frame batches, a few per second: ", generatorBatch) +
						"the generator (internal/flood, flood_gen) rewrites only the source address, ports and sequence numbers of its template in place, and BPF_PROG_TEST_RUN live frames recycle pages without restoring their data; moat turns each SYN into its SYN-ACK in the same page (XDP_TX), so after the first batch of each generator call the frames it receives are no longer SYNs to the service. Until the generator rewrites every header field per frame, moat's SYN-ACK rate cannot be measured this way"
				}
				res.Notes = append(res.Notes, note)
			}
		}
	}()
	fc := flood.Config{Kind: flood.KindSYN, Sources: synSources, DstPort: servicePort, Duration: b.cfg.SynDuration}
	for round := range b.cfg.Rounds {
		for _, d := range rotate(defences, round) {
			run := SynRun{Round: round + 1}
			err := withReceiver(ctx, d, func() error {
				before, err := counter.Counts()
				if err != nil {
					return err
				}
				own0, _, err := d.Issued(ctx)
				if err != nil {
					return err
				}
				fr, err := b.flood(ctx, fc)
				if err != nil {
					return err
				}
				after, err := counter.Counts()
				if err != nil {
					return err
				}
				own1, name, err := d.Issued(ctx)
				if err != nil {
					return err
				}
				run.SynsSent, run.Seconds, run.SynPPS = fr.Sent, fr.Elapsed.Seconds(), fr.PPS
				// SYN-ACKs are the only TCP frames without a plain SYN that
				// reach the attacker during the run.
				run.SynAcks = after.TCPOther - before.TCPOther
				run.SynAckPPS = float64(run.SynAcks) / fr.Elapsed.Seconds()
				run.OwnCount, run.OwnCounter = own1-own0, name
				run.Answered = float64(run.SynAcks) / float64(max(run.SynsSent, 1))
				run.Valid = run.Answered >= minAnswered && run.SynAcks <= run.OwnCount
				return nil
			})
			if err != nil {
				return res, err
			}
			c := by[d.Name()]
			c.Runs = append(c.Runs, run)
			b.logf("syn round %d %-8s %6.3f Mpps SYN in, %6.3f Mpps SYN-ACK out (own count %d, counted %d)",
				round+1, d.Name(), run.SynPPS/1e6, run.SynAckPPS/1e6, run.OwnCount, run.SynAcks)
		}
	}
	return res, nil
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
// network namespace (thread-self: /proc/self/net follows the main thread).
func netstat(group, name string) (uint64, error) {
	raw, err := os.ReadFile("/proc/thread-self/net/netstat")
	if err != nil {
		return 0, err
	}
	sc := bufio.NewScanner(bytes.NewReader(raw))
	for sc.Scan() {
		head := strings.Fields(sc.Text())
		if !sc.Scan() {
			break
		}
		vals := strings.Fields(sc.Text())
		if len(head) == 0 || head[0] != group+":" || len(vals) != len(head) {
			continue
		}
		for i, h := range head {
			if h == name {
				return strconv.ParseUint(vals[i], 10, 64)
			}
		}
	}
	return 0, fmt.Errorf("no %s %s in /proc/net/netstat", group, name)
}

// moatSynDefence is moat's XDP SYN cookies (bpf/include/syncookie.h) in
// "always" mode on the service port. The filter is loaded against the
// shield's pinned rule maps, so the million-entry denylist is in effect as
// in deployment; the SYN maps are its own, set up with internal/syncookie.
// The tc program that accepts the handshake's last ACK plays no part in the
// SYN-ACK rate and is not attached.
type moatSynDefence struct {
	b    *Bench
	objs moatSynObjects
	link link.Link
}

// moatSynObjects is the part of moat's object the SYN-ACK rate depends on:
// the XDP filter and its maps. The tc program that accepts the handshake's
// last ACK plays no part in answering SYNs, so it is not loaded.
type moatSynObjects struct {
	Filter      *ebpf.Program `ebpf:"moat_filter"`
	Counters    *ebpf.Map     `ebpf:"counters"`
	SynKeys     *ebpf.Map     `ebpf:"syn_keys"`
	SynPorts    *ebpf.Map     `ebpf:"syn_ports"`
	SynRotation *ebpf.Map     `ebpf:"syn_rotation"`
	SynSettings *ebpf.Map     `ebpf:"syn_settings"`
	SynStats    *ebpf.Map     `ebpf:"syn_stats"`
}

func (o *moatSynObjects) Close() error {
	var errs []error
	for _, c := range []interface{ Close() error }{o.Filter, o.Counters, o.SynKeys, o.SynPorts, o.SynRotation, o.SynSettings, o.SynStats} {
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
	m := &moatSynDefence{b: b}
	if err := spec.LoadAndAssign(&m.objs, &ebpf.CollectionOptions{MapReplacements: repl}); err != nil {
		return nil, "load moat's filter with SYN cookies: " + err.Error()
	}
	var ecn bool
	b.lab.Server.Do(func() error { ecn = syncookie.ECNEnabled(); return nil })
	setup := []error{}
	_, err = syncookie.Rotate(m.objs.SynKeys, m.objs.SynRotation)
	setup = append(setup, err,
		syncookie.Configure(m.objs.SynSettings, syncookie.Config{ECN: ecn}),
		syncookie.Protect(m.objs.SynPorts, m.objs.SynStats, servicePort, syncookie.ModeAlways, 0))
	if err := errors.Join(setup...); err != nil {
		m.objs.Close()
		return nil, "configure moat's SYN cookies: " + err.Error()
	}
	return m, ""
}

func (m *moatSynDefence) Name() string { return "moat" }
func (m *moatSynDefence) What() string {
	return fmt.Sprintf("moat_filter in native XDP on the server's interface with SYN protection mode \"always\" on port %d (cookies answered from XDP with XDP_TX; internal/syncookie: Rotate, Configure, Protect), rule maps shared with the shield (denylist of %d prefixes, none matching the SYN sources), SYN maps of its own; own count: cookies_issued of syn_stats", servicePort, len(m.b.deny))
}

func (m *moatSynDefence) Attach(context.Context) error {
	return m.b.lab.Server.Do(func() error {
		var err error
		m.link, err = link.AttachXDP(link.XDPOptions{Program: m.objs.Filter, Interface: m.b.serverIf().Index, Flags: link.XDPDriverMode})
		return err
	})
}

func (m *moatSynDefence) Detach(context.Context) error {
	if m.link == nil {
		return nil
	}
	err := m.link.Close()
	m.link = nil
	return err
}

func (m *moatSynDefence) Dropped(context.Context) (uint64, error) { return 0, nil }

func (m *moatSynDefence) Issued(context.Context) (uint64, string, error) {
	st, err := syncookie.Status(m.objs.SynPorts, m.objs.SynStats)
	if err != nil {
		return 0, "", err
	}
	for _, p := range st {
		if p.Port == servicePort {
			return p.CookiesIssued, "syn_stats cookies_issued", nil
		}
	}
	return 0, "", fmt.Errorf("port %d is not protected", servicePort)
}

func (m *moatSynDefence) Close() error {
	return errors.Join(m.Detach(context.Background()), m.objs.Close())
}
