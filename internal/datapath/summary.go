package datapath

import (
	"encoding/binary"
	"net/netip"
)

// The deny summary's geometry, from enum deny_summary_geometry
// (bpf/include/moat_consts.h).
const (
	summaryBlockShift = uint32(MoatDenySummaryGeometrySUMMARY_BLOCK_SHIFT)
	summaryV4First    = uint32(MoatDenySummaryGeometrySUMMARY_V4FIRST)
	summaryV6First    = uint32(MoatDenySummaryGeometrySUMMARY_V6FIRST)
	summaryV6HashBits = uint32(MoatDenySummaryGeometrySUMMARY_V6HASH_BITS)
	summaryV6HashMul  = uint32(MoatDenySummaryGeometrySUMMARY_V6HASH_MUL)

	// SummaryMaxBits is the most bits one prefix may mark. A prefix that
	// would need more (an IPv4 prefix shorter than /8, an IPv6 one shorter
	// than /16) makes its family's summary unusable until a rebuild finds
	// no such prefix left.
	SummaryMaxBits = 1 << 16
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

// Add marks the bits of every address prefix p covers. It reports false,
// marking nothing, when p covers more than SummaryMaxBits bits.
func (m SummaryMarks) Add(p netip.Prefix) bool {
	p = p.Masked()
	unit := 24 // IPv4: a bit per /24
	if p.Addr().Is6() {
		unit = 32 // IPv6: a bit per /32
	}
	if p.Bits() >= unit {
		m.set(p.Addr())
		return true
	}
	if unit-p.Bits() > 16 {
		return false
	}
	// Each /unit inside p, by its number.
	first := firstBits(p.Addr(), unit)
	for i := uint32(0); i < 1<<(unit-p.Bits()); i++ {
		m.set(addrOfBits(first+i, unit, p.Addr().Is4()))
	}
	return true
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
