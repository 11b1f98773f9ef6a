package ratelimit

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"sort"
	"strings"

	"github.com/cilium/ebpf"

	"github.com/moat-shield/moat/internal/datapath"
)

// HeavyHitter is one source's sampled traffic, scaled by the sampling
// interval into estimates. IPv6 sources are aggregated per /64.
type HeavyHitter struct {
	Source  netip.Prefix `json:"source"`
	Packets uint64       `json:"packets"`
	Bytes   uint64       `json:"bytes"`
	Dropped uint64       `json:"dropped"` // by a rate limit, budget or port rule
	// Over a limit or budget, or to a port a rule drops, but passed in
	// monitor mode: what enforcing would have dropped. Named as moat
	// stats names them.
	Monitored uint64 `json:"monitored"`
}

// HeavyHitters reads the sampled sources. The counts are cumulative since
// each source entered the map (an LRU: quiet sources leave it); rates come
// from the difference of two reads. The values are read as bytes: a map
// pinned by an older moat has shorter ones, without the fields added at
// their end since, which read as 0. shield.Open replaces such a map, but
// the metrics read the pins as they find them.
func (m Maps) HeavyHitters() ([]HeavyHitter, error) {
	cfg, err := m.Config()
	if err != nil {
		return nil, err
	}
	scale := uint64(cfg.Sample)
	var out []HeavyHitter
	var k datapath.MoatRlSrcKey
	var b []byte
	full := make([]byte, binary.Size(datapath.MoatHhCounts{}))
	it := m.HHSources.Iterate()
	for it.Next(&k, &b) {
		clear(full)
		copy(full, b)
		var v datapath.MoatHhCounts
		if _, err := binary.Decode(full, binary.NativeEndian, &v); err != nil {
			return nil, fmt.Errorf("read heavy hitters: %w", err)
		}
		out = append(out, HeavyHitter{
			Source:    keyPrefix(k),
			Packets:   v.Packets * scale,
			Bytes:     v.Bytes * scale,
			Dropped:   v.Dropped * scale,
			Monitored: v.Monitored * scale,
		})
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("read heavy hitters: %w", err)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Packets > out[j].Packets })
	return out, nil
}

func keyPrefix(k datapath.MoatRlSrcKey) netip.Prefix {
	if k.Family == 4 {
		return netip.PrefixFrom(netip.AddrFrom4([4]byte(k.Addr[:4])), 32)
	}
	return netip.PrefixFrom(netip.AddrFrom16(k.Addr), int(k.Prefixlen))
}

// TrackedSource is a source that has a bucket under a source limit.
type TrackedSource struct {
	Rule    uint16       `json:"rule"`
	Source  netip.Prefix `json:"source"`
	Passed  uint64       `json:"passed"`
	Dropped uint64       `json:"dropped"`
}

// TrackedSources lists the per-source buckets.
func (m Maps) TrackedSources() ([]TrackedSource, error) {
	var out []TrackedSource
	var k datapath.MoatRlSrcKey
	var v datapath.MoatRlSrcState
	it := m.Sources.Iterate()
	for it.Next(&k, &v) {
		out = append(out, TrackedSource{Rule: k.Rule, Source: keyPrefix(k), Passed: v.Passed, Dropped: v.Dropped})
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("read source buckets: %w", err)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Dropped > out[j].Dropped })
	return out, nil
}

// Shape is the attack shape: what the traffic that reached the limits
// looked like, summed over CPUs since the maps were created.
type Shape struct {
	Sizes      []Count `json:"sizes"`     // frame length buckets
	Protocols  []Count `json:"protocols"` // tcp, udp, icmp, other
	Fragments  uint64  `json:"fragments"`
	TCPFlags   []Count `json:"tcp_flags"`   // by flag combination, most first
	SYNOptions []Count `json:"syn_options"` // SYNs by the options they carry, most first
	// Non-SYN TCP segments with and without options.
	TCPOptions   uint64  `json:"tcp_with_options"`
	TCPNoOptions uint64  `json:"tcp_without_options"`
	Ports        []Count `json:"ports"` // destination ports (ICMP types), most first
}

// Count is one bucket of the shape.
type Count struct {
	Name    string `json:"name"`
	Packets uint64 `json:"packets"`
}

var sizeNames = [...]string{"<=64", "65-128", "129-256", "257-512", "513-1024", "1025-1518", "1519-9018", ">9018"}

// FlagNames spells a TCP flags byte the way tcpdump does (S, A, F, R, P,
// U, E, W).
func FlagNames(f uint8) string {
	var b strings.Builder
	for _, x := range []struct {
		bit  uint8
		name byte
	}{{0x02, 'S'}, {0x10, 'A'}, {0x01, 'F'}, {0x04, 'R'}, {0x08, 'P'}, {0x20, 'U'}, {0x40, 'E'}, {0x80, 'W'}} {
		if f&x.bit != 0 {
			b.WriteByte(x.name)
		}
	}
	if b.Len() == 0 {
		return "none"
	}
	return b.String()
}

func optionNames(combo int) string {
	var p []string
	for i, n := range []string{"mss", "wscale", "sack", "ts"} {
		if combo&(1<<i) != 0 {
			p = append(p, n)
		}
	}
	if len(p) == 0 {
		return "none"
	}
	return strings.Join(p, ",")
}

// portName names a slot of shape_ports.
func portName(i int) string {
	switch {
	case i < 65536:
		return fmt.Sprintf("tcp/%d", i)
	case i < 2*65536:
		return fmt.Sprintf("udp/%d", i-65536)
	case i < 2*65536+256:
		return fmt.Sprintf("icmp/%d", i-2*65536)
	}
	return fmt.Sprintf("icmpv6/%d", i-2*65536-256)
}

// Shape reads the attack shape with at most topPorts ports.
func (m Maps) Shape(topPorts int) (Shape, error) {
	var per []datapath.MoatAttackShape
	if err := m.ShapeCounts.Lookup(uint32(0), &per); err != nil {
		return Shape{}, fmt.Errorf("read attack shape: %w", err)
	}
	var sum datapath.MoatAttackShape
	for _, v := range per {
		for i := range sum.Sizes {
			sum.Sizes[i] += v.Sizes[i]
		}
		for i := range sum.Protocols {
			sum.Protocols[i] += v.Protocols[i]
		}
		for i := range sum.TcpFlags {
			sum.TcpFlags[i] += v.TcpFlags[i]
		}
		for i := range sum.SynOptions {
			sum.SynOptions[i] += v.SynOptions[i]
		}
		sum.TcpOptions += v.TcpOptions
		sum.TcpNoOptions += v.TcpNoOptions
		sum.Fragments += v.Fragments
	}
	// Empty lists, not null: JSON readers see one shape either way.
	s := Shape{TCPFlags: []Count{}, SYNOptions: []Count{}, Ports: []Count{}}
	for i, n := range sum.Sizes {
		s.Sizes = append(s.Sizes, Count{sizeNames[i], n})
	}
	for i, name := range []string{"tcp", "udp", "icmp", "other"} {
		s.Protocols = append(s.Protocols, Count{name, sum.Protocols[i]})
	}
	for f, n := range sum.TcpFlags {
		if n > 0 {
			s.TCPFlags = append(s.TCPFlags, Count{FlagNames(uint8(f)), n})
		}
	}
	for c, n := range sum.SynOptions {
		if n > 0 {
			s.SYNOptions = append(s.SYNOptions, Count{optionNames(c), n})
		}
	}
	s.TCPOptions, s.TCPNoOptions, s.Fragments = sum.TcpOptions, sum.TcpNoOptions, sum.Fragments

	var blk []datapath.MoatShapePortBlock
	for b := uint32(0); b < m.ShapePorts.MaxEntries(); b++ {
		if err := m.ShapePorts.Lookup(b, &blk); err != nil {
			return s, fmt.Errorf("read port counts: %w", err)
		}
		var tot [256]uint64
		for _, v := range blk {
			for i, n := range v.Packets {
				tot[i] += n
			}
		}
		for i, n := range tot {
			if n > 0 {
				s.Ports = append(s.Ports, Count{portName(int(b)*256 + i), n})
			}
		}
	}
	byCount := func(c []Count) {
		sort.SliceStable(c, func(i, j int) bool { return c[i].Packets > c[j].Packets })
	}
	byCount(s.TCPFlags)
	byCount(s.SYNOptions)
	byCount(s.Ports)
	if topPorts >= 0 && len(s.Ports) > topPorts {
		s.Ports = s.Ports[:topPorts]
	}
	return s, nil
}

// ResetShape zeroes the shape counters, so that a new reading describes
// only what came after.
func (m Maps) ResetShape() error {
	ncpu, err := ebpf.PossibleCPU()
	if err != nil {
		return err
	}
	if err := m.ShapeCounts.Put(uint32(0), make([]datapath.MoatAttackShape, ncpu)); err != nil {
		return err
	}
	zero := make([]datapath.MoatShapePortBlock, ncpu)
	for b := uint32(0); b < m.ShapePorts.MaxEntries(); b++ {
		if err := m.ShapePorts.Put(b, zero); err != nil {
			return err
		}
	}
	return nil
}
