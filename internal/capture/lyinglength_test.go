package capture

import (
	"encoding/binary"
	"testing"

	"github.com/moat-shield/moat/internal/datapath"
	"github.com/moat-shield/moat/internal/testpkt"
)

// TestCaptureProtoLyingLength: a packet whose IP header is whole but
// claims more bytes than the frame holds is malformed, and it is a UDP
// (or TCP) packet all the same to a capture by protocol, as one with a
// cut L4 header is: such floods are what `moat dump --verdict drop
// --proto udp` is run to look at.
func TestCaptureProtoLyingLength(t *testing.T) {
	f := newFixture(t, 0)
	udp := testpkt.UDP{SrcPort: 5353, DstPort: 5353, Payload: []byte("lying length")}
	long4 := testpkt.UDPv4(clean4, server4, udp)
	binary.BigEndian.PutUint16(long4[14+2:], 500) // total length past the frame
	// The header checksum is not checked by the filter.
	long6 := testpkt.UDPv6(clean6, server6, udp)
	binary.BigEndian.PutUint16(long6[14+4:], 500) // payload length past the frame

	s := f.start(Filter{Proto: ProtoUDP})
	for name, pkt := range map[string][]byte{"ipv4": long4, "ipv6": long6} {
		if got := f.run(pkt, 1, 0); got != ActionDrop {
			t.Fatalf("%s: verdict %d, want drop (malformed)", name, got)
		}
	}
	got := drain(t, s)
	if len(got) != 2 {
		t.Fatalf("captured %d packets by --proto udp, want both malformed UDP packets", len(got))
	}
	for _, p := range got {
		if p.Reason != datapath.MoatVerdictReasonREASON_MALFORMED {
			t.Errorf("reason %d, want malformed", p.Reason)
		}
	}
}
