package datapath

import (
	"encoding/binary"
	"net/netip"

	"github.com/cilium/ebpf"
)

// The deny summary's geometry, from enum deny_summary_geometry
// (bpf/include/moat_consts.h).
const (
	summaryBlockShift = uint32(MoatDenySummaryGeometrySUMMARY_BLOCK_SHIFT)
	summaryV4First    = uint32(MoatDenySummaryGeometrySUMMARY_V4FIRST)
	summaryV6First    = uint32(MoatDenySummaryGeometrySUMMARY_V6FIRST)
	summaryV6HashBits = uint32(MoatDenySummaryGeometrySUMMARY_V6HASH_BITS)
	summaryV6HashMul  = uint32(MoatDenySummaryGeometrySUMMARY_V6HASH_MUL)

	summaryV6Blocks = uint32(MoatDenySummaryGeometrySUMMARY_V6BLOCKS)
)

// SummaryFamily is the summary's flag for an address's family.
func SummaryFamily(a netip.Addr) uint32 {
	if a.Is4() {
		return uint32(MoatDenySummaryFamilySUMMARY_V4)
	}
	return uint32(MoatDenySummaryFamilySUMMARY_V6)
}

// summaryV6Bit is the bit of an IPv6 address: the hash of its /32.
func summaryV6Bit(first32 uint32) uint32 {
	return (first32 * summaryV6HashMul) >> (32 - summaryV6HashBits)
}

// SummaryLocation returns where the bit of address a lives: the block
// (the map's key), the word in it and the mask.
func SummaryLocation(a netip.Addr) (block uint32, word int, mask uint64) {
	var n, first uint32
	if a.Is4() {
		b := a.As4()
		n, first = binary.BigEndian.Uint32(b[:])>>8, summaryV4First // the /24's number
	} else {
		b := a.As16()
		n, first = summaryV6Bit(binary.BigEndian.Uint32(b[:4])), summaryV6First
	}
	return first + n>>summaryBlockShift, int(n>>6) & 63, 1 << (n & 63)
}

// SummaryMarks collects summary bits by block.
type SummaryMarks map[uint32]*[64]uint64

// Add marks the bits of every address prefix p covers. An IPv4 prefix
// shorter than /24 covers a run of consecutive bits (bit n is /24 number
// n); an IPv6 one shorter than /32 covers a bit per hashed /32 inside it,
// and one shorter than /16 (over 65536 of them) every IPv6 bit.
func (m SummaryMarks) Add(p netip.Prefix) {
	p = p.Masked()
	switch {
	case p.Addr().Is4() && p.Bits() >= 24, p.Addr().Is6() && p.Bits() >= 32:
		m.set(p.Addr())
	case p.Addr().Is4():
		first := firstBits(p.Addr(), 24)
		m.setRun(summaryV4First, first, first+1<<(24-p.Bits()))
	case p.Bits() >= 16:
		first := firstBits(p.Addr(), 32)
		for i := uint32(0); i < 1<<(32-p.Bits()); i++ {
			m.set(addrOfBits(first+i, 32, false))
		}
	default:
		n := summaryV6Blocks << summaryBlockShift
		m.setRun(summaryV6First, 0, n)
	}
}

// SummaryBroad says whether p marks more than 65536 bits: the bits it leaves
// when it is removed are worth a rebuild at once.
func SummaryBroad(p netip.Prefix) bool {
	if p.Addr().Is4() {
		return p.Bits() < 8
	}
	return p.Bits() < 16
}

// setRun sets bits from..to-1 of the family whose bits start at block
// first.
func (m SummaryMarks) setRun(first, from, to uint32) {
	for n := from; n < to; {
		blk := first + n>>summaryBlockShift
		b := m[blk]
		if b == nil {
			b = new([64]uint64)
			m[blk] = b
		}
		if n&63 == 0 && to-n >= 64 {
			b[(n>>6)&63] = ^uint64(0)
			n += 64
			continue
		}
		b[(n>>6)&63] |= 1 << (n & 63)
		n++
	}
}

func (m SummaryMarks) set(a netip.Addr) {
	blk, w, mask := SummaryLocation(a)
	b := m[blk]
	if b == nil {
		b = new([64]uint64)
		m[blk] = b
	}
	b[w] |= mask
}

// firstBits returns the first unit bits of a as a number.
func firstBits(a netip.Addr, unit int) uint32 {
	if a.Is4() {
		b := a.As4()
		return binary.BigEndian.Uint32(b[:]) >> (32 - unit)
	}
	b := a.As16()
	return binary.BigEndian.Uint32(b[:4]) >> (32 - unit)
}

// addrOfBits is the first address of the /unit numbered n.
func addrOfBits(n uint32, unit int, v4 bool) netip.Addr {
	var b [16]byte
	binary.BigEndian.PutUint32(b[:4], n<<(32-unit))
	if v4 {
		return netip.AddrFrom4([4]byte(b[:4]))
	}
	return netip.AddrFrom16(b)
}

// ClearSummaryBlocks zeroes every block of a deny_summary map, flags
// included, in one batched update.
func ClearSummaryBlocks(m *ebpf.Map) error {
	n := int(MoatDenySummaryGeometrySUMMARY_BLOCKS)
	keys := make([]uint32, n)
	for i := range keys {
		keys[i] = uint32(i)
	}
	_, err := m.BatchUpdate(keys, make([]MoatSummaryBlock, n), nil)
	return err
}
