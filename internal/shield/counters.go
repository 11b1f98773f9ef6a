package shield

import (
	"fmt"
	"path/filepath"

	"github.com/cilium/ebpf"

	"github.com/moat-shield/moat/internal/datapath"
)

// Reason names a counter slot of the data path (enum verdict_reason).
type Reason = datapath.MoatVerdictReason

// ReasonNames are the names the CLI and metrics use for each reason.
var ReasonNames = map[Reason]string{
	datapath.MoatVerdictReasonREASON_PASS:        "pass",
	datapath.MoatVerdictReasonREASON_NON_IP:      "non_ip",
	datapath.MoatVerdictReasonREASON_ALLOWLIST:   "allowlist",
	datapath.MoatVerdictReasonREASON_DENYLIST:    "denylist",
	datapath.MoatVerdictReasonREASON_PORT_DROP:   "port_drop",
	datapath.MoatVerdictReasonREASON_PORT_ALLOW:  "port_allow",
	datapath.MoatVerdictReasonREASON_FRAGMENT:    "fragment",
	datapath.MoatVerdictReasonREASON_MALFORMED:   "malformed",
	datapath.MoatVerdictReasonREASON_RATELIMIT:   "ratelimit",
	datapath.MoatVerdictReasonREASON_BUDGET:      "budget",
	datapath.MoatVerdictReasonREASON_SYN_COOKIE:  "syn_cookie",
	datapath.MoatVerdictReasonREASON_SYN_DEFENCE: "syn_defence",
}

// Count is a packet and byte count.
type Count struct {
	Packets uint64 `json:"packets"`
	Bytes   uint64 `json:"bytes"`
}

func (c *Count) add(o Count) { c.Packets += o.Packets; c.Bytes += o.Bytes }

// Counters are an interface's counters, summed over CPUs.
type Counters struct {
	Passed  Count `json:"passed"`
	Dropped Count `json:"dropped"`
	// Answered counts SYNs answered in XDP with a SYN cookie (XDP_TX): the
	// SYN-ACK leaves where the SYN came in, nothing reaches the stack.
	Answered Count `json:"answered"`
	// Monitored counts packets that a rule, limit or policy would have
	// dropped and that passed because moat is in monitor mode.
	Monitored Count `json:"monitored"`
	// ByReason holds the counts per reason, split by verdict.
	ByReason map[string]ReasonCount `json:"by_reason"`
}

// ReasonCount is one reason's counts.
type ReasonCount struct {
	Passed    Count `json:"passed"`
	Dropped   Count `json:"dropped"`
	Answered  Count `json:"answered,omitempty"`
	Monitored Count `json:"monitored,omitempty"`
}

// Counters reads one interface's counters.
func (s *Shield) Counters(iface string) (Counters, error) {
	m, err := ebpf.LoadPinnedMap(filepath.Join(s.ifaceDir(iface), "counters"), nil)
	if err != nil {
		return Counters{}, userErrorf("moat is not attached to %s", iface)
	}
	defer m.Close()
	return ReadCounters(m)
}

// monitoredSlot is the counters map's index for the drops of reason that
// monitor mode passed (bpf/include/moat_maps.h).
func monitoredSlot(reason Reason) uint32 {
	return uint32(datapath.MoatVerdictReasonREASON_MAX)*2 + uint32(reason)
}

// ReadCounters sums a counters map over CPUs.
func ReadCounters(m *ebpf.Map) (Counters, error) {
	out := Counters{ByReason: map[string]ReasonCount{}}
	// A map from before monitor mode (an interface not attached again
	// since) has no monitored slots.
	slots := uint32(2)
	if m.MaxEntries() >= monitoredSlot(datapath.MoatVerdictReasonREASON_MAX) {
		slots = 3
	}
	for reason, name := range ReasonNames {
		var rc ReasonCount
		for slot := uint32(0); slot < slots; slot++ {
			idx := uint32(reason)*2 + slot
			if slot == 2 {
				idx = monitoredSlot(reason)
			}
			var perCPU []datapath.MoatVerdictCounter
			if err := m.Lookup(idx, &perCPU); err != nil {
				return out, fmt.Errorf("read counters: %w", err)
			}
			var c Count
			for _, v := range perCPU {
				c.add(Count{v.Packets, v.Bytes})
			}
			switch {
			case slot == 2:
				rc.Monitored = c
				out.Monitored.add(c)
			case slot == 1:
				rc.Dropped = c
				out.Dropped.add(c)
			case reason == datapath.MoatVerdictReasonREASON_SYN_COOKIE || reason == datapath.MoatVerdictReasonREASON_SYN_DEFENCE:
				// XDP_TX has no slot of its own: these reasons' pass
				// slots hold it (SYN-ACKs, and RSTs for stray ACKs).
				rc.Answered = c
				out.Answered.add(c)
			default:
				rc.Passed = c
				out.Passed.add(c)
			}
		}
		out.ByReason[name] = rc
	}
	return out, nil
}
