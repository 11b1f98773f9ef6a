package capture

import (
	"fmt"
	"strings"

	"github.com/cilium/ebpf"

	"github.com/moat-shield/moat/internal/datapath"
	"github.com/moat-shield/moat/internal/rules"
	"github.com/moat-shield/moat/internal/shield"
)

// ActionName names an XDP action the way moat's commands do.
func ActionName(a uint8) string {
	switch a {
	case ActionDrop:
		return "drop"
	case ActionPass:
		return "pass"
	case ActionTX:
		return "tx"
	case ActionAborted:
		return "aborted"
	}
	return fmt.Sprintf("action-%d", a)
}

// ReasonName names a verdict reason as `moat stats` does.
func ReasonName(r shield.Reason) string {
	if n, ok := shield.ReasonNames[r]; ok {
		return n
	}
	return fmt.Sprintf("reason-%d", uint8(r))
}

// Comment is the packet comment that moat dump writes, e.g.
//
//	moat: drop denylist rule=198.19.0.0/16
//	moat: drop port_drop rule=#3 udp/9
//	moat: pass pass
//	moat: monitored denylist rule=198.19.0.0/16
//
// (monitored: a drop that monitor mode passed).
//
// portRule names a port rule by id ("" if unknown).
func Comment(p Packet, portRule func(id uint16) string) string {
	var b strings.Builder
	action := ActionName(p.Action)
	if p.Monitored {
		action = "monitored" // passed by monitor mode, a drop otherwise
	}
	fmt.Fprintf(&b, "moat: %s %s", action, ReasonName(p.Reason))
	switch {
	case p.Rule.IsValid():
		fmt.Fprintf(&b, " rule=%s", p.Rule.Masked())
	case p.PortRule != 0:
		fmt.Fprintf(&b, " rule=#%d", p.PortRule)
		if portRule != nil {
			if d := portRule(p.PortRule); d != "" {
				b.WriteString(" " + d)
			}
		}
	}
	return b.String()
}

// PortRuleNames reads port rule definitions from the pinned map to name
// them in comments, remembering each: ids are reused only after a rule is
// removed, which a capture of a few minutes rarely sees.
func PortRuleNames(defs *ebpf.Map) func(id uint16) string {
	cache := map[uint16]string{}
	return func(id uint16) string {
		if n, ok := cache[id]; ok {
			return n
		}
		var d datapath.MoatPortRuleDef
		n := ""
		if defs != nil && defs.Lookup(uint32(id), &d) == nil && d.Action != uint8(datapath.MoatRuleActionACTION_NONE) {
			// As `moat list` and the metrics name it (icmp/echo-request).
			n = rules.PortSpec{Class: rules.Class(d.Class), From: d.From, To: d.To}.String()
		}
		cache[id] = n
		return n
	}
}
