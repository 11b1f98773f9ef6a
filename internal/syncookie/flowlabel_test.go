package syncookie

import (
	"os"
	"testing"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"

	"github.com/moat-shield/moat/internal/testpkt"
)

// TestReflectedLabelZeroGetsALabel: where listeners reflect flow labels
// (net.ipv6.flowlabel_reflect bit 0 when they are made, which moat reads
// from the namespace as it is now), the kernel's SYN-ACK and RST carry
// the client's label, but a label of 0 is none to reflect: with auto
// labels on, as by default, the kernel picks one (ip6_make_flowlabel).
// moat sent 0.
func TestReflectedLabelZeroGetsALabel(t *testing.T) {
	objs := setup(t)
	if err := Configure(objs.SynSettings, Config{}); err != nil { // RSTs on
		t.Fatal(err)
	}
	syn := func(label uint32) []byte {
		return testpkt.Frame{Net: testpkt.IPv6{Src: client6, Dst: server6, FlowLabel: label},
			L4: testpkt.TCP{SrcPort: clientPort, DstPort: protectedPort, Seq: clientISN, SYN: true}}.Bytes()
	}
	stray := func(label uint32) []byte {
		return testpkt.Frame{Net: testpkt.IPv6{Src: client6, Dst: server6, FlowLabel: label},
			L4: testpkt.TCP{SrcPort: clientPort + 1, DstPort: protectedPort, Seq: 9, Ack: 12345, ACK: true}}.Bytes()
	}
	for _, tc := range []struct {
		name    string
		frame   []byte
		label   uint32
		reflect bool // the reply carries the frame's label
	}{
		{"syn, label 0x12345", syn(0x12345), 0x12345, true},
		{"syn, label 0", syn(0), 0, false},
		{"stray ack, label 0xabcde", stray(0xabcde), 0xabcde, true},
		{"stray ack, label 0", stray(0), 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var ret uint32
			var out []byte
			inScratchNetns(t, func() {
				// Before the listener: the kernel's listener takes the
				// setting when it is made.
				if err := os.WriteFile("/proc/sys/net/ipv6/flowlabel_reflect", []byte("1"), 0); err != nil {
					t.Fatal(err)
				}
				ln := listen(t, protectedPort)
				defer ln.Close()
				// The data path reads a namespace's settings once per
				// jiffy, and a scratch namespace's lo has the index of
				// the one before it.
				time.Sleep(20 * time.Millisecond)
				ret, out = run(t, objs.MoatFilter, tc.frame)
			})
			if ret != 3 {
				t.Fatalf("verdict %d, want XDP_TX (3)", ret)
			}
			ip6, ok := gopacket.NewPacket(out, layers.LayerTypeEthernet, gopacket.Default).Layer(layers.LayerTypeIPv6).(*layers.IPv6)
			if !ok {
				t.Fatalf("no IPv6 header in %x", out)
			}
			if tc.reflect && ip6.FlowLabel != tc.label {
				t.Errorf("flow label %#x, want the client's %#x reflected", ip6.FlowLabel, tc.label)
			}
			if !tc.reflect && ip6.FlowLabel == 0 {
				t.Error("flow label 0: the client's 0 reflected, where the kernel picks a label")
			}
		})
	}
}
