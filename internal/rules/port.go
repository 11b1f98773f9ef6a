package rules

import (
	"fmt"
	"strconv"
	"strings"
)

// Class is the protocol a port rule applies to. Its values are the data
// path's port classes (enum port_class).
type Class uint8

const (
	TCP    Class = 0
	UDP    Class = 1
	ICMP   Class = 2
	ICMPv6 Class = 3
)

func (c Class) String() string {
	switch c {
	case TCP:
		return "tcp"
	case UDP:
		return "udp"
	case ICMP:
		return "icmp"
	case ICMPv6:
		return "icmpv6"
	}
	return fmt.Sprintf("class%d", uint8(c))
}

// HasPorts tells whether the class matches ports (TCP, UDP) rather than
// message types (ICMP, ICMPv6).
func (c Class) HasPorts() bool { return c == TCP || c == UDP }

// Action is what a port rule does. Its values are the data path's
// enum rule_action.
type Action uint8

const (
	Drop  Action = 1
	Allow Action = 2
)

func (a Action) String() string {
	switch a {
	case Drop:
		return "drop"
	case Allow:
		return "allow"
	}
	return fmt.Sprintf("action%d", uint8(a))
}

// ParseAction reads "drop" or "allow".
func ParseAction(s string) (Action, error) {
	switch s {
	case "drop":
		return Drop, nil
	case "allow":
		return Allow, nil
	}
	return 0, fmt.Errorf("invalid action %q: want drop or allow", s)
}

// PortSpec is a protocol with a destination port range, or an ICMP or
// ICMPv6 message type range.
type PortSpec struct {
	Class    Class
	From, To uint16
}

func (s PortSpec) String() string {
	if s.From == s.To {
		return fmt.Sprintf("%s/%s", s.Class, s.name(s.From))
	}
	return fmt.Sprintf("%s/%d-%d", s.Class, s.From, s.To)
}

func (s PortSpec) name(v uint16) string {
	var names map[string]uint16
	switch s.Class {
	case ICMP:
		names = icmpTypes
	case ICMPv6:
		names = icmpv6Types
	}
	for n, t := range names {
		if t == v {
			return n
		}
	}
	return strconv.Itoa(int(v))
}

// Overlaps tells whether two specs share a port or type.
func (s PortSpec) Overlaps(o PortSpec) bool {
	return s.Class == o.Class && s.From <= o.To && o.From <= s.To
}

var icmpTypes = map[string]uint16{
	"echo-reply":              0,
	"destination-unreachable": 3,
	"redirect":                5,
	"echo-request":            8,
	"router-advertisement":    9,
	"router-solicitation":     10,
	"time-exceeded":           11,
	"parameter-problem":       12,
	"timestamp-request":       13,
	"timestamp-reply":         14,
}

var icmpv6Types = map[string]uint16{
	"destination-unreachable": 1,
	"packet-too-big":          2,
	"time-exceeded":           3,
	"parameter-problem":       4,
	"echo-request":            128,
	"echo-reply":              129,
	"router-solicitation":     133,
	"router-advertisement":    134,
	"neighbor-solicitation":   135,
	"neighbor-advertisement":  136,
	"redirect":                137,
}

// ParsePortSpec reads PROTO/PORT[-PORT] for tcp and udp ("udp/19",
// "tcp/6000-6063") and PROTO/TYPE[-TYPE] for icmp and icmpv6, where a type
// is a number or a name ("icmp/echo-request", "icmpv6/128").
func ParsePortSpec(s string) (PortSpec, error) {
	proto, rest, ok := strings.Cut(strings.TrimSpace(s), "/")
	if !ok || rest == "" {
		return PortSpec{}, fmt.Errorf("invalid port rule %q: want PROTO/PORT[-PORT], e.g. udp/19 or tcp/6000-6063", s)
	}
	var spec PortSpec
	var max uint64 = 65535
	var names map[string]uint16
	switch strings.ToLower(proto) {
	case "tcp":
		spec.Class = TCP
	case "udp":
		spec.Class = UDP
	case "icmp":
		spec.Class, max, names = ICMP, 255, icmpTypes
	case "icmpv6", "icmp6", "ipv6-icmp":
		spec.Class, max, names = ICMPv6, 255, icmpv6Types
	default:
		return PortSpec{}, fmt.Errorf("invalid port rule %q: unknown protocol %q (want tcp, udp, icmp or icmpv6)", s, proto)
	}
	what := "port"
	if !spec.Class.HasPorts() {
		what = "type"
	}
	parse := func(v string) (uint16, error) {
		if t, ok := names[strings.ToLower(v)]; ok {
			return t, nil
		}
		n, err := strconv.ParseUint(v, 10, 32)
		if err != nil {
			return 0, fmt.Errorf("invalid port rule %q: %s %q is not a number", s, what, v)
		}
		if n > max {
			return 0, fmt.Errorf("invalid port rule %q: %s %d is above %d", s, what, n, max)
		}
		if n == 0 && spec.Class.HasPorts() {
			return 0, fmt.Errorf("invalid port rule %q: port 0 is not a port", s)
		}
		return uint16(n), nil
	}
	lo, hi, isRange := strings.Cut(rest, "-")
	if _, named := names[strings.ToLower(rest)]; named {
		lo, hi, isRange = rest, "", false
	}
	var err error
	if spec.From, err = parse(lo); err != nil {
		return PortSpec{}, err
	}
	spec.To = spec.From
	if isRange {
		if spec.To, err = parse(hi); err != nil {
			return PortSpec{}, err
		}
		if spec.To < spec.From {
			return PortSpec{}, fmt.Errorf("invalid port rule %q: range ends before it starts", s)
		}
	}
	return spec, nil
}
