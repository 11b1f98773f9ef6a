package testpkt

import (
	"encoding/binary"

	"github.com/google/gopacket/layers"
)

// TCPOption is one TCP option; the header is padded to a multiple of 4
// bytes with end-of-list bytes.
type TCPOption = layers.TCPOption

// MSS returns the maximum segment size option.
func MSS(mss uint16) TCPOption {
	d := make([]byte, 2)
	binary.BigEndian.PutUint16(d, mss)
	return layers.TCPOption{OptionType: layers.TCPOptionKindMSS, OptionData: d}
}

// WindowScale returns the window scale option.
func WindowScale(shift uint8) TCPOption {
	return layers.TCPOption{OptionType: layers.TCPOptionKindWindowScale, OptionData: []byte{shift}}
}

// SACKPermitted returns the SACK-permitted option.
func SACKPermitted() TCPOption {
	return layers.TCPOption{OptionType: layers.TCPOptionKindSACKPermitted}
}

// Timestamps returns the timestamps option.
func Timestamps(val, ecr uint32) TCPOption {
	d := make([]byte, 8)
	binary.BigEndian.PutUint32(d, val)
	binary.BigEndian.PutUint32(d[4:], ecr)
	return layers.TCPOption{OptionType: layers.TCPOptionKindTimestamps, OptionData: d}
}

// TCPNOP returns the one-byte no-operation option.
func TCPNOP() TCPOption { return layers.TCPOption{OptionType: layers.TCPOptionKindNop} }
