// Package config reads the configuration file of `moat run`: YAML, which
// operators already edit by hand for their other services, that allows
// comments (unlike JSON) and whose parser keeps the line of every value, so
// that every error can be reported where it is. Reading is strict: an
// unknown key is an error, never silently ignored, and reading goes on
// after an error so that `moat check-config` lists all of them.
package config

import (
	"bytes"
	"crypto/x509"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/moat-shield/moat/internal/capture"
	"github.com/moat-shield/moat/internal/feed"
	"github.com/moat-shield/moat/internal/ratelimit"
	"github.com/moat-shield/moat/internal/rules"
	"github.com/moat-shield/moat/internal/shield"
	"github.com/moat-shield/moat/internal/syncookie"
)

// Defaults of the daemon section.
const (
	DefaultStateFile   = "/var/lib/moat/state.json"
	DefaultFeedDir     = "/var/lib/moat/feeds"
	DefaultSocket      = "/run/moat/moat.sock"
	DefaultMetricsAddr = "127.0.0.1:9477"
	DefaultExpireEvery = 10 * time.Second
	DefaultSampleEvery = time.Second
)

// Config is a whole configuration file.
type Config struct {
	Interfaces    []Interface   `yaml:"interfaces"`
	Allow         []PrefixRule  `yaml:"allow"`
	Deny          []PrefixRule  `yaml:"deny"`
	Lists         []ListFile    `yaml:"lists"`
	Ports         []PortRule    `yaml:"ports"`
	Policy        Policy        `yaml:"policy"`
	SYN           SYN           `yaml:"syn"`
	Limits        []Limit       `yaml:"limits"`
	LimitSettings LimitSettings `yaml:"limit_settings"`
	Metrics       Metrics       `yaml:"metrics"`
	Capture       Capture       `yaml:"capture"`
	Share         Share         `yaml:"share"`
	Daemon        Daemon        `yaml:"daemon"`

	// File is the path the config was read from.
	File string `yaml:"-"`
}

// Interface is one interface moat attaches to.
type Interface struct {
	Name string `yaml:"name"`
	Mode string `yaml:"mode"` // auto (default), native or generic
	Line int    `yaml:"-"`
}

// AttachMode is the interface's mode as shield takes it.
func (i Interface) AttachMode() shield.Mode {
	m, _ := shield.ParseMode(i.Mode) // checked when read
	return m
}

// PrefixRule is an allow or deny entry: a bare address or CIDR, or a
// mapping with a comment.
type PrefixRule struct {
	Prefix  netip.Prefix `yaml:"-"`
	Comment string       `yaml:"-"`
	Line    int          `yaml:"-"`
}

type prefixRuleMapping struct {
	Prefix  string `yaml:"prefix"`
	Comment string `yaml:"comment"`
}

func (p *PrefixRule) decodeNode(n *yaml.Node, path string, e *errs) {
	p.Line = n.Line
	text := n.Value
	if n.Kind == yaml.MappingNode {
		var m prefixRuleMapping
		before := len(e.list)
		decode(n, reflect.ValueOf(&m).Elem(), path, e)
		if len(e.list) > before {
			return
		}
		if m.Prefix == "" {
			e.at(n, "%s: missing key \"prefix\"", path)
			return
		}
		text, p.Comment = m.Prefix, m.Comment
		if err := rules.ValidateComment(m.Comment); err != nil {
			e.at(n, "%s: %v", path, err)
			return
		}
	} else if n.Kind != yaml.ScalarNode {
		e.at(n, "%s: want an address, a CIDR or a mapping with prefix and comment, not %s", path, describe(n))
		return
	}
	pfx, err := rules.ParsePrefix(text)
	if err != nil {
		e.at(n, "%s: %v", path, err)
		return
	}
	p.Prefix = pfx
}

// ListFile is a rule file: a plain list of addresses and CIDRs (ipset and
// FireHOL netsets) or the JSON that `moat export` writes, read from a
// file at each reload or, for a fleet, fetched from a URL (a feed) every
// refresh period.
type ListFile struct {
	File string `yaml:"file"`
	URL  string `yaml:"url"`
	List string `yaml:"list"` // where a plain list goes: deny (default) or allow
	// Feeds only.
	Refresh   time.Duration `yaml:"refresh"`    // default feed.DefaultRefresh
	CAFile    string        `yaml:"ca_file"`    // the CAs an https server's certificate must come from
	TokenFile string        `yaml:"token_file"` // a bearer token to send
	Line      int           `yaml:"-"`
}

// Feeds are the lists the config fetches from URLs.
func (c *Config) Feeds() []feed.Source {
	var out []feed.Source
	for _, lf := range c.Lists {
		if lf.URL != "" {
			out = append(out, feed.Source{URL: lf.URL, List: lf.List, Refresh: lf.Refresh, CAFile: lf.CAFile, TokenFile: lf.TokenFile})
		}
	}
	return out
}

// Share is the daemon's endpoint that publishes the rules this host made
// at run time (blocks through the CLI and API, and, if asked, rate
// limits' auto-blocks and the allow list) for other hosts' feeds.
type Share struct {
	Address   string `yaml:"address"`    // HOST:PORT; empty: not shared (default)
	TokenFile string `yaml:"token_file"` // a request must carry this bearer token (needed beyond loopback)
	CertFile  string `yaml:"cert_file"`  // with key_file: serve https
	KeyFile   string `yaml:"key_file"`
	// AutoBlocks shares the rate limits' auto-blocks too. Off by
	// default: a spoofed flood gets addresses it borrowed auto-blocked,
	// and sharing them would block those across the fleet.
	AutoBlocks bool `yaml:"auto_blocks"`
	// AllowList serves ?list=allow too. Off by default: the allow list
	// names the sources an attacker would spoof to get through.
	AllowList bool `yaml:"allow_list"`
}

// On tells whether the rules are shared.
func (s Share) On() bool { return s.Address != "" }

// PortRule is a protocol/port or ICMP type rule.
type PortRule struct {
	Rule   string `yaml:"rule"`
	Action string `yaml:"action"`
	Line   int    `yaml:"-"`

	spec   rules.PortSpec
	action rules.Action
}

// Policy is what happens to packets that rules cannot fully judge.
type Policy struct {
	Fragments string `yaml:"fragments"` // pass (default) or drop
	Malformed string `yaml:"malformed"` // drop (default) or pass
	// Monitor: count what would be dropped and pass it; the SYN defence
	// stands down (default false: enforce).
	Monitor bool `yaml:"monitor"`
}

// maxStrayACKResets bounds syn.stray_ack_resets: a million a second is
// past anything a host needs to tell its clients.
const maxStrayACKResets = 1_000_000

// SYN configures the SYN flood defence.
type SYN struct {
	RotateEvery    time.Duration `yaml:"rotate_every"`    // key rotation (default 60s)
	Hold           time.Duration `yaml:"hold"`            // auto mode: cookies stay on this long after a flood
	CookieLifetime time.Duration `yaml:"cookie_lifetime"` // the acceptor looks for cookies this long after a flood
	// StrayACKResets is how many RSTs a second cookie mode may send on
	// each interface for the ACKs it drops as stray, as the kernel answers
	// them (default syncookie.DefaultResets; 0: none).
	StrayACKResets *uint32   `yaml:"stray_ack_resets"`
	Ports          []SYNPort `yaml:"ports"`
}

// Resets is StrayACKResets as syncookie.Config.ResetsPerSec takes it.
func (s SYN) Resets() int {
	switch {
	case s.StrayACKResets == nil:
		return 0
	case *s.StrayACKResets == 0:
		return -1
	}
	return int(*s.StrayACKResets)
}

// SYNPort is one protected TCP port.
type SYNPort struct {
	Port      uint16 `yaml:"port"`
	Mode      string `yaml:"mode"`      // auto (default), always or never
	Threshold uint32 `yaml:"threshold"` // auto: SYNs per second that mean a flood
	Line      int    `yaml:"-"`
}

// ProtectMode is the port's mode as syncookie takes it.
func (p SYNPort) ProtectMode() syncookie.Mode {
	m, _ := syncookie.ParseMode(p.Mode) // checked when read
	return m
}

// CookiePort is the first port the config has moat answer SYNs for with
// cookies (mode always or auto), if any: such ports need the kernel's
// tcp_syncookies.
func (s SYN) CookiePort() (SYNPort, bool) {
	for _, p := range s.Ports {
		if m := p.ProtectMode(); m == syncookie.ModeAlways || m == syncookie.ModeAuto {
			return p, true
		}
	}
	return SYNPort{}, false
}

// Metrics configures the Prometheus endpoint.
type Metrics struct {
	Enabled *bool  `yaml:"enabled"` // default true
	Address string `yaml:"address"` // default loopback only
	// TopEntries is how many allow/deny entries with the most hits, and
	// heavy-hitter sources, get a series of their own (0: the exporter's
	// default, negative: none).
	TopEntries int `yaml:"top_entries"`
}

// On tells whether metrics are served.
func (m Metrics) On() bool { return m.Enabled == nil || *m.Enabled }

// LimitSettings are the switches of `moat limit config`. A key left out
// leaves its switch as the pinned state holds it.
type LimitSettings struct {
	Shape        *bool   `yaml:"shape"`         // count the attack shape
	HeavyHitters *bool   `yaml:"heavy_hitters"` // sample packets for heavy hitters
	Sample       *uint32 `yaml:"sample"`        // 1 packet in this many (a power of two, up to 65536)
	Gate         string  `yaml:"gate"`          // sample, sketch or none
}

// Apply sets the switches the settings name in c.
func (ls LimitSettings) Apply(c ratelimit.Config) ratelimit.Config {
	if ls.Shape != nil {
		c.Shape = *ls.Shape
	}
	if ls.HeavyHitters != nil {
		c.HeavyHitters = *ls.HeavyHitters
	}
	if ls.Sample != nil {
		c.Sample = *ls.Sample
	}
	if g, err := ratelimit.ParseGate(ls.Gate); ls.Gate != "" && err == nil {
		c.Gate = g
	}
	return c
}

// Given tells whether any switch is named.
func (ls LimitSettings) Given() bool {
	return ls.Shape != nil || ls.HeavyHitters != nil || ls.Sample != nil || ls.Gate != ""
}

// Capture bounds what `moat dump` may copy out of the data path.
type Capture struct {
	Enabled    *bool  `yaml:"enabled"`     // default true
	MaxSnaplen uint32 `yaml:"max_snaplen"` // bytes copied per packet at most
	MaxRate    uint32 `yaml:"max_rate"`    // packets per second a dump writes at most (the data path copies every match into the ring)
}

// On tells whether captures are allowed.
func (c Capture) On() bool { return c.Enabled == nil || *c.Enabled }

// Daemon is where the daemon keeps its state and how it logs.
type Daemon struct {
	BPFRoot     string        `yaml:"bpffs_root"`
	StateFile   string        `yaml:"state_file"`
	FeedDir     string        `yaml:"feed_dir"` // the last good copy of each feed
	Socket      string        `yaml:"socket"`
	ExpireEvery time.Duration `yaml:"expire_every"`
	SampleEvery time.Duration `yaml:"sample_every"`
	LogLevel    string        `yaml:"log_level"`
	LogFormat   string        `yaml:"log_format"`
}

// Limit is a rate limit (kind source: per source address) or a flood
// budget (kind budget: all sources together) on a scope of traffic.
type Limit struct {
	Kind         string        `yaml:"kind"`  // source or budget
	Scope        string        `yaml:"scope"` // all, tcp, udp/53, tcp/443+syn, icmp/echo-request...
	PPS          uint64        `yaml:"pps"`
	BPS          uint64        `yaml:"bps"` // bits per second
	BurstPackets uint64        `yaml:"burst_packets"`
	BurstBytes   uint64        `yaml:"burst_bytes"`
	IPv6Prefix   int           `yaml:"ipv6_prefix"` // source: IPv6 sources share a bucket per prefix (default 64)
	Block        time.Duration `yaml:"block"`       // source: deny a source over its limit this long
	Line         int           `yaml:"-"`

	parsed ratelimit.Limit
}

// RateLimits are the limits in the form internal/ratelimit applies.
func (c *Config) RateLimits() []ratelimit.Limit {
	out := make([]ratelimit.Limit, 0, len(c.Limits))
	for _, l := range c.Limits {
		out = append(out, l.parsed)
	}
	return out
}

// Load reads, checks and completes a config file to run on this host,
// reading the rule files it names. Beyond what Parse checks, the CA and
// token files that feeds name must be here, as the daemon reads them
// later. The error is an *Errors listing every problem with its line.
func Load(path string) (*Config, *Set, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, &Errors{File: path, List: []Error{{Msg: err.Error()}}}
	}
	return parse(path, data, true)
}

// LoadFileOnly is Load for a file meant for another host: the files its
// feeds name are not looked for here (the rule files are read all the
// same).
func LoadFileOnly(path string) (*Config, *Set, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, &Errors{File: path, List: []Error{{Msg: err.Error()}}}
	}
	return Parse(path, data)
}

// Parse reads a config from data; path names it in errors and is where
// relative rule file names start from. The files that feeds name are
// checked for absolute paths only: Load checks that they are here.
func Parse(path string, data []byte) (*Config, *Set, error) {
	return parse(path, data, false)
}

// parse is Parse; with host, it also checks the feeds' files on this
// host, as Load does.
func parse(path string, data []byte, host bool) (*Config, *Set, error) {
	var e errs
	var doc yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&doc); err != nil && err.Error() != "EOF" {
		e.list = append(e.list, syntaxError(err))
		return nil, nil, e.result(path)
	}
	var more yaml.Node
	if err := dec.Decode(&more); err == nil {
		e.at(&more, "a config file holds one YAML document; remove the second")
	}
	c := &Config{File: path}
	if len(doc.Content) > 0 {
		decode(doc.Content[0], reflect.ValueOf(c).Elem(), "", &e)
	}
	c.defaults(e.lines)
	c.check(&e)
	if host {
		c.checkFeedFiles(&e)
	}
	set := c.buildSet(filepath.Dir(path), &e)
	if err := e.result(path); err != nil {
		return nil, nil, err
	}
	return c, set, nil
}

// defaults fills in what the file leaves out; lines are the paths it
// gives (errs.lines).
func (c *Config) defaults(lines map[string]int) {
	if c.Policy.Fragments == "" {
		c.Policy.Fragments = "pass"
	}
	if c.Policy.Malformed == "" {
		c.Policy.Malformed = "drop"
	}
	if c.SYN.RotateEvery == 0 {
		c.SYN.RotateEvery = syncookie.DefaultRotation
	}
	for i := range c.SYN.Ports {
		p := &c.SYN.Ports[i]
		if p.Mode == "" {
			p.Mode = "auto"
		}
		// A threshold given as 0 stays 0, for check to refuse.
		if _, given := lines[fmt.Sprintf("syn.ports[%d].threshold", i+1)]; !given {
			p.Threshold = syncookie.DefaultThreshold
		}
	}
	for i := range c.Interfaces {
		if c.Interfaces[i].Mode == "" {
			c.Interfaces[i].Mode = "auto"
		}
	}
	for i := range c.Lists {
		if c.Lists[i].List == "" {
			c.Lists[i].List = "deny"
		}
		if c.Lists[i].URL != "" && c.Lists[i].Refresh == 0 {
			c.Lists[i].Refresh = feed.DefaultRefresh
		}
	}
	if c.Metrics.Address == "" {
		c.Metrics.Address = DefaultMetricsAddr
	}
	if c.Capture.MaxSnaplen == 0 {
		c.Capture.MaxSnaplen = capture.MaxSnaplen
	}
	d := &c.Daemon
	if d.BPFRoot == "" {
		d.BPFRoot = shield.DefaultRoot
	}
	if d.StateFile == "" {
		d.StateFile = DefaultStateFile
	}
	if d.FeedDir == "" {
		d.FeedDir = DefaultFeedDir
	}
	if d.Socket == "" {
		d.Socket = DefaultSocket
	}
	if d.ExpireEvery == 0 {
		d.ExpireEvery = DefaultExpireEvery
	}
	if d.SampleEvery == 0 {
		d.SampleEvery = DefaultSampleEvery
	}
	if d.LogLevel == "" {
		d.LogLevel = "info"
	}
	if d.LogFormat == "" {
		d.LogFormat = "text"
	}
}

// check validates what each value cannot check alone: names, ranges,
// duplicates and overlaps.
func (c *Config) check(e *errs) {
	at := func(line int, format string, args ...any) {
		e.list = append(e.list, Error{Line: line, Msg: fmt.Sprintf(format, args...)})
	}
	// key reports an error on a value known by its path.
	key := func(path, format string, args ...any) {
		at(e.lineOf(path), path+": "+format, args...)
	}
	ifaces := map[string]int{}
	for i, ifc := range c.Interfaces {
		path := fmt.Sprintf("interfaces[%d]", i+1)
		switch {
		case ifc.Name == "":
			at(ifc.Line, "%s: missing key \"name\"", path)
		case len(ifc.Name) > 15 || strings.ContainsAny(ifc.Name, "/: \t") || ifc.Name == "." || ifc.Name == "..":
			at(ifc.Line, "%s: %q is not a valid interface name", path, ifc.Name)
		case ifaces[ifc.Name] != 0:
			at(ifc.Line, "%s: interface %s is listed twice (first at line %d)", path, ifc.Name, ifaces[ifc.Name])
		default:
			ifaces[ifc.Name] = ifc.Line
		}
		if ifc.Mode == "auto" {
			continue
		}
		if _, err := shield.ParseMode(ifc.Mode); err != nil {
			key(path+".mode", "invalid mode %q: want auto, native or generic", ifc.Mode)
		}
	}

	listLines := map[netip.Prefix]int{}
	for _, l := range []struct {
		name    string
		entries []PrefixRule
	}{{"allow", c.Allow}, {"deny", c.Deny}} {
		seen := map[netip.Prefix]int{}
		for i, p := range l.entries {
			if !p.Prefix.IsValid() {
				continue // reported when read
			}
			if first, dup := seen[p.Prefix]; dup {
				at(p.Line, "%s[%d]: %s is listed twice (first at line %d)", l.name, i+1, p.Prefix, first)
				continue
			}
			seen[p.Prefix] = p.Line
			if other, both := listLines[p.Prefix]; both {
				at(p.Line, "%s[%d]: %s is also in the allow list (line %d); the allow list would win", l.name, i+1, p.Prefix, other)
			}
		}
		if l.name == "allow" {
			listLines = seen
		}
	}

	for i := range c.Ports {
		p := &c.Ports[i]
		path := fmt.Sprintf("ports[%d]", i+1)
		var err error
		if p.Rule == "" {
			at(p.Line, "%s: missing key \"rule\" (e.g. udp/19 or tcp/6000-6063)", path)
			continue
		}
		if p.spec, err = rules.ParsePortSpec(p.Rule); err != nil {
			at(p.Line, "%s: %v", path, err)
			continue
		}
		if p.action, err = rules.ParseAction(p.Action); err != nil {
			if p.Action == "" {
				err = fmt.Errorf("missing key \"action\" (drop or allow)")
			}
			at(p.Line, "%s: %v", path, err)
			continue
		}
		for j := 0; j < i; j++ {
			if o := c.Ports[j]; o.action != 0 && o.spec.Overlaps(p.spec) {
				at(p.Line, "%s: %s overlaps %s (line %d)", path, p.spec, o.spec, o.Line)
			}
		}
	}

	if f := c.Policy.Fragments; f != "pass" && f != "drop" {
		key("policy.fragments", "invalid policy %q: want pass or drop", f)
	}
	if m := c.Policy.Malformed; m != "drop" && m != "pass" {
		key("policy.malformed", "invalid policy %q: want drop or pass", m)
	}

	if err := syncookie.CheckRotation(c.SYN.RotateEvery); err != nil {
		key("syn.rotate_every", "%v", err)
	}
	if c.SYN.CookieLifetime != 0 && c.SYN.CookieLifetime < 2*c.SYN.RotateEvery {
		key("syn.cookie_lifetime", "%s is shorter than two key rotations (%s): cookies would be refused while still valid", c.SYN.CookieLifetime, 2*c.SYN.RotateEvery)
	}
	// Auto mode counts SYNs in windows of 100 ms: a hold not much longer
	// would turn cookies off between a flood's windows.
	if h := c.SYN.Hold; h < 0 || (h != 0 && h < time.Second) {
		key("syn.hold", "%s is shorter than 1s: auto mode would turn cookies off between the bursts of a flood", h)
	}
	if n := c.SYN.StrayACKResets; n != nil && *n > maxStrayACKResets {
		key("syn.stray_ack_resets", "%d RSTs a second: at most %d", *n, maxStrayACKResets)
	}
	synPorts := map[uint16]int{}
	for i, p := range c.SYN.Ports {
		path := fmt.Sprintf("syn.ports[%d]", i+1)
		if _, given := e.lines[path+".port"]; p.Port == 0 && !given {
			at(p.Line, "%s: missing key \"port\" (1 to 65535)", path)
		} else if p.Port == 0 {
			if !e.reported(e.lines[path+".port"]) {
				key(path+".port", "port 0 is not a port")
			}
		} else if first, dup := synPorts[p.Port]; dup {
			at(p.Line, "%s: tcp/%d is listed twice (first at line %d)", path, p.Port, first)
		} else {
			synPorts[p.Port] = p.Line
		}
		m, err := syncookie.ParseMode(p.Mode)
		if err != nil || m == syncookie.ModeOff {
			key(path+".mode", "invalid mode %q: want auto, always or never", p.Mode)
		} else if _, given := e.lines[path+".threshold"]; given && m != syncookie.ModeAuto {
			key(path+".threshold", "the threshold is auto mode's; %s mode has none", m)
		} else if given && p.Threshold == 0 {
			key(path+".threshold", "must be at least 1 SYN per second")
		}
	}
	if len(synPorts) > syncookie.MaxProtectedPorts {
		key("syn.ports", "%d ports listed; at most %d can be protected", len(synPorts), syncookie.MaxProtectedPorts)
	}

	seenLimits := map[string]int{}
	for i := range c.Limits {
		l := &c.Limits[i]
		path := fmt.Sprintf("limits[%d]", i+1)
		kind, err := ratelimit.ParseKind(l.Kind)
		if err != nil {
			at(l.Line, "%s: %v", path, err)
			continue
		}
		scope, err := ratelimit.ParseScope(l.Scope)
		if err != nil {
			at(l.Line, "%s: %v", path, err)
			continue
		}
		l.parsed = ratelimit.Limit{Kind: kind, Scope: scope, PPS: l.PPS, BPS: l.BPS, BurstPackets: l.BurstPackets,
			BurstBytes: l.BurstBytes, IPv6Prefix: l.IPv6Prefix, Block: ratelimit.Duration(l.Block)}
		if err := l.parsed.Validate(); err != nil {
			at(l.Line, "%s: %v", path, err)
			continue
		}
		// Left out, a burst is the default; 0 would let nothing through,
		// as `moat limit add --burst 0` is refused for.
		for _, b := range []struct {
			name string
			v    uint64
		}{{"burst_packets", l.BurstPackets}, {"burst_bytes", l.BurstBytes}} {
			if _, given := e.lines[path+"."+b.name]; given && b.v == 0 {
				key(path+"."+b.name, "must be at least 1; leave it out for the default")
			}
		}
		k := kind.String() + " " + scope.String()
		if first, dup := seenLimits[k]; dup {
			at(l.Line, "%s: a %s limit on %s is given twice (first at line %d)", path, kind, scope, first)
		} else {
			for _, o := range c.Limits[:i] {
				if o.parsed.Kind == kind && o.parsed.Scope.Overlaps(scope) && o.parsed.Validate() == nil {
					at(l.Line, "%s: %s limits on %s and %s (line %d) overlap", path, kind, scope, o.parsed.Scope, o.Line)
					break
				}
			}
		}
		seenLimits[k] = l.Line
	}
	if len(c.Limits) > ratelimit.MaxRules {
		key("limits", "%d limits: at most %d", len(c.Limits), ratelimit.MaxRules)
	}
	if n := c.LimitSettings.Sample; n != nil {
		if err := ratelimit.CheckSample(*n); err != nil {
			key("limit_settings.sample", "%v", err)
		}
	}
	if g := c.LimitSettings.Gate; g != "" {
		if _, err := ratelimit.ParseGate(g); err != nil {
			key("limit_settings.gate", "invalid gate %q: want sample, sketch or none", g)
		}
	}

	if c.Metrics.On() {
		if err := checkListenAddress(c.Metrics.Address); err != nil {
			key("metrics.address", "%v", err)
		}
	}
	if c.Capture.MaxSnaplen > capture.MaxSnaplen {
		key("capture.max_snaplen", "%d is above %d, the most bytes of a packet moat's data path copies", c.Capture.MaxSnaplen, capture.MaxSnaplen)
	}

	c.checkFeeds(e)
	if s := c.Share; s.On() {
		if err := checkListenAddress(s.Address); err != nil {
			key("share.address", "%v", err)
		} else if s.TokenFile == "" && !loopbackAddress(s.Address) {
			key("share.address", "%q is reachable beyond this host: set share.token_file, so that only the fleet reads the rules", s.Address)
		}
		if (s.CertFile == "") != (s.KeyFile == "") {
			key("share", "cert_file and key_file go together: give both to serve https, or neither")
		}
		for _, f := range []struct{ key, val string }{{"share.token_file", s.TokenFile}, {"share.cert_file", s.CertFile}, {"share.key_file", s.KeyFile}} {
			if f.val != "" && !filepath.IsAbs(f.val) {
				key(f.key, "%q must be an absolute path", f.val)
			}
		}
	} else if s.TokenFile != "" || s.CertFile != "" || s.KeyFile != "" || s.AutoBlocks || s.AllowList {
		key("share", "share.address is missing: nothing is shared without it")
	}

	d := c.Daemon
	for _, p := range []struct{ key, val string }{
		{"daemon.bpffs_root", d.BPFRoot}, {"daemon.state_file", d.StateFile}, {"daemon.socket", d.Socket}, {"daemon.feed_dir", d.FeedDir},
	} {
		if !filepath.IsAbs(p.val) {
			key(p.key, "%q must be an absolute path", p.val)
		}
	}
	if filepath.Clean(d.Socket) == filepath.Clean(d.StateFile) {
		key("daemon.socket", "%q is also daemon.state_file: each needs a path of its own", d.Socket)
	}
	if !strings.HasPrefix(filepath.Clean(d.BPFRoot)+"/", "/sys/fs/bpf/") || filepath.Clean(d.BPFRoot) == "/sys/fs/bpf" {
		key("daemon.bpffs_root", "%q must be a directory under /sys/fs/bpf", d.BPFRoot)
	}
	if d.ExpireEvery < time.Second {
		key("daemon.expire_every", "%s is too short; at least 1s", d.ExpireEvery)
	}
	if d.SampleEvery < 100*time.Millisecond {
		key("daemon.sample_every", "%s is too short; at least 100ms", d.SampleEvery)
	}
	switch d.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		key("daemon.log_level", "invalid level %q: want debug, info, warn or error", d.LogLevel)
	}
	if d.LogFormat != "text" && d.LogFormat != "json" {
		key("daemon.log_format", "invalid format %q: want text or json", d.LogFormat)
	}
}

// checkFeeds checks the lists fetched from URLs: the URL, the refresh
// period, and that a file list has no feed keys. The files a feed names
// (CA, token) must be absolute paths: the daemon reads them long after
// the config, and the token at every fetch. Whether they are there is
// the host's matter (checkFeedFiles): the file may be meant for another.
func (c *Config) checkFeeds(e *errs) {
	seen := map[string]int{}
	for i, lf := range c.Lists {
		path := fmt.Sprintf("lists[%d]", i+1)
		at := func(format string, args ...any) {
			e.list = append(e.list, Error{Line: lf.Line, Msg: path + ": " + fmt.Sprintf(format, args...)})
		}
		if lf.URL == "" {
			if lf.Refresh != 0 || lf.CAFile != "" || lf.TokenFile != "" {
				at("refresh, ca_file and token_file are for lists fetched from a url")
			}
			continue
		}
		if lf.File != "" {
			at("give file or url, not both")
			continue
		}
		if err := feed.CheckURL(lf.URL); err != nil {
			at("%v", err)
			continue
		}
		if lf.Refresh < feed.MinRefresh {
			at("refresh %s is too short; at least %s", lf.Refresh, feed.MinRefresh)
		}
		for _, f := range []struct{ key, val string }{{"ca_file", lf.CAFile}, {"token_file", lf.TokenFile}} {
			if f.val == "" {
				continue
			}
			if !filepath.IsAbs(f.val) {
				at("%s %q must be an absolute path", f.key, f.val)
			}
		}
		if lf.CAFile != "" && !strings.HasPrefix(lf.URL, "https:") {
			at("ca_file is for an https url")
		}
		// By URL alone, whatever the list: one body fills one list (a
		// JSON body that holds both is refused by both feeds), and the
		// moat_feed_* metrics name a feed by its URL, so a second feed
		// of the URL would make the scrape drop its series.
		if first, dup := seen[lf.URL]; dup {
			at("%s is listed twice (first at line %d)", lf.URL, first)
		}
		seen[lf.URL] = lf.Line
	}
}

// checkFeedFiles checks, on this host, the files that the feeds name: the
// CA and token files must be regular files, and a CA file must hold a
// PEM certificate, as the daemon reads it (feed.New). Paths that are not
// absolute were refused by checkFeeds already.
func (c *Config) checkFeedFiles(e *errs) {
	for i, lf := range c.Lists {
		if lf.URL == "" || lf.File != "" {
			continue
		}
		at := func(format string, args ...any) {
			e.list = append(e.list, Error{Line: lf.Line, Msg: fmt.Sprintf("lists[%d]: ", i+1) + fmt.Sprintf(format, args...)})
		}
		for _, f := range []struct{ key, val string }{{"ca_file", lf.CAFile}, {"token_file", lf.TokenFile}} {
			if f.val == "" || !filepath.IsAbs(f.val) {
				continue
			}
			fi, err := os.Stat(f.val)
			if err != nil {
				at("%s: %v", f.key, err)
				continue
			}
			if !fi.Mode().IsRegular() {
				at("%s: %s is not a regular file", f.key, f.val)
				continue
			}
			if f.key != "ca_file" {
				continue
			}
			pem, err := os.ReadFile(f.val)
			if err != nil {
				at("%s: %v", f.key, err)
			} else if !x509.NewCertPool().AppendCertsFromPEM(pem) {
				at("%s: %s holds no PEM certificate", f.key, f.val)
			}
		}
	}
}

// loopbackAddress tells whether a checked HOST:PORT listens on loopback
// only.
func loopbackAddress(addr string) bool {
	host, _, _ := net.SplitHostPort(addr)
	if host == "localhost" {
		return true
	}
	a, err := netip.ParseAddr(host)
	return err == nil && a.IsLoopback()
}

// checkListenAddress checks a HOST:PORT for net.Listen("tcp"), as the
// daemon serves metrics on it: HOST empty (every address), an IP address
// or a host name, PORT a number up to 65535 or a service name that
// resolves.
func checkListenAddress(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil || port == "" {
		return fmt.Errorf("%q is not HOST:PORT (e.g. 127.0.0.1:9477)", addr)
	}
	if n, err := strconv.ParseUint(port, 10, 64); err == nil {
		if n > 65535 {
			return fmt.Errorf("%q: port %s is above 65535", addr, port)
		}
	} else if _, err := net.LookupPort("tcp", port); err != nil {
		return fmt.Errorf("%q: %q is neither a port number nor a known service", addr, port)
	}
	if host == "" {
		return nil
	}
	if _, err := netip.ParseAddr(host); err == nil {
		return nil
	}
	if !isHostName(host) {
		return fmt.Errorf("%q: %q is neither an IP address nor a host name", addr, host)
	}
	return nil
}

// isHostName tells whether s is a host name by RFC 1123: dot-separated
// labels of letters, digits and inner hyphens, and a last label that is
// not all digits (999.1.1.1 is a bad address, not a name).
func isHostName(s string) bool {
	s = strings.TrimSuffix(s, ".")
	if s == "" || len(s) > 253 {
		return false
	}
	labels := strings.Split(s, ".")
	for _, l := range labels {
		if l == "" || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
			return false
		}
		for _, r := range l {
			if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-') {
				return false
			}
		}
	}
	return strings.Trim(labels[len(labels)-1], "0123456789") != ""
}

// Set is the rules a config asks for: inline entries and the rule files,
// merged.
type Set struct {
	Rules *rules.Ruleset
	// FromFiles counts the entries that came from rule files.
	FromFiles int
}

// buildSet merges the inline rules and the rule files. An entry that a
// file repeats (netsets overlap) is kept once, with the inline comment.
// Lists are merged by sorting rather than through maps: a million entries
// hash slowly and take much memory.
func (c *Config) buildSet(base string, e *errs) *Set {
	rs := &rules.Ruleset{
		Allow:    make([]rules.PrefixEntry, 0, len(c.Allow)),
		Deny:     make([]rules.PrefixEntry, 0, len(c.Deny)),
		Ports:    make([]rules.PortEntry, 0, len(c.Ports)),
		Settings: &rules.Settings{Fragments: c.Policy.Fragments, Malformed: c.Policy.Malformed, Monitor: c.Policy.Monitor},
	}
	for li, l := range [][]PrefixRule{c.Allow, c.Deny} {
		dst := &rs.Allow
		if li == 1 {
			dst = &rs.Deny
		}
		for _, p := range l {
			if p.Prefix.IsValid() { // duplicates were reported by check
				*dst = append(*dst, rules.PrefixEntry{Prefix: p.Prefix, Comment: p.Comment})
			}
		}
	}
	inline := len(rs.Allow) + len(rs.Deny)
	for _, p := range c.Ports {
		if p.action != 0 {
			rs.Ports = append(rs.Ports, rules.PortEntry{Spec: p.spec, Action: p.action})
		}
	}
	set := &Set{Rules: rs}
	for i, lf := range c.Lists {
		path := fmt.Sprintf("lists[%d]", i+1)
		if lf.List != "deny" && lf.List != "allow" {
			e.list = append(e.list, Error{Line: lf.Line, Msg: fmt.Sprintf("%s: invalid list %q: want deny or allow", path, lf.List)})
			continue
		}
		if lf.URL != "" {
			continue // a feed: checked in check, its entries come from the daemon
		}
		if lf.File == "" {
			e.list = append(e.list, Error{Line: lf.Line, Msg: fmt.Sprintf("%s: missing key \"file\" (or \"url\")", path)})
			continue
		}
		name := lf.File
		if !filepath.IsAbs(name) {
			name = filepath.Join(base, name)
		}
		// A FIFO or a device would hold the reload (and the daemon's
		// loop, for a SIGHUP) until someone writes to it: opening a FIFO
		// blocks already, so it is looked at first.
		if fi, err := os.Stat(name); err == nil && !fi.Mode().IsRegular() {
			e.list = append(e.list, Error{Line: lf.Line, Msg: fmt.Sprintf("%s: %s is not a regular file", path, name)})
			continue
		}
		f, err := os.Open(name)
		if err != nil {
			e.list = append(e.list, Error{Line: lf.Line, Msg: fmt.Sprintf("%s: %v", path, err)})
			continue
		}
		frs, err := rules.ReadRuleset(name, f, lf.List)
		f.Close()
		if err != nil {
			e.list = append(e.list, Error{Line: lf.Line, Msg: fmt.Sprintf("%s: %v", path, err)})
			continue
		}
		// The config's rules do not expire, and its policy is the policy
		// section's: a file (an export of another host, say) that says
		// otherwise is refused rather than applied in part.
		timed := 0
		for _, pe := range append(slices.Clone(frs.Allow), frs.Deny...) {
			if pe.Expires != nil {
				timed++
			}
		}
		if timed > 0 {
			e.list = append(e.list, Error{Line: lf.Line, Msg: fmt.Sprintf("%s: %s holds %d entries with an expiry; config rules do not expire (block them with --ttl instead, or leave the expiries out)", path, name, timed)})
		}
		if frs.Settings != nil {
			e.list = append(e.list, Error{Line: lf.Line, Msg: fmt.Sprintf("%s: %s holds policy settings; put them in the policy section", path, name)})
		}
		for _, pe := range frs.Allow {
			rs.Allow = append(rs.Allow, rules.PrefixEntry{Prefix: pe.Prefix, Comment: pe.Comment})
		}
		for _, pe := range frs.Deny {
			rs.Deny = append(rs.Deny, rules.PrefixEntry{Prefix: pe.Prefix, Comment: pe.Comment})
		}
		if len(frs.Ports) > 0 {
			e.list = append(e.list, Error{Line: lf.Line, Msg: fmt.Sprintf("%s: %s holds port rules; put port rules in the ports section", path, name)})
		}
	}
	rs.Allow = sortUnique(rs.Allow)
	rs.Deny = sortUnique(rs.Deny)
	set.FromFiles = len(rs.Allow) + len(rs.Deny) - inline
	return set
}

// sortUnique sorts entries by prefix and keeps the first of each prefix;
// the sort is stable, so an inline entry (first in the list) wins over a
// file's.
func sortUnique(l []rules.PrefixEntry) []rules.PrefixEntry {
	slices.SortStableFunc(l, func(a, b rules.PrefixEntry) int { return rules.ComparePrefixes(a.Prefix, b.Prefix) })
	return slices.CompactFunc(l, func(a, b rules.PrefixEntry) bool { return a.Prefix == b.Prefix })
}
