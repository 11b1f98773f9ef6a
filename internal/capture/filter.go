// Package capture copies packets out of moat's data path for `moat dump`.
//
// The XDP filter calls a capture hook with every verdict. While no capture
// runs the hook reads one flag and branches past. A Session turns capture
// on with a filter (interface, verdict, address or prefix, protocol, port,
// snap length, 1-in-N sampling); matching packets reach user space through
// a BPF ring buffer with their verdict, reason and deciding rule, and
// records that do not fit are counted per CPU in the kernel, never dropped
// silently.
//
// Capture runs under a lease: the session renews a deadline every second,
// and the data path turns capture off by itself once the deadline has
// passed. A session that is killed (SIGKILL, OOM, a crash) therefore costs
// the data path at most leaseTime of capture work, with nothing left to
// clean up. One session at a time: a lock file, released by the kernel
// when its holder dies, keeps a second one out.
package capture

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"github.com/moat-shield/moat/internal/datapath"
)

// MaxSnaplen is the most bytes of a frame a record carries; longer frames
// are cut and keep their original length.
const MaxSnaplen = 9216 // CAPTURE_MAX_SNAPLEN in capture_structs.h

// Verdicts selects packets by the filter's verdict.
type Verdicts uint8

const (
	VerdictPass = Verdicts(datapath.MoatCaptureVerdictCAPTURE_VERDICT_PASS)
	VerdictDrop = Verdicts(datapath.MoatCaptureVerdictCAPTURE_VERDICT_DROP)
	VerdictAll  = VerdictPass | VerdictDrop
)

// ParseVerdicts reads drop, pass or all.
func ParseVerdicts(s string) (Verdicts, error) {
	switch s {
	case "drop":
		return VerdictDrop, nil
	case "pass":
		return VerdictPass, nil
	case "all", "":
		return VerdictAll, nil
	}
	return 0, fmt.Errorf("invalid verdict %q: want drop, pass or all", s)
}

// IP protocol numbers the filter knows by name.
const (
	ProtoICMP   = 1
	ProtoTCP    = 6
	ProtoUDP    = 17
	ProtoICMPv6 = 58
)

// ParseProto reads tcp, udp, icmp or icmpv6.
func ParseProto(s string) (uint8, error) {
	switch strings.ToLower(s) {
	case "tcp":
		return ProtoTCP, nil
	case "udp":
		return ProtoUDP, nil
	case "icmp":
		return ProtoICMP, nil
	case "icmpv6", "icmp6":
		return ProtoICMPv6, nil
	}
	return 0, fmt.Errorf("invalid protocol %q: want tcp, udp, icmp or icmpv6", s)
}

// Filter says which packets a session captures. The zero value of each
// field matches everything, except Verdicts, where zero means all too.
type Filter struct {
	Ifindex  int          // 0: every interface moat is attached to
	Verdicts Verdicts     // 0: all
	Prefix   netip.Prefix // source or destination inside; invalid: any address
	Proto    uint8        // IP protocol; 0: any
	Port     uint16       // TCP or UDP source or destination port, with HasPort
	HasPort  bool
	Snaplen  uint32 // bytes copied per frame; 0: MaxSnaplen
	Sample   uint32 // keep 1 in Sample matching packets (per CPU); 0 or 1: all
}

// Validate reports a filter that cannot match anything or that the data
// path cannot express.
func (f Filter) Validate() error {
	if f.Ifindex < 0 {
		return errors.New("invalid interface index")
	}
	if f.Verdicts&^VerdictAll != 0 {
		return errors.New("invalid verdict selection")
	}
	if f.HasPort && f.Proto != 0 && f.Proto != ProtoTCP && f.Proto != ProtoUDP {
		return errors.New("a port filter needs tcp or udp (or no protocol)")
	}
	if f.Snaplen > MaxSnaplen {
		return fmt.Errorf("snap length %d is above the maximum of %d", f.Snaplen, MaxSnaplen)
	}
	return nil
}

// config is the filter as the data path reads it.
func (f Filter) config() datapath.MoatCaptureConfig {
	c := datapath.MoatCaptureConfig{
		Ifindex:  uint32(f.Ifindex),
		Snaplen:  f.Snaplen,
		Sample:   f.Sample,
		Verdicts: uint8(f.Verdicts),
		Proto:    f.Proto,
		Port:     f.Port,
	}
	if c.Verdicts == 0 {
		c.Verdicts = uint8(VerdictAll)
	}
	if c.Snaplen == 0 {
		c.Snaplen = MaxSnaplen
	}
	if f.Proto != 0 {
		c.Flags |= uint8(datapath.MoatCaptureFilterCAPTURE_F_PROTO)
	}
	if f.HasPort {
		c.Flags |= uint8(datapath.MoatCaptureFilterCAPTURE_F_PORT)
	}
	if f.Prefix.IsValid() {
		c.Flags |= uint8(datapath.MoatCaptureFilterCAPTURE_F_ADDR)
		p := f.Prefix.Masked()
		var addr, mask [16]byte
		if p.Addr().Is4() {
			c.Family = 4
			a := p.Addr().As4()
			copy(addr[:], a[:])
		} else {
			c.Family = 6
			addr = p.Addr().As16()
		}
		for i := 0; i < p.Bits(); i++ {
			mask[i/8] |= 0x80 >> (i % 8)
		}
		// The data path compares 32-bit words as they lie in the packet
		// (network order), so the words are built in the host's order
		// from the bytes in network order.
		for i := range 4 {
			c.Addr[i] = nativeWord(addr[4*i : 4*i+4])
			c.Mask[i] = nativeWord(mask[4*i : 4*i+4])
		}
	}
	return c
}
