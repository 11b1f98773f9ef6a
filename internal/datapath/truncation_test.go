package datapath

import (
	"errors"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/moat-shield/moat/internal/testpkt"
	"golang.org/x/sys/unix"
)

const ethHdrLen = 14

// truncationFrames are full packets with every header the parser walks:
// IPv4 options and TCP options, and an IPv6 extension header before UDP.
// Both are longer than the 60-byte Ethernet minimum, so every cut is short
// of the length the IP header declares.
func truncationFrames() []struct {
	name   string
	pkt    []byte
	ipHdrs int // bytes of Ethernet + IP header (with options, without extensions)
} {
	tcp := testpkt.Frame{
		Net: testpkt.IPv4{Src: src4, Dst: dst4, Options: []testpkt.IPv4Option{testpkt.RouterAlert()}},
		L4: testpkt.TCP{SYN: true, SrcPort: 40000, DstPort: 80, Options: []testpkt.TCPOption{
			testpkt.MSS(1460), testpkt.SACKPermitted(), testpkt.Timestamps(1, 0), testpkt.TCPNOP(), testpkt.WindowScale(7),
		}},
	}.Bytes()
	udp := testpkt.Frame{
		Net: testpkt.IPv6{Src: src6, Dst: dst6, Ext: []testpkt.IPv6Ext{testpkt.DestOpts{}}},
		L4:  testpkt.UDP{SrcPort: 5353, DstPort: 53, Payload: []byte("query")},
	}.Bytes()
	return []struct {
		name   string
		pkt    []byte
		ipHdrs int
	}{
		{"tcp4 with options", tcp, ethHdrLen + 24},
		{"udp6 with dstopts", udp, ethHdrLen + 40},
	}
}

// runShort runs a frame that may be shorter than an Ethernet header. The
// kernel's test runner refuses those (EINVAL) before the program sees them,
// as no device delivers them either; parse_eth's own check is defence in
// depth that cannot be reached from here. ok is false when refused.
func (f *fixture) runShort(pkt []byte) (verdict uint32, ok bool) {
	f.tb.Helper()
	ret, err := f.objs.MoatFilter.Run(&ebpf.RunOptions{Data: pkt})
	if err != nil {
		if len(pkt) < ethHdrLen && errors.Is(err, unix.EINVAL) {
			return 0, false
		}
		f.tb.Fatalf("run (%d bytes): %v", len(pkt), err)
	}
	return ret, true
}

// TestTruncation cuts each frame at every length short of whole. Every cut
// of an IP packet is malformed: lengths 14.. because the IP header declares
// more than the frame holds, and 0..13 because parse_eth needs the whole
// Ethernet header before it reads the EtherType (none of them counts as
// non-IP). Under malformed "pass", a cut that keeps the IP header whole must
// still be dropped when the source is denied; shorter cuts cannot be tied to
// a source and pass as malformed.
func TestTruncation(t *testing.T) {
	f := newFixture(t)
	for _, fr := range truncationFrames() {
		for _, policy := range []struct {
			name       string
			malformed  MoatMalformedPolicy
			denySource bool
		}{
			{"malformed drop", malformedDrop, false},
			{"malformed drop, source denied", malformedDrop, true},
			{"malformed pass", malformedPass, false},
			{"malformed pass, source denied", malformedPass, true},
		} {
			t.Run(fr.name+"/"+policy.name, func(t *testing.T) {
				f.tb = t
				f.reset()
				f.setPolicy(fragPass, policy.malformed)
				if policy.denySource {
					denySrc(f)
				}
				refused := 0
				for n := 0; n < len(fr.pkt); n++ {
					pkt := fr.pkt[:n]
					f.resetCounters()
					got, ok := f.runShort(pkt)
					if !ok {
						refused++
						continue
					}
					if got == xdpAborted {
						t.Fatalf("%d bytes: XDP_ABORTED", n)
					}
					wantVerdict, wantReason := uint32(xdpDrop), rMalformed
					if policy.malformed == malformedPass {
						wantVerdict = xdpPass
						if policy.denySource && n >= fr.ipHdrs {
							wantVerdict, wantReason = xdpDrop, rDeny
						}
					}
					if got != wantVerdict {
						t.Errorf("%d bytes: %s, want %s", n, verdictName(got), verdictName(wantVerdict))
					}
					c := f.counter(wantReason, wantVerdict == xdpDrop)
					if c.Packets != 1 || c.Bytes != uint64(n) {
						t.Errorf("%d bytes: reason %d counted %+v, want 1 packet of %d bytes (all: %v)", n, wantReason, c, n, f.countedSlots())
					}
				}
				if refused == ethHdrLen {
					t.Logf("the kernel refused all %d frames shorter than an Ethernet header (EINVAL)", refused)
				}
				if refused != 0 && refused != ethHdrLen {
					t.Errorf("kernel refused %d short frames, expected none or the %d shorter than an Ethernet header", refused, ethHdrLen)
				}

				// The whole frame is not malformed.
				f.resetCounters()
				want := uint32(xdpPass)
				if policy.denySource {
					want = xdpDrop
				}
				if got := f.run(fr.pkt); got != want {
					t.Errorf("whole frame: %s, want %s", verdictName(got), verdictName(want))
				}
				if c := f.counter(rMalformed, false).Packets + f.counter(rMalformed, true).Packets; c != 0 {
					t.Errorf("whole frame counted as malformed")
				}
			})
		}
	}
}
