package testpkt

import (
	"encoding/binary"
	"fmt"
	"net/netip"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
)

// IPv6Ext is an IPv6 extension header: HopByHop, Routing, DestOpts, Fragment
// or AH.
type IPv6Ext interface {
	extProto() uint8
	// layer returns the serialisable header and a function that sets its
	// next-header field.
	layer() (gopacket.SerializableLayer, func(next uint8))
}

// IPv6TLV is one option of a hop-by-hop or destination options header.
type IPv6TLV struct {
	Type uint8
	Data []byte
}

// HopByHop is the hop-by-hop options header; it is padded to a multiple of 8
// bytes with a PadN option.
type HopByHop struct{ Options []IPv6TLV }

// DestOpts is the destination options header, padded like HopByHop.
type DestOpts struct{ Options []IPv6TLV }

// Routing is a routing header with segments left and a list of addresses
// after the 4 reserved bytes (e.g. type 2 with one address is Mobile IPv6).
type Routing struct {
	Type, SegmentsLeft uint8
	Addresses          []netip.Addr
}

// Fragment is the IPv6 fragment header.
type Fragment struct {
	Offset uint16 // in 8-byte units
	More   bool
	ID     uint32
}

// AH is the IPsec authentication header; its length counts in 4-byte units,
// unlike every other extension header.
type AH struct {
	SPI, Seq uint32
	ICV      []byte // 12 zero bytes when nil (HMAC-SHA1-96)
}

func (HopByHop) extProto() uint8 { return ProtoHopByHop }
func (DestOpts) extProto() uint8 { return ProtoDstOpts }
func (Routing) extProto() uint8  { return ProtoRouting }
func (Fragment) extProto() uint8 { return ProtoFragment }
func (AH) extProto() uint8       { return ProtoAH }

// tlvOptions pads opts so that the 2-byte header plus options fill a
// multiple of 8 bytes. gopacket's own padding gets the remainder wrong
// (it pads by length%8), so it is done here and gopacket sees no gap.
func tlvOptions(opts []IPv6TLV) []*layers.IPv6HopByHopOption {
	var out []*layers.IPv6HopByHopOption
	n := 2
	for _, o := range opts {
		out = append(out, &layers.IPv6HopByHopOption{OptionType: o.Type, OptionData: o.Data})
		n += 2 + len(o.Data)
	}
	if pad := (8 - n%8) % 8; pad != 0 {
		if pad == 1 {
			pad += 8 // PadN is at least 2 bytes; Pad1 would not go through gopacket
		}
		out = append(out, &layers.IPv6HopByHopOption{OptionType: 1, OptionData: make([]byte, pad-2)})
	}
	return out
}

func (h HopByHop) layer() (gopacket.SerializableLayer, func(uint8)) {
	l := &layers.IPv6HopByHop{Options: tlvOptions(h.Options)}
	return l, func(n uint8) { l.NextHeader = layers.IPProtocol(n) }
}

func (d DestOpts) layer() (gopacket.SerializableLayer, func(uint8)) {
	var opts []*layers.IPv6DestinationOption
	for _, o := range tlvOptions(d.Options) {
		opts = append(opts, (*layers.IPv6DestinationOption)(o))
	}
	l := &layers.IPv6Destination{Options: opts}
	return l, func(n uint8) { l.NextHeader = layers.IPProtocol(n) }
}

// gopacket cannot serialise routing, fragment or AH headers; these are laid
// out by hand.

func (r Routing) layer() (gopacket.SerializableLayer, func(uint8)) {
	h := make([]byte, 8, 8+16*len(r.Addresses))
	for _, a := range r.Addresses {
		a16 := a.As16()
		h = append(h, a16[:]...)
	}
	h[1] = uint8(len(h)/8 - 1)
	h[2], h[3] = r.Type, r.SegmentsLeft
	return &rawExt{layers.LayerTypeIPv6Routing, h}, func(n uint8) { h[0] = n }
}

func (f Fragment) layer() (gopacket.SerializableLayer, func(uint8)) {
	h := make([]byte, 8)
	off := f.Offset << 3
	if f.More {
		off |= 1
	}
	binary.BigEndian.PutUint16(h[2:], off)
	binary.BigEndian.PutUint32(h[4:], f.ID)
	return &rawExt{layers.LayerTypeIPv6Fragment, h}, func(n uint8) { h[0] = n }
}

func (a AH) layer() (gopacket.SerializableLayer, func(uint8)) {
	icv := a.ICV
	if icv == nil {
		icv = make([]byte, 12)
	}
	h := make([]byte, 12, 12+len(icv))
	h = append(h, icv...)
	h[1] = uint8(len(h)/4 - 2)
	binary.BigEndian.PutUint32(h[4:], a.SPI)
	binary.BigEndian.PutUint32(h[8:], a.Seq)
	return &rawExt{layers.LayerTypeIPSecAH, h}, func(n uint8) { h[0] = n }
}

// rawExt is an extension header already laid out in bytes.
type rawExt struct {
	typ gopacket.LayerType
	hdr []byte
}

func (r *rawExt) LayerType() gopacket.LayerType { return r.typ }

func (r *rawExt) SerializeTo(b gopacket.SerializeBuffer, _ gopacket.SerializeOptions) error {
	if len(r.hdr)%8 != 0 {
		return fmt.Errorf("%v header is %d bytes, not a multiple of 8", r.typ, len(r.hdr))
	}
	p, err := b.PrependBytes(len(r.hdr))
	if err != nil {
		return err
	}
	copy(p, r.hdr)
	return nil
}
