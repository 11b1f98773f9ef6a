// Package syncookie is the control plane of moat's SYN flood defence: cookie
// keys and their rotation, per-port protection modes, counters, the sysctl
// check and the tc attachment of the program that accepts cookie handshakes.
// It also holds a Go implementation of the cookie, written from the format
// described in bpf/include/syn_structs.h, that tests use to check the BPF
// output independently.
package syncookie

import (
	"encoding/binary"
	"math/bits"
	"net/netip"
)

// Cookie bit layout (see bpf/include/syn_structs.h):
//
//	31 ......... 10 |  9  |  8  |  7   | 6 5 4 | 3 2 1 0
//	hash (22 bits)  | key | ECN | SACK |  MSS  | wscale
const (
	wscaleMask = 0xf
	noWScale   = 0xf
	mssShift   = 4
	mssMask    = 0x7
	sackBit    = 1 << 7
	ecnBit     = 1 << 8
	keyBit     = 1 << 9
	metaMask   = 0x3ff
	maxWScale  = 14

	// msgTS is hashed with the meta bits, not carried: the SYN offered
	// timestamps, and moat's TSval carries 8 more hash bits.
	msgTS         = 1 << 16
	tsHashMask    = 0xff
	tsHashShift   = 32
	tsOffsetShift = 32
)

// MSSTable is the MSS values a cookie can carry. IPv6 raises entries below
// 1220 to 1220, its minimum, and takes 8940 for the last (a 9000-byte MTU
// less IPv6's 40-byte header: mssJumbo6).
var MSSTable = [8]uint16{536, 1220, 1300, 1360, 1400, 1440, 1460, 8960}

const mssJumbo6 = 8940

// Key is one SipHash-2-4 key.
type Key struct{ K0, K1 uint64 }

// Options is what a cookie remembers of the client's SYN.
type Options struct {
	MSS       uint16 // decoded: a table value
	WScale    uint8  // the client's window scale, valid when HasWScale
	HasWScale bool
	SACK      bool
	ECN       bool
}

// Tuple is a connection seen from the server: the client's address and
// port first.
type Tuple struct {
	Client, Server netip.AddrPort
}

// SipHash24 is SipHash-2-4 of msg under key (k0, k1 little-endian).
func SipHash24(k Key, msg []byte) uint64 {
	v0 := k.K0 ^ 0x736f6d6570736575
	v1 := k.K1 ^ 0x646f72616e646f6d
	v2 := k.K0 ^ 0x6c7967656e657261
	v3 := k.K1 ^ 0x7465646279746573
	round := func() {
		v0 += v1
		v1 = bits.RotateLeft64(v1, 13)
		v1 ^= v0
		v0 = bits.RotateLeft64(v0, 32)
		v2 += v3
		v3 = bits.RotateLeft64(v3, 16)
		v3 ^= v2
		v0 += v3
		v3 = bits.RotateLeft64(v3, 21)
		v3 ^= v0
		v2 += v1
		v1 = bits.RotateLeft64(v1, 17)
		v1 ^= v2
		v2 = bits.RotateLeft64(v2, 32)
	}
	n := len(msg)
	for len(msg) >= 8 {
		m := binary.LittleEndian.Uint64(msg)
		v3 ^= m
		round()
		round()
		v0 ^= m
		msg = msg[8:]
	}
	var last [8]byte
	copy(last[:], msg)
	last[7] = byte(n)
	b := binary.LittleEndian.Uint64(last[:])
	v3 ^= b
	round()
	round()
	v0 ^= b
	v2 ^= 0xff
	round()
	round()
	round()
	round()
	return v0 ^ v1 ^ v2 ^ v3
}

// mssIndex is the largest table entry not above mss.
func mssIndex(mss uint16, v6 bool) uint32 {
	idx := uint32(0)
	for i := range MSSTable {
		if mss >= mssValue(uint32(i), v6) {
			idx = uint32(i)
		}
	}
	return idx
}

func mssValue(idx uint32, v6 bool) uint16 {
	m := MSSTable[idx&mssMask]
	if v6 && m < 1220 {
		m = 1220
	}
	if v6 && idx&mssMask == uint32(len(MSSTable)-1) {
		m = mssJumbo6
	}
	return m
}

// Meta is the cookie's low 10 bits for a SYN with the given options, sent
// while key generation gen is current. mss is the client's MSS option,
// 0 when it sent none.
func Meta(mss uint16, hasMSS bool, wscale uint8, hasWScale, sack, ecn bool, gen uint64, v6 bool) uint32 {
	if !hasMSS {
		mss = 536
		if v6 {
			mss = 1220
		}
	}
	m := mssIndex(mss, v6) << mssShift
	if hasWScale {
		m |= uint32(min(wscale, maxWScale))
	} else {
		m |= noWScale
	}
	if sack {
		m |= sackBit
	}
	if ecn {
		m |= ecnBit
	}
	if gen&1 == 1 {
		m |= keyBit
	}
	return m
}

// message is what SipHash authenticates, laid out as in struct
// syn_cookie_msg_v4 (20 bytes) or struct syn_cookie_msg (44 bytes, IPv6):
// the addresses, the ports and the client's ISN in network order, then
// meta, little-endian. The lengths differ, and SipHash hashes the length,
// so no IPv4 message hashes like an IPv6 one.
func message(t Tuple, clientISN uint32, meta uint32, ts bool) []byte {
	var msg []byte
	c, s := t.Client.Addr(), t.Server.Addr()
	if c.Is4() {
		a, b := c.As4(), s.As4()
		msg = make([]byte, 20)
		copy(msg[0:], a[:])
		copy(msg[4:], b[:])
	} else {
		a, b := c.As16(), s.As16()
		msg = make([]byte, 44)
		copy(msg[0:], a[:])
		copy(msg[16:], b[:])
	}
	tail := msg[len(msg)-12:]
	binary.BigEndian.PutUint16(tail[0:], t.Client.Port())
	binary.BigEndian.PutUint16(tail[2:], t.Server.Port())
	binary.BigEndian.PutUint32(tail[4:], clientISN)
	m := meta & metaMask
	if ts {
		m |= msgTS
	}
	binary.LittleEndian.PutUint32(tail[8:], m)
	return msg
}

func cookieOf(h uint64, meta uint32) uint32 {
	return uint32(h)&^metaMask | meta&metaMask
}

// Cookie is the sequence number moat puts in its SYN-ACK for a SYN without
// timestamps.
func Cookie(k Key, t Tuple, clientISN uint32, meta uint32) uint32 {
	return cookieOf(SipHash24(k, message(t, clientISN, meta, false)), meta)
}

// CookieTS is the sequence number and TSval moat puts in its SYN-ACK for a
// SYN with timestamps, sent when moat's millisecond clock (CLOCK_BOOTTIME)
// read nowMS: the clock plus a keyed per-connection offset, its low 8 bits
// replaced by more hash bits that the ACK must echo in TSecr.
func CookieTS(k Key, t Tuple, clientISN uint32, meta uint32, nowMS uint32) (cookie, tsval uint32) {
	h := SipHash24(k, message(t, clientISN, meta, true))
	ms := nowMS + uint32(h>>tsOffsetShift)
	return cookieOf(h, meta), ms&^tsHashMask | uint32(h>>tsHashShift)&tsHashMask
}

// TSOffset is the offset moat adds to its clock in the TSval of the
// SYN-ACK that carries cookie (rounded down to the hash bits' 256 ms).
func TSOffset(k Key, t Tuple, clientISN uint32, meta uint32) uint32 {
	return uint32(SipHash24(k, message(t, clientISN, meta, true)) >> tsOffsetShift)
}

// Check validates a cookie returned in an ACK without timestamps (its
// ack_seq - 1) against the key pair in force (keys[gen&1] current, the
// other slot previous) and returns the options it encodes.
func Check(keys [2]Key, t Tuple, clientISN, cookie uint32) (Options, bool) {
	return check(keys, t, clientISN, cookie, false, 0)
}

// CheckTS is Check for an ACK with timestamps, whose TSecr must echo the
// hash bits of moat's TSval.
func CheckTS(keys [2]Key, t Tuple, clientISN, cookie, tsecr uint32) (Options, bool) {
	return check(keys, t, clientISN, cookie, true, tsecr)
}

func check(keys [2]Key, t Tuple, clientISN, cookie uint32, ts bool, tsecr uint32) (Options, bool) {
	meta := cookie & metaMask
	slot := 0
	if meta&keyBit != 0 {
		slot = 1
	}
	h := SipHash24(keys[slot], message(t, clientISN, meta, ts))
	if cookieOf(h, meta) != cookie {
		return Options{}, false
	}
	if ts && tsecr&tsHashMask != uint32(h>>tsHashShift)&tsHashMask {
		return Options{}, false
	}
	ws := uint8(meta & wscaleMask)
	if ws > maxWScale && ws != noWScale {
		return Options{}, false
	}
	return Options{
		MSS:       mssValue(meta>>mssShift, t.Client.Addr().Is6() && !t.Client.Addr().Is4In6()),
		WScale:    ws,
		HasWScale: ws != noWScale,
		SACK:      meta&sackBit != 0,
		ECN:       meta&ecnBit != 0,
	}, true
}
