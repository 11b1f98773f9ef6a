package metrics

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"sort"
	"strconv"
	"sync"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/moat-shield/moat/internal/datapath"
	"github.com/moat-shield/moat/internal/ratelimit"
	"github.com/moat-shield/moat/internal/rules"
	"github.com/moat-shield/moat/internal/shield"
	"github.com/moat-shield/moat/internal/syncookie"
)

// DefaultTopEntries is how many allow/deny entries with the most hits, and
// heavy-hitter sources, are exported when Config.TopEntries is 0.
const DefaultTopEntries = 10

// DefaultScanShare bounds the list scans to 5% of one CPU.
const DefaultScanShare = 0.05

// Config says what to read and how much of it to export.
type Config struct {
	// Root is the bpffs directory of moat's pinned state
	// (shield.DefaultRoot when empty).
	Root string
	// TopEntries is how many allow/deny entries, those with the most hits,
	// and how many heavy-hitter sources get a series of their own; 0 means
	// DefaultTopEntries, negative none.
	// Every entry would be a series per rule: a million-entry denylist
	// would make a million series, which no Prometheus should ingest.
	// Whole lists are already counted by moat_packets_total{reason=
	// "allowlist"|"denylist"}, so only the heavy hitters are added.
	TopEntries int
	// ScanShare is the largest share of one CPU's time that reading the
	// allow/deny lists (for the top entries and their fill levels) may
	// take: a scan that took d is reused for d/ScanShare. 0 means
	// DefaultScanShare. Everything else is read at every scrape.
	ScanShare float64
	// Logger receives scrape errors (slog.Default() when nil).
	Logger *slog.Logger
	// Extra collectors join the registry: the daemon's feeds.
	Extra []prometheus.Collector
}

func (c Config) withDefaults() Config {
	if c.Root == "" {
		c.Root = shield.DefaultRoot
	}
	if c.TopEntries == 0 {
		c.TopEntries = DefaultTopEntries
	}
	if c.ScanShare <= 0 || c.ScanShare > 1 {
		c.ScanShare = DefaultScanShare
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

func desc(name, help string, labels ...string) *prometheus.Desc {
	return prometheus.NewDesc(name, help, labels, nil)
}

var (
	packetsDesc = desc("moat_packets_total",
		"Packets moat's XDP filter decided on an interface, by verdict and reason. pass: pass (no rule matched), "+
			"non_ip, allowlist, port_allow; drop: denylist, port_drop, ratelimit (a source over its limit), "+
			"budget (over a flood budget), syn_defence (ACKs with no socket and no valid cookie, SYNs unfit "+
			"for a cookie); pass or drop by policy: fragment, malformed; tx: syn_cookie (SYNs answered with a "+
			"SYN-ACK cookie, counted as the SYN-ACKs sent); monitored: the packets a drop reason would have "+
			"dropped and that passed in monitor mode (moat_monitor_mode). Per port: moat_syncookie_*.",
		"interface", "verdict", "reason")
	bytesDesc = desc("moat_bytes_total",
		"Bytes of the packets in moat_packets_total: whole frames as XDP sees them, from the Ethernet header, "+
			"without FCS; for verdict tx, the SYN-ACKs sent.",
		"interface", "verdict", "reason")
	attachedDesc = desc("moat_interface_attached",
		"1 if moat's XDP program is attached to the interface in this mode (native, generic); "+
			"0 (mode \"\") if its pins remain but the interface has gone.",
		"interface", "mode")
	progRunTimeDesc = desc("moat_program_run_time_seconds_total",
		"Time the kernel spent running a moat BPF program (xdp_filter, tc_syn_accept) on an interface. "+
			"Only counts while the sysctl kernel.bpf_stats_enabled is 1 (see moat_bpf_stats_enabled); it costs a few ns per packet.",
		"interface", "program")
	progRunsDesc = desc("moat_program_runs_total",
		"Runs of a moat BPF program on an interface. Only counts while the sysctl kernel.bpf_stats_enabled is 1.",
		"interface", "program")
	bpfStatsDesc = desc("moat_bpf_stats_enabled",
		"1 if the sysctl kernel.bpf_stats_enabled is 1, so that moat_program_run_time_seconds_total and moat_program_runs_total count.")

	portRuleHitsDesc = desc("moat_port_rule_hits_total",
		"Packets a protocol/port or ICMP type rule matched (rule as the CLI writes it, e.g. tcp/22, udp/1000-2000), shared by all interfaces.",
		"rule", "action")
	entryHitsDesc = desc("moat_list_entry_hits_total",
		"Packets one allow or deny entry decided, shared by all interfaces. Only the entries with the most hits are "+
			"exported (the top N, configurable); whole lists are counted by moat_packets_total{reason=\"allowlist\"|\"denylist\"}.",
		"list", "prefix")

	mapEntriesDesc = desc("moat_map_entries",
		"Entries in one of moat's BPF maps (the allow/deny lists, comments, port rule definitions, SYN-protected ports, "+
			"rate limits and their per-source and heavy-hitter tables).",
		"map")
	mapMaxEntriesDesc = desc("moat_map_max_entries",
		"How many entries the map can hold; inserts fail beyond it.",
		"map")
	mapMemoryDesc = desc("moat_map_memory_bytes",
		"Kernel memory the map is charged for (memlock), as the kernel reports it; absent for maps it reports none for.",
		"map")

	synSYNsDesc = desc("moat_syncookie_syns_total",
		"SYNs (without ACK) that reached a SYN-protected port.", "port")
	synIssuedDesc = desc("moat_syncookie_cookies_issued_total",
		"SYN-ACKs with a moat cookie sent for a port (XDP_TX).", "port")
	synAcceptedDesc = desc("moat_syncookie_cookies_accepted_total",
		"Handshakes completed with a valid moat cookie and handed to the kernel while the listener's accept queue had room (see moat_syncookie_accept_queue_full_total).", "port")
	synRejectedDesc = desc("moat_syncookie_cookies_rejected_total",
		"Pure ACKs to a listener dropped in cookie mode because their cookie, moat's or the kernel's, is invalid (forged, or older than two key rotations).", "port")
	synACKsDroppedDesc = desc("moat_syncookie_acks_dropped_total",
		"ACKs with no socket and no valid cookie dropped in XDP: the rejected cookies, and ACKs whose headers are too long to check.", "port")
	synAcceptErrorsDesc = desc("moat_syncookie_accept_errors_total",
		"Valid cookies whose handshake the kernel refused: tcp_syncookies or tcp_window_scaling turned off between SYN-ACK and ACK, or the listener replaced by an MPTCP one.", "port")
	synQueueFullDesc = desc("moat_syncookie_accept_queue_full_total",
		"Valid cookies whose handshake came while the listener's accept queue was full: the kernel dropped the connection (TcpExt ListenOverflows) and the client sends again. Not in moat_syncookie_cookies_accepted_total. tc's view as the handshake passes, which the stack may overtake within a receive batch; the sum of the two is exact.", "port")
	synMPTCPDesc = desc("moat_syncookie_mptcp_syns_total",
		"SYNs left to the kernel in cookie mode because the listener is MPTCP: the kernel makes no connection from a moat cookie for one. Also in moat_syncookie_syns_passed_total.", "port")
	synNATDesc = desc("moat_syncookie_nat_syns_total",
		"SYNs left to the kernel in cookie mode because NAT runs for their address family in the listener's namespace: the kernel drops the request socket of a moat cookie handshake there. Also in moat_syncookie_syns_passed_total.", "port")
	synResetsDesc = desc("moat_syncookie_resets_sent_total",
		"RSTs sent from XDP in cookie mode for ACKs that fit no socket and no cookie, as the kernel would answer them (about syn.stray_ack_resets a second per interface); those ACKs also count in moat_syncookie_acks_dropped_total.", "port")
	synSYNsDroppedDesc = desc("moat_syncookie_syns_dropped_total",
		"SYNs moat refused to answer in cookie mode (with data, FIN or RST, or otherwise unfit for a cookie), dropped.", "port")
	synSYNsPassedDesc = desc("moat_syncookie_syns_passed_total",
		"SYNs left to the kernel in cookie mode: net.ipv4.tcp_syncookies 0, no listener in this namespace, a time-wait, request or established socket owns the tuple, a destination this host routes on, no key or stale keys (these also count in moat_syncookie_stale_key_syns_total), an MPTCP listener (also in moat_syncookie_mptcp_syns_total), NAT in the listener's namespace (also in moat_syncookie_nat_syns_total), a SYN signed with TCP-MD5 or TCP-AO for a listener with keys, double VLAN tags, or a frame that could not be rewritten.", "port")
	synStaleKeyDesc = desc("moat_syncookie_stale_key_syns_total",
		"SYNs left to the kernel because the key rotation is stale (see moat_syncookie_keys_stale).", "port")
	synFloodingDesc = desc("moat_syncookie_flooding",
		"1 while a SYN flood is detected on the port and moat answers its SYNs with cookies (auto mode), else 0.", "port")
	synFloodChangeDesc = desc("moat_syncookie_flooding_last_change_timestamp_seconds",
		"Unix time at which moat_syncookie_flooding last changed for the port; 0 if it never has.", "port")
	synThresholdDesc = desc("moat_syncookie_flood_threshold_syns_per_second",
		"SYN rate on the port above which auto mode detects a flood.", "port")
	synPortInfoDesc = desc("moat_syncookie_port_info",
		"A SYN-protected port and its mode (always, auto, never); value 1.", "port", "mode")
	keyRotationsDesc = desc("moat_syncookie_key_rotations_total",
		"SYN cookie key rotations since moat's maps were created; 0 means no key is installed and no cookies are issued.")
	keysStaleDesc = desc("moat_syncookie_keys_stale",
		"1 if the last SYN cookie key rotation is older than 2.5 rotation periods: the data path then issues no cookies "+
			"(is the daemon that rotates the keys running?).")
	censusPassesDesc = desc("moat_syncookie_census_passes_total",
		"Socket census passes since moat's maps were created (the daemon takes one a second).")
	censusSocketsDesc = desc("moat_syncookie_census_sockets",
		"Sockets of protected ports (established, request, time-wait) that the last census pass marked.")
	censusCurrentDesc = desc("moat_syncookie_census_current",
		"1 while the socket census is current, so that SYNs and ACKs whose tuple no socket owns skip the socket lookup; "+
			"0: every SYN and ACK of a protected port pays the lookup (is the daemon running?).")
	keyRotatedDesc = desc("moat_syncookie_key_last_rotation_timestamp_seconds",
		"Unix time of the last SYN cookie key rotation; 0 if none. Keys rotate every minute while the daemon runs.")

	rlPacketsDesc = desc("moat_ratelimit_packets_total",
		"Packets a rate limit (kind source: per source; budget: one bucket for the whole scope) let through (pass), "+
			"dropped (drop), or found over the limit and let through in monitor mode (monitored), by the limit's scope "+
			"as the CLI writes it (all, udp, tcp/80, tcp+syn, ...). Drops and monitored packets per interface are "+
			"moat_packets_total{reason=\"ratelimit\"|\"budget\"}.",
		"kind", "scope", "verdict")
	rlBytesDesc = desc("moat_ratelimit_bytes_total",
		"Bytes of the packets in moat_ratelimit_packets_total.", "kind", "scope", "verdict")
	rlUntrackedDesc = desc("moat_ratelimit_untracked_packets_total",
		"Packets a source limit passed before their source had a bucket of its own (below the tracking threshold).",
		"kind", "scope")
	rlTrackedDesc = desc("moat_ratelimit_sources_tracked_total",
		"Per-source buckets a source limit created.", "kind", "scope")
	rlBlocksDesc = desc("moat_ratelimit_auto_blocks_total",
		"Denylist entries a source limit wrote for sources over their limit.", "kind", "scope")
	rlBlockErrorsDesc = desc("moat_ratelimit_auto_block_errors_total",
		"Auto-blocks that could not be written (denylist full).", "kind", "scope")

	listScanAgeDesc = desc("moat_list_scan_age_seconds",
		"Age of the read of the allow/deny lists behind moat_list_entry_hits_total and their moat_map_entries: "+
			"big lists are read again only when the last read is older than its duration times 20, to bound the cost of scrapes.")

	scrapeSuccessDesc = desc("moat_scrape_collector_success",
		"1 if this part of the scrape read moat's state without error, 0 if it failed (the error is logged).",
		"collector")
	scrapeDurationDesc = desc("moat_scrape_collector_duration_seconds",
		"How long this part of the scrape took.", "collector")
	monitorDesc = desc("moat_monitor_mode",
		"1 if moat is in monitor mode (moat policy monitor on): nothing is dropped, what rules would drop "+
			"passes and is counted as verdict monitored, and the SYN defence stands down.")
	stateDesc = desc("moat_state_present",
		"1 if moat's pinned state exists under the configured bpffs root, 0 if moat is not set up.")
)

// Collector is a prometheus.Collector that reads moat's pinned maps at
// every scrape; it keeps no state between scrapes and takes no lock, so a
// scrape never waits for, or delays, a writer of the rules.
type Collector struct {
	cfg Config

	mu       sync.Mutex
	lastScan *listScan
}

// NewCollector returns a collector of the state under cfg.Root.
func NewCollector(cfg Config) *Collector {
	return &Collector{cfg: cfg.withDefaults()}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	ratelimit.NewCollector(ratelimit.Maps{}, 0, 0).Describe(ch)
	for _, d := range []*prometheus.Desc{
		packetsDesc, bytesDesc, attachedDesc, progRunTimeDesc, progRunsDesc, bpfStatsDesc,
		portRuleHitsDesc, entryHitsDesc, mapEntriesDesc, mapMaxEntriesDesc, mapMemoryDesc,
		synSYNsDesc, synIssuedDesc, synAcceptedDesc, synRejectedDesc, synACKsDroppedDesc,
		synAcceptErrorsDesc, synQueueFullDesc, synMPTCPDesc, synNATDesc, synResetsDesc, synSYNsDroppedDesc, synSYNsPassedDesc, synStaleKeyDesc, synFloodingDesc, synFloodChangeDesc,
		synThresholdDesc, synPortInfoDesc, keyRotationsDesc, keyRotatedDesc, keysStaleDesc,
		censusPassesDesc, censusSocketsDesc, censusCurrentDesc,
		rlPacketsDesc, rlBytesDesc, rlUntrackedDesc, rlTrackedDesc, rlBlocksDesc, rlBlockErrorsDesc,
		listScanAgeDesc, scrapeSuccessDesc, scrapeDurationDesc, stateDesc, monitorDesc,
	} {
		ch <- d
	}
}

// part is one independent section of a scrape: a failure in one still
// lets the others report.
type part struct {
	name    string
	collect func(p *pinned, ch chan<- prometheus.Metric) error
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	p, err := openPinned(c.cfg.Root)
	if errors.Is(err, errNotSetUp) {
		ch <- gauge(stateDesc, 0)
		return
	}
	if err != nil {
		c.cfg.Logger.Error("metrics: open moat state", "root", c.cfg.Root, "err", err)
		ch <- gauge(stateDesc, 0)
		ch <- gauge(scrapeSuccessDesc, 0, "state")
		return
	}
	defer p.close()
	ch <- gauge(stateDesc, 1)
	for _, pt := range []part{
		{"policy", collectPolicy},
		{"interfaces", c.collectInterfaces},
		{"port_rules", c.collectPortRules},
		{"lists", c.collectLists},
		{"syncookie", c.collectSynCookie},
		{"ratelimit", c.collectRateLimits},
		{"maps", c.collectMaps},
	} {
		start := time.Now()
		err := pt.collect(p, ch)
		ok := 1.0
		if err != nil {
			ok = 0
			c.cfg.Logger.Error("metrics: scrape failed", "collector", pt.name, "err", err)
		}
		ch <- gauge(scrapeSuccessDesc, ok, pt.name)
		ch <- gauge(scrapeDurationDesc, time.Since(start).Seconds(), pt.name)
	}
}

// collectPolicy reports monitor mode. The pinned settings are read as
// bytes: a moat from before monitor mode pinned a shorter value, which
// says it is off.
func collectPolicy(p *pinned, ch chan<- prometheus.Metric) error {
	m, err := p.mapNamed(datapath.MoatMapSettings)
	if err != nil {
		return err
	}
	var v []byte
	if err := m.Lookup(uint32(0), &v); err != nil {
		return fmt.Errorf("read settings: %w", err)
	}
	on := false
	if at := int(unsafe.Offsetof(datapath.MoatRuntimeSettings{}.Monitor)); len(v) >= at+4 {
		on = binary.NativeEndian.Uint32(v[at:]) != 0
	}
	ch <- gauge(monitorDesc, boolValue(on))
	return nil
}

func gauge(d *prometheus.Desc, v float64, labels ...string) prometheus.Metric {
	return prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
}

func counter(d *prometheus.Desc, v float64, labels ...string) prometheus.Metric {
	return prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, labels...)
}

// reasonNames lists the counter reasons in a fixed order, so that the
// exposition does not change order between scrapes.
func reasonNames() []string {
	out := make([]string, 0, len(shield.ReasonNames))
	for _, n := range shield.ReasonNames {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// reasonVerdicts are the verdicts the data path gives for each reason
// (verdict() in bpf/moat.bpf.c); the other pairs stay 0 and are left out,
// unless one ever counts.
var reasonVerdicts = map[string][]string{
	"pass": {"pass"}, "non_ip": {"pass"}, "allowlist": {"pass"}, "port_allow": {"pass"},
	// Monitor mode passes every drop but the SYN defence's, which stands
	// down then.
	"denylist": {"drop", "monitored"}, "port_drop": {"drop", "monitored"},
	"ratelimit": {"drop", "monitored"}, "budget": {"drop", "monitored"}, "syn_defence": {"drop", "tx"},
	"fragment": {"pass", "drop", "monitored"}, "malformed": {"pass", "drop", "monitored"},
	"syn_cookie": {"tx"},
}

// programs are the programs pinned per interface and their metric labels.
var programs = []struct{ pin, label string }{
	{"prog", "xdp_filter"},
	{"tc-prog", "tc_syn_accept"},
}

func (c *Collector) collectInterfaces(p *pinned, ch chan<- prometheus.Metric) error {
	ifaces, err := p.ifaces()
	if err != nil {
		return err
	}
	statsOn := bpfStatsEnabled()
	ch <- gauge(bpfStatsDesc, boolValue(statsOn))
	var errs []error
	for _, ifc := range ifaces {
		counts, ok, err := ifc.counters()
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if !ok { // detached while we read
			continue
		}
		mode, err := ifc.attachMode()
		if err != nil {
			errs = append(errs, err)
		} else {
			ch <- gauge(attachedDesc, boolValue(mode != ""), ifc.name, mode)
		}
		for _, reason := range reasonNames() {
			rc := counts.ByReason[reason]
			for _, v := range []struct {
				verdict string
				count   shield.Count
			}{{"pass", rc.Passed}, {"drop", rc.Dropped}, {"tx", rc.Answered}, {"monitored", rc.Monitored}} {
				vs, known := reasonVerdicts[reason]
				if known && !slices.Contains(vs, v.verdict) && v.count == (shield.Count{}) {
					continue
				}
				ch <- counter(packetsDesc, float64(v.count.Packets), ifc.name, v.verdict, reason)
				ch <- counter(bytesDesc, float64(v.count.Bytes), ifc.name, v.verdict, reason)
			}
		}
		for _, prog := range programs {
			st, ok, err := ifc.programStats(prog.pin)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			if !ok {
				continue
			}
			ch <- counter(progRunTimeDesc, st.Runtime.Seconds(), ifc.name, prog.label)
			ch <- counter(progRunsDesc, float64(st.RunCount), ifc.name, prog.label)
		}
	}
	return errors.Join(errs...)
}

func (c *Collector) collectPortRules(p *pinned, ch chan<- prometheus.Metric) error {
	rules, used, capacity, err := p.portRules()
	if err != nil {
		return err
	}
	for _, r := range rules {
		ch <- counter(portRuleHitsDesc, float64(r.hits), r.rule, r.action)
	}
	ch <- gauge(mapEntriesDesc, float64(used), datapath.MoatMapPortRuleDefs)
	ch <- gauge(mapMaxEntriesDesc, float64(capacity), datapath.MoatMapPortRuleDefs)
	return nil
}

// listScan is the result of reading every allow/deny entry: the top
// entries by hits and, on the way, the fill level of each map (the kernel
// keeps no count of a hash map's or trie's entries that user space can
// read).
type listScan struct {
	ids      []ebpf.MapID // the maps read, to notice that the state was recreated
	entries  map[string]int
	top      []listEntry
	at       time.Time
	duration time.Duration
	err      error
}

// collectLists exports the list scan, reading the maps again only when
// the last scan is older than its own duration divided by
// Config.ScanShare: a few thousand entries are read at every scrape, a
// million (about half a second of kernel time) at most every ten seconds
// or so, so that the metrics never cost more than that share of a CPU.
func (c *Collector) collectLists(p *pinned, ch chan<- prometheus.Metric) error {
	ids := make([]ebpf.MapID, 0, len(listMaps))
	for _, lm := range listMaps {
		if m := p.maps[lm.name]; m != nil {
			if info, err := m.Info(); err == nil {
				id, _ := info.ID()
				ids = append(ids, id)
			}
		}
	}
	c.mu.Lock() // also keeps two scrapes from scanning at once
	sc := c.lastScan
	if sc == nil || !slices.Equal(sc.ids, ids) || time.Since(sc.at) >= time.Duration(float64(sc.duration)/c.cfg.ScanShare) {
		sc = c.scanLists(p)
		sc.ids = ids
		c.lastScan = sc
	}
	c.mu.Unlock()

	for _, lm := range listMaps {
		if n, ok := sc.entries[lm.name]; ok {
			ch <- gauge(mapEntriesDesc, float64(n), lm.name)
			ch <- gauge(mapMaxEntriesDesc, float64(p.maps[lm.name].MaxEntries()), lm.name)
		}
	}
	for _, e := range sc.top {
		ch <- counter(entryHitsDesc, float64(e.hits), e.list, e.prefix.String())
	}
	ch <- gauge(listScanAgeDesc, time.Since(sc.at).Seconds())
	return sc.err
}

func (c *Collector) scanLists(p *pinned) *listScan {
	start := time.Now()
	sc := &listScan{entries: map[string]int{}, at: start}
	top := topEntries{n: c.cfg.TopEntries}
	var errs []error
	for _, lm := range listMaps {
		m, err := p.mapNamed(lm.name)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		n, err := lm.read(m, func(pfx netip.Prefix, hits uint64) {
			top.offer(listEntry{list: lm.list, prefix: pfx, hits: hits})
		})
		if err != nil {
			errs = append(errs, fmt.Errorf("read %s: %w", lm.name, err))
			continue
		}
		sc.entries[lm.name] = n
	}
	sc.top = top.sorted()
	sc.duration = time.Since(start)
	sc.err = errors.Join(errs...)
	return sc
}

func (c *Collector) collectSynCookie(p *pinned, ch chan<- prometheus.Metric) error {
	ports, err := p.mapNamed(datapath.MoatMapSynPorts)
	if err != nil {
		return err
	}
	stats, err := p.mapNamed(datapath.MoatMapSynCounters)
	if err != nil {
		return err
	}
	status, err := syncookie.Status(ports, stats)
	if err != nil {
		return err
	}
	for _, s := range status {
		port := strconv.Itoa(int(s.Port))
		ch <- counter(synSYNsDesc, float64(s.SYNs), port)
		ch <- counter(synIssuedDesc, float64(s.CookiesIssued), port)
		ch <- counter(synAcceptedDesc, float64(s.CookiesAccepted), port)
		ch <- counter(synRejectedDesc, float64(s.CookiesRejected), port)
		ch <- counter(synACKsDroppedDesc, float64(s.ACKsDropped), port)
		ch <- counter(synAcceptErrorsDesc, float64(s.AcceptErrors), port)
		ch <- counter(synQueueFullDesc, float64(s.AcceptQueueFull), port)
		ch <- counter(synMPTCPDesc, float64(s.MPTCPSYNs), port)
		ch <- counter(synNATDesc, float64(s.NATSYNs), port)
		ch <- counter(synResetsDesc, float64(s.ResetsSent), port)
		ch <- counter(synSYNsDroppedDesc, float64(s.SYNsDropped), port)
		ch <- counter(synSYNsPassedDesc, float64(s.SYNsPassed), port)
		ch <- counter(synStaleKeyDesc, float64(s.StaleKeySYNs), port)
		ch <- gauge(synFloodingDesc, boolValue(s.Flooding), port)
		ch <- gauge(synFloodChangeDesc, unixSeconds(s.LastChange), port)
		ch <- gauge(synThresholdDesc, float64(s.ThresholdPerSec), port)
		ch <- gauge(synPortInfoDesc, 1, port, s.Mode)
	}
	ch <- gauge(mapEntriesDesc, float64(len(status)), datapath.MoatMapSynCounters)
	ch <- gauge(mapMaxEntriesDesc, float64(stats.MaxEntries()-1), datapath.MoatMapSynCounters)

	rotation, err := p.mapNamed(datapath.MoatMapSynRotation)
	if err != nil {
		return err
	}
	settings, err := p.mapNamed(datapath.MoatMapSynSettings)
	if err != nil {
		return err
	}
	keys, err := syncookie.Keys(rotation, settings)
	if err != nil {
		return err
	}
	ch <- counter(keyRotationsDesc, float64(keys.Rotations))
	ch <- gauge(keyRotatedDesc, unixSeconds(keys.LastRotation))
	ch <- gauge(keysStaleDesc, boolValue(keys.Rotations > 0 && keys.Stale))

	// State pinned by a moat older than the census has no census map
	// until this version opens it.
	censusMap := p.maps[datapath.MoatMapSynCensus]
	if censusMap == nil {
		return nil
	}
	census, err := syncookie.ReadCensus(censusMap)
	if err != nil {
		return err
	}
	ch <- counter(censusPassesDesc, float64(census.Passes))
	ch <- gauge(censusSocketsDesc, float64(census.Sockets))
	ch <- gauge(censusCurrentDesc, boolValue(census.Trusted))
	return nil
}

func (c *Collector) collectRateLimits(p *pinned, ch chan<- prometheus.Metric) error {
	m, err := ratelimit.NewMaps(func(name string) *ebpf.Map { return p.maps[name] })
	if err != nil {
		return err
	}
	limits, err := m.Limits()
	if err != nil {
		return err
	}
	for _, l := range limits {
		kind, scope := l.Kind.String(), l.Scope.String()
		ch <- counter(rlPacketsDesc, float64(l.Stats.Passed), kind, scope, "pass")
		ch <- counter(rlPacketsDesc, float64(l.Stats.Dropped), kind, scope, "drop")
		ch <- counter(rlPacketsDesc, float64(l.Stats.Monitored), kind, scope, "monitored")
		ch <- counter(rlBytesDesc, float64(l.Stats.PassedBytes), kind, scope, "pass")
		ch <- counter(rlBytesDesc, float64(l.Stats.DroppedBytes), kind, scope, "drop")
		ch <- counter(rlBytesDesc, float64(l.Stats.MonitoredBytes), kind, scope, "monitored")
		if l.Kind == ratelimit.Source {
			ch <- counter(rlUntrackedDesc, float64(l.Stats.Untracked), kind, scope)
			ch <- counter(rlTrackedDesc, float64(l.Stats.Tracked), kind, scope)
			ch <- counter(rlBlocksDesc, float64(l.Stats.Blocks), kind, scope)
			ch <- counter(rlBlockErrorsDesc, float64(l.Stats.BlockErrors), kind, scope)
		}
	}
	ch <- gauge(mapEntriesDesc, float64(len(limits)), datapath.MoatMapRlRules)
	ch <- gauge(mapMaxEntriesDesc, float64(ratelimit.MaxRules), datapath.MoatMapRlRules)
	// Heavy hitters, whose labels are addresses, as many as list entries;
	// the attack shape's ports are not addresses, and are not turned off.
	ratelimit.NewCollector(m, c.cfg.TopEntries, max(c.cfg.TopEntries, DefaultTopEntries)).Collect(ch)
	// The per-source tables are LRU maps: full is their normal state
	// under a flood, and how often they are full says whether they are
	// big enough.
	var errs []error
	for _, lru := range []struct {
		name  string
		count func(*ebpf.Map) (int, error)
	}{
		{datapath.MoatMapRlSources, func(m *ebpf.Map) (int, error) {
			return scan(m, func(*datapath.MoatRlSrcKey, *datapath.MoatRlSrcState) {})
		}},
		{datapath.MoatMapHhSources, func(m *ebpf.Map) (int, error) {
			if m.ValueSize() != uint32(binary.Size(datapath.MoatHhCounts{})) {
				// Pinned by an older moat, whose values were shorter:
				// counted as they are, until shield.Open replaces it.
				return walk(m, int(m.MaxEntries()), func(*datapath.MoatRlSrcKey, *[]byte) {})
			}
			return scan(m, func(*datapath.MoatRlSrcKey, *datapath.MoatHhCounts) {})
		}},
	} {
		mp := p.maps[lru.name]
		n, err := lru.count(mp)
		if err != nil {
			errs = append(errs, fmt.Errorf("read %s: %w", lru.name, err))
			continue
		}
		ch <- gauge(mapEntriesDesc, float64(n), lru.name)
		ch <- gauge(mapMaxEntriesDesc, float64(mp.MaxEntries()), lru.name)
	}
	return errors.Join(errs...)
}

// collectMaps reports the fill of the comments map and of the auto-blocks'
// reasons (the others are reported with the data they hold) and every
// map's memory.
func (c *Collector) collectMaps(p *pinned, ch chan<- prometheus.Metric) error {
	var errs []error
	for _, name := range []string{datapath.MoatMapComments, datapath.MoatMapAutoReasons} {
		m, err := p.mapNamed(name)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		n, err := scan(m, func(*datapath.MoatCommentKey, *datapath.MoatComment) {})
		if err != nil {
			errs = append(errs, err)
			continue
		}
		ch <- gauge(mapEntriesDesc, float64(n), name)
		ch <- gauge(mapMaxEntriesDesc, float64(m.MaxEntries()), name)
	}
	names := make([]string, 0, len(p.maps))
	for name := range p.maps {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		info, err := p.maps[name].Info()
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if mem, ok := info.Memlock(); ok {
			ch <- gauge(mapMemoryDesc, float64(mem), name)
		}
	}
	return errors.Join(errs...)
}

func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

func unixSeconds(t time.Time) float64 {
	if t.IsZero() {
		return 0
	}
	return float64(t.UnixNano()) / 1e9
}

func portSpec(d datapath.MoatPortRuleDef) rules.PortSpec {
	return rules.PortSpec{Class: rules.Class(d.Class), From: d.From, To: d.To}
}

func actionName(a uint8) string { return rules.Action(a).String() }
