package lab

import "testing"

func TestSumEthtoolStats(t *testing.T) {
	out := []byte(`NIC statistics:
     peer_ifindex: 7
     rx_queue_0_xdp_drops: 5
     rx_queue_1_xdp_drops: 12
     tx_queue_0_xdp_xmit: 100
     tx_queue_0_xdp_xmit_errors: 3
`)
	if n, err := SumEthtoolStats(out, "rx_queue_", "_xdp_drops"); err != nil || n != 17 {
		t.Errorf("rx drops: %d, %v; want 17", n, err)
	}
	// The suffix tells xdp_xmit from xdp_xmit_errors.
	if n, err := SumEthtoolStats(out, "tx_queue_", "_xdp_xmit"); err != nil || n != 100 {
		t.Errorf("tx xmit: %d, %v; want 100", n, err)
	}
	if _, err := SumEthtoolStats(out, "rx_queue_", "_xdp_tx"); err == nil {
		t.Error("no error for a counter the output lacks")
	}
	if _, err := SumEthtoolStats([]byte("     rx_queue_0_xdp_tx: many\n"), "rx_queue_", "_xdp_tx"); err == nil {
		t.Error("no error for a value that is no number")
	}
}
