package syncookie

import (
	"testing"

	"github.com/cilium/ebpf"

	"github.com/moat-shield/moat/internal/datapath"
	"github.com/moat-shield/moat/internal/testpkt"
)

// counterOf sums one slot of the interface counters over CPUs: slot 0 of
// a reason counts passes (and, for syn_cookie, XDP_TX), slot 1 drops.
func counterOf(t *testing.T, m *ebpf.Map, reason datapath.MoatVerdictReason, slot uint32) (packets, bytes uint64) {
	t.Helper()
	var perCPU []datapath.MoatVerdictCounter
	if err := m.Lookup(uint32(reason)*2+slot, &perCPU); err != nil {
		t.Fatal(err)
	}
	for _, v := range perCPU {
		packets += v.Packets
		bytes += v.Bytes
	}
	return packets, bytes
}

// TestInterfaceCountersSeeSynDefence checks that what the SYN defence does
// shows in the interface's verdict counters (moat stats, metrics), not only
// in the per-port SYN counters: a SYN answered with a cookie counts under
// syn_cookie, a random ACK to a protected port as a drop under
// syn_defence, each with its frame's bytes.
func TestInterfaceCountersSeeSynDefence(t *testing.T) {
	objs := setup(t)
	syn := synFrame(nil, client4, server4, testpkt.TCP{})
	ack := ackFrame(client4, server4, protectedPort, 99, 12345, false)
	rets, _ := verdicts(t, objs.MoatFilter, [][]byte{syn, ack}, nil)
	if rets[0] != 3 || rets[1] != 1 { // XDP_TX, XDP_DROP
		t.Fatalf("verdicts %v, want [3 1]", rets)
	}
	if p, b := counterOf(t, objs.Counters, datapath.MoatVerdictReasonREASON_SYN_COOKIE, 0); p != 1 || b == 0 {
		t.Errorf("syn_cookie answered: %d packets, %d bytes; want 1 with the SYN-ACK's bytes", p, b)
	}
	if p, b := counterOf(t, objs.Counters, datapath.MoatVerdictReasonREASON_SYN_DEFENCE, 1); p != 1 || b != uint64(len(ack)) {
		t.Errorf("syn_defence drops: %d packets, %d bytes; want 1 of %d bytes", p, b, len(ack))
	}
	if p, _ := counterOf(t, objs.Counters, datapath.MoatVerdictReasonREASON_PASS, 0); p != 0 {
		t.Errorf("%d packets counted as plain passes", p)
	}
}
