// Package ratelimit controls moat's adaptive mitigation in the data path
// (bpf/include/ratelimit.h): per-source rate limits with optional
// automatic blocking, flood budgets that hold a protocol/port to a ceiling
// whatever the sources, heavy-hitter sampling and attack-shape counters.
//
// A limit has a kind (source or budget) and a scope: all traffic, one
// protocol, or a protocol with a port (ICMP type) range, optionally
// narrowed to one kind of packet (Packets): TCP SYNs (+syn), TCP segments
// that open a TLS ClientHello (+tls-hello), UDP datagrams that open with a
// QUIC Initial packet (+quic-initial). For each kind the most specific
// scope whose limit takes the packet decides: a port range over a whole
// protocol over all traffic. A packet that a narrowed limit does not take
// falls to the next wider scope.
//
// Everything works on a Maps value, which the CLI gets from the pinned
// state (FromShield) and a daemon can get the same way; Apply makes the
// configured limits equal to a list, as a config file reload wants.
package ratelimit

import (
	"errors"
	"fmt"
	"math/bits"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/cilium/ebpf"

	"github.com/moat-shield/moat/internal/datapath"
	"github.com/moat-shield/moat/internal/rules"
)

// Kind says what a limit counts against.
type Kind uint8

const (
	// Source limits give every source address (IPv6: prefix) a bucket.
	Source Kind = Kind(datapath.MoatRlKindRL_KIND_SOURCE)
	// Budget limits give the whole scope one bucket: a flood budget.
	Budget Kind = Kind(datapath.MoatRlKindRL_KIND_BUDGET)
)

func (k Kind) String() string {
	switch k {
	case Source:
		return "source"
	case Budget:
		return "budget"
	}
	return fmt.Sprintf("kind%d", uint8(k))
}

// ParseKind reads "source" or "budget".
func ParseKind(s string) (Kind, error) {
	switch s {
	case "source", "per-source":
		return Source, nil
	case "budget":
		return Budget, nil
	}
	return 0, fmt.Errorf("invalid limit kind %q: want source or budget", s)
}

func (k Kind) MarshalText() ([]byte, error) { return []byte(k.String()), nil }
func (k *Kind) UnmarshalText(b []byte) (err error) {
	*k, err = ParseKind(string(b))
	return err
}

// Scope is the traffic a limit applies to.
type Scope struct {
	All bool // all traffic; Class and the ports are unused
	// Class with WholeClass covers every port of a protocol; otherwise
	// From..To (ICMP: message types).
	Class      rules.Class
	WholeClass bool
	From, To   uint16
	Only       Packets // the packets of the scope the limit takes
}

// Packets narrows a scope to one kind of packet: a "+…" suffix.
type Packets uint8

const (
	AnyPackets   Packets = iota
	SYNs                 // +syn: TCP SYNs without ACK
	TLSHellos            // +tls-hello: TCP segments that open a TLS ClientHello
	QUICInitials         // +quic-initial: UDP datagrams that open with a QUIC Initial packet
)

// packetKinds describes each Packets value but AnyPackets: its suffix,
// the protocol it is for, and its flag in the data path's rule.
var packetKinds = map[Packets]struct {
	suffix string
	class  rules.Class
	flag   datapath.MoatRlRuleFlags
}{
	SYNs:         {"+syn", rules.TCP, datapath.MoatRlRuleFlagsRL_F_SYN_ONLY},
	TLSHellos:    {"+tls-hello", rules.TCP, datapath.MoatRlRuleFlagsRL_F_TLS_HELLO},
	QUICInitials: {"+quic-initial", rules.UDP, datapath.MoatRlRuleFlagsRL_F_QUIC_INITIAL},
}

// classSlot is the index in the class scope table; RL_CLASS_ALL for All.
func (s Scope) classSlot() uint32 {
	if s.All {
		return 4 // RL_CLASS_ALL
	}
	return uint32(s.Class)
}

func (s Scope) String() string {
	var b string
	switch {
	case s.All:
		b = "all"
	case s.WholeClass:
		b = s.Class.String()
	default:
		b = rules.PortSpec{Class: s.Class, From: s.From, To: s.To}.String()
	}
	return b + packetKinds[s.Only].suffix
}

// ParseScope reads "all", a protocol ("udp", "tcp", "icmp", "icmpv6") or a
// port rule's PROTO/PORT[-PORT] ("udp/53", "icmp/echo-request"); a
// "+syn" suffix restricts a TCP scope to SYNs, "+tls-hello" to segments
// that open a TLS ClientHello, "+quic-initial" a UDP scope to datagrams
// that open with a QUIC Initial packet.
func ParseScope(text string) (Scope, error) {
	var s Scope
	t := strings.ToLower(strings.TrimSpace(text))
	for only, k := range packetKinds {
		if rest, ok := strings.CutSuffix(t, k.suffix); ok {
			s.Only, t = only, rest
			break
		}
	}
	if strings.Contains(t, "+") {
		return Scope{}, fmt.Errorf("invalid scope %q: one qualifier at most, +syn, +tls-hello or +quic-initial", text)
	}
	switch t {
	case "all", "any", "*":
		s.All = true
	case "tcp":
		s.Class, s.WholeClass = rules.TCP, true
	case "udp":
		s.Class, s.WholeClass = rules.UDP, true
	case "icmp":
		s.Class, s.WholeClass = rules.ICMP, true
	case "icmpv6", "icmp6", "ipv6-icmp":
		s.Class, s.WholeClass = rules.ICMPv6, true
	default:
		spec, err := rules.ParsePortSpec(t)
		if err != nil {
			return Scope{}, fmt.Errorf("invalid scope %q: want all, tcp, udp, icmp, icmpv6 or PROTO/PORT[-PORT]", text)
		}
		s.Class, s.From, s.To = spec.Class, spec.From, spec.To
	}
	if k, ok := packetKinds[s.Only]; ok && (s.All || s.Class != k.class) {
		return Scope{}, fmt.Errorf("invalid scope %q: %s is for %s scopes only", text, k.suffix, strings.ToUpper(k.class.String()))
	}
	return s, nil
}

func (s Scope) MarshalText() ([]byte, error) { return []byte(s.String()), nil }
func (s *Scope) UnmarshalText(b []byte) (err error) {
	*s, err = ParseScope(string(b))
	return err
}

// Overlaps tells whether two scopes share a slot of the scope tables: two
// limits of one kind may not.
func (s Scope) Overlaps(o Scope) bool {
	if s.All || o.All {
		return s.All && o.All
	}
	if s.Class != o.Class || s.WholeClass != o.WholeClass {
		return false
	}
	return s.WholeClass || (s.From <= o.To && o.From <= s.To)
}

// Limit is one rate limit or flood budget as the operator writes it.
type Limit struct {
	Kind  Kind  `json:"kind"`
	Scope Scope `json:"scope"`
	// Rates; at least one. A packet must conform to both.
	PPS uint64 `json:"pps,omitempty"`
	BPS uint64 `json:"bps,omitempty"` // bits per second
	// Bursts; 0 takes a tenth of a second of the rate (at least one packet,
	// at least one 1518-byte frame).
	BurstPackets uint64 `json:"burst_packets,omitempty"`
	BurstBytes   uint64 `json:"burst_bytes,omitempty"`
	// Source limits: IPv6 sources share a bucket per prefix of this length
	// (0 takes 64), and a source over its limit is denied for Block (0:
	// never).
	IPv6Prefix int      `json:"ipv6_prefix,omitempty"`
	Block      Duration `json:"block,omitempty"`
}

// Duration is a time.Duration that reads and writes as "10s".
type Duration time.Duration

func (d Duration) MarshalText() ([]byte, error) { return []byte(time.Duration(d).String()), nil }
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	*d = Duration(v)
	return err
}

// Defaults and bounds.
const (
	DefaultIPv6Prefix = 64
	burstDivisor      = 10   // default burst: 1/10 s of the rate
	minBurstBytes     = 1518 // a byte burst below one frame would refuse that frame forever
	minBPS            = 8000 // keeps bytes * ns-per-byte within 64 bits in the data path
	maxPPS            = 1e8
	maxBPS            = 1e11
	// maxTrack bounds the packets a source may send before it gets a
	// bucket; the bucket is charged for them, so this trades the churn a
	// random-source flood causes against how late a bucket starts.
	maxTrack = 64
	fpShift  = 16 // RL_FP_SHIFT
	// MaxRules is how many limits may exist at once (ids 1..255).
	MaxRules = 255
)

// Normalize fills in defaults; Validate calls it.
func (l *Limit) Normalize() {
	if l.PPS > 0 && l.BurstPackets == 0 {
		l.BurstPackets = max(1, l.PPS/burstDivisor)
	}
	if l.BPS > 0 && l.BurstBytes == 0 {
		l.BurstBytes = max(minBurstBytes, l.BPS/8/burstDivisor)
	}
	if l.Kind == Source && l.IPv6Prefix == 0 {
		l.IPv6Prefix = DefaultIPv6Prefix
	}
}

// Validate checks a limit and fills in its defaults.
func (l *Limit) Validate() error {
	if l.Kind != Source && l.Kind != Budget {
		return fmt.Errorf("limit %s: kind must be source or budget", l.Scope)
	}
	if l.PPS == 0 && l.BPS == 0 {
		return fmt.Errorf("%s limit %s: give a rate in packets or bits per second", l.Kind, l.Scope)
	}
	// The data path adds a whole number of ns per packet, so a rate is
	// enforced to within 1/(ns per packet): 0.1% at 1 Mpps, 1% at 10 Mpps.
	if l.PPS > maxPPS || l.BPS > maxBPS {
		return fmt.Errorf("%s limit %s: rate too large (at most %d pps, %d bit/s)", l.Kind, l.Scope, uint64(maxPPS), uint64(maxBPS))
	}
	if l.BPS > 0 && l.BPS < minBPS {
		return fmt.Errorf("%s limit %s: a bit rate below %d bit/s is not supported", l.Kind, l.Scope, minBPS)
	}
	if l.Kind == Budget {
		if l.Block != 0 {
			return fmt.Errorf("budget %s: a block time is for source limits (a budget has no source to block)", l.Scope)
		}
		if l.IPv6Prefix != 0 {
			return fmt.Errorf("budget %s: an IPv6 prefix length is for source limits", l.Scope)
		}
	}
	if l.IPv6Prefix < 0 || l.IPv6Prefix > 128 {
		return fmt.Errorf("%s limit %s: IPv6 prefix length %d out of 0..128", l.Kind, l.Scope, l.IPv6Prefix)
	}
	if l.Block < 0 {
		return fmt.Errorf("%s limit %s: negative block time", l.Kind, l.Scope)
	}
	if l.PPS == 0 && l.BurstPackets != 0 || l.BPS == 0 && l.BurstBytes != 0 {
		return fmt.Errorf("%s limit %s: a burst needs its rate", l.Kind, l.Scope)
	}
	l.Normalize()
	if l.BPS > 0 && l.BurstBytes < minBurstBytes {
		return fmt.Errorf("%s limit %s: byte burst %d is below one %d-byte frame", l.Kind, l.Scope, l.BurstBytes, minBurstBytes)
	}
	// An hour of the rate keeps the bucket's tolerance far from wrapping
	// in the data path's 64-bit nanoseconds.
	if most := l.PPS * maxBurstSeconds; l.PPS > 0 && l.BurstPackets > most {
		return fmt.Errorf("%s limit %s: burst %d is more than an hour of the rate (at most %d)", l.Kind, l.Scope, l.BurstPackets, most)
	}
	if most := l.BPS / 8 * maxBurstSeconds; l.BPS > 0 && l.BurstBytes > most {
		return fmt.Errorf("%s limit %s: byte burst %d is more than an hour of the rate (at most %d)", l.Kind, l.Scope, l.BurstBytes, most)
	}
	return nil
}

func (l Limit) String() string {
	var parts []string
	parts = append(parts, l.Kind.String(), l.Scope.String())
	if l.PPS > 0 {
		parts = append(parts, fmt.Sprintf("%dpps burst %d", l.PPS, l.BurstPackets))
	}
	if l.BPS > 0 {
		parts = append(parts, fmt.Sprintf("%dbit/s burst %dB", l.BPS, l.BurstBytes))
	}
	if l.Kind == Source && l.IPv6Prefix != DefaultIPv6Prefix {
		parts = append(parts, fmt.Sprintf("ipv6/%d", l.IPv6Prefix))
	}
	if l.Block > 0 {
		parts = append(parts, "block "+time.Duration(l.Block).String())
	}
	return strings.Join(parts, " ")
}

// ruleValue is the data path's form of a validated limit.
func (l Limit) ruleValue() datapath.MoatRlRule {
	var r datapath.MoatRlRule
	if l.PPS > 0 {
		r.PktInterval = (uint64(1e9) << fpShift) / l.PPS
		r.PktTolerance = l.BurstPackets * (r.PktInterval >> fpShift)
	}
	if l.BPS > 0 {
		r.ByteInterval = (uint64(8e9) << fpShift) / l.BPS
		hi, lo := bits.Mul64(l.BurstBytes, r.ByteInterval)
		r.ByteTolerance = hi<<(64-fpShift) | lo>>fpShift
	}
	r.Kind = uint8(l.Kind)
	r.Flags = uint8(packetKinds[l.Scope.Only].flag)
	if l.Kind == Source {
		r.V6Prefix = uint8(l.IPv6Prefix)
		r.BlockNs = uint64(l.Block)
		r.TrackPkts = trackPackets(l)
		setText(&r.Reason, "auto-block on "+l.Scope.String()+": over "+l.rateText()+" per source")
	}
	r.Class = uint8(l.Scope.classSlot())
	if l.Scope.All || l.Scope.WholeClass {
		r.AllPorts = 1
	} else {
		r.PortFrom, r.PortTo = l.Scope.From, l.Scope.To
	}
	return r
}

func (l Limit) rateText() string {
	var p []string
	if l.PPS > 0 {
		p = append(p, strconv.FormatUint(l.PPS, 10)+"pps")
	}
	if l.BPS > 0 {
		p = append(p, strconv.FormatUint(l.BPS, 10)+"bit/s")
	}
	return strings.Join(p, "+")
}

// trackPackets is how many packets a source may send before it gets a
// bucket: at most its burst (the bucket is charged for them), at most what
// its rate allows in one sketch window (so a source over its rate always
// reaches the threshold within a window), rounded down to a power of two
// (the sampling gate uses it as a mask).
func trackPackets(l Limit) uint32 {
	// The window is a little over a second, so a second of the rate is
	// within it.
	t := uint64(maxTrack)
	if l.PPS > 0 {
		t = min(t, l.BurstPackets, l.PPS)
	}
	if l.BPS > 0 {
		t = min(t, l.BurstBytes/minBurstBytes, l.BPS/8/minBurstBytes)
	}
	if t < 1 {
		return 1
	}
	return uint32(1) << (bits.Len64(t) - 1)
}

func setText(c *datapath.MoatComment, s string) {
	for i := range c.Text {
		c.Text[i] = 0
	}
	for i := 0; i < len(s) && i < len(c.Text)-1; i++ {
		c.Text[i] = int8(s[i])
	}
}

// limitOf reads a stored rule back.
func limitOf(r datapath.MoatRlRule) Limit {
	l := Limit{Kind: Kind(r.Kind)}
	switch {
	case r.Class == 4:
		l.Scope.All = true
	case r.AllPorts == 1:
		l.Scope.Class, l.Scope.WholeClass = rules.Class(r.Class), true
	default:
		l.Scope.Class, l.Scope.From, l.Scope.To = rules.Class(r.Class), r.PortFrom, r.PortTo
	}
	for only, k := range packetKinds {
		if r.Flags&uint8(k.flag) != 0 {
			l.Scope.Only = only
		}
	}
	if r.PktInterval > 0 {
		l.PPS = roundDiv(uint64(1e9)<<fpShift, r.PktInterval)
		l.BurstPackets = r.PktTolerance / max(1, r.PktInterval>>fpShift)
	}
	if r.ByteInterval > 0 {
		l.BPS = roundDiv(uint64(8e9)<<fpShift, r.ByteInterval)
		hi, lo := bits.Mul64(r.ByteTolerance, 1<<fpShift)
		q, _ := bits.Div64(hi, lo, r.ByteInterval)
		l.BurstBytes = q
		if q*r.ByteInterval>>fpShift < r.ByteTolerance {
			l.BurstBytes++
		}
	}
	if l.Kind == Source {
		l.IPv6Prefix = int(r.V6Prefix)
		l.Block = Duration(r.BlockNs)
	}
	return l
}

func roundDiv(a, b uint64) uint64 { return (a + b/2) / b }

// ErrExists is returned (wrapped) by Add when a limit of that kind and
// scope exists and replace is false; ErrNotFound by Remove.
var (
	ErrExists   = errors.New("exists")
	ErrNotFound = errors.New("not found")
)

// UserError marks an error caused by what the caller asked for; the CLI
// maps it to its usage exit status.
type UserError struct{ Err error }

func (e *UserError) Error() string { return e.Err.Error() }
func (e *UserError) Unwrap() error { return e.Err }

func userErrorf(format string, args ...any) error {
	return &UserError{fmt.Errorf(format, args...)}
}

// maxBurstSeconds bounds a burst to an hour of its rate.
const maxBurstSeconds = 3600

// sortLimits orders limits by kind, then scope from general to specific.
func sortLimits[T any](xs []T, lim func(T) Limit) {
	sort.SliceStable(xs, func(i, j int) bool {
		a, b := lim(xs[i]), lim(xs[j])
		if a.Kind != b.Kind {
			return a.Kind < b.Kind
		}
		ka, kb := scopeOrder(a.Scope), scopeOrder(b.Scope)
		return ka < kb
	})
}

func scopeOrder(s Scope) uint64 {
	switch {
	case s.All:
		return 0
	case s.WholeClass:
		return 1<<40 | uint64(s.Class)<<20
	}
	return 2<<40 | uint64(s.Class)<<20 | uint64(s.From)<<2 | uint64(s.Only)
}

// Maps are the pinned maps of the mitigation.
type Maps struct {
	Rules, PortScopes, ClassScopes, Budgets, Sources, Sketch, Stats, Settings *ebpf.Map
	HHSources, ShapeCounts, ShapePorts                                        *ebpf.Map
}

// MapNames are the names of every map in Maps; internal/shield pins them
// with the other shared maps.
var MapNames = []string{
	datapath.MoatMapRlRules, datapath.MoatMapRlPortScopes, datapath.MoatMapRlClassScopes,
	datapath.MoatMapRlBudgets, datapath.MoatMapRlSources, datapath.MoatMapRlSketch,
	datapath.MoatMapRlStats, datapath.MoatMapRlSettings, datapath.MoatMapHhSources,
	datapath.MoatMapShape, datapath.MoatMapShapePorts,
}

// NewMaps takes the maps from a lookup by name (shield.Shield.Map, or a
// collection's Maps).
func NewMaps(get func(name string) *ebpf.Map) (Maps, error) {
	m := Maps{
		Rules: get(datapath.MoatMapRlRules), PortScopes: get(datapath.MoatMapRlPortScopes),
		ClassScopes: get(datapath.MoatMapRlClassScopes), Budgets: get(datapath.MoatMapRlBudgets),
		Sources: get(datapath.MoatMapRlSources), Sketch: get(datapath.MoatMapRlSketch),
		Stats: get(datapath.MoatMapRlStats), Settings: get(datapath.MoatMapRlSettings),
		HHSources: get(datapath.MoatMapHhSources), ShapeCounts: get(datapath.MoatMapShape),
		ShapePorts: get(datapath.MoatMapShapePorts),
	}
	for i, mp := range []*ebpf.Map{m.Rules, m.PortScopes, m.ClassScopes, m.Budgets, m.Sources,
		m.Sketch, m.Stats, m.Settings, m.HHSources, m.ShapeCounts, m.ShapePorts} {
		if mp == nil {
			return m, fmt.Errorf("the pinned state has no map %s (made by an older moat?)", MapNames[i])
		}
	}
	return m, nil
}
