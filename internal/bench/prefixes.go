package bench

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"math/rand/v2"
	"net/netip"
	"slices"

	"github.com/moat-shield/moat/internal/rules"
)

// DenyMix is how a generated denylist splits between hosts and networks of
// each family, in parts of the total.
type DenyMix struct {
	V4Hosts, V4Nets, V6Hosts, V6Nets float64
}

// DefaultMix resembles public block lists: mostly single addresses, some
// networks, a large IPv6 share.
var DefaultMix = DenyMix{V4Hosts: 0.45, V4Nets: 0.05, V6Hosts: 0.40, V6Nets: 0.10}

// Regions the generated prefixes come from. Each kind has its own region, so
// hosts never fall inside generated networks, and none touches the lab's
// addresses (198.18.0.0/15, 2001:db8::/32): the only denied lab sources are
// the ones a comparison adds on purpose. Non-overlapping entries are what an
// nftables interval set accepts, so every tool gets the same list.
var (
	v4NetRegion  = [2]uint32{0x01000000, 0x63ffffff} // 1.0.0.0 - 99.255.255.255
	v4HostRegion = [2]uint32{0x64000000, 0xdfffffff} // 100.0.0.0 - 223.255.255.255
	v6NetRegion  = netip.MustParsePrefix("2a00::/12")
	v6HostRegion = netip.MustParsePrefix("2400::/12")
	reservedV4   = []netip.Prefix{
		netip.MustParsePrefix("10.0.0.0/8"),
		netip.MustParsePrefix("127.0.0.0/8"),
		netip.MustParsePrefix("198.18.0.0/15"),
	}
)

// Lengths of generated networks: the sizes block lists carry.
const (
	minV4NetBits, maxV4NetBits = 16, 30
	minV6NetBits, maxV6NetBits = 32, 64
)

// GenerateDenylist returns n distinct, non-overlapping prefixes: the extra
// ones (which must lie outside the generated regions, e.g. the lab's spoofed
// range) plus generated hosts and networks of both families in the mix's
// proportions. The same seed gives the same list, so runs compare.
func GenerateDenylist(n int, extra []netip.Prefix, mix DenyMix, seed uint64) ([]netip.Prefix, error) {
	if n < len(extra) {
		return nil, fmt.Errorf("denylist of %d cannot hold %d extra prefixes", n, len(extra))
	}
	for _, p := range extra {
		if inGenerated(p) {
			return nil, fmt.Errorf("extra prefix %s overlaps the generated regions", p)
		}
	}
	rest := n - len(extra)
	total := mix.V4Hosts + mix.V4Nets + mix.V6Hosts + mix.V6Nets
	v4h := int(float64(rest) * mix.V4Hosts / total)
	v4n := int(float64(rest) * mix.V4Nets / total)
	v6n := int(float64(rest) * mix.V6Nets / total)
	v6h := rest - v4h - v4n - v6n

	rng := rand.New(rand.NewPCG(seed, seed^0x6d6f6174)) // "moat"
	out := slices.Clone(extra)
	out = append(out, v4Hosts(rng, v4h)...)
	out = append(out, disjointNets(v4n, func() netip.Prefix {
		bits := minV4NetBits + rng.IntN(maxV4NetBits-minV4NetBits+1)
		a := v4NetRegion[0] + rng.Uint32N(v4NetRegion[1]-v4NetRegion[0])
		return netip.PrefixFrom(v4Addr(a), bits).Masked()
	}, func(p netip.Prefix) bool { return !isReservedV4(p) })...)
	out = append(out, v6Hosts(rng, v6h)...)
	out = append(out, disjointNets(v6n, func() netip.Prefix {
		bits := minV6NetBits + rng.IntN(maxV6NetBits-minV6NetBits+1)
		return netip.PrefixFrom(randomIn(rng, v6NetRegion), bits).Masked()
	}, func(netip.Prefix) bool { return true })...)
	return out, nil
}

func v4Addr(a uint32) netip.Addr {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], a)
	return netip.AddrFrom4(b)
}

func isReservedV4(p netip.Prefix) bool {
	for _, r := range reservedV4 {
		if r.Overlaps(p) {
			return true
		}
	}
	return false
}

// inGenerated tells whether p could overlap a generated prefix.
func inGenerated(p netip.Prefix) bool {
	if !p.Addr().Is4() {
		return v6NetRegion.Overlaps(p) || v6HostRegion.Overlaps(p)
	}
	for _, r := range reservedV4 {
		if r.Bits() <= p.Bits() && r.Contains(p.Addr()) {
			return false // generation skips reserved ranges
		}
	}
	lo, hi := v4Addr(v4NetRegion[0]), v4Addr(v4HostRegion[1])
	return p.Masked().Addr().Compare(hi) <= 0 && lastAddr(p).Compare(lo) >= 0
}

func v4Hosts(rng *rand.Rand, n int) []netip.Prefix {
	seen := make(map[uint32]struct{}, n)
	out := make([]netip.Prefix, 0, n)
	for len(out) < n {
		a := v4HostRegion[0] + rng.Uint32N(v4HostRegion[1]-v4HostRegion[0])
		p := netip.PrefixFrom(v4Addr(a), 32)
		if _, dup := seen[a]; dup || isReservedV4(p) {
			continue
		}
		seen[a] = struct{}{}
		out = append(out, p)
	}
	return out
}

func v6Hosts(rng *rand.Rand, n int) []netip.Prefix {
	seen := make(map[netip.Addr]struct{}, n)
	out := make([]netip.Prefix, 0, n)
	for len(out) < n {
		a := randomIn(rng, v6HostRegion)
		if _, dup := seen[a]; dup {
			continue
		}
		seen[a] = struct{}{}
		out = append(out, netip.PrefixFrom(a, 128))
	}
	return out
}

// randomIn draws an address uniformly from p.
func randomIn(rng *rand.Rand, p netip.Prefix) netip.Addr {
	var b [16]byte
	binary.BigEndian.PutUint64(b[:8], rng.Uint64())
	binary.BigEndian.PutUint64(b[8:], rng.Uint64())
	base := p.Masked().Addr().As16()
	for i := range 16 {
		keep := byte(0) // bits of the prefix come from base
		switch bits := p.Bits() - i*8; {
		case bits >= 8:
			keep = 0xff
		case bits > 0:
			keep = ^byte(0xff >> bits)
		}
		b[i] = base[i]&keep | b[i]&^keep
	}
	return netip.AddrFrom16(b)
}

// disjointNets draws networks until it holds n that overlap neither each
// other nor anything ok rejects. Draws are sorted and swept, and the sweep
// repeats with fresh draws until enough survive.
func disjointNets(n int, draw func() netip.Prefix, ok func(netip.Prefix) bool) []netip.Prefix {
	var kept []netip.Prefix
	for len(kept) < n {
		cand := slices.Clone(kept)
		for range (n - len(kept)) * 5 / 4 {
			if p := draw(); ok(p) {
				cand = append(cand, p)
			}
		}
		slices.SortFunc(cand, rules.ComparePrefixes)
		kept = kept[:0]
		for _, p := range cand {
			if len(kept) > 0 && kept[len(kept)-1].Overlaps(p) {
				continue // sorted by start: only the last kept can overlap
			}
			kept = append(kept, p)
		}
	}
	return kept[:n]
}

// lastAddr is the highest address in p.
func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().As16()
	off := 0
	if p.Addr().Is4() {
		off = 96
	}
	for i := p.Bits() + off; i < 128; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a := netip.AddrFrom16(b)
	if p.Addr().Is4() {
		return a.Unmap()
	}
	return a
}

// nftTable is the nftables table the comparisons create in the server's
// namespace; its sets hold the denylist.
const (
	nftTable = "moatbench"
	nftSetV4 = "deny4"
	nftSetV6 = "deny6"
	nftChunk = 50000 // elements per add statement: keeps nft's parser fast

	// Named counters of the drop rules, which netlink reads by name.
	nftCounterV4 = "dropped4"
	nftCounterV6 = "dropped6"
)

// WriteNftSets writes an nft script that creates the table and fills one
// interval set per family with prefixes. The netdev family is the one whose
// ingress hook runs before the stack, the earliest point nftables offers.
func WriteNftSets(w io.Writer, prefixes []netip.Prefix) error {
	bw := bufio.NewWriter(w)
	fmt.Fprintf(bw, "table netdev %s {\n", nftTable)
	fmt.Fprintf(bw, "\tset %s { type ipv4_addr; flags interval; }\n", nftSetV4)
	fmt.Fprintf(bw, "\tset %s { type ipv6_addr; flags interval; }\n", nftSetV6)
	fmt.Fprintf(bw, "\tcounter %s { }\n\tcounter %s { }\n", nftCounterV4, nftCounterV6)
	fmt.Fprintf(bw, "}\n")
	sorted := slices.Clone(prefixes)
	slices.SortFunc(sorted, rules.ComparePrefixes)
	for _, fam := range []struct {
		set string
		v4  bool
	}{{nftSetV4, true}, {nftSetV6, false}} {
		n := 0
		for _, p := range sorted {
			if p.Addr().Is4() != fam.v4 {
				continue
			}
			switch {
			case n%nftChunk == 0:
				if n > 0 {
					bw.WriteString(" }\n")
				}
				fmt.Fprintf(bw, "add element netdev %s %s { ", nftTable, fam.set)
			default:
				bw.WriteString(", ")
			}
			if p.IsSingleIP() {
				bw.WriteString(p.Addr().String())
			} else {
				bw.WriteString(p.String())
			}
			n++
		}
		if n > 0 {
			bw.WriteString(" }\n")
		}
	}
	return bw.Flush()
}
